/* A bounded queue of fixed-size records from many producer threads to one consumer (Vyukov's
 * bounded MPMC ring, used with a single consumer): a push never locks, never waits and never
 * allocates; when the queue is full the record is dropped and counted. The consumer may be a
 * thread of the queue's own (oi_recq_consume): the access log and the trace writer hand their
 * records to their writers through it. */
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

/* Starts the one consumer as a thread of its own: it pops each record into a buffer of its
 * own and calls `each` with it, then `pass` (NULL: none) with how many records that pass over
 * the queue took; after a pass that took none it sleeps a few milliseconds. Returns 0 or an
 * errno. No oi_recq_pop may follow. */
int oi_recq_consume(oi_recq_t *q, void (*each)(void *ctx, void *rec), void (*pass)(void *ctx, size_t n), void *ctx);

/* Ends the consuming thread after a last pass, which takes every record pushed before the
 * call; returns once the thread has ended. */
void oi_recq_stop(oi_recq_t *q);

/* Records dropped so far. */
uint64_t oi_recq_dropped(const oi_recq_t *q);

/* No push or pop may follow or run, and no consuming thread (oi_recq_stop first). */
void oi_recq_free(oi_recq_t *q);

#endif
