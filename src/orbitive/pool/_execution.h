/* orbitive.pool._fastpath, part 2: the C Execution, one accepted unit (twin of
 * _execution.PythonExecution); complete() gives it back in one C call.
 *
 * Included once by pool/_fastpath.c, after the operations' helpers it uses.
 */
#ifndef ORBIT_POOL_EXECUTION_H
#define ORBIT_POOL_EXECUTION_H

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

/* Dropped without complete(): _execution.finalise warns and gives the unit back. */
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
                        "_execution.Execution, built by Operations.accept)."),
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

#endif /* ORBIT_POOL_EXECUTION_H */
