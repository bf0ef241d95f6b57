#include "core/recq.h"

#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/thread.h"

/* How long the consuming thread sleeps after a pass that found the queue empty. */
#define IDLE_NS 5000000L

/* Each slot is its sequence number then the record: the sequence says whether the slot is
 * free for the producer at that position or full for the consumer at it. */
struct oi_recq_s {
    size_t capacity, rec_size, stride;
    atomic_size_t head; /* next position to fill (producers) */
    size_t tail;        /* next position to read (the consumer only) */
    atomic_uint_fast64_t dropped;
    unsigned char *slots;
    /* The consuming thread (oi_recq_consume), and the record it pops into. */
    void (*each)(void *ctx, void *rec);
    void (*pass)(void *ctx, size_t n);
    void *ctx;
    void *rec;
    atomic_int stop;
    pthread_t thread;
};

static atomic_size_t *slot_seq(const oi_recq_t *q, size_t pos)
{
    return (atomic_size_t *)(q->slots + (pos & (q->capacity - 1)) * q->stride);
}

static void *slot_rec(const oi_recq_t *q, size_t pos)
{
    return (unsigned char *)slot_seq(q, pos) + sizeof(atomic_size_t);
}

oi_recq_t *oi_recq_new(size_t capacity, size_t rec_size)
{
    if (capacity == 0 || (capacity & (capacity - 1)) != 0)
        return NULL;
    oi_recq_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    const size_t align = alignof(max_align_t);
    q->capacity = capacity;
    q->rec_size = rec_size;
    q->stride = (sizeof(atomic_size_t) + rec_size + align - 1) / align * align;
    q->slots = calloc(capacity, q->stride);
    if (q->slots == NULL) {
        free(q);
        return NULL;
    }
    for (size_t i = 0; i < capacity; i++)
        atomic_init(slot_seq(q, i), i);
    return q;
}

int oi_recq_push(oi_recq_t *q, const void *rec)
{
    size_t pos = atomic_load_explicit(&q->head, memory_order_relaxed);
    for (;;) {
        atomic_size_t *seq = slot_seq(q, pos);
        intptr_t diff = (intptr_t)atomic_load_explicit(seq, memory_order_acquire) - (intptr_t)pos;
        if (diff == 0) {
            if (atomic_compare_exchange_weak_explicit(&q->head, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                memcpy(slot_rec(q, pos), rec, q->rec_size);
                atomic_store_explicit(seq, pos + 1, memory_order_release);
                return 0;
            }
        } else if (diff < 0) { /* full: the consumer has not read this slot's last record yet */
            atomic_fetch_add_explicit(&q->dropped, 1, memory_order_relaxed);
            return -1;
        } else {
            pos = atomic_load_explicit(&q->head, memory_order_relaxed);
        }
    }
}

int oi_recq_pop(oi_recq_t *q, void *out)
{
    atomic_size_t *seq = slot_seq(q, q->tail);
    if (atomic_load_explicit(seq, memory_order_acquire) != q->tail + 1)
        return 0;
    memcpy(out, slot_rec(q, q->tail), q->rec_size);
    atomic_store_explicit(seq, q->tail + q->capacity, memory_order_release);
    q->tail++;
    return 1;
}

static void *consumer_main(void *arg)
{
    oi_recq_t *q = arg;
    for (;;) {
        int stopping = atomic_load(&q->stop);
        size_t n = 0;
        for (; oi_recq_pop(q, q->rec); n++)
            q->each(q->ctx, q->rec);
        if (q->pass != NULL)
            q->pass(q->ctx, n);
        if (stopping)
            return NULL;
        if (n == 0) {
            struct timespec idle = {0, IDLE_NS};
            nanosleep(&idle, NULL);
        }
    }
}

int oi_recq_consume(oi_recq_t *q, void (*each)(void *ctx, void *rec), void (*pass)(void *ctx, size_t n), void *ctx)
{
    if ((q->rec = malloc(q->rec_size ? q->rec_size : 1)) == NULL)
        return ENOMEM;
    q->each = each;
    q->pass = pass;
    q->ctx = ctx;
    int rc = oi_thread_create(&q->thread, "oi-recq", consumer_main, q, 0);
    if (rc != 0) {
        free(q->rec);
        q->rec = NULL;
    }
    return rc;
}

void oi_recq_stop(oi_recq_t *q)
{
    atomic_store(&q->stop, 1);
    pthread_join(q->thread, NULL);
}

uint64_t oi_recq_dropped(const oi_recq_t *q)
{
    return atomic_load_explicit(&((oi_recq_t *)q)->dropped, memory_order_relaxed);
}

void oi_recq_free(oi_recq_t *q)
{
    if (q == NULL)
        return;
    free(q->rec);
    free(q->slots);
    free(q);
}
