/* What counting one request costs under load: the three clock reads the request path takes
 * when statistics are on and the executor goes straight from one request to the next (queue
 * start on the loop thread, model returned, end; the compute start is the previous end), one
 * oi_stats_request and one oi_stats_execution, as the scheduler and infer.c call them. Prints
 * nanoseconds per request, the best of `rounds`. With `summaries` 1, the slot also keeps latency
 * summaries (--metrics-config summary_latencies=true).
 *
 *     stats_bench [requests_per_round] [rounds] [summaries]
 */
#include <stdio.h>
#include <stdlib.h>

#include "server/observe/counters.h"

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    int summaries = argc > 3 && atoi(argv[3]);
    oi_stats_t *s = oi_stats_new(1);
    if (s == NULL || n <= 0 || rounds <= 0 || (summaries && oi_stats_enable_summaries(s, 0) != 0))
        return 1;
    oi_stats_slot_t *slot = &s->slots[0];
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        uint64_t t0 = oi_now_ns();
        for (long i = 0; i < n; i++) {
            oi_stats_times_t t = {oi_now_ns(), 0, 0, 0};
            t.compute_start = t.input_end = slot->last_end > t.start ? slot->last_end : t.start;
            t.output_start = oi_now_ns();
            oi_stats_request(slot, &t, oi_now_ns(), 1, OI_FAIL_BACKEND, 1 + (uint64_t)(i & 3));
            oi_stats_execution(slot, 1 + (uint64_t)(i & 3), t.compute_start, t.input_end, t.output_start,
                               slot->last_end);
        }
        double ns = (double)(oi_now_ns() - t0) / (double)n;
        if (ns < best)
            best = ns;
    }
    oi_stats_snapshot_t snap;
    if (oi_stats_read(s, &snap) != 0 || snap.success.count != (uint64_t)n * (uint64_t)rounds)
        return 2; /* the counts must be right for the time to mean anything */
    oi_stats_snapshot_clear(&snap);
    oi_stats_free(s);
    printf("%.1f\n", best);
    return 0;
}
