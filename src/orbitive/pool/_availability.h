/* orbitive.pool._fastpath, part 3: a client pool owner's idle checkout and return,
 * Operations.take and Operations.give_back, the C twins of take and give_back in
 * pool/_availability.py (same checks, same writes, in the same order).
 *
 * Included once by pool/_fastpath.c, after the operations' helpers it uses.
 */
#ifndef ORBIT_POOL_AVAILABILITY_H
#define ORBIT_POOL_AVAILABILITY_H

/* -- the availability steps: a client pool's own checkout and return (_availability.py) -- */

/* The slot is the LIVE registration v = (node, generation, epoch) and this process owns
 * it (its node and incarnation): _availability._owned_live without the errors. */
static int owned_live(const Operations *o, const uint8_t *p, const uint64_t *v)
{
    return p[0] == LIVE && is_registration(p, v) && v[0] == o->node &&
           ld64(p + INCARNATION_AT) == o->incarnation;
}

/* _availability.take: DONE (one free unit is active now), REFUSED (not that LIVE
 * registration of ours) or BUSY (no free unit: a borrower reserved it). */
static int take(const Operations *o, uint8_t *p, const uint64_t *v)
{
    if (!owned_live(o, p, v))
        return REFUSED;
    int free;
    find_entry(p, 0, &free);
    int64_t reserved = PENDING - free;
    uint32_t active = ld32(p + ACTIVE_AT);
    if ((int64_t)ld32(p + CAPACITY_AT) - reserved - (int64_t)active <= 0)
        return BUSY;
    st32(p + ACTIVE_AT, active + 1);
    return DONE;
}

/* _availability.give_back's fast path for v = (node, generation, epoch, max_idle,
 * max_live): DONE (the unit is free again; nobody waits, so nobody is woken), or
 * DECLINED: the Python step decides (not ours or not LIVE, a damaged key index, a
 * waiter counted on the key, or max_idle below max_live, which need the census). */
static int give_back(const Operations *o, uint8_t *b, uint8_t *p, const uint64_t *v)
{
    uint64_t index = ld32(p + KEY_INDEX_AT);
    if (!owned_live(o, p, v) || index >= (uint64_t)o->key_capacity || v[3] < v[4])
        return DECLINED;
    const uint8_t *waiters = b + o->key_base + (Py_ssize_t)index * o->key_stride + o->key_waiters;
    for (Py_ssize_t n = 0; n < o->fleet_capacity; n++)
        if (ld32(waiters + 4 * n))
            return DECLINED;
    uint32_t active = ld32(p + ACTIVE_AT);
    st32(p + ACTIVE_AT, active ? active - 1 : 0);
    return DONE;
}

PyDoc_STRVAR(ops_take_doc,
"take(rid, /) -> None: _availability.take in one call (else Pool._take).");

static PyObject *Operations_take(Operations *o, PyObject *rid)
{
    uint64_t id[3]; /* node, generation, epoch */
    Py_ssize_t offset;
    Slot s;
    if (!usable(o) || !parse_rid(o, rid, id, &offset) || !enter(o, &s, offset))
        return decline(o, python_take, rid);
    int outcome = take(o, s.p, id);
    leave(o, &s);
    if (outcome != DONE) /* the Python operation raises BusyError, StaleError, ... */
        return decline(o, python_take, rid);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ops_give_back_doc,
"give_back(rid, max_idle, max_live, in_turn, borrowers, /) -> bool: _availability.give_back\n"
"in one call where nobody waits (else Pool._give_back).");

/* The Python operation, Pool._give_back(rid, max_idle, max_live, in_turn, borrowers). */
static PyObject *decline_give_back(const Operations *o, PyObject *const *args)
{
    if (o->pool == NULL) {
        PyErr_SetString(PyExc_ValueError, "Operations is not initialised");
        return NULL;
    }
    PyObject *call[6] = {o->pool, args[0], args[1], args[2], args[3], args[4]};
    return PyObject_VectorcallMethod(python_give_back, call, 6, NULL);
}

static PyObject *Operations_give_back(Operations *o, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t v[5]; /* node, generation, epoch, max_idle, max_live */
    Py_ssize_t offset;
    Slot s;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "give_back takes 5 arguments");
        return NULL;
    }
    if (!usable(o) || !parse_rid(o, args[0], v, &offset) || !small(args[1], UINT32_MAX, &v[3]) ||
        !small(args[2], UINT32_MAX, &v[4]) || !enter(o, &s, offset))
        return decline_give_back(o, args);
    int outcome = give_back(o, s.view.buf, s.p, v);
    leave(o, &s);
    if (outcome != DONE)
        return decline_give_back(o, args);
    Py_RETURN_TRUE;
}

#endif /* ORBIT_POOL_AVAILABILITY_H */
