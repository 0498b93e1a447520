/* orbitive.lock._fastpath, part 2: buffers, arguments and results of the C operations.
 *
 * Included once, by lock/_fastpath.c, after _steps.h. Anything unusual in the
 * arguments declines to the Python operation (lock/_lock_table.py), which raises.
 */
#ifndef ORBIT_LOCK_CALLS_H
#define ORBIT_LOCK_CALLS_H

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
static PyObject *python_acquire, *python_release, *python_renew, *python_release_handing;

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

#endif /* ORBIT_LOCK_CALLS_H */
