/* orbitive.lock._fastpath: the lock table's hot operations, each one C call.
 *
 * Steps.try_acquire, Steps.release and Steps.renew are LockTable's public
 * operations of the same names on their common path, and Steps.release_handing its
 * _release_handing (a release telling the waiters it found and the key word it left,
 * for release_waking and the SHM store's release): argument checks, the
 * clock, the stripes of the section the key's probe reads (robust mutexes in
 * the object's section block, _robust.h; lock/_layout.py "Stripes"), the table
 * step and the result objects. The step is byte for byte what ReferenceSteps in
 * lock/_steps.py does (the comment over each C function names its Python twin):
 * linear probing bounded by the header's max_probe, with lazy reclaim of
 * expired entries, counters advanced first, one transition frame published to
 * this node's ring lane (seqlock) with the readiness word bumped, then
 * max_probe raised if the entry lies further from its home, then the slot
 * tombstoned, written and made OCCUPIED last; a renewal rewrites its live entry in
 * place instead (the revision, then the expiry, each one aligned 8-byte store), so
 * that a kill at any instruction leaves the old expiry or the new one. A release
 * also adds one to its key's bucket word when a thread waits on a key word, and
 * wakes the longest waiting one once the stripes are let go (lock/_key_wait.py);
 * the word it left is what the releaser's next wait for the key waits past.
 *
 * LockTable binds these methods as its own. Anything off that path (other
 * argument types, an error to raise, a fork, a closed table, the test-only
 * crash hook) hands the call, before or after the step, to the table class's
 * method of the same name (lock/_lock_table.py), which runs the Python operation
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
#include "_layout.h"
#include "_robust.h"
#include "_slots.h"
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the SHM layouts are little-endian; the pure-Python table is used instead"
#endif
#ifdef Py_GIL_DISABLED
#error "a process's ring lane writes rely on the GIL; the pure-Python table is used instead"
#endif

#include "_steps.h"
#include "_calls.h"

/* -- the operations ---------------------------------------------------------------- */

/* Map the buffers and hold e's stripes; 0 (nothing held) hands the call to Python. */
static int enter(Steps *t, Maps *m, const Entry *e, Held *h)
{
    h->lo = 0;
    h->hi = -1;
    h->repaired = 0;
    if (maps_get(t, m) < 0) {
        PyErr_Clear(); /* a closed mapping: the Python operation says why */
        return 0;
    }
    if (cover(t, m->s, e, h) != 0 || t->closed) { /* closed while this thread waited */
        let_go(t, h);
        maps_release(m);
        robust_report(t->repaired, &h->repaired);
        return 0;
    }
    return 1;
}

/* Signal armed readiness sockets (inside the section, as Ring.publish does), leave it,
 * then wake the longest waiter on key_word (if any) while the ring is still mapped. */
static int leave(Steps *t, Maps *m, Held *h, int wake, uint32_t *key_word)
{
    int failed = 0;
    if (wake) {
        PyObject *done = PyObject_CallNoArgs(t->wake);
        failed = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    let_go(t, h);
    if (key_word != NULL)
        syscall(SYS_futex, key_word, FUTEX_WAKE, 1, NULL, NULL, 0);
    maps_release(m);
    robust_report(t->repaired, &h->repaired);
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
        count_conflict(m.s);
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
    if (leave(t, &m, &h, wake, NULL) < 0) {
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

/* release: -1 (a decline: *result is its result or NULL), ABSENT (not live), or DONE
 * with *waiting the nodes waiting for the key and *left the key word as the release
 * left it (Ring.key_released). */
static int release_step(Steps *t, const Call *c, PyObject *python, PyObject **result,
                        long *waiting, uint32_t *left)
{
    static const char *const names[] = {"lease"};
    PyObject *a[1];
    Entry e;
    Maps m;
    Held h;
    Py_ssize_t hint;
    uint64_t revision;
    uint32_t *key_word = NULL;
    int outcome = ABSENT, wake = 0, rc = 0;
    *waiting = 0;
    *left = 0;
    if (!usable(t) || !positional(c, names, 1, a) || !parse_lease(t, a[0], &e, &hint) ||
        !enter(t, &m, &e, &h)) {
        *result = decline(t, python, c);
        return -1;
    }
    e.now = now_ms();
    Py_ssize_t slot = find_tenure(t, m.s, &e, hint, &h, &rc);
    if (rc != 0) {
        outcome = CORRUPT;
    } else if (slot >= 0) {
        if ((revision = next_revision(m.s)) == 0) {
            outcome = EXHAUSTED;
        } else {
            outcome = publish(t, m.r, &e, RELEASED, revision, 0, 0, &wake);
            if (outcome == DONE) {
                tombstone(t, m.s, slot, e.digest);
                *waiting = key_released(t, m.r, &e, &key_word, left);
            }
        }
    }
    if (leave(t, &m, &h, wake, key_word) < 0) {
        *result = NULL;
        return -1;
    }
    if (outcome == DONE || outcome == ABSENT)
        return outcome;
    *result = decline(t, python, c);
    return -1;
}

PyDoc_STRVAR(release_doc,
"release(lease) -> bool: LockTable.release in one call.");

static PyObject *Steps_release(Steps *t, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    const Call c = {args, PyVectorcall_NARGS(nargsf), kwnames};
    PyObject *result;
    long waiting;
    uint32_t left;
    int outcome = release_step(t, &c, python_release, &result, &waiting, &left);
    if (outcome < 0)
        return result;
    return PyBool_FromLong(outcome == DONE);
}

PyDoc_STRVAR(release_handing_doc,
"release_handing(lease) -> (int, int): LockTable._release_handing in one call.");

static PyObject *Steps_release_handing(Steps *t, PyObject *const *args, size_t nargsf,
                                       PyObject *kwnames)
{
    const Call c = {args, PyVectorcall_NARGS(nargsf), kwnames};
    PyObject *result;
    long waiting;
    uint32_t left;
    int outcome = release_step(t, &c, python_release_handing, &result, &waiting, &left);
    if (outcome < 0)
        return result;
    if (outcome != DONE)
        return Py_BuildValue("(ii)", -1, 0);
    return Py_BuildValue("(lk)", waiting, (unsigned long)left);
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
            if (outcome == DONE)
                rewrite(p, revision, e.expires);
        }
    }
    if (leave(t, &m, &h, wake, NULL) < 0)
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
                            "fork_module", "table", "steps_module", "repaired", NULL};
    PyObject *state, *ring, *block, *wake, *types, *fork_module, *table, *steps_module;
    PyObject *repaired;
    unsigned long long id_base;
    Steps g; /* parsed and checked here, copied into t only when consistent */
    if (t->ready) {
        PyErr_SetString(PyExc_TypeError, "Steps is initialised already");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOnnnnnnnnnnKOiOOOOO", names, &state,
                                     &ring, &block, &g.capacity, &g.stride, &g.payload_max,
                                     &g.lanes, &g.heads_at, &g.slots_at, &g.ring_capacity,
                                     &g.ring_stride, &g.frame_bytes, &g.node, &id_base, &wake,
                                     &g.stripes, &types, &fork_module, &table, &steps_module,
                                     &repaired))
        return -1;
    int pow2 = g.capacity > 0 && !(g.capacity & (g.capacity - 1)) && g.capacity <= 1 << 20 &&
               g.ring_capacity > 0 && !(g.ring_capacity & (g.ring_capacity - 1)) &&
               g.ring_capacity <= 1 << 20;
    if (!pow2 || g.payload_max < 3 || g.payload_max > 0xFFFF ||
        g.stride < SLOT_HEADER + g.payload_max || g.stride > 1 << 17 || g.stride % 8 ||
        g.lanes < 1 ||
        g.lanes > 0xFFFF || g.heads_at < RING_HEADER + ROUND64(g.lanes) + ROUND64(4 * g.lanes) ||
        g.heads_at > 1 << 30 ||
        g.slots_at < g.heads_at + g.lanes * LANE_HEAD || g.slots_at > 1 << 30 ||
        g.frame_bytes < EVENT_HEADER + g.payload_max || g.frame_bytes > 1 << 20 ||
        g.ring_stride < FRAME_HEADER + g.frame_bytes || g.ring_stride > 1 << 21 || g.node < 0 ||
        g.node >= g.lanes || g.stripes < 1 || g.stripes > SECTION_STRIPES_MAX ||
        (g.stripes & (g.stripes - 1)) || g.stripes > g.capacity) {
        PyErr_SetString(PyExc_ValueError, "inconsistent lock table or ring geometry");
        return -1;
    }
    if (!PyCallable_Check(wake) || !PyCallable_Check(repaired) || !PyModule_Check(fork_module) ||
        !PyModule_Check(steps_module) || parse_types(types, &t->types) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError,
                            "wake and repaired must be callable and the modules modules");
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
    t->waiting_at = RING_HEADER + ROUND64(g.lanes); /* _ring.RingGeometry.waiting_offset */
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
    t->repaired = Py_NewRef(repaired);
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
    Py_VISIT(t->repaired);
    return 0;
}

static int Steps_clear(Steps *t)
{
    Py_CLEAR(t->table);
    Py_CLEAR(t->wake);
    Py_CLEAR(t->repaired);
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
    {"release_handing", (PyCFunction)(void (*)(void))Steps_release_handing,
     METH_FASTCALL | METH_KEYWORDS, release_handing_doc},
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

static const LayoutConstant layout[] = {
    LAYOUT_CONSTANT(EMPTY),         LAYOUT_CONSTANT(OCCUPIED),      LAYOUT_CONSTANT(TOMBSTONE),
    LAYOUT_CONSTANT(STATE_HEADER),  LAYOUT_CONSTANT(SLOT_HEADER),   LAYOUT_CONSTANT(MAX_PROBE_AT),
    LAYOUT_CONSTANT(TOKEN_AT),      LAYOUT_CONSTANT(REVISION_AT),   LAYOUT_CONSTANT(CONFLICTS_AT),
    LAYOUT_CONSTANT(RING_HEADER),   LAYOUT_CONSTANT(LANE_HEAD),     LAYOUT_CONSTANT(FRAME_HEADER),
    LAYOUT_CONSTANT(EVENT_HEADER),  LAYOUT_CONSTANT(GENERATION_AT), LAYOUT_CONSTANT(ACQUIRED),
    LAYOUT_CONSTANT(RENEWED),       LAYOUT_CONSTANT(RELEASED),      LAYOUT_CONSTANT(EVENT_MAGIC),
    LAYOUT_CONSTANT(EVENT_VERSION), LAYOUT_CONSTANT(TOKEN_MASK),    LAYOUT_CONSTANT(COUNTER_LIMIT),
    LAYOUT_CONSTANT(TTL_MAX_S),
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    generation_name = PyUnicode_InternFromString("generation");
    crash_hook_name = PyUnicode_InternFromString("crash_hook");
    python_acquire = PyUnicode_InternFromString("try_acquire");
    python_release = PyUnicode_InternFromString("release");
    python_renew = PyUnicode_InternFromString("renew");
    python_release_handing = PyUnicode_InternFromString("_release_handing");
    if (generation_name == NULL || crash_hook_name == NULL || python_acquire == NULL ||
        python_release == NULL || python_renew == NULL || python_release_handing == NULL)
        return NULL;
    return steps_module(&fastpath_module, &StepsType, layout, sizeof layout / sizeof layout[0]);
}
