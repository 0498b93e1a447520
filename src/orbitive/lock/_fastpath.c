/* orbitive.lock._fastpath: the lock table's two hot critical-section steps in C.
 *
 * Steps.acquire is try_acquire's probe-and-insert and Steps.release is
 * release's find-and-remove, byte for byte what _table.py does: linear probing
 * bounded by the header's max_probe, with lazy reclaim of expired entries,
 * counters advanced first, one transition
 * frame published to this node's ring lane (seqlock) with the readiness word
 * bumped, then max_probe raised if the entry lies further from its home, then
 * the slot tombstoned, rewritten and made OCCUPIED last. The
 * caller holds the critical section (process mutex + flock), reads the clock,
 * validates its arguments and raises the errors; the Python code in _table.py
 * is the reference and the fallback when this module is not built.
 *
 * Every length and offset read from shared memory is checked before use, and
 * the geometry is checked against the buffers' sizes on every call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the SHM layouts are little-endian; the pure-Python table is used instead"
#endif

/* Layouts: docs/format.md, lock/_layout.py, lock/_events.py and _ring.py. */
enum { EMPTY = 0, OCCUPIED = 1, TOMBSTONE = 2 };
enum { STATE_HEADER = 64, SLOT_HEADER = 48, MAX_PROBE_AT = 20, TOKEN_AT = 24, REVISION_AT = 32 };
enum { RING_HEADER = 64, LANE_HEAD = 64, FRAME_HEADER = 32, EVENT_HEADER = 35 };
enum { GENERATION_AT = 24, ACQUIRED = 1, RELEASED = 3 };
#define EVENT_MAGIC UINT32_C(0x4F4C434B)
#define EVENT_VERSION 1
#define TOKEN_MASK ((UINT64_C(1) << 40) - 1)
#define COUNTER_LIMIT (UINT64_C(1) << 62)

/* Step outcomes, mirrored in _table.py. */
enum { DONE = 0, BUSY = 1, FULL = 2, EXHAUSTED = 3, CORRUPT = 4, ABSENT = 5 };

typedef struct {
    PyObject_HEAD
    PyObject *state; /* the state table's mmap */
    PyObject *ring;  /* the transition ring's mmap */
    Py_ssize_t capacity, stride, payload_max;
    Py_ssize_t lanes, heads_at, slots_at, ring_capacity, ring_stride, frame_bytes;
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

/* _read_live: a valid, unexpired OCCUPIED entry. */
static int live(const Steps *t, const uint8_t *p, uint64_t now)
{
    Py_ssize_t ns = ld16(p + 2), lb = ld16(p + 4), ow = ld16(p + 6);
    uint64_t acquired = ld64(p + 32), expires = ld64(p + 40);
    return p[0] == OCCUPIED && ns && lb && ow && ns + lb + ow <= t->payload_max &&
           acquired < expires && expires > now;
}

/* _holds_key: the live entry at p stores exactly e's key. */
static int holds_key(const uint8_t *p, const Entry *e)
{
    return ld64(p + 8) == e->digest && ld16(p + 2) == e->ns_len &&
           ld16(p + 4) == e->ident_len - e->ns_len &&
           memcmp(p + SLOT_HEADER, e->ident, (size_t)e->ident_len) == 0;
}

/* _tombstone: mark slot TOMBSTONE; a run of tombstones before an EMPTY slot turns EMPTY. */
static void tombstone(const Steps *t, uint8_t *s, Py_ssize_t slot)
{
    Py_ssize_t mask = t->capacity - 1;
    slot_at(t, s, slot)[0] = TOMBSTONE;
    if (!empty_head(slot_at(t, s, (slot + 1) & mask)))
        return;
    for (Py_ssize_t i = 0; i < t->capacity; i++) {
        uint8_t *p = slot_at(t, s, slot);
        if (p[0] != TOMBSTONE)
            return;
        memset(p, 0, 8);
        slot = (slot - 1) & mask;
    }
}

/* _bound: the stored max_probe, read as at most capacity - 1. */
static Py_ssize_t bound(const Steps *t, const uint8_t *s)
{
    uint32_t stored = ld32(s + MAX_PROBE_AT);
    return stored < (uint64_t)(t->capacity - 1) ? (Py_ssize_t)stored : t->capacity - 1;
}

/* _free_after: the first slot of count from slot on holding no live entry, else capacity. */
static Py_ssize_t free_after(const Steps *t, uint8_t *s, Py_ssize_t slot, Py_ssize_t count,
                             uint64_t now)
{
    Py_ssize_t mask = t->capacity - 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint8_t *p = slot_at(t, s, slot);
        if (p[0] != OCCUPIED)
            return slot;
        if (!live(t, p, now)) {
            tombstone(t, s, slot);
            return slot;
        }
        slot = (slot + 1) & mask;
    }
    return t->capacity;
}

/* _probe: the slot of the key's live entry, else ~insertion_slot (~capacity: none).
 * Stops at EMPTY or after max_probe + 1 slots. */
static Py_ssize_t probe(const Steps *t, uint8_t *s, const Entry *e)
{
    Py_ssize_t mask = t->capacity - 1, slot = (Py_ssize_t)(e->digest & (uint64_t)mask);
    Py_ssize_t insert_at = t->capacity, limit = bound(t, s);
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
            tombstone(t, s, slot);
        }
        if (insert_at == t->capacity)
            insert_at = slot;
        slot = (slot + 1) & mask;
    }
    return ~(insert_at < t->capacity ? insert_at : free_after(t, s, slot, mask - limit, e->now));
}

/* Ring.publish plus bump: one lock-event frame in the node's lane. *wake: a driver is parked. */
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
    uint32_t generation;
    memcpy(&generation, r + GENERATION_AT, 4);
    st32(r + GENERATION_AT, generation + 1);
    *wake = 0;
    for (Py_ssize_t n = 0; n < t->lanes; n++)
        if (r[RING_HEADER + n]) {
            *wake = 1;
            break;
        }
    return DONE;
}

/* The insert half of _insert: max_probe raised, then TOMBSTONE, rewrite, OCCUPIED last. */
static void write_slot(const Steps *t, uint8_t *s, Py_ssize_t slot, const Entry *e,
                       uint64_t revision)
{
    uint64_t mask = (uint64_t)(t->capacity - 1);
    Py_ssize_t displacement = (Py_ssize_t)(((uint64_t)slot - e->digest) & mask);
    if (displacement > bound(t, s)) {
        st32(s + MAX_PROBE_AT, (uint32_t)displacement);
        fence();
    }
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

/* -- buffers and arguments ------------------------------------------------------- */

static int maps_get(const Steps *t, Maps *m)
{
    if (t->state == NULL || t->ring == NULL) {
        PyErr_SetString(PyExc_ValueError, "Steps is not initialised");
        return -1;
    }
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

static int as_u64(PyObject *o, uint64_t *out)
{
    *out = PyLong_AsUnsignedLongLong(o);
    return *out == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

static int as_index(PyObject *o, Py_ssize_t *out)
{
    *out = PyLong_AsSsize_t(o);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* (digest, ident, ns_len, owner, node, now, ...): the six arguments every step starts with. */
static int parse_entry(const Steps *t, PyObject *const *args, Py_ssize_t nargs, Entry *e)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "a step takes 8 arguments");
        return -1;
    }
    if (!PyBytes_Check(args[1]) || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "ident and owner must be bytes");
        return -1;
    }
    e->ident = (const uint8_t *)PyBytes_AS_STRING(args[1]);
    e->ident_len = PyBytes_GET_SIZE(args[1]);
    e->owner = (const uint8_t *)PyBytes_AS_STRING(args[3]);
    e->owner_len = PyBytes_GET_SIZE(args[3]);
    if (as_u64(args[0], &e->digest) < 0 || as_index(args[2], &e->ns_len) < 0 ||
        as_index(args[4], &e->node) < 0 || as_u64(args[5], &e->now) < 0)
        return -1;
    if (e->ns_len < 1 || e->ns_len >= e->ident_len || e->owner_len < 1 ||
        e->ident_len + e->owner_len > t->payload_max || e->node < 0 || e->node >= t->lanes) {
        PyErr_SetString(PyExc_ValueError, "entry or node out of range");
        return -1;
    }
    return 0;
}

/* -- the steps ---------------------------------------------------------------------- */

PyDoc_STRVAR(acquire_doc,
"acquire(digest, ident, ns_len, owner, node, now, expires, id_base)\n"
"-> (outcome, slot, lock_id, revision, wake)\n\n"
"try_acquire's step inside the critical section. outcome: DONE (inserted at\n"
"slot), BUSY (slot holds the key's live entry), FULL, EXHAUSTED or CORRUPT.");

static PyObject *Steps_acquire(Steps *t, PyObject *const *args, Py_ssize_t nargs)
{
    Entry e;
    uint64_t id_base;
    Maps m;
    int outcome = DONE, wake = 0;
    uint64_t revision = 0;
    if (parse_entry(t, args, nargs, &e) < 0 || as_u64(args[6], &e.expires) < 0 ||
        as_u64(args[7], &id_base) < 0 || maps_get(t, &m) < 0)
        return NULL;
    Py_ssize_t slot = probe(t, m.s, &e);
    if (slot >= 0) {
        outcome = BUSY;
    } else if ((slot = ~slot) >= t->capacity) {
        outcome = FULL;
    } else {
        uint64_t token = ld64(m.s + TOKEN_AT);
        revision = ld64(m.s + REVISION_AT);
        if (token >= TOKEN_MASK || revision == UINT64_MAX) {
            outcome = EXHAUSTED;
        } else {
            st64(m.s + TOKEN_AT, ++token);
            st64(m.s + REVISION_AT, ++revision);
            e.lock_id = id_base | token;
            outcome = publish(t, m.r, &e, ACQUIRED, revision, e.now, e.expires, &wake);
            if (outcome == DONE)
                write_slot(t, m.s, slot, &e, revision);
        }
    }
    maps_release(&m);
    return Py_BuildValue("(inKKi)", outcome, slot, outcome == DONE ? e.lock_id : 0,
                         (unsigned long long)revision, wake);
}

/* The live entry at p is e's tenure: its lock id and its stored owner. */
static int is_tenure(const uint8_t *p, const Entry *e)
{
    return ld64(p + 16) == e->lock_id && ld16(p + 6) == e->owner_len &&
           memcmp(p + SLOT_HEADER + e->ident_len, e->owner, (size_t)e->owner_len) == 0;
}

/* _find_tenure: the slot holding exactly e's tenure (key, lock id, owner), or -1. */
static Py_ssize_t find_tenure(const Steps *t, uint8_t *s, const Entry *e, Py_ssize_t hint)
{
    if (hint == (Py_ssize_t)(e->digest & (uint64_t)(t->capacity - 1))) {
        uint8_t *p = slot_at(t, s, hint);
        if (live(t, p, e->now) && holds_key(p, e))
            return is_tenure(p, e) ? hint : -1;
    }
    Py_ssize_t slot = probe(t, s, e);
    return slot >= 0 && is_tenure(slot_at(t, s, slot), e) ? slot : -1;
}

PyDoc_STRVAR(release_doc,
"release(digest, ident, ns_len, owner, node, now, lock_id, slot) -> (outcome, wake)\n\n"
"release's step inside the critical section. outcome: DONE (released),\n"
"ABSENT (that tenure is gone), EXHAUSTED or CORRUPT.");

static PyObject *Steps_release(Steps *t, PyObject *const *args, Py_ssize_t nargs)
{
    Entry e;
    Py_ssize_t hint;
    Maps m;
    int outcome = ABSENT, wake = 0;
    if (parse_entry(t, args, nargs, &e) < 0)
        return NULL;
    if (as_u64(args[6], &e.lock_id) < 0) { /* no tenure has such an id (the Python step agrees) */
        PyErr_Clear();
        return Py_BuildValue("(ii)", ABSENT, 0);
    }
    if (as_index(args[7], &hint) < 0) { /* no usable hint: probe */
        PyErr_Clear();
        hint = -1;
    }
    if (maps_get(t, &m) < 0)
        return NULL;
    Py_ssize_t slot = find_tenure(t, m.s, &e, hint);
    if (slot >= 0) {
        uint64_t token = ld64(m.s + TOKEN_AT), revision = ld64(m.s + REVISION_AT);
        if (token > TOKEN_MASK || revision == UINT64_MAX) {
            outcome = EXHAUSTED;
        } else {
            st64(m.s + REVISION_AT, ++revision);
            outcome = publish(t, m.r, &e, RELEASED, revision, 0, 0, &wake);
            if (outcome == DONE)
                tombstone(t, m.s, slot);
        }
    }
    maps_release(&m);
    return Py_BuildValue("(ii)", outcome, wake);
}

/* -- the type ----------------------------------------------------------------------- */

static int Steps_init(Steps *t, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"state", "ring", "capacity", "stride", "payload_max", "lanes",
                            "heads_at", "slots_at", "ring_capacity", "ring_stride",
                            "frame_bytes", NULL};
    PyObject *state, *ring;
    Steps g; /* parsed and checked here, copied into t only when consistent */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOnnnnnnnnn", names, &state, &ring,
                                     &g.capacity, &g.stride, &g.payload_max, &g.lanes,
                                     &g.heads_at, &g.slots_at, &g.ring_capacity, &g.ring_stride,
                                     &g.frame_bytes))
        return -1;
    int pow2 = g.capacity > 0 && !(g.capacity & (g.capacity - 1)) && g.capacity <= 1 << 20 &&
               g.ring_capacity > 0 && !(g.ring_capacity & (g.ring_capacity - 1)) &&
               g.ring_capacity <= 1 << 20;
    if (!pow2 || g.payload_max < 3 || g.payload_max > 0xFFFF ||
        g.stride < SLOT_HEADER + g.payload_max || g.stride > 1 << 17 || g.lanes < 1 ||
        g.lanes > 0xFFFF || g.heads_at < RING_HEADER + g.lanes || g.heads_at > 1 << 30 ||
        g.slots_at < g.heads_at + g.lanes * LANE_HEAD || g.slots_at > 1 << 30 ||
        g.frame_bytes < EVENT_HEADER + g.payload_max || g.frame_bytes > 1 << 20 ||
        g.ring_stride < FRAME_HEADER + g.frame_bytes || g.ring_stride > 1 << 21) {
        PyErr_SetString(PyExc_ValueError, "inconsistent lock table or ring geometry");
        return -1;
    }
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
    Py_XSETREF(t->state, Py_NewRef(state));
    Py_XSETREF(t->ring, Py_NewRef(ring));
    return 0;
}

static void Steps_dealloc(Steps *t)
{
    Py_XDECREF(t->state);
    Py_XDECREF(t->ring);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef Steps_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))Steps_acquire, METH_FASTCALL, acquire_doc},
    {"release", (PyCFunction)(void (*)(void))Steps_release, METH_FASTCALL, release_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StepsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "orbitive.lock._fastpath.Steps",
    .tp_doc = PyDoc_STR("The lock table's hot steps over one state and one ring mapping."),
    .tp_basicsize = sizeof(Steps),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Steps_init,
    .tp_dealloc = (destructor)Steps_dealloc,
    .tp_methods = Steps_methods,
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "orbitive.lock._fastpath",
    PyDoc_STR("The lock table's try_acquire and release steps in C (see _table.py)."), -1, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    if (PyType_Ready(&StepsType) < 0)
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
