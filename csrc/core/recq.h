/* A bounded queue of fixed-size records from many producer threads to one consumer (Vyukov's
 * bounded MPMC ring, used with a single consumer): a push never locks, never waits and never
 * allocates; when the queue is full the record is dropped and counted. The access log and
 * the trace writer hand their records to their writer threads through it. */
#ifndef OI_CORE_RECQ_H
#define OI_CORE_RECQ_H

#include <stddef.h>
#include <stdint.h>

typedef struct oi_recq_s oi_recq_t;

/* A queue of `capacity` (a power of two) records of `rec_size` bytes, or NULL (out of memory
 * or a capacity that is not a power of two). */
oi_recq_t *oi_recq_new(size_t capacity, size_t rec_size);

/* Copies `rec` in; any thread. Returns 0, or -1 when full (the record is dropped and counted). */
int oi_recq_push(oi_recq_t *q, const void *rec);

/* Copies the oldest record into `out`; the one consumer thread only. Returns 1, or 0 when
 * empty. */
int oi_recq_pop(oi_recq_t *q, void *out);

/* Records dropped so far. */
uint64_t oi_recq_dropped(const oi_recq_t *q);

/* No push or pop may follow or run. */
void oi_recq_free(oi_recq_t *q);

#endif
