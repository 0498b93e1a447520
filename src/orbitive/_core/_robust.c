/* orbitive._core._robust_c: the C twin of _robust.py's RobustMutex (see _robust.h).
 *
 * RobustMutex(block, stripes) wraps the stripe mutexes of one region's section
 * block (a writable mapping of SECTION_BYTES bytes, kept exported while the
 * object lives, so the memory stays mapped under a thread that waits for a lock).
 * acquire() locks every stripe in ascending order: the whole region.
 */
#define PY_SSIZE_T_CLEAN
#include "_layout.h"
#include "_robust.h"
#include <stddef.h>

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    uint8_t *block;
    int stripes;
} RobustMutex;

static int RobustMutex_init(RobustMutex *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"block", "stripes", NULL};
    PyObject *block;
    int stripes = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|i", names, &block, &stripes))
        return -1;
    if (stripes < 1 || stripes > SECTION_STRIPES_MAX) {
        PyErr_Format(PyExc_ValueError, "stripes must be 1..%d", SECTION_STRIPES_MAX);
        return -1;
    }
    if (self->block != NULL) {
        PyErr_SetString(PyExc_TypeError, "RobustMutex is initialised already");
        return -1;
    }
    if (robust_block_hold(block, &self->view) < 0)
        return -1;
    self->block = self->view.buf;
    self->stripes = stripes;
    return 0;
}

static int ready(const RobustMutex *self)
{
    if (self->block == NULL) {
        PyErr_SetString(PyExc_ValueError, "RobustMutex is not initialised");
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(create_doc, "create() -> None: initialise new stripe mutexes (process-shared, robust).");

static PyObject *RobustMutex_create(RobustMutex *self, PyObject *unused)
{
    pthread_mutexattr_t attr;
    int rc;
    if (!ready(self))
        return NULL;
    if ((rc = pthread_mutexattr_init(&attr)) == 0) {
        if ((rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)) == 0 &&
            (rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST)) == 0)
            for (int stripe = 0; rc == 0 && stripe < self->stripes; stripe++)
                rc = pthread_mutex_init(robust_mutex(self->block, stripe), &attr);
        pthread_mutexattr_destroy(&attr);
    }
    if (rc != 0) {
        robust_error(rc);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(acquire_doc,
"acquire() -> int: lock every stripe, waiting without the GIL; repairs EOWNERDEAD and\n"
"returns how many stripe mutexes it repaired (the caller reports them once it has let go).");

static PyObject *RobustMutex_acquire(RobustMutex *self, PyObject *unused)
{
    if (!ready(self))
        return NULL;
    int repaired = 0;
    int rc = robust_lock_range(self->block, 0, self->stripes - 1, &repaired);
    if (rc != 0) {
        robust_error(rc);
        return NULL;
    }
    return PyLong_FromLong(repaired);
}

PyDoc_STRVAR(release_doc, "release() -> None: unlock every stripe.");

static PyObject *RobustMutex_release(RobustMutex *self, PyObject *unused)
{
    if (!ready(self))
        return NULL;
    int rc = robust_unlock_range(self->block, 0, self->stripes - 1);
    if (rc != 0) {
        robust_error(rc);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(release_mine_doc,
"release_mine() -> int: unlock the stripes whose futex word names this thread as their\n"
"holder, in descending order; returns how many (an acquire cut short by an exception).");

static PyObject *RobustMutex_release_mine(RobustMutex *self, PyObject *unused)
{
    if (!ready(self))
        return NULL;
    int released = 0;
    for (int stripe = self->stripes - 1; stripe >= 0; stripe--) {
        if (robust_names_me(robust_mutex(self->block, stripe))) {
            robust_unlock(self->block, stripe);
            released++;
        }
    }
    return PyLong_FromLong(released);
}

/* The view is the mapping's last hold unless a table's C steps share it: see
 * robust_before_unmap for why a block a thread of this process holds is never let go. */
static void RobustMutex_dealloc(RobustMutex *self)
{
    if (self->block != NULL && !robust_before_unmap(self->block, self->stripes))
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef RobustMutex_methods[] = {
    {"create", (PyCFunction)RobustMutex_create, METH_NOARGS, create_doc},
    {"acquire", (PyCFunction)RobustMutex_acquire, METH_NOARGS, acquire_doc},
    {"release", (PyCFunction)RobustMutex_release, METH_NOARGS, release_doc},
    {"release_mine", (PyCFunction)RobustMutex_release_mine, METH_NOARGS, release_mine_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RobustMutexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "orbitive._core._robust_c.RobustMutex",
    .tp_doc = PyDoc_STR("The robust process-shared mutex of one section block."),
    .tp_basicsize = sizeof(RobustMutex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RobustMutex_init,
    .tp_dealloc = (destructor)RobustMutex_dealloc,
    .tp_methods = RobustMutex_methods,
};

static struct PyModuleDef robust_module = {
    PyModuleDef_HEAD_INIT, "orbitive._core._robust_c",
    PyDoc_STR("The section's robust mutex in C (see _robust.py)."), -1, NULL,
};

static const LayoutConstant layout[] = {
    LAYOUT_CONSTANT(SECTION_RECOVERIES_AT), LAYOUT_CONSTANT(SECTION_MUTEX_AT),
    LAYOUT_CONSTANT(SECTION_STRIPE_BYTES),  LAYOUT_CONSTANT(SECTION_STRIPES_MAX),
    LAYOUT_CONSTANT(SECTION_BYTES),         LAYOUT_CONSTANT(ROBUST_TID_MASK),
    LAYOUT_CONSTANT(ROBUST_OWNER_DIED),
};

PyMODINIT_FUNC PyInit__robust_c(void)
{
    if (PyType_Ready(&RobustMutexType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&robust_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "RobustMutex", (PyObject *)&RobustMutexType) < 0 ||
        add_layout(module, layout, sizeof layout / sizeof layout[0]) < 0 ||
        PyModule_AddIntConstant(module, "MUTEX_BYTES", (long)sizeof(pthread_mutex_t)) < 0 ||
#ifdef __GLIBC__
        PyModule_AddIntConstant(module, "MUTEX_LIST_AT",
                                (long)offsetof(pthread_mutex_t, __data.__list.__next)) < 0 ||
        PyModule_AddIntConstant(module, "GLIBC", 1) < 0
#else
        PyModule_AddIntConstant(module, "MUTEX_LIST_AT", 0) < 0 ||
        PyModule_AddIntConstant(module, "GLIBC", 0) < 0
#endif
    ) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
