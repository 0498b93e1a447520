/* orbitive/_core/_slots.h: reading and writing the instance slots of the value types.
 *
 * The C operations of both tables read their arguments' fields (LockKey,
 * ResourceId, Lease, ...) and fill the objects they return straight through
 * the slots of those frozen, slotted classes, whose offsets are looked up once
 * from the classes' member descriptors.
 */
#ifndef ORBITIVE_SLOTS_H
#define ORBITIVE_SLOTS_H

#include <Python.h>
#include <structmember.h>

static inline PyObject *slot_of(PyObject *obj, Py_ssize_t at)
{
    return *(PyObject **)((char *)obj + at);
}

/* Where the instance slot ``name`` of a slotted type lives (TypeError when it has none).
 * The descriptor is looked up as an attribute, never through type->tp_dict: from
 * Python 3.12 on, that field is NULL for the static builtin types (int, tuple, ...),
 * whose dictionaries live in the interpreter state. */
static int member_at(PyTypeObject *type, const char *name, Py_ssize_t *at)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    int slot = descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
               PyType_IsSubtype(type, ((PyDescrObject *)descr)->d_type) &&
               ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
    if (slot)
        *at = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_XDECREF(descr);
    if (!slot) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s.%s is not an instance slot", type->tp_name, name);
        return -1;
    }
    return 0;
}

#endif
