/* orbitive.lock._fastpath, part 1: the types and the byte steps, twin of lock/_steps.py.
 *
 * Included once, by lock/_fastpath.c (one translation unit: these are static).
 * Each step does to the state table and the ring what the ReferenceSteps method
 * its comment names does in lock/_steps.py, in the same order of writes; the
 * caller holds the stripes the step reads (the stripes section below).
 */
#ifndef ORBIT_LOCK_STEPS_H
#define ORBIT_LOCK_STEPS_H

/* Layouts: docs/format.md, lock/_layout.py, lock/_events.py and _ring.py. */
enum { EMPTY = 0, OCCUPIED = 1, TOMBSTONE = 2 };
enum { STATE_HEADER = 128, SLOT_HEADER = 48, MAX_PROBE_AT = 20, TOKEN_AT = 64, REVISION_AT = 72 };
enum { CONFLICTS_AT = 80 };
enum { RING_HEADER = 64, LANE_HEAD = 64, FRAME_HEADER = 32, EVENT_HEADER = 35 };
enum { GENERATION_AT = 24, KEY_WORD_AT = 8, ACQUIRED = 1, RENEWED = 2, RELEASED = 3 };
#define ANY_KEY UINT32_C(0xFFFFFFFF) /* _ring.ANY_KEY */
#define EVENT_MAGIC UINT32_C(0x4F4C434B)
#define EVENT_VERSION 1
#define TOKEN_MASK ((UINT64_C(1) << 40) - 1)
#define COUNTER_LIMIT (UINT64_C(1) << 62)
#define TTL_MAX_S 1e9 /* _clock.TTL_MAX_S */
#define ROUND64(n) (((n) + 63) / 64 * 64) /* _ring._round_up(n, 64) */

/* Step outcomes. */
enum { DONE = 0, BUSY = 1, FULL = 2, EXHAUSTED = 3, CORRUPT = 4, ABSENT = 5 };

/* The stripes a step holds: lo..hi, none while hi < lo; the probe bound they cover
 * (max_probe as read when they were held: it may grow after, for other keys); and
 * the stripe mutexes it repaired, reported once it has let go (robust_report). */
typedef struct {
    int lo, hi;
    Py_ssize_t span;
    int repaired;
} Held;

/* The value types of _types.py, and where their slots live in an instance. */
typedef struct {
    PyTypeObject *key, *owner, *lease, *acquired, *occupied;
    Py_ssize_t digest_at, ident_at, namespace_at, value_at, acquired_lease_at, occupied_lease_at;
} Types;

typedef struct {
    PyObject_HEAD
    PyObject *state; /* the state table's mmap */
    PyObject *ring;  /* the transition ring's mmap */
    Py_buffer block; /* the state object's section block, held for life */
    PyObject *wake;  /* the ring's Channel.signal: called when a readiness socket is armed */
    PyObject *fork_dict, *generation; /* _fork's globals, and its generation at creation */
    PyObject *table, *table_dict;     /* the LockTable, and _steps's globals (crash_hook) */
    PyObject *repaired; /* the state region's report_repaired: a dead holder's stripes */
    Types types;
    Py_ssize_t capacity, stride, payload_max;
    Py_ssize_t lanes, waiting_at, heads_at, slots_at, ring_capacity, ring_stride, frame_bytes;
    Py_ssize_t node, stripe_slots;
    uint64_t id_base;
    int stripes, closed, ready;
} Steps;

typedef struct {
    Py_buffer sb, rb;
    uint8_t *s, *r;
} Maps;

/* The key, owner and times of one step, as the caller passed them. */
typedef struct {
    uint64_t digest, now, expires, lock_id;
    const uint8_t *ident, *owner;
    Py_ssize_t ident_len, ns_len, owner_len, node;
    PyObject *key, *owner_obj; /* borrowed: the caller's LockKey and LockOwner */
} Entry;

static inline uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void st16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
/* Stores before it are visible before stores after it (seqlock and commit order). */
static inline void fence(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }

static inline uint8_t *slot_at(const Steps *t, uint8_t *s, Py_ssize_t slot)
{
    return s + STATE_HEADER + slot * t->stride;
}

static int empty_head(const uint8_t *p)
{
    static const uint8_t zero[8];
    return memcmp(p, zero, 8) == 0;
}

/* read_live: a valid, unexpired OCCUPIED entry. */
static int live(const Steps *t, const uint8_t *p, uint64_t now)
{
    Py_ssize_t ns = ld16(p + 2), lb = ld16(p + 4), ow = ld16(p + 6);
    uint64_t acquired = ld64(p + 32), expires = ld64(p + 40);
    return p[0] == OCCUPIED && ns && lb && ow && ns + lb + ow <= t->payload_max &&
           acquired < expires && expires > now;
}

/* holds_key: the live entry at p stores exactly e's key. */
static int holds_key(const uint8_t *p, const Entry *e)
{
    return ld64(p + 8) == e->digest && ld16(p + 2) == e->ns_len &&
           ld16(p + 4) == e->ident_len - e->ns_len &&
           memcmp(p + SLOT_HEADER, e->ident, (size_t)e->ident_len) == 0;
}

/* tombstone: mark slot TOMBSTONE; a run of tombstones before an EMPTY slot turns EMPTY. */
static void tombstone(const Steps *t, uint8_t *s, Py_ssize_t slot, uint64_t digest)
{
    Py_ssize_t mask = t->capacity - 1;
    Py_ssize_t floor = (Py_ssize_t)(digest & (uint64_t)mask) & ~(t->stripe_slots - 1);
    slot_at(t, s, slot)[0] = TOMBSTONE;
    if (!empty_head(slot_at(t, s, (slot + 1) & mask)))
        return;
    for (Py_ssize_t i = ((slot - floor) & mask) + 1; i > 0; i--) {
        uint8_t *p = slot_at(t, s, slot);
        if (p[0] != TOMBSTONE)
            return;
        memset(p, 0, 8);
        slot = (slot - 1) & mask;
    }
}

/* bound: the stored max_probe, read as at most capacity - 1. */
static Py_ssize_t bound(const Steps *t, const uint8_t *s)
{
    uint32_t stored = __atomic_load_n((const uint32_t *)(s + MAX_PROBE_AT), __ATOMIC_ACQUIRE);
    return stored < (uint64_t)(t->capacity - 1) ? (Py_ssize_t)stored : t->capacity - 1;
}

/* free_after: the first slot of count from slot on holding no live entry, else capacity. */
static Py_ssize_t free_after(const Steps *t, uint8_t *s, Py_ssize_t slot, Py_ssize_t count,
                             const Entry *e)
{
    Py_ssize_t mask = t->capacity - 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint8_t *p = slot_at(t, s, slot);
        if (p[0] != OCCUPIED)
            return slot;
        if (!live(t, p, e->now)) {
            tombstone(t, s, slot, e->digest);
            return slot;
        }
        slot = (slot + 1) & mask;
    }
    return t->capacity;
}

/* probe: the slot of the key's live entry, else ~insertion_slot (~capacity: none).
 * Stops at EMPTY or after limit + 1 slots (limit: the bound the held stripes cover,
 * never max_probe read again, which another stripe's insert may have raised since).
 * Past those, free_after may read any slot: without every stripe held (!all) the
 * probe stops there and sets *wider. */
static Py_ssize_t probe(const Steps *t, uint8_t *s, const Entry *e, Py_ssize_t limit, int all,
                        int *wider)
{
    Py_ssize_t mask = t->capacity - 1, slot = (Py_ssize_t)(e->digest & (uint64_t)mask);
    Py_ssize_t insert_at = t->capacity;
    for (Py_ssize_t i = 0; i <= limit; i++) {
        uint8_t *p = slot_at(t, s, slot);
        if (p[0] == EMPTY && empty_head(p))
            return ~(insert_at < t->capacity ? insert_at : slot);
        if (p[0] == OCCUPIED) {
            if (live(t, p, e->now)) {
                if (holds_key(p, e))
                    return slot;
                slot = (slot + 1) & mask;
                continue;
            }
            tombstone(t, s, slot, e->digest);
        }
        if (insert_at == t->capacity)
            insert_at = slot;
        slot = (slot + 1) & mask;
    }
    if (insert_at < t->capacity)
        return ~insert_at;
    if (!all) {
        *wider = 1;
        return ~t->capacity;
    }
    return ~free_after(t, s, slot, mask - limit, e);
}

/* publish (Ring.publish plus Channel.bump): one lock-event frame in the node's lane.
 * *wake: a readiness socket is armed (the ring's Channel.signal signals it). */
static int publish(const Steps *t, uint8_t *r, const Entry *e, uint8_t kind, uint64_t revision,
                   uint64_t t1, uint64_t t2, int *wake)
{
    uint8_t *head = r + t->heads_at + e->node * LANE_HEAD;
    uint64_t counter = ld64(head);
    Py_ssize_t body = e->ident_len + e->owner_len;
    if (counter >= COUNTER_LIMIT || EVENT_HEADER + body > t->frame_bytes)
        return CORRUPT;
    Py_ssize_t index = (Py_ssize_t)(counter & (uint64_t)(t->ring_capacity - 1));
    uint8_t *f = r + t->slots_at + (e->node * t->ring_capacity + index) * t->ring_stride;
    st64(f, 2 * counter + 1);
    fence();
    st64(f + 8, counter);
    st64(f + 16, revision);
    st32(f + 24, (uint32_t)(EVENT_HEADER + body));
    f[28] = kind;
    memset(f + 29, 0, 3);
    uint8_t *h = f + FRAME_HEADER;
    st32(h, EVENT_MAGIC);
    h[4] = EVENT_VERSION;
    st16(h + 5, (uint16_t)e->ns_len);
    st16(h + 7, (uint16_t)(e->ident_len - e->ns_len));
    st16(h + 9, (uint16_t)e->owner_len);
    st64(h + 11, e->lock_id);
    st64(h + 19, t1);
    st64(h + 27, t2);
    memcpy(h + EVENT_HEADER, e->ident, (size_t)e->ident_len);
    memcpy(h + EVENT_HEADER + e->ident_len, e->owner, (size_t)e->owner_len);
    fence();
    st64(f, 2 * counter + 2);
    fence();
    st64(head, counter + 1);
    fence();
    /* Sequentially consistent, and so a full barrier: the armed bytes are read after it. */
    __atomic_add_fetch((uint32_t *)(r + GENERATION_AT), 1, __ATOMIC_SEQ_CST);
    *wake = 0;
    for (Py_ssize_t n = 0; n < t->lanes; n++)
        if (r[RING_HEADER + n]) {
            *wake = 1;
            break;
        }
    return DONE;
}

/* _ring.key_tag: what a waiting slot holds for the key of digest. */
static uint32_t key_tag(uint64_t digest)
{
    uint32_t tag = (uint32_t)digest;
    return tag != 0 && tag != ANY_KEY ? tag : 1;
}

/* Ring.key_released: after a release, the nodes waiting for e's key (their waiting slot
 * holds its tag, or any key); when there are some, the key word of its bucket + 1, and
 * *word set to it for one FUTEX_WAKE once the stripes are let go. *left: the key word
 * as the release left it. The slots are read under the stripes the waiter's own
 * attempt took, which orders them (lock/_key_wait.py). */
static long key_released(const Steps *t, uint8_t *r, const Entry *e, uint32_t **word,
                         uint32_t *left)
{
    uint32_t tag = key_tag(e->digest);
    const uint8_t *slots = r + t->waiting_at;
    Py_ssize_t bucket = (Py_ssize_t)(e->digest % (uint64_t)t->lanes);
    uint32_t *key_word = (uint32_t *)(r + t->heads_at + bucket * LANE_HEAD + KEY_WORD_AT);
    long waiting = 0;
    for (Py_ssize_t n = 0; n < t->lanes; n++) {
        uint32_t v = ld32(slots + 4 * n);
        waiting += v == tag || v == ANY_KEY;
    }
    if (waiting) {
        *word = key_word;
        *left = __atomic_add_fetch(key_word, 1, __ATOMIC_SEQ_CST);
    } else {
        *left = __atomic_load_n(key_word, __ATOMIC_RELAXED);
    }
    return waiting;
}

/* The insert half of insert (raise_bound, then the slot): max_probe raised, then TOMBSTONE, rewrite, OCCUPIED last. */
static void write_slot(const Steps *t, uint8_t *s, Py_ssize_t slot, const Entry *e,
                       uint64_t revision)
{
    uint64_t mask = (uint64_t)(t->capacity - 1);
    Py_ssize_t displacement = (Py_ssize_t)(((uint64_t)slot - e->digest) & mask);
    uint32_t *word = (uint32_t *)(s + MAX_PROBE_AT);
    uint32_t stored = __atomic_load_n(word, __ATOMIC_RELAXED);
    while ((Py_ssize_t)stored < displacement &&
           !__atomic_compare_exchange_n(word, &stored, (uint32_t)displacement, 0,
                                        __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ; /* another stripe's step changed it meanwhile: compare again */
    fence();
    uint8_t *p = slot_at(t, s, slot);
    p[0] = TOMBSTONE;
    fence();
    p[1] = 0;
    st16(p + 2, (uint16_t)e->ns_len);
    st16(p + 4, (uint16_t)(e->ident_len - e->ns_len));
    st16(p + 6, (uint16_t)e->owner_len);
    st64(p + 8, e->digest);
    st64(p + 16, e->lock_id);
    st64(p + 24, revision);
    st64(p + 32, e->now);
    st64(p + 40, e->expires);
    memcpy(p + SLOT_HEADER, e->ident, (size_t)e->ident_len);
    memcpy(p + SLOT_HEADER + e->ident_len, e->owner, (size_t)e->owner_len);
    fence();
    p[0] = OCCUPIED;
}

/* rewrite: renew the live entry at p in place, OCCUPIED throughout: the revision, then
 * the expiry, each one aligned 8-byte store (a slot starts 128 + a multiple of the
 * stride, itself a multiple of 8, past the page-aligned mapping), so a process killed
 * at any instruction leaves the entry live with its old expiry or its new one. */
static void rewrite(uint8_t *p, uint64_t revision, uint64_t expires)
{
    __atomic_store_n((uint64_t *)(p + 24), revision, __ATOMIC_RELAXED);
    fence();
    __atomic_store_n((uint64_t *)(p + 40), expires, __ATOMIC_RELAXED);
}

/* -- counters --------------------------------------------------------------------- */

static uint64_t load64(const uint8_t *p)
{
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_RELAXED);
}

/* next_ids for one counter: the u64 at p advanced by one, unless it has reached
 * limit (0 then). Atomic: steps holding other stripes advance it at the same time. */
static uint64_t advance(uint8_t *p, uint64_t limit)
{
    uint64_t *word = (uint64_t *)p, last = __atomic_load_n(word, __ATOMIC_RELAXED);
    do {
        if (last >= limit)
            return 0;
    } while (!__atomic_compare_exchange_n(word, &last, last + 1, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
    return last + 1;
}

/* ReferenceSteps.count_conflict: one more try_acquire found a live holder. Atomic, as
 * the other counters: steps holding other stripes count at the same time. */
static void count_conflict(uint8_t *s)
{
    __atomic_add_fetch((uint64_t *)(s + CONFLICTS_AT), 1, __ATOMIC_RELAXED);
}

/* -- stripes ------------------------------------------------------------------------ */

static int stripe_of(const Steps *t, Py_ssize_t slot) { return (int)(slot / t->stripe_slots); }

static int holds_all(const Steps *t, const Held *h) { return h->lo == 0 && h->hi == t->stripes - 1; }

static void let_go(Steps *t, Held *h)
{
    if (h->hi >= h->lo)
        robust_unlock_range(t->block.buf, h->lo, h->hi);
    h->lo = 0;
    h->hi = -1;
}

/* Hold the stripes of slots home .. home + span, every stripe when that wraps. The
 * stripes held already stay held and new ones above them are added, which keeps the
 * ascending order; else all are let go and taken again from the lowest. Returns 0,
 * or robust_lock's errno value (with nothing held). */
static int hold(Steps *t, Held *h, Py_ssize_t home, Py_ssize_t span)
{
    int lo = 0, hi = t->stripes - 1, rc;
    if (home + span < t->capacity) {
        lo = stripe_of(t, home);
        hi = stripe_of(t, home + span);
    }
    if (h->hi >= h->lo && lo >= h->lo) {
        if (hi <= h->hi)
            return 0;
        if ((rc = robust_lock_range(t->block.buf, h->hi + 1, hi, &h->repaired)) != 0)
            let_go(t, h);
        else
            h->hi = hi;
        return rc;
    }
    let_go(t, h);
    if ((rc = robust_lock_range(t->block.buf, lo, hi, &h->repaired)) == 0) {
        h->lo = lo;
        h->hi = hi;
    }
    return rc;
}

/* Hold the stripes e's probe reads: its home .. home + max_probe, recorded in h->span.
 * max_probe only grows, and a step that raises it for e's key holds e's home stripe:
 * read again once they are held, it is final for e unless it grew meanwhile, and then
 * more are held. Growing later, it is another key's: the probe keeps to h->span. */
static int cover(Steps *t, const uint8_t *s, const Entry *e, Held *h)
{
    Py_ssize_t home = (Py_ssize_t)(e->digest & (uint64_t)(t->capacity - 1));
    for (;;) {
        h->span = bound(t, s);
        int rc = hold(t, h, home, h->span);
        if (rc != 0 || bound(t, s) <= h->span)
            return rc;
    }
}

/* probe, with every stripe held when it must look past max_probe. *rc: a lock's errno. */
static Py_ssize_t probe_held(Steps *t, uint8_t *s, const Entry *e, Held *h, int *rc)
{
    int wider = 0;
    Py_ssize_t slot = probe(t, s, e, h->span, holds_all(t, h), &wider);
    if (wider) {
        if ((*rc = hold(t, h, 0, t->capacity)) != 0)
            return ~t->capacity;
        h->span = bound(t, s); /* every stripe held: no other step changes it now */
        slot = probe(t, s, e, h->span, 1, &wider);
    }
    return slot;
}

/* The live entry at p is e's tenure: its lock id and its stored owner. */
static int is_tenure(const uint8_t *p, const Entry *e)
{
    return ld64(p + 16) == e->lock_id && ld16(p + 6) == e->owner_len &&
           memcmp(p + SLOT_HEADER + e->ident_len, e->owner, (size_t)e->owner_len) == 0;
}

/* find_tenure: the slot holding exactly e's tenure (key, lock id, owner), or -1. */
static Py_ssize_t find_tenure(Steps *t, uint8_t *s, const Entry *e, Py_ssize_t hint, Held *h,
                              int *rc)
{
    if (hint == (Py_ssize_t)(e->digest & (uint64_t)(t->capacity - 1))) {
        uint8_t *p = slot_at(t, s, hint);
        if (live(t, p, e->now) && holds_key(p, e))
            return is_tenure(p, e) ? hint : -1;
    }
    Py_ssize_t slot = probe_held(t, s, e, h, rc);
    return slot >= 0 && is_tenure(slot_at(t, s, slot), e) ? slot : -1;
}

/* The revision for a release or renewal, advanced; 0 when the counters are exhausted. */
static uint64_t next_revision(uint8_t *s)
{
    return load64(s + TOKEN_AT) > TOKEN_MASK ? 0 : advance(s + REVISION_AT, UINT64_MAX);
}

#endif /* ORBIT_LOCK_STEPS_H */
