/* orbitive.limits._fastpath: the rate-limit table's three hot steps, each one C call.
 *
 * Steps.incr adds to a live counter entry, Steps.acquire takes entries of a live
 * moving-window slot and Steps.sliding counts a sliding-window hit in a live current
 * counter (or refuses it): the common path of RateTable.incr, RateTable.acquire_entry
 * and RateTable.acquire_sliding (limits/_table.py, the reference twin: same probe,
 * same checks, same arithmetic, same order of writes, under the same names: find,
 * find_slot, stamp). Each takes the section's
 * robust mutex (_robust.h) itself, repairing it when its holder died, and declines
 * (returns None, having written nothing) whenever the Python step must run instead:
 * the journal is armed (a writer died inside a step: Python rolls it back), the key
 * has no live entry or slot (a new one is written under the journal), a mapping is
 * closed, or the mutex cannot be locked (Python raises the named error).
 *
 * Every field read from shared memory is checked as the Python step checks it: an
 * entry counts only with a finite expiry above now and below 1e15 and a value of
 * 0..2**62-1, a slot only with its head below the window and its count within it.
 * The geometry is checked against the mappings' sizes on every call.
 */
#define PY_SSIZE_T_CLEAN
#include "_layout.h"
#include "_robust.h"
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the SHM layouts are little-endian; the pure-Python table is used instead"
#endif

/* The layout (limits/_layout.py), compared by tests/limits/test_fastpath.py. */
enum {
    JOURNAL_AT = 64,
    ENTRIES_AT = 128,
    ENTRY_SIZE = 32,
    SLOT_HEAD_SIZE = 32,
    EXPIRES_AT = 16,
    VALUE_AT = 24,
    HEAD_AT = 24,
    COUNT_AT = 28
};
#define VALUE_MAX (1LL << 62)
#define EXPIRES_MAX 1e15

typedef struct {
    PyObject_HEAD
    PyObject *buf, *block, *report;
    Py_ssize_t capacity, probe, windows, window_probe, window, windows_at, slot_size;
    int repaired;
} Steps;

typedef struct {
    Py_buffer table, section;
} Maps;

static inline uint64_t load_u64(const uint8_t *at) { uint64_t v; memcpy(&v, at, 8); return v; }
static inline double load_f64(const uint8_t *at) { double v; memcpy(&v, at, 8); return v; }
static inline uint32_t load_u32(const uint8_t *at) { uint32_t v; memcpy(&v, at, 4); return v; }
static inline void store_f64(uint8_t *at, double v) { memcpy(at, &v, 8); }

static inline int live(double expires, double now) { return now < expires && expires < EXPIRES_MAX; }

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Map both buffers and take the section; 0 (nothing held) declines. */
static int enter(Steps *t, Maps *m)
{
    if (PyObject_GetBuffer(t->buf, &m->table, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (PyObject_GetBuffer(t->block, &m->section, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&m->table);
        return 0;
    }
    if (m->table.len < t->windows_at + t->windows * t->slot_size ||
        m->section.len < SECTION_BYTES ||
        robust_lock(m->section.buf, 0, &t->repaired) != 0) {
        PyBuffer_Release(&m->section);
        PyBuffer_Release(&m->table);
        robust_report(t->report, &t->repaired);
        return 0;
    }
    return 1;
}

static void leave(Steps *t, Maps *m)
{
    robust_unlock(m->section.buf, 0);
    PyBuffer_Release(&m->section);
    PyBuffer_Release(&m->table);
    robust_report(t->report, &t->repaired);
}

/* The key's live counter entry, or NULL (twin of RateTable._find's first answer). */
static uint8_t *find(const Steps *t, uint8_t *base, uint64_t lo, uint64_t hi, double now)
{
    Py_ssize_t slot = (Py_ssize_t)(lo % (uint64_t)t->capacity);
    for (Py_ssize_t n = 0; n < t->probe; n++) {
        uint8_t *at = base + ENTRIES_AT + ENTRY_SIZE * slot;
        uint64_t elo = load_u64(at), ehi = load_u64(at + 8);
        if (elo == lo && ehi == hi) {
            int64_t value = (int64_t)load_u64(at + VALUE_AT);
            if (live(load_f64(at + EXPIRES_AT), now) && value >= 0 && value < VALUE_MAX)
                return at;
        } else if (elo == 0 && ehi == 0) {
            return NULL;
        }
        slot = slot + 1 < t->capacity ? slot + 1 : 0;
    }
    return NULL;
}

/* The key's live moving-window slot, or NULL (twin of RateTable._find_slot's first answer). */
static uint8_t *find_slot(const Steps *t, uint8_t *base, uint64_t lo, uint64_t hi, double now)
{
    Py_ssize_t index = (Py_ssize_t)(lo % (uint64_t)t->windows);
    for (Py_ssize_t n = 0; n < t->window_probe; n++) {
        uint8_t *at = base + t->windows_at + t->slot_size * index;
        uint64_t slo = load_u64(at), shi = load_u64(at + 8);
        if (slo == lo && shi == hi) {
            if (live(load_f64(at + EXPIRES_AT), now) && load_u32(at + HEAD_AT) < t->window &&
                load_u32(at + COUNT_AT) <= t->window)
                return at;
        } else if (slo == 0 && shi == 0) {
            return NULL;
        }
        index = index + 1 < t->windows ? index + 1 : 0;
    }
    return NULL;
}

/* Write amount timestamps now into the slot's ring from head (twin of RateTable._stamp). */
static void stamp(const Steps *t, uint8_t *at, uint32_t head, uint64_t amount, double now)
{
    uint8_t *stamps = at + SLOT_HEAD_SIZE;
    for (uint64_t i = 0; i < amount; i++)
        store_f64(stamps + 8 * ((head + i) % (uint64_t)t->window), now);
}

static int unsigned_arg(PyObject *arg, uint64_t *out)
{
    if (!PyLong_CheckExact(arg))
        return 0;
    *out = PyLong_AsUnsignedLongLong(arg);
    if (*out == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static int seconds_arg(PyObject *arg, double *out)
{
    *out = PyFloat_CheckExact(arg) ? PyFloat_AS_DOUBLE(arg) : -1.0;
    return *out > 0.0 && isfinite(*out);
}

PyDoc_STRVAR(incr_doc, "incr(lo, hi, expiry, amount) -> int | None: add amount to the key's "
                       "live counter; None: nothing written, run the Python step.");

static PyObject *Steps_incr(Steps *t, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t lo, hi, amount;
    double expiry;
    Maps m;
    if (nargs != 4 || !unsigned_arg(args[0], &lo) || !unsigned_arg(args[1], &hi) ||
        !seconds_arg(args[2], &expiry) || !unsigned_arg(args[3], &amount) || amount < 1 ||
        amount >= (uint64_t)VALUE_MAX || t->buf == NULL || !enter(t, &m))
        Py_RETURN_NONE;
    uint8_t *base = m.table.buf;
    uint8_t *at = load_u64(base + JOURNAL_AT) != 0 ? NULL : find(t, base, lo, hi, wall_now());
    int64_t value = -1;
    if (at != NULL) {
        value = (int64_t)load_u64(at + VALUE_AT) + (int64_t)amount;
        if (value >= VALUE_MAX)
            value = VALUE_MAX - 1;
        memcpy(at + VALUE_AT, &value, 8);
    }
    leave(t, &m);
    if (value < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(value);
}

PyDoc_STRVAR(acquire_doc, "acquire(lo, hi, limit, expiry, amount) -> bool | None: take amount "
                          "entries of the key's live moving window if it has room; None: nothing "
                          "written, run the Python step.");

static PyObject *Steps_acquire(Steps *t, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t lo, hi, limit, amount;
    double expiry;
    Maps m;
    if (nargs != 5 || !unsigned_arg(args[0], &lo) || !unsigned_arg(args[1], &hi) ||
        !unsigned_arg(args[2], &limit) || !seconds_arg(args[3], &expiry) ||
        !unsigned_arg(args[4], &amount) || amount < 1 || amount > limit ||
        limit > (uint64_t)t->window || t->buf == NULL || !enter(t, &m))
        Py_RETURN_NONE;
    uint8_t *base = m.table.buf;
    double now = wall_now();
    uint8_t *at = load_u64(base + JOURNAL_AT) != 0 ? NULL : find_slot(t, base, lo, hi, now);
    int taken = -1;
    if (at != NULL) {
        uint32_t head = load_u32(at + HEAD_AT), count = load_u32(at + COUNT_AT);
        uint64_t window = (uint64_t)t->window, gate = limit - amount;
        taken = 1;
        if (gate < count) {
            uint64_t back = (head + window - 1 - gate) % window;
            if (load_f64(at + SLOT_HEAD_SIZE + 8 * back) >= now - expiry)
                taken = 0;
        }
        if (taken) {
            stamp(t, at, head, amount, now);
            if (now + expiry > load_f64(at + EXPIRES_AT))
                store_f64(at + EXPIRES_AT, now + expiry);
            uint64_t total = count + amount;
            uint32_t words[2] = {(uint32_t)((head + amount) % window),
                                 (uint32_t)(total < window ? total : window)};
            memcpy(at + HEAD_AT, words, 8); /* head and count: one aligned 8-byte store */
        }
    }
    leave(t, &m);
    if (taken < 0)
        Py_RETURN_NONE;
    return PyBool_FromLong(taken);
}

/* Counts above this decline to Python, where the weighted count's arithmetic is exact. */
#define SLIDING_MAX (1ULL << 52)

PyDoc_STRVAR(sliding_doc,
"sliding(previous_lo, previous_hi, current_lo, current_hi, limit, expiry, amount, now) "
"-> bool | None: count amount in the current window's live counter if the weighted "
"count leaves room; None: nothing written, run the Python step.");

/* Twin of RateTable._sliding_step on a live current counter (or a refusal). */
static PyObject *Steps_sliding(Steps *t, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t plo, phi, clo, chi, limit, amount;
    double expiry, now;
    Maps m;
    if (nargs != 8 || !unsigned_arg(args[0], &plo) || !unsigned_arg(args[1], &phi) ||
        !unsigned_arg(args[2], &clo) || !unsigned_arg(args[3], &chi) ||
        !unsigned_arg(args[4], &limit) || !seconds_arg(args[5], &expiry) ||
        !unsigned_arg(args[6], &amount) || !PyFloat_CheckExact(args[7]) || amount < 1 ||
        amount > limit || limit > SLIDING_MAX || t->buf == NULL)
        Py_RETURN_NONE;
    now = PyFloat_AS_DOUBLE(args[7]);
    if (!(now - expiry >= 0.0) || !isfinite(now) || !enter(t, &m))
        Py_RETURN_NONE;
    uint8_t *base = m.table.buf;
    int taken = -1;
    if (load_u64(base + JOURNAL_AT) == 0) {
        uint8_t *previous = find(t, base, plo, phi, now), *current = find(t, base, clo, chi, now);
        int64_t pc = previous ? (int64_t)load_u64(previous + VALUE_AT) : 0;
        int64_t cc = current ? (int64_t)load_u64(current + VALUE_AT) : 0;
        if ((uint64_t)pc <= SLIDING_MAX && (uint64_t)cc <= SLIDING_MAX) {
            double ttl = pc == 0 ? 0.0 : (1.0 - fmod((now - expiry) / expiry, 1.0)) * expiry;
            double weighted = (double)pc * ttl / expiry + (double)cc;
            if (floor(weighted) + (double)amount > (double)limit) {
                taken = 0;
            } else if (current != NULL) {
                int64_t value = cc + (int64_t)amount;
                memcpy(current + VALUE_AT, &value, 8);
                taken = 1;
            }
        }
    }
    leave(t, &m);
    if (taken < 0)
        Py_RETURN_NONE;
    return PyBool_FromLong(taken);
}

static int Steps_init(Steps *t, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"buf", "block", "report", "capacity", "probe", "windows",
                            "window_probe", "window", "windows_at", "slot_size", NULL};
    PyObject *buf, *block, *report;
    Py_ssize_t g[7];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOnnnnnnn", names, &buf, &block, &report,
                                     &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6]))
        return -1;
    if (g[0] < 1 || g[1] < 1 || g[1] > g[0] || g[2] < 1 || g[3] < 1 || g[3] > g[2] ||
        g[4] < 1 || g[4] > 65536 || g[5] < ENTRIES_AT + ENTRY_SIZE * g[0] ||
        g[6] != SLOT_HEAD_SIZE + 8 * g[4]) {
        PyErr_SetString(PyExc_ValueError, "Steps: a geometry no rate-limit table has");
        return -1;
    }
    Py_XSETREF(t->buf, Py_NewRef(buf));
    Py_XSETREF(t->block, Py_NewRef(block));
    Py_XSETREF(t->report, Py_NewRef(report));
    t->capacity = g[0];
    t->probe = g[1];
    t->windows = g[2];
    t->window_probe = g[3];
    t->window = g[4];
    t->windows_at = g[5];
    t->slot_size = g[6];
    t->repaired = 0;
    return 0;
}

static int Steps_traverse(Steps *t, visitproc visit, void *arg)
{
    Py_VISIT(t->buf);
    Py_VISIT(t->block);
    Py_VISIT(t->report);
    return 0;
}

static int Steps_clear(Steps *t)
{
    Py_CLEAR(t->buf);
    Py_CLEAR(t->block);
    Py_CLEAR(t->report);
    return 0;
}

static void Steps_dealloc(Steps *t)
{
    PyObject_GC_UnTrack(t);
    Steps_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef Steps_methods[] = {
    {"incr", (PyCFunction)(void (*)(void))Steps_incr, METH_FASTCALL, incr_doc},
    {"acquire", (PyCFunction)(void (*)(void))Steps_acquire, METH_FASTCALL, acquire_doc},
    {"sliding", (PyCFunction)(void (*)(void))Steps_sliding, METH_FASTCALL, sliding_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StepsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "orbitive.limits._fastpath.Steps",
    .tp_doc = PyDoc_STR("Steps(buf, block, report, capacity, probe, windows, window_probe, "
                        "window, windows_at, slot_size): a rate-limit table's hot steps."),
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
    PyModuleDef_HEAD_INIT, "orbitive.limits._fastpath",
    PyDoc_STR("The rate-limit table's incr, moving-window and sliding-window steps in C "
              "(see _table.py)."),
    -1, NULL,
};

static const LayoutConstant layout[] = {
    LAYOUT_CONSTANT(JOURNAL_AT), LAYOUT_CONSTANT(ENTRIES_AT), LAYOUT_CONSTANT(ENTRY_SIZE),
    LAYOUT_CONSTANT(SLOT_HEAD_SIZE), LAYOUT_CONSTANT(EXPIRES_AT), LAYOUT_CONSTANT(VALUE_AT),
    LAYOUT_CONSTANT(HEAD_AT), LAYOUT_CONSTANT(COUNT_AT), LAYOUT_CONSTANT(VALUE_MAX),
    LAYOUT_CONSTANT(EXPIRES_MAX),
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    return steps_module(&fastpath_module, &StepsType, layout, sizeof layout / sizeof layout[0]);
}
