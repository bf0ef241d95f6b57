-- Shared wrk reporter: prints one machine-readable line that
-- benchmarks/common.py parses (exact percentiles in microseconds and all
-- error counters). Loaded by the scenario scripts with dofile().
done = function(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "BENCH_RESULT requests=%d duration_us=%d bytes=%d p50_us=%d p90_us=%d"
      .. " p99_us=%d p999_us=%d max_us=%d mean_us=%.1f"
      .. " connect=%d read=%d write=%d status=%d timeout=%d\n",
      summary.requests, summary.duration, summary.bytes,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency:percentile(99.9), latency.max, latency.mean,
      e.connect, e.read, e.write, e.status, e.timeout))
end
