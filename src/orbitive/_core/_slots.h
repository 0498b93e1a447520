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

/* Where the instance slot ``name`` of a slotted type lives. */
static int member_at(PyTypeObject *type, const char *name, Py_ssize_t *at)
{
    PyObject *descr = PyDict_GetItemString(type->tp_dict, name);
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not an instance slot", type->tp_name, name);
        return -1;
    }
    *at = ((PyMemberDescrObject *)descr)->d_member->offset;
    return 0;
}

#endif
