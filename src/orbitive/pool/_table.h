/* orbitive.pool._fastpath, part 1: the resource slot's three hot steps and the Steps type.
 *
 * Included once, at its top, by pool/_fastpath.c (one translation unit: these are
 * static). reserve, accept and complete are the C twins of Table._reserve_step,
 * _accept_step and _complete_step in pool/_table.py: the same checks of one
 * resource slot and the same writes in the same (commit-last) order. Steps
 * exposes them to the Python Table, which holds the critical section around them.
 */
#ifndef ORBIT_POOL_STEPS_H
#define ORBIT_POOL_STEPS_H

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

/* One step's view of its slot: the buffer held for the call and the slot in it, and
 * whether locking the section repaired its mutex (reported once the step let go). */
typedef struct {
    Py_buffer view;
    uint8_t *p;
    int repaired;
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

#endif /* ORBIT_POOL_STEPS_H */
