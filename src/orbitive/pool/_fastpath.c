/* orbitive.pool._fastpath: the pool table's three hot steps in C, and the
 * operations over them that make Pool.reserve, Pool.accept and
 * Execution.complete one C call each.
 *
 * Steps.reserve, Steps.accept and Steps.complete do the byte work of
 * Table.reserve, Table.accept and Table.complete in _table.py: the same checks
 * of one resource slot and the same writes in the same (commit-last) order.
 * Their caller holds the critical section, checks the resource id, reads the
 * clock, raises the errors and announces key changes; the Python steps in
 * _table.py are the reference and the fallback when this module is not built.
 *
 * Operations does all of that itself on its common path (the object's robust
 * mutex, _robust.h; the wall clock; the key's change, woken with FUTEX_WAKE; the
 * Lease and Execution objects); anything off that path is handed to the Pool's
 * Python operation (_reserve, _accept_lease), which also raises every error.
 * Operations.take and Operations.give_back are a client pool's own checkout
 * and return (_availability.take and give_back, the references, in the same
 * order of checks and writes); give_back does only the case where nobody waits
 * on the key and hands the rest (the census) to Pool._give_back.
 *
 * Nothing read from shared memory is used to address memory unchecked: the
 * addresses are the slot offset the caller passes, checked against the
 * resource area and the buffer's size on every call, the pending entry found
 * by scanning that slot's sixteen fences, and the key slot of the key index
 * a give_back reads, checked against the key table's capacity first.
 */
#define PY_SSIZE_T_CLEAN
#include "_robust.h"
#include "_slots.h"
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the SHM layouts are little-endian; the pure-Python table is used instead"
#endif

/* Resource slot layout: docs/format.md and pool/_layout.py. */
enum { RESOURCE_SIZE = 384, PENDING = 16, LIVE = 1, DRAINING = 2 };
enum { NODE_AT = 2, GENERATION_AT = 4, INCARNATION_AT = 8, CAPACITY_AT = 32 };
enum { KEY_INDEX_AT = 36, ACTIVE_AT = 40, FENCE_AT = 48, LAST_RESERVE_AT = 56, EPOCH_AT = 64 };
enum { FENCES_AT = 128, SINCE_AT = 256 };
/* Key slot and bell offsets (_layout.py): the change word, the parked bytes. */
enum { KEY_CHANGES = 24, KEY_PARKED = 64, BELL_PARKED = 8 };

/* Step outcomes, mirrored in _table.py; every one but DONE left the slot untouched. */
enum { DONE = 0, REFUSED = -1, BUSY = -2, NOT_PENDING = -3, DECLINED = -4 };

typedef struct {
    PyObject_HEAD
    PyObject *buf;          /* the pool table's mmap */
    Py_ssize_t first, end;  /* the resource area: [first, end) */
} Steps;

/* One step's view of its slot: the buffer held for the call and the slot in it. */
typedef struct {
    Py_buffer view;
    uint8_t *p;
} Slot;

static inline uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
/* Stores before it are visible before stores after it (commit order). */
static inline void fence(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }

/* PyLong_AsUnsignedLong converts a small int several times faster than the long long
 * form (which goes through a byte array); both raise OverflowError out of range. */
#if ULONG_MAX == UINT64_MAX
#define AS_U64 PyLong_AsUnsignedLong
#else
#define AS_U64 PyLong_AsUnsignedLongLong
#endif

/* -- arguments and the slot ----------------------------------------------------------- */

/* args[1..n) as u64s into v[0..n-1): returns the mask of those that are negative or too
 * big (bit i for v[i]; such a value equals no field, as in Python), or -1 with TypeError
 * when the count is wrong or one is not an int. */
static int parse(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t n, uint64_t *v)
{
    if (nargs != n) {
        PyErr_Format(PyExc_TypeError, "this step takes %zd arguments (%zd given)", n, nargs);
        return -1;
    }
    int misfit = 0;
    for (Py_ssize_t i = 1; i < n; i++) {
        if (!PyLong_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "argument %zd must be an int, not %.80s", i + 1,
                         Py_TYPE(args[i])->tp_name);
            return -1;
        }
        v[i - 1] = AS_U64(args[i]);
        if (v[i - 1] == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            misfit |= 1 << (i - 1);
        }
    }
    return misfit;
}

/* Hold the buffer and find the slot at `offset`, which must be one of the resource
 * area's slots and inside the buffer (ValueError or TypeError otherwise). */
static int slot_open(const Steps *t, PyObject *offset, Slot *s)
{
    if (t->buf == NULL) {
        PyErr_SetString(PyExc_ValueError, "Steps is not initialised");
        return -1;
    }
    if (!PyLong_Check(offset)) {
        PyErr_SetString(PyExc_TypeError, "the slot offset must be an int");
        return -1;
    }
    int overflow;
    long long at = PyLong_AsLongLongAndOverflow(offset, &overflow);
    if (overflow || at < t->first || at > t->end - RESOURCE_SIZE ||
        (at - t->first) % RESOURCE_SIZE) {
        PyErr_SetString(PyExc_ValueError, "not the offset of a resource slot");
        return -1;
    }
    if (PyObject_GetBuffer(t->buf, &s->view, PyBUF_WRITABLE) < 0)
        return -1;
    if (s->view.len < t->end) {
        PyBuffer_Release(&s->view);
        PyErr_SetString(PyExc_ValueError, "the mapping is smaller than its resource area");
        return -1;
    }
    s->p = (uint8_t *)s->view.buf + at;
    return 0;
}

/* The slot holds the registration (node, generation, epoch) that a resource id names. */
static int is_registration(const uint8_t *p, const uint64_t *id)
{
    return ld16(p + NODE_AT) == id[0] && ld32(p + GENERATION_AT) == id[1] &&
           ld64(p + EPOCH_AT) == id[2];
}

/* The first pending entry holding `value` (0: a free entry), or -1; *count: how many do. */
static int find_entry(const uint8_t *p, uint64_t value, int *count)
{
    int entry = -1;
    *count = 0;
    for (int i = 0; i < PENDING; i++) {
        if (ld64(p + FENCES_AT + 8 * i) == value) {
            if (entry < 0)
                entry = i;
            ++*count;
        }
    }
    return entry;
}

/* -- the steps ------------------------------------------------------------------------ */

/* Table._reserve_step for the id v = (node, generation, epoch, now): DONE with the new
 * *fence, or an outcome < 0. */
static int reserve(uint8_t *p, const uint64_t *v, uint64_t *fence_out)
{
    if (p[0] != LIVE || !is_registration(p, v))
        return REFUSED;
    int free;
    int entry = find_entry(p, 0, &free);
    uint64_t active = ld32(p + ACTIVE_AT), capacity = ld32(p + CAPACITY_AT);
    if ((uint64_t)(PENDING - free) + active >= capacity || !free)
        return BUSY;
    uint64_t last = ld64(p + FENCE_AT), now = v[3];
    if (last == UINT64_MAX) /* the fence counter is spent: the Python step decides */
        return DECLINED;
    *fence_out = last + 1;
    st64(p + FENCE_AT, last + 1);
    st64(p + LAST_RESERVE_AT, now);
    fence();
    st64(p + SINCE_AT + 8 * entry, now);
    fence();
    st64(p + FENCES_AT + 8 * entry, last + 1); /* commit */
    return DONE;
}

PyDoc_STRVAR(reserve_doc,
"reserve(offset, node, generation, epoch, now, /) -> int\n\n"
"Table.reserve's step inside the critical section: the new fence (>= 1), or\n"
"REFUSED (not that LIVE registration), BUSY (no free unit or entry) or\n"
"DECLINED (the fence counter is spent; the Python step decides).");

static PyObject *Steps_reserve(Steps *t, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t v[4], fence = 0; /* node, generation, epoch, now */
    Slot s;
    int misfit = parse(args, nargs, 5, v);
    if (misfit < 0)
        return NULL;
    if (misfit & 8) {
        PyErr_SetString(PyExc_ValueError, "now must be an int in 0..2**64-1");
        return NULL;
    }
    if (slot_open(t, args[0], &s) < 0)
        return NULL;
    int outcome = misfit ? REFUSED : reserve(s.p, v, &fence);
    PyBuffer_Release(&s.view);
    return outcome == DONE ? PyLong_FromUnsignedLongLong(fence) : PyLong_FromLong(outcome);
}

/* Table._accept_step for v = (node, generation, epoch, my_node, my_incarnation, fence):
 * DONE, or an outcome < 0. `misfit` as parse returned it. */
static int accept(uint8_t *p, const uint64_t *v, int misfit)
{
    if (misfit & 0x1F || p[0] != LIVE || !is_registration(p, v) ||
        ld16(p + NODE_AT) != v[3] || ld64(p + INCARNATION_AT) != v[4])
        return REFUSED;
    int count;
    int entry = misfit ? -1 : find_entry(p, v[5], &count);
    if (entry < 0)
        return NOT_PENDING;
    uint32_t active = ld32(p + ACTIVE_AT);
    if (active >= ld32(p + CAPACITY_AT)) /* a pending fence had a free unit: damaged, the */
        return DECLINED;                  /* Python step refuses by name */
    st64(p + FENCES_AT + 8 * entry, 0);
    fence();
    st32(p + ACTIVE_AT, active + 1);
    return DONE;
}

PyDoc_STRVAR(accept_doc,
"accept(offset, node, generation, epoch, my_node, my_incarnation, fence, /) -> int\n\n"
"Table.accept's step inside the critical section: DONE (the pending fence is an\n"
"active unit now), REFUSED (not that LIVE registration, or not ours),\n"
"NOT_PENDING or DECLINED (the active count already fills the capacity: a damaged\n"
"slot, which the Python step refuses).");

static PyObject *Steps_accept(Steps *t, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t v[6];
    Slot s;
    int misfit = parse(args, nargs, 7, v);
    if (misfit < 0 || slot_open(t, args[0], &s) < 0)
        return NULL;
    int outcome = accept(s.p, v, misfit);
    PyBuffer_Release(&s.view);
    return PyLong_FromLong(outcome);
}

/* Table._complete_step for v = (generation, epoch): the stored key index, or -1. */
static long long complete(uint8_t *p, const uint64_t *v)
{
    uint32_t active = ld32(p + ACTIVE_AT);
    if (ld32(p + GENERATION_AT) != v[0] || ld64(p + EPOCH_AT) != v[1] || p[0] < LIVE ||
        p[0] > DRAINING || !active)
        return -1;
    st32(p + ACTIVE_AT, active - 1);
    return ld32(p + KEY_INDEX_AT);
}

PyDoc_STRVAR(complete_doc,
"complete(offset, generation, epoch, /) -> int\n\n"
"Table.complete's step inside the critical section: the key index stored in the\n"
"slot when one active unit was returned (the caller announces that key's\n"
"change), or -1 when the slot is no longer that resource or has none active.");

static PyObject *Steps_complete(Steps *t, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t v[2];
    Slot s;
    int misfit = parse(args, nargs, 3, v);
    if (misfit < 0 || slot_open(t, args[0], &s) < 0)
        return NULL;
    long long index = misfit ? -1 : complete(s.p, v);
    PyBuffer_Release(&s.view);
    return PyLong_FromLongLong(index);
}

/* -- the operations ------------------------------------------------------------------- */

/* The value types (_values.py) and where their slots live in an instance. */
typedef struct {
    PyTypeObject *rid, *lease;
    Py_ssize_t kind_at, node_at, slot_at, generation_at, epoch_at;
    Py_ssize_t id_at, fence_at, holder_node_at, holder_incarnation_at;
} Types;

typedef struct {
    PyObject_HEAD
    PyObject *buf;        /* the pool table's mmap */
    Py_buffer block;      /* its section block, held for life */
    PyObject *pool;       /* the Pool: its Python operations take what this declines */
    PyObject *table;      /* the Table: Executions complete through it after a decline */
    PyObject *fork_dict, *generation;
    PyObject *node_obj, *incarnation_obj;
    Types types;
    Py_ssize_t first, end, kind, fleet_capacity, lane_capacity;
    Py_ssize_t key_base, key_stride, key_capacity, key_interest, key_waiters, bell;
    uint64_t node, incarnation;
    int closed, ready;
} Operations;

static PyTypeObject OperationsType, ExecutionType;
static PyObject *generation_name, *python_reserve, *python_accept, *python_take;
static PyObject *python_give_back;
static PyObject *fork_globals; /* orbitive._fork's globals: its generation, read per call */
static PyObject *finalise_fn;  /* _guards.finalise, fetched with the first Execution */

/* Fetch _guards.finalise while imports work (never at interpreter shutdown). */
static int fetch_finalise(void)
{
    if (finalise_fn != NULL)
        return 0;
    PyObject *guards = PyImport_ImportModule("orbitive.pool._guards");
    if (guards == NULL)
        return -1;
    finalise_fn = PyObject_GetAttrString(guards, "finalise");
    Py_DECREF(guards);
    return finalise_fn == NULL ? -1 : 0;
}

/* An exact int in 0..limit into *out; 0 when it is anything else. */
static int small(PyObject *o, uint64_t limit, uint64_t *out)
{
    if (o == NULL || !PyLong_CheckExact(o))
        return 0;
    uint64_t v = AS_U64(o);
    if (v == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return v <= limit;
}

/* The table may run here: built, open, and in the process that built it. */
static int usable(const Operations *o)
{
    return o->ready && !o->closed &&
           PyDict_GetItemWithError(o->fork_dict, generation_name) == o->generation;
}

/* A ResourceId of this table: (node, generation, epoch) into id and its slot's offset. */
static int parse_rid(const Operations *o, PyObject *rid, uint64_t *id, Py_ssize_t *offset)
{
    const Types *y = &o->types;
    uint64_t kind, slot;
    if (!Py_IS_TYPE(rid, y->rid) || !small(slot_of(rid, y->kind_at), 255, &kind) ||
        kind != (uint64_t)o->kind ||
        !small(slot_of(rid, y->node_at), (uint64_t)o->fleet_capacity - 1, &id[0]) ||
        !small(slot_of(rid, y->slot_at), (uint64_t)o->lane_capacity - 1, &slot) ||
        !small(slot_of(rid, y->generation_at), UINT32_MAX, &id[1]) ||
        !small(slot_of(rid, y->epoch_at), UINT64_MAX - 1, &id[2]))
        return 0;
    *offset = o->first + ((Py_ssize_t)id[0] * o->lane_capacity + (Py_ssize_t)slot) * RESOURCE_SIZE;
    return *offset <= o->end - RESOURCE_SIZE;
}

/* Lock the section with the table's mapping held; 0 (nothing held) to decline. */
static int enter(Operations *o, Slot *s, Py_ssize_t offset)
{
    if (PyObject_GetBuffer(o->buf, &s->view, PyBUF_WRITABLE) < 0) {
        PyErr_Clear(); /* a closed mapping: the Python operation says why */
        return 0;
    }
    if (s->view.len < o->end || robust_lock(o->block.buf, 0) != 0) {
        PyBuffer_Release(&s->view);
        return 0;
    }
    if (o->closed) {
        robust_unlock(o->block.buf, 0);
        PyBuffer_Release(&s->view);
        return 0;
    }
    s->p = (uint8_t *)s->view.buf + offset;
    return 1;
}

static void leave(Operations *o, Slot *s)
{
    robust_unlock(o->block.buf, 0);
    PyBuffer_Release(&s->view);
}

/* time.time_ns() // 1_000_000 (_clock.wall_ms) */
static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* _readiness_futex.bump: the word + 1, and a wake only when a node is parked. */
static void bump(uint8_t *word, const uint8_t *parked, Py_ssize_t capacity)
{
    st32(word, ld32(word) + 1);
    for (Py_ssize_t n = 0; n < capacity; n++) {
        if (parked[n]) {
            syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
            return;
        }
    }
}

/* KeyTable.key_changed: the key's version and waiters, then the nodes that asked. */
static void key_changed(const Operations *o, uint8_t *b, uint64_t index)
{
    uint8_t *k = b + o->key_base + (Py_ssize_t)index * o->key_stride;
    bump(k + KEY_CHANGES, k + KEY_PARKED, o->fleet_capacity);
    uint8_t *interest = k + o->key_interest;
    for (Py_ssize_t n = 0; n < o->fleet_capacity; n++) {
        if (interest[n]) {
            memset(interest, 0, (size_t)o->fleet_capacity);
            bump(b + o->bell, b + o->bell + BELL_PARKED, o->fleet_capacity);
            return;
        }
    }
}

/* An instance of a slotted value type with its slots set from values (references taken). */
static PyObject *new_value(PyTypeObject *type, const Py_ssize_t *at, PyObject **values, int n)
{
    PyObject *obj = type->tp_alloc(type, 0);
    for (int i = 0; i < n; i++) {
        if (values[i] == NULL || obj == NULL) {
            for (int j = 0; j < n; j++)
                Py_XDECREF(values[j]);
            Py_XDECREF(obj);
            return NULL;
        }
    }
    for (int i = 0; i < n; i++)
        *(PyObject **)((char *)obj + at[i]) = values[i];
    return obj;
}

static PyObject *decline(const Operations *o, PyObject *name, PyObject *arg)
{
    if (o->pool == NULL) {
        PyErr_SetString(PyExc_ValueError, "Operations is not initialised");
        return NULL;
    }
    return PyObject_CallMethodOneArg(o->pool, name, arg);
}

PyDoc_STRVAR(ops_reserve_doc, "reserve(rid, /) -> Lease: Pool.reserve in one call.");

static PyObject *Operations_reserve(Operations *o, PyObject *rid)
{
    uint64_t id[4], fence = 0; /* node, generation, epoch, now */
    Py_ssize_t offset;
    Slot s;
    if (!usable(o) || !parse_rid(o, rid, id, &offset) || !enter(o, &s, offset))
        return decline(o, python_reserve, rid);
    id[3] = wall_ms();
    int outcome = reserve(s.p, id, &fence);
    leave(o, &s);
    if (outcome != DONE) /* the Python operation raises StaleError, BusyError, ... */
        return decline(o, python_reserve, rid);
    const Types *y = &o->types;
    Py_ssize_t at[4] = {y->id_at, y->fence_at, y->holder_node_at, y->holder_incarnation_at};
    PyObject *values[4] = {Py_NewRef(rid), PyLong_FromUnsignedLongLong(fence),
                           Py_NewRef(o->node_obj), Py_NewRef(o->incarnation_obj)};
    return new_value(y->lease, at, values, 4);
}

/* -- Execution: one accepted unit; complete() is its only way back ------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *ops;   /* the Operations that accepted it, or NULL: complete through table */
    PyObject *table; /* the Table (its run_soon and complete, for the finaliser) */
    PyObject *id, *fence, *fork;
    Py_ssize_t offset;
    uint64_t generation, epoch;
    int done;
} Execution;

/* A new Execution: accepted by ops (NULL: by a Python step), completing through table. */
static PyObject *new_execution(PyTypeObject *type, PyObject *ops, PyObject *table, PyObject *rid,
                               PyObject *fence, PyObject *fork, Py_ssize_t offset,
                               uint64_t generation, uint64_t epoch)
{
    if (fetch_finalise() < 0)
        return NULL;
    Execution *e = PyObject_GC_New(Execution, type);
    if (e == NULL)
        return NULL;
    e->ops = Py_XNewRef(ops);
    e->table = Py_NewRef(table);
    e->id = Py_NewRef(rid);
    e->fence = Py_NewRef(fence);
    e->fork = Py_NewRef(fork);
    e->offset = offset;
    e->generation = generation;
    e->epoch = epoch;
    e->done = 0;
    PyObject_GC_Track(e);
    return (PyObject *)e;
}

PyDoc_STRVAR(ops_accept_doc, "accept(lease, /) -> Execution: Pool.accept in one call.");

static PyObject *Operations_accept(Operations *o, PyObject *lease)
{
    uint64_t v[6]; /* node, generation, epoch, my node, my incarnation, fence */
    Py_ssize_t offset;
    Slot s;
    const Types *y = &o->types;
    PyObject *rid = Py_IS_TYPE(lease, y->lease) ? slot_of(lease, y->id_at) : NULL;
    PyObject *fence = rid ? slot_of(lease, y->fence_at) : NULL;
    if (!usable(o) || rid == NULL || !parse_rid(o, rid, v, &offset) ||
        !small(fence, UINT64_MAX - 1, &v[5]) || v[5] == 0 || !enter(o, &s, offset))
        return decline(o, python_accept, lease);
    v[3] = o->node;
    v[4] = o->incarnation;
    int outcome = accept(s.p, v, 0);
    leave(o, &s);
    if (outcome != DONE) /* the Python operation raises NotReservedError, ... */
        return decline(o, python_accept, lease);
    return new_execution(&ExecutionType, (PyObject *)o, o->table, rid, fence, o->generation,
                         offset, v[1], v[2]);
}

/* -- the availability steps: a client pool's own checkout and return (_availability.py) -- */

/* The slot is the LIVE registration v = (node, generation, epoch) and this process owns
 * it (its node and incarnation): _availability._owned_live without the errors. */
static int owned_live(const Operations *o, const uint8_t *p, const uint64_t *v)
{
    return p[0] == LIVE && is_registration(p, v) && v[0] == o->node &&
           ld64(p + INCARNATION_AT) == o->incarnation;
}

/* _availability.take: DONE (one free unit is active now), REFUSED (not that LIVE
 * registration of ours) or BUSY (no free unit: a borrower reserved it). */
static int take(const Operations *o, uint8_t *p, const uint64_t *v)
{
    if (!owned_live(o, p, v))
        return REFUSED;
    int free;
    find_entry(p, 0, &free);
    int64_t reserved = PENDING - free;
    uint32_t active = ld32(p + ACTIVE_AT);
    if ((int64_t)ld32(p + CAPACITY_AT) - reserved - (int64_t)active <= 0)
        return BUSY;
    st32(p + ACTIVE_AT, active + 1);
    return DONE;
}

/* _availability.give_back's fast path for v = (node, generation, epoch, max_idle,
 * max_live): DONE (the unit is free again; nobody waits, so nobody is woken), or
 * DECLINED: the Python step decides (not ours or not LIVE, a damaged key index, a
 * waiter counted on the key, or max_idle below max_live, which need the census). */
static int give_back(const Operations *o, uint8_t *b, uint8_t *p, const uint64_t *v)
{
    uint64_t index = ld32(p + KEY_INDEX_AT);
    if (!owned_live(o, p, v) || index >= (uint64_t)o->key_capacity || v[3] < v[4])
        return DECLINED;
    const uint8_t *waiters = b + o->key_base + (Py_ssize_t)index * o->key_stride + o->key_waiters;
    for (Py_ssize_t n = 0; n < o->fleet_capacity; n++)
        if (ld32(waiters + 4 * n))
            return DECLINED;
    uint32_t active = ld32(p + ACTIVE_AT);
    st32(p + ACTIVE_AT, active ? active - 1 : 0);
    return DONE;
}

PyDoc_STRVAR(ops_take_doc,
"take(rid, /) -> None: _availability.take in one call (else Pool._take).");

static PyObject *Operations_take(Operations *o, PyObject *rid)
{
    uint64_t id[3]; /* node, generation, epoch */
    Py_ssize_t offset;
    Slot s;
    if (!usable(o) || !parse_rid(o, rid, id, &offset) || !enter(o, &s, offset))
        return decline(o, python_take, rid);
    int outcome = take(o, s.p, id);
    leave(o, &s);
    if (outcome != DONE) /* the Python operation raises BusyError, StaleError, ... */
        return decline(o, python_take, rid);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ops_give_back_doc,
"give_back(rid, max_idle, max_live, in_turn, borrowers, /) -> bool: _availability.give_back\n"
"in one call where nobody waits (else Pool._give_back).");

/* The Python operation, Pool._give_back(rid, max_idle, max_live, in_turn, borrowers). */
static PyObject *decline_give_back(const Operations *o, PyObject *const *args)
{
    if (o->pool == NULL) {
        PyErr_SetString(PyExc_ValueError, "Operations is not initialised");
        return NULL;
    }
    PyObject *call[6] = {o->pool, args[0], args[1], args[2], args[3], args[4]};
    return PyObject_VectorcallMethod(python_give_back, call, 6, NULL);
}

static PyObject *Operations_give_back(Operations *o, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t v[5]; /* node, generation, epoch, max_idle, max_live */
    Py_ssize_t offset;
    Slot s;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "give_back takes 5 arguments");
        return NULL;
    }
    if (!usable(o) || !parse_rid(o, args[0], v, &offset) || !small(args[1], UINT32_MAX, &v[3]) ||
        !small(args[2], UINT32_MAX, &v[4]) || !enter(o, &s, offset))
        return decline_give_back(o, args);
    int outcome = give_back(o, s.view.buf, s.p, v);
    leave(o, &s);
    if (outcome != DONE)
        return decline_give_back(o, args);
    Py_RETURN_TRUE;
}

/* Table.complete for the slot at offset: one active unit back, and the key's change. */
static int ops_complete(Operations *o, Py_ssize_t offset, uint64_t generation, uint64_t epoch)
{
    Slot s;
    if (!usable(o) || !enter(o, &s, offset))
        return 0;
    uint64_t id[2] = {generation, epoch};
    long long index = complete(s.p, id);
    if (index >= 0 && index < o->key_capacity)
        key_changed(o, s.view.buf, (uint64_t)index);
    leave(o, &s);
    return 1;
}

PyDoc_STRVAR(execution_complete_doc,
"complete() -> None\\n\\n"
"Give the unit back and wake the key's waiters. Idempotent. Does nothing if the\\n"
"resource was closed or its slot reused meanwhile, or in a forked child (the\\n"
"parent's unit stays the parent's).");

static PyObject *Execution_complete(Execution *e, PyObject *unused)
{
    if (e->done)
        Py_RETURN_NONE;
    e->done = 1;
    if (PyDict_GetItemWithError(fork_globals, generation_name) != e->fork)
        Py_RETURN_NONE;
    if (e->ops != NULL && ops_complete((Operations *)e->ops, e->offset, e->generation, e->epoch))
        Py_RETURN_NONE;
    return PyObject_CallMethod(e->table, "complete", "nKK", e->offset,
                               (unsigned long long)e->generation, (unsigned long long)e->epoch);
}

static PyObject *Execution_enter(PyObject *e, PyObject *unused)
{
    return Py_NewRef(e);
}

static PyObject *Execution_exit(Execution *e, PyObject *args)
{
    PyObject *done = Execution_complete(e, NULL);
    if (done == NULL)
        return NULL;
    Py_DECREF(done);
    Py_RETURN_NONE;
}

static PyObject *Execution_get_done(Execution *e, void *unused)
{
    return PyBool_FromLong(e->done);
}

/* Dropped without complete(): _guards.finalise warns and gives the unit back. */
static void Execution_finalize(Execution *e)
{
    if (e->done || e->table == NULL || finalise_fn == NULL)
        return;
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    if (PyDict_GetItemWithError(fork_globals, generation_name) == e->fork) {
        PyObject *done = PyObject_CallFunction(finalise_fn, "OOnKK", e, e->table, e->offset,
                                               (unsigned long long)e->generation,
                                               (unsigned long long)e->epoch);
        if (done == NULL)
            PyErr_WriteUnraisable((PyObject *)e);
        Py_XDECREF(done);
    }
    e->done = 1;
    PyErr_Restore(type, value, trace);
}

/* Execution(table, rid, fence, offset): a unit a Python step accepted (register_active,
 * a session, a declined accept); it completes through table.complete. */
static PyObject *Execution_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"table", "rid", "fence", "offset", NULL};
    PyObject *table, *rid, *fence, *generation, *epoch;
    Py_ssize_t offset;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOn", names, &table, &rid, &fence, &offset))
        return NULL;
    uint64_t id[3];
    generation = PyObject_GetAttrString(rid, "generation");
    epoch = generation ? PyObject_GetAttrString(rid, "epoch") : NULL;
    int fits = epoch != NULL && small(generation, UINT32_MAX, &id[1]) &&
               small(epoch, UINT64_MAX, &id[2]);
    Py_XDECREF(generation);
    Py_XDECREF(epoch);
    if (!fits) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "rid must be a ResourceId");
        return NULL;
    }
    PyObject *fork = PyDict_GetItemWithError(fork_globals, generation_name);
    if (fork == NULL)
        return NULL;
    return new_execution(type, NULL, table, rid, fence, fork, offset, id[1], id[2]);
}

static PyObject *Execution_repr(Execution *e)
{
    return PyUnicode_FromFormat("<Execution %S fence=%S %s>", e->id, e->fence,
                                e->done ? "done" : "active");
}

static int Execution_traverse(Execution *e, visitproc visit, void *arg)
{
    Py_VISIT(e->ops);
    Py_VISIT(e->table);
    return 0;
}

static int Execution_clear(Execution *e)
{
    Py_CLEAR(e->ops);
    Py_CLEAR(e->table);
    return 0;
}

static void Execution_dealloc(Execution *e)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)e) < 0)
        return; /* resurrected */
    PyObject_GC_UnTrack(e);
    Execution_clear(e);
    Py_XDECREF(e->id);
    Py_XDECREF(e->fence);
    Py_XDECREF(e->fork);
    PyObject_GC_Del(e);
}

static PyMethodDef Execution_methods[] = {
    {"complete", (PyCFunction)Execution_complete, METH_NOARGS, execution_complete_doc},
    {"__enter__", (PyCFunction)Execution_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Execution_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Execution_members[] = {
    {"id", T_OBJECT_EX, offsetof(Execution, id), READONLY, "the resource"},
    {"fence", T_OBJECT_EX, offsetof(Execution, fence), READONLY,
     "the fence this unit was accepted under"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Execution_getset[] = {
    {"done", (getter)Execution_get_done, NULL, "True once the unit was given back.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ExecutionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "orbitive.pool.Execution",
    .tp_doc = PyDoc_STR("One accepted unit of a resource, in use by its owner (the C twin of "
                        "_guards.Execution, built by Operations.accept)."),
    .tp_basicsize = sizeof(Execution),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_FINALIZE,
    .tp_dealloc = (destructor)Execution_dealloc,
    .tp_finalize = (destructor)Execution_finalize,
    .tp_traverse = (traverseproc)Execution_traverse,
    .tp_clear = (inquiry)Execution_clear,
    .tp_repr = (reprfunc)Execution_repr,
    .tp_new = Execution_new,
    .tp_methods = Execution_methods,
    .tp_members = Execution_members,
    .tp_getset = Execution_getset,
};

PyDoc_STRVAR(ops_close_doc, "close() -> None: every later call declines (the pool is closed).");

static PyObject *Operations_close(Operations *o, PyObject *unused)
{
    o->closed = 1;
    Py_RETURN_NONE;
}

static int parse_types(PyObject *rid, PyObject *lease, Types *y)
{
    if (!PyType_Check(rid) || !PyType_Check(lease)) {
        PyErr_SetString(PyExc_TypeError, "rid_type and lease_type must be classes");
        return -1;
    }
    y->rid = (PyTypeObject *)rid;
    y->lease = (PyTypeObject *)lease;
    return member_at(y->rid, "kind", &y->kind_at) < 0 ||
                   member_at(y->rid, "node", &y->node_at) < 0 ||
                   member_at(y->rid, "slot", &y->slot_at) < 0 ||
                   member_at(y->rid, "generation", &y->generation_at) < 0 ||
                   member_at(y->rid, "epoch", &y->epoch_at) < 0 ||
                   member_at(y->lease, "id", &y->id_at) < 0 ||
                   member_at(y->lease, "fence", &y->fence_at) < 0 ||
                   member_at(y->lease, "holder_node", &y->holder_node_at) < 0 ||
                   member_at(y->lease, "holder_incarnation", &y->holder_incarnation_at) < 0
               ? -1
               : 0;
}

static int Operations_init(Operations *o, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"buf", "block", "first", "end", "kind", "fleet_capacity",
                            "lane_capacity", "key_base", "key_stride", "key_capacity",
                            "key_interest", "key_waiters", "bell", "node", "incarnation",
                            "rid_type",
                            "lease_type", "fork_module", "pool", "table", NULL};
    PyObject *buf, *block, *rid_type, *lease_type, *fork_module, *pool, *table;
    Operations g; /* parsed and checked here, copied into o only when consistent */
    unsigned long long node, incarnation;
    if (o->ready) {
        PyErr_SetString(PyExc_TypeError, "Operations is initialised already");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOnnnnnnnnnnnKKOOOOO", names, &buf, &block,
                                     &g.first, &g.end, &g.kind, &g.fleet_capacity,
                                     &g.lane_capacity, &g.key_base, &g.key_stride,
                                     &g.key_capacity, &g.key_interest, &g.key_waiters,
                                     &g.bell, &node,
                                     &incarnation, &rid_type, &lease_type, &fork_module, &pool,
                                     &table))
        return -1;
    if (g.first < 0 || g.end < g.first || g.end > (Py_ssize_t)1 << 40 ||
        (g.end - g.first) % RESOURCE_SIZE || g.kind < 0 || g.kind > 255 ||
        g.fleet_capacity < 1 || g.fleet_capacity > 0xFFFF || g.lane_capacity < 1 ||
        g.lane_capacity > 1 << 16 ||
        g.first + g.fleet_capacity * g.lane_capacity * RESOURCE_SIZE != g.end ||
        g.key_capacity < 1 || g.key_capacity > 1 << 16 || g.key_base < 0 ||
        g.key_stride < KEY_PARKED + g.fleet_capacity || g.key_stride > 1 << 20 ||
        g.key_interest < KEY_PARKED + g.fleet_capacity ||
        g.key_interest + g.fleet_capacity > g.key_stride || g.key_waiters < KEY_PARKED ||
        g.key_waiters + 4 * g.fleet_capacity > g.key_stride ||
        g.key_base + g.key_capacity * g.key_stride > g.first || g.bell < 0 ||
        g.bell + BELL_PARKED + g.fleet_capacity > g.key_base || node >= (uint64_t)g.fleet_capacity) {
        PyErr_SetString(PyExc_ValueError, "inconsistent pool table geometry");
        return -1;
    }
    if (!PyModule_Check(fork_module) || parse_types(rid_type, lease_type, &o->types) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "fork_module must be a module");
        return -1;
    }
    PyObject *fork_dict = PyModule_GetDict(fork_module);
    PyObject *generation = PyDict_GetItemWithError(fork_dict, generation_name);
    if (generation == NULL) {
        PyErr_SetString(PyExc_TypeError, "fork_module has no generation");
        return -1;
    }
    if (robust_block_hold(block, &o->block) < 0)
        return -1;
    o->node_obj = PyLong_FromUnsignedLongLong(node);
    o->incarnation_obj = PyLong_FromUnsignedLongLong(incarnation);
    if (o->node_obj == NULL || o->incarnation_obj == NULL) {
        PyBuffer_Release(&o->block);
        return -1;
    }
    o->first = g.first;
    o->end = g.end;
    o->kind = g.kind;
    o->fleet_capacity = g.fleet_capacity;
    o->lane_capacity = g.lane_capacity;
    o->key_base = g.key_base;
    o->key_stride = g.key_stride;
    o->key_capacity = g.key_capacity;
    o->key_interest = g.key_interest;
    o->key_waiters = g.key_waiters;
    o->bell = g.bell;
    o->node = node;
    o->incarnation = incarnation;
    o->buf = Py_NewRef(buf);
    o->pool = Py_NewRef(pool);
    o->table = Py_NewRef(table);
    o->fork_dict = Py_NewRef(fork_dict);
    o->generation = Py_NewRef(generation);
    Py_INCREF(o->types.rid);
    Py_INCREF(o->types.lease);
    o->ready = 1;
    return 0;
}

static int Operations_traverse(Operations *o, visitproc visit, void *arg)
{
    Py_VISIT(o->pool);
    Py_VISIT(o->table);
    return 0;
}

static int Operations_clear(Operations *o)
{
    Py_CLEAR(o->pool);
    Py_CLEAR(o->table);
    return 0;
}

static void Operations_dealloc(Operations *o)
{
    PyObject_GC_UnTrack(o);
    if (o->ready) {
        PyBuffer_Release(&o->block);
        Py_DECREF(o->types.rid);
        Py_DECREF(o->types.lease);
    }
    Operations_clear(o);
    Py_XDECREF(o->buf);
    Py_XDECREF(o->fork_dict);
    Py_XDECREF(o->generation);
    Py_XDECREF(o->node_obj);
    Py_XDECREF(o->incarnation_obj);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

static PyMethodDef Operations_methods[] = {
    {"reserve", (PyCFunction)Operations_reserve, METH_O, ops_reserve_doc},
    {"accept", (PyCFunction)Operations_accept, METH_O, ops_accept_doc},
    {"take", (PyCFunction)Operations_take, METH_O, ops_take_doc},
    {"give_back", (PyCFunction)(void (*)(void))Operations_give_back, METH_FASTCALL,
     ops_give_back_doc},
    {"close", (PyCFunction)Operations_close, METH_NOARGS, ops_close_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject OperationsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "orbitive.pool._fastpath.Operations",
    .tp_doc = PyDoc_STR("Pool.reserve and Pool.accept, each one call, over one pool table."),
    .tp_basicsize = sizeof(Operations),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Operations_init,
    .tp_dealloc = (destructor)Operations_dealloc,
    .tp_traverse = (traverseproc)Operations_traverse,
    .tp_clear = (inquiry)Operations_clear,
    .tp_methods = Operations_methods,
};

/* -- the type ------------------------------------------------------------------------- */

static int Steps_init(Steps *t, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"buf", "first", "end", NULL};
    PyObject *buf;
    Py_ssize_t first, end;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Onn", names, &buf, &first, &end))
        return -1;
    if (first < 0 || end < first || end > (Py_ssize_t)1 << 40 ||
        (end - first) % RESOURCE_SIZE) {
        PyErr_SetString(PyExc_ValueError, "inconsistent pool resource area");
        return -1;
    }
    t->first = first;
    t->end = end;
    Py_XSETREF(t->buf, Py_NewRef(buf));
    return 0;
}

static void Steps_dealloc(Steps *t)
{
    Py_XDECREF(t->buf);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef Steps_methods[] = {
    {"reserve", (PyCFunction)(void (*)(void))Steps_reserve, METH_FASTCALL, reserve_doc},
    {"accept", (PyCFunction)(void (*)(void))Steps_accept, METH_FASTCALL, accept_doc},
    {"complete", (PyCFunction)(void (*)(void))Steps_complete, METH_FASTCALL, complete_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StepsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "orbitive.pool._fastpath.Steps",
    .tp_doc = PyDoc_STR("Steps(buf, first, end): the pool table's hot steps over one mapping "
                        "whose resource slots fill [first, end)."),
    .tp_basicsize = sizeof(Steps),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Steps_init,
    .tp_dealloc = (destructor)Steps_dealloc,
    .tp_methods = Steps_methods,
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "orbitive.pool._fastpath",
    PyDoc_STR("The pool table's reserve, accept and complete steps in C (see _table.py)."),
    -1, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    PyObject *fork = PyImport_ImportModule("orbitive._fork");
    if (fork == NULL)
        return NULL;
    fork_globals = Py_NewRef(PyModule_GetDict(fork));
    Py_DECREF(fork);
    generation_name = PyUnicode_InternFromString("generation");
    python_reserve = PyUnicode_InternFromString("_reserve");
    python_accept = PyUnicode_InternFromString("_accept_lease");
    python_take = PyUnicode_InternFromString("_take");
    python_give_back = PyUnicode_InternFromString("_give_back");
    if (generation_name == NULL || python_reserve == NULL || python_accept == NULL ||
        python_take == NULL || python_give_back == NULL ||
        PyType_Ready(&StepsType) < 0 || PyType_Ready(&OperationsType) < 0 ||
        PyType_Ready(&ExecutionType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&fastpath_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Steps", (PyObject *)&StepsType) < 0 ||
        PyModule_AddObjectRef(module, "Operations", (PyObject *)&OperationsType) < 0 ||
        PyModule_AddObjectRef(module, "Execution", (PyObject *)&ExecutionType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
