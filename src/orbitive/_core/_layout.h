/* orbitive/_core/_layout.h: a C module's layout constants, exported as its LAYOUT dict,
 * and a table module's PyInit tail (steps_module()).
 *
 * Each C module states the offsets, sizes and codes it shares with its Python twin
 * in enums and macros; add_layout() publishes them by name, so that
 * tests/core/test_layout_constants.py compares every one with the Python value and
 * a hand copy cannot drift. */
#ifndef ORBITIVE_LAYOUT_H
#define ORBITIVE_LAYOUT_H

#include <Python.h>

typedef struct {
    const char *name;
    unsigned long long value;
} LayoutConstant;

#define LAYOUT_CONSTANT(name) {#name, (unsigned long long)(name)}

/* module.LAYOUT = {name: value, ...}; -1 with an exception set on failure. */
static int add_layout(PyObject *module, const LayoutConstant *constants, size_t count)
{
    PyObject *layout = PyDict_New();
    if (layout == NULL)
        return -1;
    for (size_t i = 0; i < count; i++) {
        PyObject *value = PyLong_FromUnsignedLongLong(constants[i].value);
        if (value == NULL || PyDict_SetItemString(layout, constants[i].name, value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(layout);
            return -1;
        }
        Py_DECREF(value);
    }
    int added = PyModule_AddObjectRef(module, "LAYOUT", layout);
    Py_DECREF(layout);
    return added;
}

/* A table module's PyInit tail: the module of `def` with its `Steps` type (readied
 * here) and its LAYOUT dict; NULL with an exception set on failure. */
static inline PyObject *steps_module(PyModuleDef *def, PyTypeObject *steps,
                                     const LayoutConstant *constants, size_t count)
{
    if (PyType_Ready(steps) < 0)
        return NULL;
    PyObject *module = PyModule_Create(def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Steps", (PyObject *)steps) < 0 ||
        add_layout(module, constants, count) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

#endif
