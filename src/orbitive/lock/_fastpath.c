/* orbitive.lock._fastpath: the lock table's hot operations, each one C call.
 *
 * Steps.try_acquire, Steps.release and Steps.renew are LockTable's public
 * operations of the same names on their common path: argument checks, the
 * clock, the stripes of the section the key's probe reads (robust mutexes in
 * the object's section block, _robust.h; lock/_layout.py "Stripes"), the table
 * step and the result objects. The step is byte for byte what ReferenceSteps in
 * lock/_steps.py does (the comment over each C function names its Python twin):
 * linear probing bounded by the header's max_probe, with lazy reclaim of
 * expired entries, counters advanced first, one transition frame published to
 * this node's ring lane (seqlock) with the readiness word bumped, then
 * max_probe raised if the entry lies further from its home, then the slot
 * tombstoned, rewritten and made OCCUPIED last.
 *
 * LockTable binds these methods as its own. Anything off that path (other
 * argument types, an error to raise, a fork, a closed table, the test-only
 * crash hook) hands the call, before or after the step, to the table class's
 * method of the same name (lock/_table.py), which runs the Python operation
 * (_try_acquire, _release, _renew) over the steps of lock/_steps.py, the reference,
 * which also runs when this module is not built.
 *
 * Every length and offset read from shared memory is checked before use, and
 * the geometry is checked against the buffers' sizes on every call.
 *
 * Steps on keys whose probes lie in different stripes run at once, in different
 * processes. What they share changes only by atomic instructions: the header's
 * counters and max_probe, the ring's readiness word and the section's recovery
 * count. A Python step holds every stripe, so its plain loads and stores of the
 * same words never meet one of these. Each process writes only its own ring lane,
 * and its threads' C steps do so one at a time under the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include "_robust.h"
#include "_slots.h"
#include <math.h>
#include <time.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the SHM layouts are little-endian; the pure-Python table is used instead"
#endif
#ifdef Py_GIL_DISABLED
#error "a process's ring lane writes rely on the GIL; the pure-Python table is used instead"
#endif

/* Layouts: docs/format.md, lock/_layout.py, lock/_events.py and _ring.py. */
enum { EMPTY = 0, OCCUPIED = 1, TOMBSTONE = 2 };
enum { STATE_HEADER = 128, SLOT_HEADER = 48, MAX_PROBE_AT = 20, TOKEN_AT = 64, REVISION_AT = 72 };
enum { RING_HEADER = 64, LANE_HEAD = 64, FRAME_HEADER = 32, EVENT_HEADER = 35 };
enum { GENERATION_AT = 24, ACQUIRED = 1, RENEWED = 2, RELEASED = 3 };
#define EVENT_MAGIC UINT32_C(0x4F4C434B)
#define EVENT_VERSION 1
#define TOKEN_MASK ((UINT64_C(1) << 40) - 1)
#define COUNTER_LIMIT (UINT64_C(1) << 62)
#define TTL_MAX_S 1e9 /* _clock.TTL_MAX_S */

/* Step outcomes. */
enum { DONE = 0, BUSY = 1, FULL = 2, EXHAUSTED = 3, CORRUPT = 4, ABSENT = 5 };

/* The stripes a step holds: lo..hi, none while hi < lo; and the probe bound they
 * cover (max_probe as read when they were held: it may grow after, for other keys). */
typedef struct {
    int lo, hi;
    Py_ssize_t span;
} Held;

/* The value types of _types.py, and where their slots live in an instance. */
typedef struct {
    PyTypeObject *key, *owner, *lease, *acquired, *occupied;
    Py_ssize_t digest_at, ident_at, namespace_at, value_at, acquired_lease_at, occupied_lease_at;
} Types;

typedef struct {
    PyObject_HEAD
    PyObject *state; /* the state table's mmap */
    PyObject *ring;  /* the transition ring's mmap */
    Py_buffer block; /* the state object's section block, held for life */
    PyObject *wake;  /* Ring.wake: called when a driver is parked */
    PyObject *fork_dict, *generation; /* _fork's globals, and its generation at creation */
    PyObject *table, *table_dict;     /* the LockTable, and _steps's globals (crash_hook) */
    Types types;
    Py_ssize_t capacity, stride, payload_max;
    Py_ssize_t lanes, heads_at, slots_at, ring_capacity, ring_stride, frame_bytes;
    Py_ssize_t node, stripe_slots;
    uint64_t id_base;
    int stripes, closed, ready;
} Steps;

typedef struct {
    Py_buffer sb, rb;
    uint8_t *s, *r;
} Maps;

/* The key, owner and times of one step, as the caller passed them. */
typedef struct {
    uint64_t digest, now, expires, lock_id;
    const uint8_t *ident, *owner;
    Py_ssize_t ident_len, ns_len, owner_len, node;
    PyObject *key, *owner_obj; /* borrowed: the caller's LockKey and LockOwner */
} Entry;

static inline uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void st16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
/* Stores before it are visible before stores after it (seqlock and commit order). */
static inline void fence(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }

static inline uint8_t *slot_at(const Steps *t, uint8_t *s, Py_ssize_t slot)
{
    return s + STATE_HEADER + slot * t->stride;
}

static int empty_head(const uint8_t *p)
{
    static const uint8_t zero[8];
    return memcmp(p, zero, 8) == 0;
}

/* read_live: a valid, unexpired OCCUPIED entry. */
static int live(const Steps *t, const uint8_t *p, uint64_t now)
{
    Py_ssize_t ns = ld16(p + 2), lb = ld16(p + 4), ow = ld16(p + 6);
    uint64_t acquired = ld64(p + 32), expires = ld64(p + 40);
    return p[0] == OCCUPIED && ns && lb && ow && ns + lb + ow <= t->payload_max &&
           acquired < expires && expires > now;
}

/* holds_key: the live entry at p stores exactly e's key. */
static int holds_key(const uint8_t *p, const Entry *e)
{
    return ld64(p + 8) == e->digest && ld16(p + 2) == e->ns_len &&
           ld16(p + 4) == e->ident_len - e->ns_len &&
           memcmp(p + SLOT_HEADER, e->ident, (size_t)e->ident_len) == 0;
}

/* tombstone: mark slot TOMBSTONE; a run of tombstones before an EMPTY slot turns EMPTY. */
static void tombstone(const Steps *t, uint8_t *s, Py_ssize_t slot, uint64_t digest)
{
    Py_ssize_t mask = t->capacity - 1;
    Py_ssize_t floor = (Py_ssize_t)(digest & (uint64_t)mask) & ~(t->stripe_slots - 1);
    slot_at(t, s, slot)[0] = TOMBSTONE;
    if (!empty_head(slot_at(t, s, (slot + 1) & mask)))
        return;
    for (Py_ssize_t i = ((slot - floor) & mask) + 1; i > 0; i--) {
        uint8_t *p = slot_at(t, s, slot);
        if (p[0] != TOMBSTONE)
            return;
        memset(p, 0, 8);
        slot = (slot - 1) & mask;
    }
}

/* bound: the stored max_probe, read as at most capacity - 1. */
static Py_ssize_t bound(const Steps *t, const uint8_t *s)
{
    uint32_t stored = __atomic_load_n((const uint32_t *)(s + MAX_PROBE_AT), __ATOMIC_ACQUIRE);
    return stored < (uint64_t)(t->capacity - 1) ? (Py_ssize_t)stored : t->capacity - 1;
}

/* free_after: the first slot of count from slot on holding no live entry, else capacity. */
static Py_ssize_t free_after(const Steps *t, uint8_t *s, Py_ssize_t slot, Py_ssize_t count,
                             const Entry *e)
{
    Py_ssize_t mask = t->capacity - 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint8_t *p = slot_at(t, s, slot);
        if (p[0] != OCCUPIED)
            return slot;
        if (!live(t, p, e->now)) {
            tombstone(t, s, slot, e->digest);
            return slot;
        }
        slot = (slot + 1) & mask;
    }
    return t->capacity;
}

/* probe: the slot of the key's live entry, else ~insertion_slot (~capacity: none).
 * Stops at EMPTY or after limit + 1 slots (limit: the bound the held stripes cover,
 * never max_probe read again, which another stripe's insert may have raised since).
 * Past those, free_after may read any slot: without every stripe held (!all) the
 * probe stops there and sets *wider. */
static Py_ssize_t probe(const Steps *t, uint8_t *s, const Entry *e, Py_ssize_t limit, int all,
                        int *wider)
{
    Py_ssize_t mask = t->capacity - 1, slot = (Py_ssize_t)(e->digest & (uint64_t)mask);
    Py_ssize_t insert_at = t->capacity;
    for (Py_ssize_t i = 0; i <= limit; i++) {
        uint8_t *p = slot_at(t, s, slot);
        if (p[0] == EMPTY && empty_head(p))
            return ~(insert_at < t->capacity ? insert_at : slot);
        if (p[0] == OCCUPIED) {
            if (live(t, p, e->now)) {
                if (holds_key(p, e))
                    return slot;
                slot = (slot + 1) & mask;
                continue;
            }
            tombstone(t, s, slot, e->digest);
        }
        if (insert_at == t->capacity)
            insert_at = slot;
        slot = (slot + 1) & mask;
    }
    if (insert_at < t->capacity)
        return ~insert_at;
    if (!all) {
        *wider = 1;
        return ~t->capacity;
    }
    return ~free_after(t, s, slot, mask - limit, e);
}

/* publish (Ring.publish plus bump): one lock-event frame in the node's lane.
 * *wake: a driver is parked. */
static int publish(const Steps *t, uint8_t *r, const Entry *e, uint8_t kind, uint64_t revision,
                   uint64_t t1, uint64_t t2, int *wake)
{
    uint8_t *head = r + t->heads_at + e->node * LANE_HEAD;
    uint64_t counter = ld64(head);
    Py_ssize_t body = e->ident_len + e->owner_len;
    if (counter >= COUNTER_LIMIT || EVENT_HEADER + body > t->frame_bytes)
        return CORRUPT;
    Py_ssize_t index = (Py_ssize_t)(counter & (uint64_t)(t->ring_capacity - 1));
    uint8_t *f = r + t->slots_at + (e->node * t->ring_capacity + index) * t->ring_stride;
    st64(f, 2 * counter + 1);
    fence();
    st64(f + 8, counter);
    st64(f + 16, revision);
    st32(f + 24, (uint32_t)(EVENT_HEADER + body));
    f[28] = kind;
    memset(f + 29, 0, 3);
    uint8_t *h = f + FRAME_HEADER;
    st32(h, EVENT_MAGIC);
    h[4] = EVENT_VERSION;
    st16(h + 5, (uint16_t)e->ns_len);
    st16(h + 7, (uint16_t)(e->ident_len - e->ns_len));
    st16(h + 9, (uint16_t)e->owner_len);
    st64(h + 11, e->lock_id);
    st64(h + 19, t1);
    st64(h + 27, t2);
    memcpy(h + EVENT_HEADER, e->ident, (size_t)e->ident_len);
    memcpy(h + EVENT_HEADER + e->ident_len, e->owner, (size_t)e->owner_len);
    fence();
    st64(f, 2 * counter + 2);
    fence();
    st64(head, counter + 1);
    fence();
    /* Sequentially consistent, and so a full barrier: the parked bytes are read after it. */
    __atomic_add_fetch((uint32_t *)(r + GENERATION_AT), 1, __ATOMIC_SEQ_CST);
    *wake = 0;
    for (Py_ssize_t n = 0; n < t->lanes; n++)
        if (r[RING_HEADER + n]) {
            *wake = 1;
            break;
        }
    return DONE;
}

/* The insert half of insert (raise_bound, then the slot): max_probe raised, then TOMBSTONE, rewrite, OCCUPIED last. */
static void write_slot(const Steps *t, uint8_t *s, Py_ssize_t slot, const Entry *e,
                       uint64_t revision)
{
    uint64_t mask = (uint64_t)(t->capacity - 1);
    Py_ssize_t displacement = (Py_ssize_t)(((uint64_t)slot - e->digest) & mask);
    uint32_t *word = (uint32_t *)(s + MAX_PROBE_AT);
    uint32_t stored = __atomic_load_n(word, __ATOMIC_RELAXED);
    while ((Py_ssize_t)stored < displacement &&
           !__atomic_compare_exchange_n(word, &stored, (uint32_t)displacement, 0,
                                        __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ; /* another stripe's step changed it meanwhile: compare again */
    fence();
    uint8_t *p = slot_at(t, s, slot);
    p[0] = TOMBSTONE;
    fence();
    p[1] = 0;
    st16(p + 2, (uint16_t)e->ns_len);
    st16(p + 4, (uint16_t)(e->ident_len - e->ns_len));
    st16(p + 6, (uint16_t)e->owner_len);
    st64(p + 8, e->digest);
    st64(p + 16, e->lock_id);
    st64(p + 24, revision);
    st64(p + 32, e->now);
    st64(p + 40, e->expires);
    memcpy(p + SLOT_HEADER, e->ident, (size_t)e->ident_len);
    memcpy(p + SLOT_HEADER + e->ident_len, e->owner, (size_t)e->owner_len);
    fence();
    p[0] = OCCUPIED;
}

/* -- buffers ----------------------------------------------------------------------- */

static int maps_get(const Steps *t, Maps *m)
{
    if (PyObject_GetBuffer(t->state, &m->sb, PyBUF_WRITABLE) < 0)
        return -1;
    if (PyObject_GetBuffer(t->ring, &m->rb, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&m->sb);
        return -1;
    }
    if (m->sb.len < STATE_HEADER + t->capacity * t->stride ||
        m->rb.len < t->slots_at + t->lanes * t->ring_capacity * t->ring_stride) {
        PyBuffer_Release(&m->sb);
        PyBuffer_Release(&m->rb);
        PyErr_SetString(PyExc_ValueError, "a mapping is smaller than its layout");
        return -1;
    }
    m->s = m->sb.buf;
    m->r = m->rb.buf;
    return 0;
}

static void maps_release(Maps *m)
{
    PyBuffer_Release(&m->sb);
    PyBuffer_Release(&m->rb);
}

/* -- arguments: anything unusual declines to the Python operation ------------------------ */

/* Names interned at import: globals read per call, and the Python operations. */
static PyObject *generation_name, *crash_hook_name;
static PyObject *python_acquire, *python_release, *python_renew;

/* A call as it came: positional arguments, then the values of its keywords. */
typedef struct {
    PyObject *const *args;
    Py_ssize_t nargs;
    PyObject *kwnames;
} Call;

enum { MOST_ARGS = 8 };

/* Hand the call, as it came, to the table class's Python method ``name``: the
 * public one, which runs the Python operation (the reference), so that even a
 * call with wrong arguments fails exactly as it does on the Python path. */
static PyObject *decline(const Steps *t, PyObject *name, const Call *c)
{
    PyObject *small[MOST_ARGS + 1];
    Py_ssize_t total = c->nargs + (c->kwnames ? PyTuple_GET_SIZE(c->kwnames) : 0);
    if (t->table == NULL) {
        PyErr_SetString(PyExc_ValueError, "Steps is not initialised");
        return NULL;
    }
    PyObject **call = total <= MOST_ARGS ? small : PyMem_New(PyObject *, total + 1);
    if (call == NULL)
        return PyErr_NoMemory();
    call[0] = t->table;
    for (Py_ssize_t i = 0; i < total; i++)
        call[i + 1] = c->args[i];
    PyObject *method = PyObject_GetAttr((PyObject *)Py_TYPE(t->table), name);
    PyObject *result =
        method == NULL ? NULL : PyObject_Vectorcall(method, call, (size_t)c->nargs + 1, c->kwnames);
    Py_XDECREF(method);
    if (call != small)
        PyMem_Free(call);
    return result;
}

/* The call's n arguments in the order of names (keywords put in their places); 0 when
 * any is missing, unknown or given twice (the Python operation then says which). */
static int positional(const Call *c, const char *const *names, Py_ssize_t n, PyObject **out)
{
    if (c->nargs > n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = i < c->nargs ? c->args[i] : NULL;
    Py_ssize_t keywords = c->kwnames ? PyTuple_GET_SIZE(c->kwnames) : 0;
    for (Py_ssize_t k = 0; k < keywords; k++) {
        PyObject *name = PyTuple_GET_ITEM(c->kwnames, k);
        Py_ssize_t j = 0;
        while (j < n && PyUnicode_CompareWithASCIIString(name, names[j]) != 0)
            j++;
        if (j == n || out[j] != NULL)
            return 0;
        out[j] = c->args[c->nargs + k];
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (out[i] == NULL)
            return 0;
    return 1;
}

/* The table may run here: built, open, in the process that built it, no crash hook. */
static int usable(const Steps *t)
{
    if (!t->ready || t->closed)
        return 0;
    PyObject *now = PyDict_GetItemWithError(t->fork_dict, generation_name);
    PyObject *hook = PyDict_GetItemWithError(t->table_dict, crash_hook_name);
    return now == t->generation && (hook == NULL || hook == Py_None) && !PyErr_Occurred();
}

/* ttl seconds (an exact float or int, finite, 0 < ttl <= TTL_MAX_S) as _clock.ttl_ms does. */
static int ttl_ms(PyObject *o, uint64_t *ms)
{
    double ttl;
    if (PyFloat_CheckExact(o)) {
        ttl = PyFloat_AS_DOUBLE(o);
    } else if (PyLong_CheckExact(o)) {
        ttl = PyLong_AsDouble(o);
        if (ttl == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else {
        return 0;
    }
    if (!(ttl > 0.0 && ttl <= TTL_MAX_S))
        return 0;
    double whole = ceil(ttl * 1000.0 - 1e-6);
    *ms = whole < 1.0 ? 1 : (uint64_t)whole;
    return 1;
}

/* monotonic_ns() // 1_000_000 */
static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The caller's key and owner (a LockKey and a LockOwner) into e; 0 to decline. */
static int parse_entry(const Steps *t, PyObject *key, PyObject *owner, Entry *e)
{
    const Types *y = &t->types;
    if (!Py_IS_TYPE(key, y->key) || !Py_IS_TYPE(owner, y->owner))
        return 0;
    PyObject *digest = slot_of(key, y->digest_at), *ident = slot_of(key, y->ident_at);
    PyObject *ns = slot_of(key, y->namespace_at), *value = slot_of(owner, y->value_at);
    if (digest == NULL || ident == NULL || ns == NULL || value == NULL || !PyLong_Check(digest) ||
        !PyBytes_Check(ident) || !PyBytes_Check(ns) || !PyBytes_Check(value))
        return 0;
    e->digest = PyLong_AsUnsignedLongLong(digest);
    if (e->digest == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    e->ident = (const uint8_t *)PyBytes_AS_STRING(ident);
    e->ident_len = PyBytes_GET_SIZE(ident);
    e->ns_len = PyBytes_GET_SIZE(ns);
    e->owner = (const uint8_t *)PyBytes_AS_STRING(value);
    e->owner_len = PyBytes_GET_SIZE(value);
    e->node = t->node;
    e->key = key;
    e->owner_obj = owner;
    return e->ns_len >= 1 && e->ns_len < e->ident_len && e->owner_len >= 1 &&
           e->ident_len + e->owner_len <= t->payload_max;
}

/* A LockLease's key, owner, lock id and slot hint into e; 0 to decline. */
static int parse_lease(const Steps *t, PyObject *lease, Entry *e, Py_ssize_t *hint)
{
    if (!Py_IS_TYPE(lease, t->types.lease) || PyTuple_GET_SIZE(lease) != 7 ||
        !parse_entry(t, PyTuple_GET_ITEM(lease, 0), PyTuple_GET_ITEM(lease, 1), e))
        return 0;
    PyObject *lock_id = PyTuple_GET_ITEM(lease, 2), *slot = PyTuple_GET_ITEM(lease, 6);
    if (!PyLong_CheckExact(lock_id) || !PyLong_CheckExact(slot))
        return 0;
    e->lock_id = PyLong_AsUnsignedLongLong(lock_id);
    *hint = PyLong_AsSsize_t(slot);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* -- results --------------------------------------------------------------------------- */

/* LockLease(key, owner, lock_id, revision, acquired / 1000, expires / 1000, slot). */
static PyObject *new_lease(const Steps *t, PyObject *key, PyObject *owner, uint64_t lock_id,
                           uint64_t revision, uint64_t acquired, uint64_t expires, Py_ssize_t slot)
{
    PyObject *lease = t->types.lease->tp_alloc(t->types.lease, 7);
    if (lease == NULL)
        return NULL;
    PyObject *items[7] = {
        Py_NewRef(key),
        Py_NewRef(owner),
        PyLong_FromUnsignedLongLong(lock_id),
        PyLong_FromUnsignedLongLong(revision),
        PyFloat_FromDouble((double)acquired / 1000.0),
        PyFloat_FromDouble((double)expires / 1000.0),
        PyLong_FromSsize_t(slot),
    };
    for (int i = 0; i < 7; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 7; j++)
                Py_XDECREF(items[j]);
            Py_DECREF(lease);
            return NULL;
        }
    }
    for (int i = 0; i < 7; i++)
        PyTuple_SET_ITEM(lease, i, items[i]);
    return lease;
}

/* An instance of a one-slot value type (Acquired, Occupied, LockOwner) holding value. */
static PyObject *new_boxed(PyTypeObject *type, Py_ssize_t at, PyObject *value)
{
    if (value == NULL)
        return NULL;
    PyObject *box = type->tp_alloc(type, 0);
    if (box == NULL) {
        Py_DECREF(value);
        return NULL;
    }
    *(PyObject **)((char *)box + at) = value;
    return box;
}

/* -- counters --------------------------------------------------------------------- */

static uint64_t load64(const uint8_t *p)
{
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_RELAXED);
}

/* next_ids for one counter: the u64 at p advanced by one, unless it has reached
 * limit (0 then). Atomic: steps holding other stripes advance it at the same time. */
static uint64_t advance(uint8_t *p, uint64_t limit)
{
    uint64_t *word = (uint64_t *)p, last = __atomic_load_n(word, __ATOMIC_RELAXED);
    do {
        if (last >= limit)
            return 0;
    } while (!__atomic_compare_exchange_n(word, &last, last + 1, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
    return last + 1;
}

/* -- stripes ------------------------------------------------------------------------ */

static int stripe_of(const Steps *t, Py_ssize_t slot) { return (int)(slot / t->stripe_slots); }

static int holds_all(const Steps *t, const Held *h) { return h->lo == 0 && h->hi == t->stripes - 1; }

static void let_go(Steps *t, Held *h)
{
    if (h->hi >= h->lo)
        robust_unlock_range(t->block.buf, h->lo, h->hi);
    h->lo = 0;
    h->hi = -1;
}

/* Hold the stripes of slots home .. home + span, every stripe when that wraps. The
 * stripes held already stay held and new ones above them are added, which keeps the
 * ascending order; else all are let go and taken again from the lowest. Returns 0,
 * or robust_lock's errno value (with nothing held). */
static int hold(Steps *t, Held *h, Py_ssize_t home, Py_ssize_t span)
{
    int lo = 0, hi = t->stripes - 1, rc;
    if (home + span < t->capacity) {
        lo = stripe_of(t, home);
        hi = stripe_of(t, home + span);
    }
    if (h->hi >= h->lo && lo >= h->lo) {
        if (hi <= h->hi)
            return 0;
        if ((rc = robust_lock_range(t->block.buf, h->hi + 1, hi)) != 0)
            let_go(t, h);
        else
            h->hi = hi;
        return rc;
    }
    let_go(t, h);
    if ((rc = robust_lock_range(t->block.buf, lo, hi)) == 0) {
        h->lo = lo;
        h->hi = hi;
    }
    return rc;
}

/* Hold the stripes e's probe reads: its home .. home + max_probe, recorded in h->span.
 * max_probe only grows, and a step that raises it for e's key holds e's home stripe:
 * read again once they are held, it is final for e unless it grew meanwhile, and then
 * more are held. Growing later, it is another key's: the probe keeps to h->span. */
static int cover(Steps *t, const uint8_t *s, const Entry *e, Held *h)
{
    Py_ssize_t home = (Py_ssize_t)(e->digest & (uint64_t)(t->capacity - 1));
    for (;;) {
        h->span = bound(t, s);
        int rc = hold(t, h, home, h->span);
        if (rc != 0 || bound(t, s) <= h->span)
            return rc;
    }
}

/* probe, with every stripe held when it must look past max_probe. *rc: a lock's errno. */
static Py_ssize_t probe_held(Steps *t, uint8_t *s, const Entry *e, Held *h, int *rc)
{
    int wider = 0;
    Py_ssize_t slot = probe(t, s, e, h->span, holds_all(t, h), &wider);
    if (wider) {
        if ((*rc = hold(t, h, 0, t->capacity)) != 0)
            return ~t->capacity;
        h->span = bound(t, s); /* every stripe held: no other step changes it now */
        slot = probe(t, s, e, h->span, 1, &wider);
    }
    return slot;
}

/* -- the operations ---------------------------------------------------------------- */

/* Map the buffers and hold e's stripes; 0 (nothing held) hands the call to Python. */
static int enter(Steps *t, Maps *m, const Entry *e, Held *h)
{
    h->lo = 0;
    h->hi = -1;
    if (maps_get(t, m) < 0) {
        PyErr_Clear(); /* a closed mapping: the Python operation says why */
        return 0;
    }
    if (cover(t, m->s, e, h) != 0 || t->closed) { /* closed while this thread waited */
        let_go(t, h);
        maps_release(m);
        return 0;
    }
    return 1;
}

/* Wake parked drivers (inside the section, as Ring.publish does), then leave it. */
static int leave(Steps *t, Maps *m, Held *h, int wake)
{
    int failed = 0;
    if (wake) {
        PyObject *done = PyObject_CallNoArgs(t->wake);
        failed = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    let_go(t, h);
    maps_release(m);
    return failed;
}

PyDoc_STRVAR(try_acquire_doc,
"try_acquire(key, owner, ttl) -> Acquired | Occupied: LockTable.try_acquire in one call.");

static PyObject *Steps_try_acquire(Steps *t, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames)
{
    static const char *const names[] = {"key", "owner", "ttl"};
    const Call c = {args, PyVectorcall_NARGS(nargsf), kwnames};
    PyObject *a[3];
    Entry e;
    Maps m;
    Held h;
    uint64_t ms, revision = 0, id_base = t->id_base, busy[4] = {0};
    PyObject *holder = NULL;
    int outcome, wake = 0, rc = 0;
    if (!usable(t) || !positional(&c, names, 3, a) || !parse_entry(t, a[0], a[1], &e) ||
        !ttl_ms(a[2], &ms) || !enter(t, &m, &e, &h))
        return decline(t, python_acquire, &c);
    e.now = now_ms();
    e.expires = e.now + ms;
    Py_ssize_t slot = probe_held(t, m.s, &e, &h, &rc);
    if (rc != 0) {
        outcome = CORRUPT;
    } else if (slot >= 0) {
        const uint8_t *p = slot_at(t, m.s, slot);
        outcome = BUSY;
        busy[0] = ld64(p + 16);
        busy[1] = ld64(p + 24);
        busy[2] = ld64(p + 32);
        busy[3] = ld64(p + 40);
        holder = PyBytes_FromStringAndSize((const char *)p + SLOT_HEADER + e.ident_len, ld16(p + 6));
    } else if ((slot = ~slot) >= t->capacity) {
        outcome = FULL;
    } else {
        uint64_t token;
        /* The revision is checked first, so that a token is not spent on a refusal. */
        if (load64(m.s + REVISION_AT) == UINT64_MAX ||
            (token = advance(m.s + TOKEN_AT, TOKEN_MASK)) == 0 ||
            (revision = advance(m.s + REVISION_AT, UINT64_MAX)) == 0) {
            outcome = EXHAUSTED;
        } else {
            e.lock_id = id_base | token;
            outcome = publish(t, m.r, &e, ACQUIRED, revision, e.now, e.expires, &wake);
            if (outcome == DONE)
                write_slot(t, m.s, slot, &e, revision);
        }
    }
    if (leave(t, &m, &h, wake) < 0) {
        Py_XDECREF(holder);
        return NULL;
    }
    const Types *y = &t->types;
    if (outcome == DONE)
        return new_boxed(y->acquired, y->acquired_lease_at,
                         new_lease(t, e.key, e.owner_obj, e.lock_id, revision, e.now, e.expires, slot));
    if (outcome != BUSY) /* the Python operation raises StateFull, IdExhausted or LayoutMismatch */
        return decline(t, python_acquire, &c);
    if (holder == NULL)
        return NULL;
    PyObject *owner = new_boxed(y->owner, y->value_at, holder);
    if (owner == NULL)
        return NULL;
    PyObject *lease = new_lease(t, e.key, owner, busy[0], busy[1], busy[2], busy[3], slot);
    Py_DECREF(owner);
    return new_boxed(y->occupied, y->occupied_lease_at, lease);
}

/* The live entry at p is e's tenure: its lock id and its stored owner. */
static int is_tenure(const uint8_t *p, const Entry *e)
{
    return ld64(p + 16) == e->lock_id && ld16(p + 6) == e->owner_len &&
           memcmp(p + SLOT_HEADER + e->ident_len, e->owner, (size_t)e->owner_len) == 0;
}

/* find_tenure: the slot holding exactly e's tenure (key, lock id, owner), or -1. */
static Py_ssize_t find_tenure(Steps *t, uint8_t *s, const Entry *e, Py_ssize_t hint, Held *h,
                              int *rc)
{
    if (hint == (Py_ssize_t)(e->digest & (uint64_t)(t->capacity - 1))) {
        uint8_t *p = slot_at(t, s, hint);
        if (live(t, p, e->now) && holds_key(p, e))
            return is_tenure(p, e) ? hint : -1;
    }
    Py_ssize_t slot = probe_held(t, s, e, h, rc);
    return slot >= 0 && is_tenure(slot_at(t, s, slot), e) ? slot : -1;
}

/* The revision for a release or renewal, advanced; 0 when the counters are exhausted. */
static uint64_t next_revision(uint8_t *s)
{
    return load64(s + TOKEN_AT) > TOKEN_MASK ? 0 : advance(s + REVISION_AT, UINT64_MAX);
}

PyDoc_STRVAR(release_doc,
"release(lease) -> bool: LockTable.release in one call.");

static PyObject *Steps_release(Steps *t, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    static const char *const names[] = {"lease"};
    const Call c = {args, PyVectorcall_NARGS(nargsf), kwnames};
    PyObject *a[1];
    Entry e;
    Maps m;
    Held h;
    Py_ssize_t hint;
    uint64_t revision;
    int outcome = ABSENT, wake = 0, rc = 0;
    if (!usable(t) || !positional(&c, names, 1, a) || !parse_lease(t, a[0], &e, &hint) ||
        !enter(t, &m, &e, &h))
        return decline(t, python_release, &c);
    e.now = now_ms();
    Py_ssize_t slot = find_tenure(t, m.s, &e, hint, &h, &rc);
    if (rc != 0) {
        outcome = CORRUPT;
    } else if (slot >= 0) {
        if ((revision = next_revision(m.s)) == 0) {
            outcome = EXHAUSTED;
        } else {
            outcome = publish(t, m.r, &e, RELEASED, revision, 0, 0, &wake);
            if (outcome == DONE)
                tombstone(t, m.s, slot, e.digest);
        }
    }
    if (leave(t, &m, &h, wake) < 0)
        return NULL;
    if (outcome == DONE)
        Py_RETURN_TRUE;
    if (outcome == ABSENT)
        Py_RETURN_FALSE;
    return decline(t, python_release, &c);
}

PyDoc_STRVAR(renew_doc,
"renew(lease, ttl) -> LockLease | None: LockTable.renew in one call.");

static PyObject *Steps_renew(Steps *t, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    static const char *const names[] = {"lease", "ttl"};
    const Call c = {args, PyVectorcall_NARGS(nargsf), kwnames};
    PyObject *a[2];
    Entry e;
    Maps m;
    Held h;
    Py_ssize_t hint;
    uint64_t ms, revision = 0, acquired = 0;
    int outcome = ABSENT, wake = 0, rc = 0;
    if (!usable(t) || !positional(&c, names, 2, a) || !ttl_ms(a[1], &ms) ||
        !parse_lease(t, a[0], &e, &hint) || !enter(t, &m, &e, &h))
        return decline(t, python_renew, &c);
    e.now = now_ms();
    e.expires = e.now + ms;
    Py_ssize_t slot = find_tenure(t, m.s, &e, hint, &h, &rc);
    if (rc != 0) {
        outcome = CORRUPT;
    } else if (slot >= 0) {
        uint8_t *p = slot_at(t, m.s, slot);
        acquired = ld64(p + 32);
        if ((revision = next_revision(m.s)) == 0) {
            outcome = EXHAUSTED;
        } else {
            outcome = publish(t, m.r, &e, RENEWED, revision, acquired, e.expires, &wake);
            if (outcome == DONE) { /* rewrite: TOMBSTONE, revision and expiry, OCCUPIED */
                p[0] = TOMBSTONE;
                fence();
                st64(p + 24, revision);
                st64(p + 40, e.expires);
                fence();
                p[0] = OCCUPIED;
            }
        }
    }
    if (leave(t, &m, &h, wake) < 0)
        return NULL;
    if (outcome == DONE)
        return new_lease(t, e.key, e.owner_obj, e.lock_id, revision, acquired, e.expires, slot);
    if (outcome == ABSENT)
        Py_RETURN_NONE;
    return decline(t, python_renew, &c);
}

PyDoc_STRVAR(close_doc, "close() -> None: every later call declines (the table is closed).");

static PyObject *Steps_close(Steps *t, PyObject *unused)
{
    t->closed = 1;
    Py_RETURN_NONE;
}

/* -- the type ----------------------------------------------------------------------- */

/* Take (hold) or drop references to the five types. */
static void types_ref(Types *y, int hold)
{
    PyTypeObject *types[5] = {y->key, y->owner, y->lease, y->acquired, y->occupied};
    for (int i = 0; i < 5; i++) {
        if (hold)
            Py_INCREF(types[i]);
        else
            Py_DECREF(types[i]);
    }
}

static int parse_types(PyObject *tuple, Types *y)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 5) {
        PyErr_SetString(PyExc_TypeError, "types must be (LockKey, LockOwner, LockLease, "
                                         "Acquired, Occupied)");
        return -1;
    }
    PyTypeObject **types[5] = {&y->key, &y->owner, &y->lease, &y->acquired, &y->occupied};
    for (int i = 0; i < 5; i++) {
        PyObject *type = PyTuple_GET_ITEM(tuple, i);
        if (!PyType_Check(type)) {
            PyErr_SetString(PyExc_TypeError, "types must be classes");
            return -1;
        }
        *types[i] = (PyTypeObject *)type;
    }
    if (!PyType_IsSubtype(y->lease, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "LockLease must be a tuple type");
        return -1;
    }
    return member_at(y->key, "digest", &y->digest_at) < 0 ||
                   member_at(y->key, "ident", &y->ident_at) < 0 ||
                   member_at(y->key, "namespace", &y->namespace_at) < 0 ||
                   member_at(y->owner, "value", &y->value_at) < 0 ||
                   member_at(y->acquired, "lease", &y->acquired_lease_at) < 0 ||
                   member_at(y->occupied, "lease", &y->occupied_lease_at) < 0
               ? -1
               : 0;
}

static int Steps_init(Steps *t, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"state", "ring", "block", "capacity", "stride", "payload_max",
                            "lanes", "heads_at", "slots_at", "ring_capacity", "ring_stride",
                            "frame_bytes", "node", "id_base", "wake", "stripes", "types",
                            "fork_module", "table", "steps_module", NULL};
    PyObject *state, *ring, *block, *wake, *types, *fork_module, *table, *steps_module;
    unsigned long long id_base;
    Steps g; /* parsed and checked here, copied into t only when consistent */
    if (t->ready) {
        PyErr_SetString(PyExc_TypeError, "Steps is initialised already");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOnnnnnnnnnnKOiOOOO", names, &state,
                                     &ring, &block, &g.capacity, &g.stride, &g.payload_max,
                                     &g.lanes, &g.heads_at, &g.slots_at, &g.ring_capacity,
                                     &g.ring_stride, &g.frame_bytes, &g.node, &id_base, &wake,
                                     &g.stripes, &types, &fork_module, &table, &steps_module))
        return -1;
    int pow2 = g.capacity > 0 && !(g.capacity & (g.capacity - 1)) && g.capacity <= 1 << 20 &&
               g.ring_capacity > 0 && !(g.ring_capacity & (g.ring_capacity - 1)) &&
               g.ring_capacity <= 1 << 20;
    if (!pow2 || g.payload_max < 3 || g.payload_max > 0xFFFF ||
        g.stride < SLOT_HEADER + g.payload_max || g.stride > 1 << 17 || g.lanes < 1 ||
        g.lanes > 0xFFFF || g.heads_at < RING_HEADER + g.lanes || g.heads_at > 1 << 30 ||
        g.slots_at < g.heads_at + g.lanes * LANE_HEAD || g.slots_at > 1 << 30 ||
        g.frame_bytes < EVENT_HEADER + g.payload_max || g.frame_bytes > 1 << 20 ||
        g.ring_stride < FRAME_HEADER + g.frame_bytes || g.ring_stride > 1 << 21 || g.node < 0 ||
        g.node >= g.lanes || g.stripes < 1 || g.stripes > SECTION_STRIPES_MAX ||
        (g.stripes & (g.stripes - 1)) || g.stripes > g.capacity) {
        PyErr_SetString(PyExc_ValueError, "inconsistent lock table or ring geometry");
        return -1;
    }
    if (!PyCallable_Check(wake) || !PyModule_Check(fork_module) ||
        !PyModule_Check(steps_module) || parse_types(types, &t->types) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "wake must be callable and the modules modules");
        return -1;
    }
    PyObject *fork_dict = PyModule_GetDict(fork_module);
    PyObject *generation = PyDict_GetItemWithError(fork_dict, generation_name);
    if (generation == NULL) {
        PyErr_SetString(PyExc_TypeError, "fork_module has no generation");
        return -1;
    }
    if (robust_block_hold(block, &t->block) < 0)
        return -1;
    /* Every product below now fits: 2**20 x 2**17 and 2**16 x 2**20 x 2**21 < 2**62. */
    t->capacity = g.capacity;
    t->stride = g.stride;
    t->payload_max = g.payload_max;
    t->lanes = g.lanes;
    t->heads_at = g.heads_at;
    t->slots_at = g.slots_at;
    t->ring_capacity = g.ring_capacity;
    t->ring_stride = g.ring_stride;
    t->frame_bytes = g.frame_bytes;
    t->node = g.node;
    t->stripes = g.stripes;
    t->stripe_slots = g.capacity / g.stripes;
    t->id_base = id_base;
    t->state = Py_NewRef(state);
    t->ring = Py_NewRef(ring);
    t->wake = Py_NewRef(wake);
    t->fork_dict = Py_NewRef(fork_dict);
    t->generation = Py_NewRef(generation);
    t->table = Py_NewRef(table);
    t->table_dict = Py_NewRef(PyModule_GetDict(steps_module));
    types_ref(&t->types, 1);
    t->ready = 1;
    return 0;
}

/* The table refers to its Steps and the Steps to their table: a cycle the GC sees. */
static int Steps_traverse(Steps *t, visitproc visit, void *arg)
{
    Py_VISIT(t->table);
    Py_VISIT(t->wake);
    return 0;
}

static int Steps_clear(Steps *t)
{
    Py_CLEAR(t->table);
    Py_CLEAR(t->wake);
    return 0;
}

static void Steps_dealloc(Steps *t)
{
    PyObject_GC_UnTrack(t);
    if (t->ready) {
        PyBuffer_Release(&t->block);
        types_ref(&t->types, 0);
    }
    Steps_clear(t);
    Py_XDECREF(t->state);
    Py_XDECREF(t->ring);
    Py_XDECREF(t->fork_dict);
    Py_XDECREF(t->generation);
    Py_XDECREF(t->table_dict);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef Steps_methods[] = {
    {"try_acquire", (PyCFunction)(void (*)(void))Steps_try_acquire,
     METH_FASTCALL | METH_KEYWORDS, try_acquire_doc},
    {"release", (PyCFunction)(void (*)(void))Steps_release, METH_FASTCALL | METH_KEYWORDS,
     release_doc},
    {"renew", (PyCFunction)(void (*)(void))Steps_renew, METH_FASTCALL | METH_KEYWORDS, renew_doc},
    {"close", (PyCFunction)Steps_close, METH_NOARGS, close_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StepsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "orbitive.lock._fastpath.Steps",
    .tp_doc = PyDoc_STR("The lock table's hot operations over one state and one ring mapping."),
    .tp_basicsize = sizeof(Steps),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Steps_init,
    .tp_dealloc = (destructor)Steps_dealloc,
    .tp_traverse = (traverseproc)Steps_traverse,
    .tp_clear = (inquiry)Steps_clear,
    .tp_methods = Steps_methods,
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "orbitive.lock._fastpath",
    PyDoc_STR("The lock table's try_acquire, release and renew in C (see lock/_steps.py)."), -1,
    NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    generation_name = PyUnicode_InternFromString("generation");
    crash_hook_name = PyUnicode_InternFromString("crash_hook");
    python_acquire = PyUnicode_InternFromString("try_acquire");
    python_release = PyUnicode_InternFromString("release");
    python_renew = PyUnicode_InternFromString("renew");
    if (generation_name == NULL || crash_hook_name == NULL || python_acquire == NULL ||
        python_release == NULL || python_renew == NULL || PyType_Ready(&StepsType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&fastpath_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Steps", (PyObject *)&StepsType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
