/* orbitive/_robust.h: the robust process-shared mutex of a region's section block.
 *
 * The C twin of _robust.py's RobustMutex: lock, recover, unlock in the same order.
 * Included by _robust.c and by the tables' _fastpath.c, so that a hot step takes
 * the section itself. The mutex lives in shared memory (docs/format.md, "Section
 * block"); the kernel's robust list hands it on when its holder dies, and the
 * next locker sees EOWNERDEAD, marks it consistent (every table step is crash-safe
 * by its own write order, so no other repair is needed) and counts the recovery.
 */
#ifndef ORBITIVE_ROBUST_H
#define ORBITIVE_ROBUST_H

#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Section block offsets, mirrored in _section.py. */
enum { SECTION_RECOVERIES_AT = 16, SECTION_MUTEX_AT = 64, SECTION_BYTES = 4096 };

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

/* Lock the mutex at block + SECTION_MUTEX_AT. Tries with the GIL held, and waits
 * for another holder with the GIL released. Returns 0, or an errno value:
 * EINVAL when the mutex's type word is not the one this mutex was made with
 * (corrupt bytes), EDEADLK when its futex word names this very thread (a forged
 * word, or a re-entry from this thread: waiting would never end), ENOTRECOVERABLE
 * when a holder unlocked an EOWNERDEAD mutex without repairing it. */
static inline int robust_lock(uint8_t *block)
{
    pthread_mutex_t *mutex = (pthread_mutex_t *)(block + SECTION_MUTEX_AT);
    if (!robust_kind_ok(mutex))
        return EINVAL;
    int rc = pthread_mutex_trylock(mutex);
    if (rc == EBUSY) {
        uint32_t word = __atomic_load_n((uint32_t *)mutex, __ATOMIC_RELAXED);
        if ((word & ROBUST_TID_MASK) == (uint32_t)syscall(SYS_gettid) &&
            !(word & ROBUST_OWNER_DIED))
            return EDEADLK;
        Py_BEGIN_ALLOW_THREADS
        rc = pthread_mutex_lock(mutex);
        Py_END_ALLOW_THREADS
    }
    if (rc == EOWNERDEAD) {
        rc = pthread_mutex_consistent(mutex);
        if (rc == 0) {
            uint64_t recoveries;
            memcpy(&recoveries, block + SECTION_RECOVERIES_AT, 8);
            recoveries++;
            memcpy(block + SECTION_RECOVERIES_AT, &recoveries, 8);
        }
    }
    return rc;
}

/* Unlock. A type word changed while this thread held the mutex is put back first
 * (it is a constant, and the holder may write the mutex): unlocked as another kind
 * of mutex, it would wake no waiter of another process, and they would wait for ever. */
static inline int robust_unlock(uint8_t *block)
{
    pthread_mutex_t *mutex = (pthread_mutex_t *)(block + SECTION_MUTEX_AT);
    if (!robust_kind_ok(mutex))
        robust_kind_restore(mutex);
    return pthread_mutex_unlock(mutex);
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
