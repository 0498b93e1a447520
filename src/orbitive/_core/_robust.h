/* orbitive/_core/_robust.h: the robust process-shared mutexes of a region's section block.
 *
 * The C twin of _robust.py's RobustMutex: lock, recover, unlock in the same order.
 * A block holds one mutex per stripe (a lock table's state has several, every
 * other region one), each in its own cache line; stripe i is at
 * SECTION_MUTEX_AT + i * SECTION_STRIPE_BYTES.
 * Included by _robust.c and by the tables' _fastpath.c, so that a hot step takes
 * the section itself. The mutex lives in shared memory (docs/format.md, "Section
 * block"); the kernel's robust list hands it on when its holder dies, and the
 * next locker sees EOWNERDEAD, marks it consistent (every table step is crash-safe
 * by its own write order, so no other repair is needed) and counts the recovery.
 * Each lock adds its repair to the caller's count, and the step reports the count
 * once it has left the section (robust_report), so that no log handler runs inside
 * a section.
 */
#ifndef ORBITIVE_ROBUST_H
#define ORBITIVE_ROBUST_H

#include <Python.h>
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Section block offsets, mirrored in _robust.py (compared by tests/core/test_layout_constants.py). */
enum {
    SECTION_RECOVERIES_AT = 16,
    SECTION_MUTEX_AT = 64,
    SECTION_STRIPE_BYTES = 64,
    SECTION_STRIPES_MAX = 63,
    SECTION_BYTES = 4096
};

static inline pthread_mutex_t *robust_mutex(uint8_t *block, int stripe)
{
    return (pthread_mutex_t *)(block + SECTION_MUTEX_AT + stripe * SECTION_STRIPE_BYTES);
}

/* The futex word's owner bits and its owner-died bit (linux/futex.h). */
#define ROBUST_TID_MASK 0x3fffffffu
#define ROBUST_OWNER_DIED 0x40000000u

#ifdef __GLIBC__
/* The type word glibc's pthread_mutex_init writes for our attributes (-1 until known).
 * glibc reads it on every lock and unlock: a foreign value makes it treat the bytes
 * as another kind of mutex (process-private, not robust, priority-inheriting), which
 * would wedge or abort; robust_lock refuses such a mutex instead. */
static inline int robust_kind(void)
{
    static int kind = -1;
    if (kind == -1) {
        pthread_mutexattr_t attr;
        pthread_mutex_t probe;
        if (pthread_mutexattr_init(&attr) != 0)
            return -1;
        if (pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) == 0 &&
            pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) == 0 &&
            pthread_mutex_init(&probe, &attr) == 0) {
            kind = probe.__data.__kind;
            pthread_mutex_destroy(&probe);
        }
        pthread_mutexattr_destroy(&attr);
    }
    return kind;
}
static inline int robust_kind_ok(const pthread_mutex_t *mutex)
{
    return mutex->__data.__kind == robust_kind();
}
static inline void robust_kind_restore(pthread_mutex_t *mutex)
{
    mutex->__data.__kind = robust_kind();
}
#else /* no known type word: sections of such C libraries use flock (_section.py) */
static inline int robust_kind_ok(const pthread_mutex_t *mutex) { return mutex != NULL; }
static inline void robust_kind_restore(pthread_mutex_t *mutex) { (void)mutex; }
#endif

/* Whether the futex word names this very thread as a live holder (a forged word, or a
 * re-entry from this thread): a wait for it would never end. */
static inline int robust_names_me(pthread_mutex_t *mutex)
{
    uint32_t word = __atomic_load_n((uint32_t *)mutex, __ATOMIC_RELAXED);
    return (word & ROBUST_TID_MASK) == (uint32_t)syscall(SYS_gettid) && !(word & ROBUST_OWNER_DIED);
}

/* At most this many entries of a thread's robust list are read (the kernel's own bound). */
#define ROBUST_LIST_MAX 2048

/* Whether this thread holds the mutex at this very address: 1 yes, 0 no, -1 unknown.
 * One object mapped twice in a process (the block of a closed store that the garbage
 * collector frees later, a parent's mapping a forked child inherited) has one futex word
 * at two addresses, so a word naming this thread (robust_names_me) says only that it
 * holds the mutex through some mapping. glibc links a robust mutex into its locker's
 * robust list through the address it was locked at (&__data.__list.__next, the low bit
 * a flag): this thread's list, read from the head the kernel has for it
 * (get_robust_list), says which. Its entries are mutexes this thread holds, all mapped.
 * Unknown: the list could not be read, or is longer than ROBUST_LIST_MAX. */
static inline int robust_linked_here(pthread_mutex_t *mutex)
{
#ifdef __GLIBC__
    struct robust_list_head *head = NULL;
    size_t size = 0;
    if (syscall(SYS_get_robust_list, 0, &head, &size) != 0 || head == NULL)
        return -1;
    uintptr_t end = (uintptr_t)&head->list, here = (uintptr_t)&mutex->__data.__list.__next;
    uintptr_t entry = (uintptr_t)head->list.next;
    for (int n = 0; n < ROBUST_LIST_MAX; n++) {
        entry &= ~(uintptr_t)1;
        if (entry == end)
            return 0;
        if (entry == here)
            return 1;
        entry = (uintptr_t)((struct robust_list *)entry)->next;
    }
#else
    (void)mutex;
#endif
    return -1;
}

/* Whether the futex word names a live thread of this process (this one included) as holder. */
static inline int robust_held_here(pthread_mutex_t *mutex)
{
    uint32_t word = __atomic_load_n((uint32_t *)mutex, __ATOMIC_RELAXED);
    pid_t tid = (pid_t)(word & ROBUST_TID_MASK);
    return tid != 0 && !(word & ROBUST_OWNER_DIED) && syscall(SYS_tgkill, getpid(), tid, 0) == 0;
}

/* Wait for a mutex another thread holds, in slices of ROBUST_SLICE_NS: a wake can be
 * lost (the kernel hands a dead holder's mutex on with one wake, and the woken waiter
 * may be killed too before it takes the mutex), and a waiter that only slept until
 * woken would then sleep for ever while the mutex is free. Before each slice the
 * mutex is checked as on entry: a futex word naming this thread is EDEADLK; while
 * the type word is foreign and the mutex held, the holder puts it back before it
 * unlocks (robust_unlock), so the waiter sleeps a slice without handing glibc the
 * bytes; foreign and unheld (or its holder dead), EINVAL. */
#define ROBUST_SLICE_NS 50000000L
static inline int robust_wait(pthread_mutex_t *mutex)
{
    for (;;) {
        if (robust_names_me(mutex))
            return EDEADLK;
        struct timespec until;
        if (!robust_kind_ok(mutex)) {
            uint32_t word = __atomic_load_n((uint32_t *)mutex, __ATOMIC_RELAXED);
            if (!(word & ROBUST_TID_MASK) || (word & ROBUST_OWNER_DIED))
                return EINVAL;
            until.tv_sec = 0;
            until.tv_nsec = ROBUST_SLICE_NS;
            nanosleep(&until, NULL);
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += ROBUST_SLICE_NS;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        int rc = pthread_mutex_clocklock(mutex, CLOCK_MONOTONIC, &until);
        if (rc != ETIMEDOUT)
            return rc;
    }
}

/* Lock the mutex of one stripe; one repaired (EOWNERDEAD) adds 1 to *repaired. Tries
 * with the GIL held, and waits for another holder with the GIL released. Returns 0,
 * or an errno value:
 * EINVAL when the mutex's type word is not the one this mutex was made with
 * (corrupt bytes), EDEADLK when its futex word names this very thread, before or
 * while it waits (robust_names_me), ENOTRECOVERABLE when a holder unlocked an
 * EOWNERDEAD mutex without repairing it. */
static inline int robust_lock(uint8_t *block, int stripe, int *repaired)
{
    pthread_mutex_t *mutex = robust_mutex(block, stripe);
    if (!robust_kind_ok(mutex))
        return EINVAL;
    int rc = pthread_mutex_trylock(mutex);
    if (rc == EBUSY) {
        Py_BEGIN_ALLOW_THREADS
        rc = robust_wait(mutex);
        Py_END_ALLOW_THREADS
    }
    if (rc == EOWNERDEAD) {
        rc = pthread_mutex_consistent(mutex);
        if (rc == 0) { /* atomic: another stripe's holder may count one at the same time */
            __atomic_add_fetch((uint64_t *)(block + SECTION_RECOVERIES_AT), 1, __ATOMIC_RELAXED);
            ++*repaired;
        }
    }
    return rc;
}

/* Report the step's repairs, if any, as report(*repaired), and set *repaired to 0.
 * A step calls it once it has left the section. The error indicator (the step's own
 * error) is kept as it was; a report that fails is written as unraisable, since a
 * repair is news, never the step's failure. */
static inline void robust_report(PyObject *report, int *repaired)
{
    int count = *repaired;
    if (count == 0)
        return;
    *repaired = 0;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *raised = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
#endif
    PyObject *done = PyObject_CallFunction(report, "i", count);
    if (done == NULL)
        PyErr_WriteUnraisable(report);
    Py_XDECREF(done);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(raised);
#else
    PyErr_Restore(type, value, trace);
#endif
}

/* Unlock. A type word changed while this thread held the mutex is put back first
 * (it is a constant, and the holder may write the mutex): unlocked as another kind
 * of mutex, it would wake no waiter of another process, and they would wait for ever. */
static inline int robust_unlock(uint8_t *block, int stripe)
{
    pthread_mutex_t *mutex = robust_mutex(block, stripe);
    if (!robust_kind_ok(mutex))
        robust_kind_restore(mutex);
    return pthread_mutex_unlock(mutex);
}

/* Unlock stripes hi down to lo. Returns 0, or the first failure's errno value. */
static inline int robust_unlock_range(uint8_t *block, int lo, int hi)
{
    int failed = 0;
    for (int stripe = hi; stripe >= lo; stripe--) {
        int rc = robust_unlock(block, stripe);
        if (rc != 0 && failed == 0)
            failed = rc;
    }
    return failed;
}

/* Lock stripes lo up to hi, in ascending order (every locker takes stripes in
 * that order, so none waits in a cycle), counting repairs in *repaired. On a failure
 * the stripes already taken are unlocked again. Returns 0, or robust_lock's errno value. */
static inline int robust_lock_range(uint8_t *block, int lo, int hi, int *repaired)
{
    for (int stripe = lo; stripe <= hi; stripe++) {
        int rc = robust_lock(block, stripe, repaired);
        if (rc != 0) {
            robust_unlock_range(block, lo, stripe - 1);
            return rc;
        }
    }
    return 0;
}

/* Make a block's mapping safe to unmap; returns 1 when it must stay mapped instead.
 *
 * glibc links every robust mutex a thread holds into that thread's robust list,
 * through the mutex's own bytes: the thread's next lock of any robust mutex writes
 * into the list's head, an unlock writes into its neighbours, and the kernel walks
 * the list when the thread exits. A mapping unmapped under a held mutex leaves a
 * dangling entry, and those writes land in whatever is mapped there later, or fault.
 * So the stripes this thread holds through this block are unlocked (the step that
 * held them was abandoned with its last reference; the table's write order makes
 * that as safe as a crash), and while another live thread of this process holds one,
 * the block stays mapped for good (a leaked page, never a write into freed memory).
 * A stripe this thread holds through another mapping of the object is that mapping's
 * hold, in a step still running: left as it is (unlocked here, the section would let
 * other processes in under the step, and the step's own unlock would fail with
 * EPERM). When the robust list cannot tell, the stripe is left held and the block
 * mapped. */
static inline int robust_before_unmap(uint8_t *block, int stripes)
{
    int keep = 0;
    for (int stripe = stripes - 1; stripe >= 0; stripe--) {
        pthread_mutex_t *mutex = robust_mutex(block, stripe);
        if (robust_names_me(mutex)) {
            int linked = robust_linked_here(mutex);
            if (linked > 0)
                robust_unlock(block, stripe);
            else if (linked < 0)
                keep = 1;
        } else if (robust_held_here(mutex)) {
            keep = 1;
        }
    }
    return keep;
}

/* Hold a writable view of a section block (the mapping stays mapped while it is held).
 * Returns 0, or -1 with ValueError (too small) or the buffer protocol's error. */
static inline int robust_block_hold(PyObject *block, Py_buffer *view)
{
    if (PyObject_GetBuffer(block, view, PyBUF_WRITABLE) < 0)
        return -1;
    if (view->len < SECTION_BYTES) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "a section block is smaller than its layout");
        return -1;
    }
    return 0;
}

/* Set OSError(rc, ...) for a failed lock or unlock (the section is unusable). */
static inline void robust_error(int rc)
{
    PyObject *args = Py_BuildValue("(is)", rc, strerror(rc));
    if (args != NULL) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
}

#endif
