/* Survivable faults in shared mappings. Touching a page of a MAP_SHARED mapping past the end
 * of its object raises SIGBUS, and a client can shrink (ftruncate) a shared-memory object it
 * registered at any moment, also while a model reads it. Each watched range is looked up by
 * the SIGBUS handler: a fault inside one maps private zero pages over the rest of the range,
 * so the faulting access completes, and marks the range faulted, so the request that used it
 * can be failed. A fault anywhere else goes to the handler that was there before (Python's
 * faulthandler, or the default action). */
#ifndef OI_SERVER_SHM_SHM_GUARD_H
#define OI_SERVER_SHM_SHM_GUARD_H

#include <stdatomic.h>
#include <stddef.h>

/* Ranges watched at once in the process; past that, oi_shm_guard_add refuses. */
#define OI_SHM_GUARD_SLOTS 8192

/* Watches [start, start + len) (page-aligned start) until oi_shm_guard_remove; `faulted` (set
 * to 1 by a fault in the range) must stay valid as long. Installs the handler on first use.
 * Returns 0, or -1 when OI_SHM_GUARD_SLOTS ranges are watched or the handler cannot be
 * installed. */
int oi_shm_guard_add(void *start, size_t len, atomic_int *faulted);

/* Stops watching the range that starts at `start`; call before unmapping it. */
void oi_shm_guard_remove(void *start);

#endif
