#include "server/observe/counters.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

const uint64_t oi_hist_bounds_ms[OI_HIST_BUCKETS] = {100, 500, 2000, 5000};

const char *oi_fail_reason_name(oi_fail_reason_t r)
{
    static const char *const names[OI_FAIL_REASONS] = {"REJECTED", "CANCELED", "BACKEND", "OTHER"};
    return (unsigned)r < OI_FAIL_REASONS ? names[r] : "OTHER";
}

uint64_t oi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- per batch size ----------------------------------------------------------------------- */

typedef struct batch_entry_s {
    _Atomic uint64_t size; /* 0: free; published last (release) */
    _Atomic uint64_t count, input_ns, infer_ns, output_ns;
} batch_entry_t;

/* An open-addressing table keyed by batch size, written by its slot's writer only. A full
 * one is replaced by a copy twice its size; the old one stays (linked from the new) until the
 * statistics are freed, because a reader may still be reading it. */
struct oi_batch_table_s {
    uint32_t cap; /* a power of two */
    uint32_t used;
    oi_batch_table_t *older;
    batch_entry_t e[];
};

static uint32_t hash_size(uint64_t size) { return (uint32_t)((size * 0x9E3779B97F4A7C15ull) >> 40); }

static batch_entry_t *probe(oi_batch_table_t *t, uint64_t size)
{
    for (uint32_t i = hash_size(size) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        uint64_t k = atomic_load_explicit(&t->e[i].size, memory_order_relaxed);
        if (k == size || k == 0)
            return &t->e[i];
    }
}

static oi_batch_table_t *table_new(uint32_t cap)
{
    oi_batch_table_t *t = calloc(1, sizeof(*t) + (size_t)cap * sizeof(batch_entry_t));
    if (t != NULL)
        t->cap = cap;
    return t;
}

/* The entry of `size` in the slot's table, added when new; NULL when out of memory (that
 * execution then goes uncounted per batch size). */
static batch_entry_t *batch_entry(oi_stats_slot_t *slot, uint64_t size)
{
    oi_batch_table_t *t = atomic_load_explicit(&slot->batches, memory_order_relaxed);
    batch_entry_t *e = t ? probe(t, size) : NULL;
    if (e != NULL && atomic_load_explicit(&e->size, memory_order_relaxed) == size)
        return e;
    if (t == NULL || (t->used + 1) * 2 > t->cap) {
        oi_batch_table_t *n = table_new(t ? t->cap * 2 : 16);
        if (n == NULL)
            return NULL;
        for (uint32_t i = 0; t && i < t->cap; i++) {
            uint64_t k = atomic_load_explicit(&t->e[i].size, memory_order_relaxed);
            if (k == 0)
                continue;
            batch_entry_t *d = probe(n, k);
            atomic_init(&d->count, atomic_load_explicit(&t->e[i].count, memory_order_relaxed));
            atomic_init(&d->input_ns, atomic_load_explicit(&t->e[i].input_ns, memory_order_relaxed));
            atomic_init(&d->infer_ns, atomic_load_explicit(&t->e[i].infer_ns, memory_order_relaxed));
            atomic_init(&d->output_ns, atomic_load_explicit(&t->e[i].output_ns, memory_order_relaxed));
            atomic_init(&d->size, k);
        }
        n->used = t ? t->used : 0;
        n->older = t;
        atomic_store_explicit(&slot->batches, n, memory_order_release);
        t = n;
        e = probe(t, size);
    }
    t->used++;
    atomic_store_explicit(&e->size, size, memory_order_release);
    return e;
}

/* ---- writing -------------------------------------------------------------------------------- */

/* Adds to a counter: a plain load and store for a slot's only writer, an atomic add for the
 * shared slot. Relaxed either way: readers want each counter, not an order between them. */
static inline void add(const oi_stats_slot_t *slot, _Atomic uint64_t *c, uint64_t d)
{
    if (slot->shared)
        atomic_fetch_add_explicit(c, d, memory_order_relaxed);
    else
        atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + d, memory_order_relaxed);
}

static inline uint64_t since(uint64_t from, uint64_t to) { return to > from ? to - from : 0; }

void oi_stats_request(oi_stats_slot_t *slot, const oi_stats_times_t *t, uint64_t end, int ok, oi_fail_reason_t reason,
                      uint64_t rows)
{
    uint64_t total = since(t->start, end);
    slot->last_end = end;
    if (ok) {
        add(slot, &slot->success, 1);
        add(slot, &slot->success_ns, total);
        add(slot, &slot->queue_ns, since(t->start, t->compute_start));
        add(slot, &slot->input_ns, since(t->compute_start, t->input_end));
        add(slot, &slot->infer_ns, since(t->input_end, t->output_start));
        add(slot, &slot->output_ns, since(t->output_start, end));
        add(slot, &slot->inferences, rows ? rows : 1);
        if (slot->summary != NULL && !slot->shared) {
            uint64_t us[OI_SUM_KINDS] = {
                total / 1000, since(t->start, t->compute_start) / 1000, since(t->compute_start, t->input_end) / 1000,
                since(t->input_end, t->output_start) / 1000, since(t->output_start, end) / 1000};
            oi_summary_observe(slot->summary, us, end);
        }
    } else {
        add(slot, &slot->fail[(unsigned)reason < OI_FAIL_REASONS ? reason : OI_FAIL_OTHER], 1);
        add(slot, &slot->fail_ns, total);
    }
    /* Whole milliseconds, as Triton observes them. */
    uint64_t ms = total / 1000000u;
    int b = 0;
    while (b < OI_HIST_BUCKETS && ms > oi_hist_bounds_ms[b])
        b++;
    add(slot, &slot->hist[b], 1);
    add(slot, &slot->hist_sum_ms, ms);
}

void oi_stats_execution(oi_stats_slot_t *slot, uint64_t batch_size, uint64_t compute_start, uint64_t input_end,
                        uint64_t output_start, uint64_t end)
{
    if (end > atomic_load_explicit(&slot->last_execution, memory_order_relaxed))
        atomic_store_explicit(&slot->last_execution, end, memory_order_relaxed);
    add(slot, &slot->executions, 1);
    batch_entry_t *e = batch_entry(slot, batch_size ? batch_size : 1);
    if (e == NULL)
        return;
    add(slot, &e->count, 1);
    add(slot, &e->input_ns, since(compute_start, input_end));
    add(slot, &e->infer_ns, since(input_end, output_start));
    add(slot, &e->output_ns, since(output_start, end));
}

/* ---- life and reading ------------------------------------------------------------------------- */

oi_stats_t *oi_stats_new(int nslots)
{
    if (nslots < 0)
        nslots = 0;
    oi_stats_t *s = aligned_alloc(64, (sizeof(oi_stats_t) + (size_t)nslots * sizeof(oi_stats_slot_t) + 63) / 64 * 64);
    if (s == NULL)
        return NULL;
    memset(s, 0, sizeof(*s) + (size_t)nslots * sizeof(oi_stats_slot_t));
    s->nslots = nslots;
    s->shared.shared = 1;
    return s;
}

static void free_tables(oi_batch_table_t *t)
{
    while (t != NULL) {
        oi_batch_table_t *older = t->older;
        free(t);
        t = older;
    }
}

void oi_stats_free(oi_stats_t *s)
{
    if (s == NULL)
        return;
    free_tables(atomic_load(&s->shared.batches));
    free(s->cache_summary);
    for (int i = 0; i < s->nslots; i++) {
        free_tables(atomic_load(&s->slots[i].batches));
        free(s->slots[i].summary);
    }
    free(s);
}

int oi_stats_enable_summaries(oi_stats_t *s, int cache)
{
    if (cache && s->cache_summary == NULL && (s->cache_summary = oi_summary_new()) == NULL)
        return -1;
    for (int i = 0; i < s->nslots; i++)
        if (s->slots[i].summary == NULL && (s->slots[i].summary = oi_summary_new()) == NULL)
            return -1;
    return 0;
}

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

static int by_size(const void *a, const void *b)
{
    uint64_t x = ((const oi_batch_stats_t *)a)->batch_size, y = ((const oi_batch_stats_t *)b)->batch_size;
    return x < y ? -1 : x > y;
}

/* Adds a slot's batch table into the snapshot's array (grown as needed). */
static int read_batches(const oi_stats_slot_t *slot, oi_stats_snapshot_t *out, size_t *cap)
{
    const oi_batch_table_t *t = atomic_load_explicit(&slot->batches, memory_order_acquire);
    for (uint32_t i = 0; t && i < t->cap; i++) {
        const batch_entry_t *e = &t->e[i];
        uint64_t size = atomic_load_explicit(&e->size, memory_order_acquire);
        if (size == 0)
            continue;
        oi_batch_stats_t *d = NULL;
        for (size_t k = 0; k < out->n_batches && d == NULL; k++)
            if (out->batches[k].batch_size == size)
                d = &out->batches[k];
        if (d == NULL) {
            if (out->n_batches == *cap) {
                size_t ncap = *cap ? *cap * 2 : 16;
                oi_batch_stats_t *grown = realloc(out->batches, ncap * sizeof(*grown));
                if (grown == NULL)
                    return -1;
                out->batches = grown;
                *cap = ncap;
            }
            d = &out->batches[out->n_batches++];
            memset(d, 0, sizeof(*d));
            d->batch_size = size;
        }
        uint64_t n = LOAD(e->count);
        d->compute_input.count += n;
        d->compute_infer.count += n;
        d->compute_output.count += n;
        d->compute_input.ns += LOAD(e->input_ns);
        d->compute_infer.ns += LOAD(e->infer_ns);
        d->compute_output.ns += LOAD(e->output_ns);
    }
    return 0;
}

static void read_slot(const oi_stats_slot_t *s, oi_stats_snapshot_t *o)
{
    uint64_t success = LOAD(s->success);
    o->success.count += success;
    o->success.ns += LOAD(s->success_ns);
    o->queue.ns += LOAD(s->queue_ns);
    o->compute_input.ns += LOAD(s->input_ns);
    o->compute_infer.ns += LOAD(s->infer_ns);
    o->compute_output.ns += LOAD(s->output_ns);
    o->inference_count += LOAD(s->inferences);
    for (int r = 0; r < OI_FAIL_REASONS; r++) {
        uint64_t n = LOAD(s->fail[r]);
        o->fail_by_reason[r] += n;
        o->fail.count += n;
    }
    o->fail.ns += LOAD(s->fail_ns);
    o->execution_count += LOAD(s->executions);
    uint64_t last = LOAD(s->last_execution);
    if (last > o->last_inference_ms) /* monotonic ns until oi_stats_read converts it */
        o->last_inference_ms = last;
    for (int b = 0; b <= OI_HIST_BUCKETS; b++)
        o->hist[b] += LOAD(s->hist[b]);
    o->hist_sum_ms += LOAD(s->hist_sum_ms);
}

int oi_stats_read(const oi_stats_t *s, oi_stats_snapshot_t *out)
{
    memset(out, 0, sizeof(*out));
    size_t cap = 0;
    int rc = 0;
    read_slot(&s->shared, out);
    rc |= read_batches(&s->shared, out, &cap);
    for (int i = 0; i < s->nslots; i++) {
        read_slot(&s->slots[i], out);
        rc |= read_batches(&s->slots[i], out, &cap);
    }
    if (out->last_inference_ms != 0) { /* monotonic ns -> wall-clock ms, by the clocks' offset now */
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        uint64_t mono = oi_now_ns(), wall_ns = (uint64_t)wall.tv_sec * 1000000000u + (uint64_t)wall.tv_nsec;
        uint64_t ago = mono > out->last_inference_ms ? mono - out->last_inference_ms : 0;
        out->last_inference_ms = (wall_ns > ago ? wall_ns - ago : 0) / 1000000u;
    }
    /* Triton counts queue and compute per successful request that was not a cache hit: with
     * no response cache, every success. */
    out->queue.count = out->compute_input.count = out->compute_infer.count = out->compute_output.count =
        out->success.count;
    if (rc != 0) {
        oi_stats_snapshot_clear(out);
        return -1;
    }
    if (out->n_batches > 1)
        qsort(out->batches, out->n_batches, sizeof(*out->batches), by_size);
    return 0;
}

void oi_stats_snapshot_clear(oi_stats_snapshot_t *snap)
{
    free(snap->batches);
    snap->batches = NULL;
    snap->n_batches = 0;
}
