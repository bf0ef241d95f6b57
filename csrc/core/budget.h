/* A server-wide budget of bytes (request bodies in flight: as received, and inflated), shared
 * by every loop and worker thread: a body is charged before its buffer is allocated and given
 * back when the buffer's last reference goes (oi_buf_charge), so that no mix of large and
 * compressed requests, however many at once, holds more than the budget. Lock-free: one
 * atomic counter. */
#ifndef OI_CORE_BUDGET_H
#define OI_CORE_BUDGET_H

#include <stdatomic.h>
#include <stddef.h>

#include "core/status.h"

typedef struct oi_budget_s {
    atomic_size_t used; /* bytes charged; its top bit is set once the owner let go */
    size_t limit;       /* 0: no limit (used is still counted) */
    const char *name;   /* the setting that sets limit, for errors: "max_inflight_body_bytes" (static) */
} oi_budget_t;

/* A new budget (its owner's reference), or NULL when out of memory. */
oi_budget_t *oi_budget_new(size_t limit, const char *name);

/* The owner lets go: the budget is freed now, or by the oi_budget_give that leaves nothing
 * charged (a buffer may outlive the server that charged it: a model keeps an input). No take
 * may follow. NULL is ignored. */
void oi_budget_release(oi_budget_t *b);

/* Takes `n` bytes: 0, or -1 when used + n would pass the limit (then nothing is taken). A
 * NULL budget always has room. Each 0 is matched by one oi_budget_give of the same n (or by
 * the release of a buffer charged with oi_buf_charge). */
int oi_budget_take(oi_budget_t *b, size_t n);

void oi_budget_give(oi_budget_t *b, size_t n);

/* The 503 for a `what` ("request body") of n bytes that the budget has no room for; a new
 * status naming the setting, its limit and what is in use. */
oi_status_t *oi_budget_refusal(const oi_budget_t *b, const char *what, size_t n);

/* The default limit: half of the memory the process may use (physical memory, or its
 * cgroup's memory limit when lower); 4 GiB when neither can be read. */
size_t oi_budget_default_limit(void);

#endif
