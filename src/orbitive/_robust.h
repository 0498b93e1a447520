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

/* Section block offsets, mirrored in _section.py. */
enum { SECTION_RECOVERIES_AT = 16, SECTION_MUTEX_AT = 64, SECTION_BYTES = 4096 };

/* Lock the mutex at block + SECTION_MUTEX_AT. Tries with the GIL held, and waits
 * for another holder with the GIL released. Returns 0, or an errno value
 * (ENOTRECOVERABLE: a holder unlocked an EOWNERDEAD mutex without repairing it). */
static inline int robust_lock(uint8_t *block)
{
    pthread_mutex_t *mutex = (pthread_mutex_t *)(block + SECTION_MUTEX_AT);
    int rc = pthread_mutex_trylock(mutex);
    if (rc == EBUSY) {
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

static inline int robust_unlock(uint8_t *block)
{
    return pthread_mutex_unlock((pthread_mutex_t *)(block + SECTION_MUTEX_AT));
}

/* Set the error for a failed lock or unlock (the section is unusable). */
static inline void robust_error(int rc)
{
    PyErr_Format(PyExc_OSError, "the section mutex failed: %s", strerror(rc));
}

#endif
