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
 * mutex, _robust.h; the wall clock; the key's change, woken with FUTEX_WAKE, and
 * the bell, whose armed readiness sockets the table's Channel.signal signals; the
 * Lease and Execution objects); anything off that path is handed to the Pool's
 * Python operation (_reserve, _accept_lease), which also raises every error.
 * Operations.take and Operations.give_back are a client pool's own checkout
 * and return (_availability.take and give_back, the references, in the same
 * order of checks and writes), give_back with the key's census and decision.
 *
 * One translation unit in four parts: _table.h (the byte steps and the Steps
 * type), this file (the operations' helpers, reserve and accept, the type and
 * the module), _execution.h (the C Execution) and _availability.h (take and
 * give_back).
 *
 * Nothing read from shared memory is used to address memory unchecked: the
 * addresses are the slot offset the caller passes, checked against the
 * resource area and the buffer's size on every call, the pending entry found
 * by scanning that slot's sixteen fences, and the key slot of the key index
 * a give_back reads, checked against the key table's capacity first (its member
 * bits address resource slots only below fleet_capacity x lane_capacity).
 */
#define PY_SSIZE_T_CLEAN
#include "_layout.h"
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

#include "_table.h"

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
    PyObject *signal;     /* the table's channel.signal: the bell's armed sockets */
    PyObject *repaired;   /* the region's report_repaired: a dead holder's section */
    PyObject *fork_dict, *generation;
    PyObject *node_obj, *incarnation_obj;
    Types types;
    Py_ssize_t first, end, kind, fleet_capacity, lane_capacity;
    Py_ssize_t key_base, key_stride, key_capacity, key_interest, key_claims, key_waiters;
    Py_ssize_t key_members, bell;
    uint64_t node, incarnation;
    uint32_t *live_by_node; /* a census's count per node (_availability.h), fleet_capacity */
    int closed, ready;
} Operations;

static PyTypeObject OperationsType, ExecutionType;
static PyObject *generation_name, *python_reserve, *python_accept, *python_take;
static PyObject *python_give_back;
static PyObject *fork_globals; /* orbitive._fork's globals: its generation, read per call */
static PyObject *finalise_fn;  /* _execution.finalise, fetched with the first Execution */

/* Fetch _execution.finalise while imports work (never at interpreter shutdown). */
static int fetch_finalise(void)
{
    if (finalise_fn != NULL)
        return 0;
    PyObject *execution = PyImport_ImportModule("orbitive.pool._execution");
    if (execution == NULL)
        return -1;
    finalise_fn = PyObject_GetAttrString(execution, "finalise");
    Py_DECREF(execution);
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

/* Layout.member_bytes: bytes of one key's member bitmap (a bit per resource slot,
 * rounded up to whole u64 words). */
static Py_ssize_t member_bytes(Py_ssize_t fleet_capacity, Py_ssize_t lane_capacity)
{
    return (fleet_capacity * lane_capacity + 63) / 64 * 8;
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
    s->repaired = 0;
    if (s->view.len < o->end || robust_lock(o->block.buf, 0, &s->repaired) != 0) {
        PyBuffer_Release(&s->view);
        return 0;
    }
    if (o->closed) {
        robust_unlock(o->block.buf, 0);
        PyBuffer_Release(&s->view);
        robust_report(o->repaired, &s->repaired);
        return 0;
    }
    s->p = (uint8_t *)s->view.buf + offset;
    return 1;
}

static void leave(Operations *o, Slot *s)
{
    robust_unlock(o->block.buf, 0);
    PyBuffer_Release(&s->view);
    robust_report(o->repaired, &s->repaired);
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

/* Channel.bump on the bell: the word + 1, then Channel.signal when a socket is armed
 * (a signal that fails is reported as unraisable: the change itself is made). */
static void ring_bell(const Operations *o, uint8_t *b)
{
    uint8_t *word = b + o->bell;
    st32(word, ld32(word) + 1);
    for (Py_ssize_t n = 0; n < o->fleet_capacity; n++) {
        if (word[BELL_PARKED + n]) {
            PyObject *done = PyObject_CallNoArgs(o->signal);
            if (done == NULL)
                PyErr_WriteUnraisable(o->signal);
            Py_XDECREF(done);
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
            ring_bell(o, b);
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

#include "_execution.h"

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

#include "_availability.h"

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
                            "key_interest", "key_claims", "key_waiters", "key_members",
                            "bell", "node", "incarnation", "rid_type",
                            "lease_type", "fork_module", "pool", "table", "repaired", NULL};
    PyObject *buf, *block, *rid_type, *lease_type, *fork_module, *pool, *table, *repaired;
    Operations g; /* parsed and checked here, copied into o only when consistent */
    unsigned long long node, incarnation;
    if (o->ready) {
        PyErr_SetString(PyExc_TypeError, "Operations is initialised already");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOnnnnnnnnnnnnnKKOOOOOO", names, &buf,
                                     &block, &g.first, &g.end, &g.kind, &g.fleet_capacity,
                                     &g.lane_capacity, &g.key_base, &g.key_stride,
                                     &g.key_capacity, &g.key_interest, &g.key_claims,
                                     &g.key_waiters, &g.key_members, &g.bell, &node,
                                     &incarnation, &rid_type, &lease_type, &fork_module, &pool,
                                     &table, &repaired))
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
        g.key_waiters + 4 * g.fleet_capacity > g.key_stride || g.key_claims < KEY_PARKED ||
        g.key_claims + 4 * g.fleet_capacity > g.key_stride || g.key_members < KEY_PARKED ||
        g.key_members + member_bytes(g.fleet_capacity, g.lane_capacity) > g.key_stride ||
        g.key_base + g.key_capacity * g.key_stride > g.first || g.bell < 0 ||
        g.bell + BELL_PARKED + g.fleet_capacity > g.key_base || node >= (uint64_t)g.fleet_capacity) {
        PyErr_SetString(PyExc_ValueError, "inconsistent pool table geometry");
        return -1;
    }
    if (!PyModule_Check(fork_module) || !PyCallable_Check(repaired) ||
        parse_types(rid_type, lease_type, &o->types) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError,
                            "fork_module must be a module and repaired callable");
        return -1;
    }
    PyObject *fork_dict = PyModule_GetDict(fork_module);
    PyObject *generation = PyDict_GetItemWithError(fork_dict, generation_name);
    if (generation == NULL) {
        PyErr_SetString(PyExc_TypeError, "fork_module has no generation");
        return -1;
    }
    PyObject *channel = PyObject_GetAttrString(table, "channel");
    PyObject *signal = channel == NULL ? NULL : PyObject_GetAttrString(channel, "signal");
    Py_XDECREF(channel);
    if (signal == NULL)
        return -1;
    if (!PyCallable_Check(signal)) {
        Py_DECREF(signal);
        PyErr_SetString(PyExc_TypeError, "table.channel.signal must be callable");
        return -1;
    }
    Py_XSETREF(o->signal, signal); /* an earlier __init__ that failed later on */
    PyMem_Free(o->live_by_node); /* an earlier __init__ that failed later on */
    o->live_by_node = PyMem_Calloc((size_t)g.fleet_capacity, sizeof(uint32_t));
    if (o->live_by_node == NULL) {
        PyErr_NoMemory();
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
    o->key_claims = g.key_claims;
    o->key_waiters = g.key_waiters;
    o->key_members = g.key_members;
    o->bell = g.bell;
    o->node = node;
    o->incarnation = incarnation;
    o->buf = Py_NewRef(buf);
    o->pool = Py_NewRef(pool);
    o->table = Py_NewRef(table);
    o->repaired = Py_NewRef(repaired);
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
    Py_VISIT(o->signal);
    Py_VISIT(o->repaired);
    return 0;
}

static int Operations_clear(Operations *o)
{
    Py_CLEAR(o->pool);
    Py_CLEAR(o->table);
    Py_CLEAR(o->signal);
    Py_CLEAR(o->repaired);
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
    PyMem_Free(o->live_by_node);
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

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "orbitive.pool._fastpath",
    PyDoc_STR("The pool table's reserve, accept and complete steps in C (see _table.py)."),
    -1, NULL,
};

static const LayoutConstant layout[] = {
    LAYOUT_CONSTANT(RESOURCE_SIZE),   LAYOUT_CONSTANT(PENDING),     LAYOUT_CONSTANT(LIVE),
    LAYOUT_CONSTANT(DRAINING),        LAYOUT_CONSTANT(NODE_AT),     LAYOUT_CONSTANT(GENERATION_AT),
    LAYOUT_CONSTANT(INCARNATION_AT),  LAYOUT_CONSTANT(CAPACITY_AT), LAYOUT_CONSTANT(KEY_INDEX_AT),
    LAYOUT_CONSTANT(ACTIVE_AT),       LAYOUT_CONSTANT(FENCE_AT),    LAYOUT_CONSTANT(LAST_RESERVE_AT),
    LAYOUT_CONSTANT(EPOCH_AT),        LAYOUT_CONSTANT(FENCES_AT),   LAYOUT_CONSTANT(SINCE_AT),
    LAYOUT_CONSTANT(KEY_CHANGES),     LAYOUT_CONSTANT(KEY_PARKED),  LAYOUT_CONSTANT(BELL_PARKED),
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    PyObject *fork = PyImport_ImportModule("orbitive._core._fork");
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
        PyModule_AddObjectRef(module, "Execution", (PyObject *)&ExecutionType) < 0 ||
        add_layout(module, layout, sizeof layout / sizeof layout[0]) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
