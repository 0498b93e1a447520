/* orbitive.pool._fastpath, part 3: a client pool owner's idle checkout and return,
 * Operations.take and Operations.give_back, the C twins of take and give_back in
 * pool/_availability.py (same checks, same writes, in the same order), with the
 * census and the keep-or-retire decision (census, Census's methods and _keep) that
 * give_back needs while a process waits on the key or max_idle is below max_live.
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

/* give_back's outcome when the client is not kept: the caller retires it. */
enum { RETIRE = -5 };

/* _availability.Census: one key at one moment, counted in the section. live_by_node
 * is the Operations' own array, valid until its next census (one thread at a time
 * holds the section). */
typedef struct {
    int64_t live, idle, creating;
    const uint8_t *waiters; /* u32 per node, in the key slot */
    const uint32_t *live_by_node;
} Census;

static uint32_t waiters_of(const Census *c, Py_ssize_t node) { return ld32(c->waiters + 4 * node); }

/* _availability.census: the key's LIVE members' count and free units, per node too, its
 * creation claims and its waiter counters. */
static void census(const Operations *o, const uint8_t *b, uint64_t index, Census *c)
{
    const uint8_t *k = b + o->key_base + (Py_ssize_t)index * o->key_stride;
    const uint8_t *members = k + o->key_members;
    Py_ssize_t slots = o->fleet_capacity * o->lane_capacity;
    c->live = c->idle = c->creating = 0;
    memset(o->live_by_node, 0, (size_t)o->fleet_capacity * sizeof(uint32_t));
    for (Py_ssize_t word = 0; word * 64 < slots; word++) {
        uint64_t bits = ld64(members + 8 * word);
        while (bits) {
            Py_ssize_t global_index = word * 64 + __builtin_ctzll(bits);
            bits &= bits - 1;
            if (global_index >= slots) /* past the last resource slot (damage) */
                break;
            const uint8_t *p = b + o->first + global_index * RESOURCE_SIZE;
            if (p[0] != LIVE)
                continue;
            int free;
            find_entry(p, 0, &free);
            int64_t reserved = PENDING - free;
            int64_t spare = (int64_t)ld32(p + CAPACITY_AT) - reserved - ld32(p + ACTIVE_AT);
            c->live++;
            c->idle += spare > 0 ? spare : 0;
            o->live_by_node[global_index / o->lane_capacity]++;
        }
    }
    for (Py_ssize_t n = 0; n < o->fleet_capacity; n++)
        c->creating += ld32(k + o->key_claims + 4 * n);
    c->waiters = k + o->key_waiters;
    c->live_by_node = o->live_by_node;
}

/* Census.others_waiting: waiters of every node but `node`. */
static int64_t others_waiting(const Operations *o, const Census *c, Py_ssize_t node)
{
    int64_t sum = 0;
    for (Py_ssize_t n = 0; n < o->fleet_capacity; n++)
        sum += n == node ? 0 : waiters_of(c, n);
    return sum;
}

/* Census.poorer_waiting: another node waits that holds fewer live clients than `node`. */
static int poorer_waiting(const Operations *o, const Census *c, Py_ssize_t node)
{
    uint32_t mine = c->live_by_node[node];
    for (Py_ssize_t other = 0; other < o->fleet_capacity; other++)
        if (waiters_of(c, other) && other != node && c->live_by_node[other] < mine)
            return 1;
    return 0;
}

/* Census.fair_share: clients one demanding node (waiting, or holding a live client) may
 * keep while others wait, at least one. */
static int64_t fair_share(const Operations *o, const Census *c, uint64_t max_live)
{
    int64_t demanding = 0;
    for (Py_ssize_t n = 0; n < o->fleet_capacity; n++)
        demanding += waiters_of(c, n) || c->live_by_node[n];
    int64_t share = (int64_t)max_live / (demanding > 1 ? demanding : 1);
    return share > 1 ? share : 1;
}

/* _availability._keep: whether a finished client of `node` stays idle. */
static int keep(const Operations *o, const Census *c, Py_ssize_t node, uint64_t max_idle,
                uint64_t max_live, int in_turn)
{
    int at_max = c->live + c->creating >= (int64_t)max_live;
    if (!in_turn && others_waiting(o, c, node) && at_max) {
        uint32_t own = waiters_of(c, node);
        uint32_t mine = c->live_by_node[node];
        return own && mine <= fair_share(o, c, max_live) && !poorer_waiting(o, c, node);
    }
    return c->idle < (int64_t)max_idle;
}

/* _availability.give_back for v = (node, generation, epoch, max_idle, max_live, in_turn,
 * borrowers): DONE (the unit is free again, the waiters that can take it woken), RETIRE
 * (the unit stays active: the caller closes the client), or DECLINED: the Python step
 * decides (not ours or not LIVE, or a damaged key index). */
static int give_back(const Operations *o, uint8_t *b, uint8_t *p, const uint64_t *v)
{
    uint64_t index = ld32(p + KEY_INDEX_AT);
    if (!owned_live(o, p, v) || index >= (uint64_t)o->key_capacity)
        return DECLINED;
    const uint8_t *waiters = b + o->key_base + (Py_ssize_t)index * o->key_stride + o->key_waiters;
    int anyone = 0;
    for (Py_ssize_t n = 0; n < o->fleet_capacity && !anyone; n++)
        anyone = ld32(waiters + 4 * n) != 0;
    Census c;
    /* Fast path: nobody waits and max_idle cannot be reached (idle < live <= max_live). */
    if (anyone || v[3] < v[4]) {
        census(o, b, index, &c);
        if (!keep(o, &c, (Py_ssize_t)o->node, v[3], v[4], (int)v[5]))
            return RETIRE;
    }
    uint32_t active = ld32(p + ACTIVE_AT);
    st32(p + ACTIVE_AT, active ? active - 1 : 0);
    if (ld32(waiters + 4 * (Py_ssize_t)o->node) || (v[6] && anyone))
        key_changed(o, b, index);
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
"in one call (else Pool._give_back).");

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
    uint64_t v[7]; /* node, generation, epoch, max_idle, max_live, in_turn, borrowers */
    Py_ssize_t offset;
    Slot s;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "give_back takes 5 arguments");
        return NULL;
    }
    if (!usable(o) || !parse_rid(o, args[0], v, &offset) || !small(args[1], UINT32_MAX, &v[3]) ||
        !small(args[2], UINT32_MAX, &v[4]) || !PyBool_Check(args[3]) || !PyBool_Check(args[4]) ||
        !enter(o, &s, offset))
        return decline_give_back(o, args);
    v[5] = args[3] == Py_True;
    v[6] = args[4] == Py_True;
    int outcome = give_back(o, s.view.buf, s.p, v);
    leave(o, &s);
    if (outcome == DECLINED)
        return decline_give_back(o, args);
    return PyBool_FromLong(outcome == DONE);
}

#endif /* ORBIT_POOL_AVAILABILITY_H */
