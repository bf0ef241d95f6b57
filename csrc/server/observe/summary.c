#include "server/observe/summary.h"

#include <math.h>
#include <stdlib.h>

#define PART_NS 10000000000ull /* 10 s */

oi_summary_t *oi_summary_new(void)
{
    return calloc(1, sizeof(oi_summary_t));
}

/* Values below 32 have a bucket each; above, 16 buckets per power of two. */
static int bucket_of(uint64_t v)
{
    if (v < 32)
        return (int)v;
    int msb = 63 - __builtin_clzll(v);
    int idx = 32 + (msb - 5) * 16 + (int)((v >> (msb - 4)) & 15);
    return idx < OI_SUMMARY_BUCKETS ? idx : OI_SUMMARY_BUCKETS - 1;
}

/* The middle of a bucket's range. */
static double bucket_value(int idx)
{
    if (idx < 32)
        return idx;
    int msb = 5 + (idx - 32) / 16, sub = (idx - 32) % 16;
    double width = ldexp(1.0, msb - 4);
    return (16 + sub) * width + width / 2;
}

void oi_summary_observe(oi_summary_t *s, const uint64_t us[OI_SUM_REQUEST_KINDS], uint64_t now_ns)
{
    uint64_t epoch = now_ns / PART_NS + 1; /* never 0, which marks a part never used */
    int p = (int)(epoch % OI_SUMMARY_PARTS);
    if (atomic_load_explicit(&s->part_epoch[p], memory_order_relaxed) != epoch) {
        /* The part's period is over: start it afresh. A reader meanwhile may see a few stale
         * counts; the estimate is approximate anyway. */
        for (int k = 0; k < OI_SUM_KINDS; k++)
            for (int b = 0; b < OI_SUMMARY_BUCKETS; b++)
                atomic_store_explicit(&s->counts[p][k][b], 0, memory_order_relaxed);
        atomic_store_explicit(&s->part_epoch[p], epoch, memory_order_release);
    }
    for (int k = 0; k < OI_SUM_REQUEST_KINDS; k++) {
        _Atomic uint32_t *c = &s->counts[p][k][bucket_of(us[k])];
        atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
    }
}

void oi_summary_observe_shared(oi_summary_t *s, oi_summary_kind_t kind, uint64_t us, uint64_t now_ns)
{
    uint64_t epoch = now_ns / PART_NS + 1;
    int p = (int)(epoch % OI_SUMMARY_PARTS);
    uint64_t seen = atomic_load_explicit(&s->part_epoch[p], memory_order_acquire);
    /* One writer wins the turn-over and clears the part; the others go on adding. */
    if (seen != epoch && atomic_compare_exchange_strong(&s->part_epoch[p], &seen, epoch))
        for (int k = 0; k < OI_SUM_KINDS; k++)
            for (int b = 0; b < OI_SUMMARY_BUCKETS; b++)
                atomic_store_explicit(&s->counts[p][k][b], 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->counts[p][kind][bucket_of(us)], 1, memory_order_relaxed);
}

void oi_summary_merge(const oi_summary_t *s, oi_summary_kind_t kind, uint64_t now_ns, uint64_t into[OI_SUMMARY_BUCKETS])
{
    uint64_t epoch = now_ns / PART_NS + 1;
    for (int p = 0; p < OI_SUMMARY_PARTS; p++) {
        uint64_t e = atomic_load_explicit(&s->part_epoch[p], memory_order_acquire);
        if (e == 0 || e + OI_SUMMARY_PARTS <= epoch)
            continue; /* unused, or older than the window */
        for (int b = 0; b < OI_SUMMARY_BUCKETS; b++)
            into[b] += atomic_load_explicit(&s->counts[p][kind][b], memory_order_relaxed);
    }
}

double oi_summary_quantile(const uint64_t counts[OI_SUMMARY_BUCKETS], double q)
{
    uint64_t total = 0;
    for (int b = 0; b < OI_SUMMARY_BUCKETS; b++)
        total += counts[b];
    if (total == 0)
        return NAN;
    /* The smallest bucket at which the cumulative count reaches rank ceil(q * total). */
    double rank = ceil(q * (double)total);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (int b = 0; b < OI_SUMMARY_BUCKETS; b++) {
        seen += counts[b];
        if ((double)seen >= rank)
            return bucket_value(b);
    }
    return bucket_value(OI_SUMMARY_BUCKETS - 1);
}
