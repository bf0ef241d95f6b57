#!/usr/bin/env bash
# Runs each fuzz target named on the command line for FUZZ_SECONDS on its seed corpus
# (tests/fuzz/corpus/<target>/, read only; what the fuzzer adds goes to a scratch directory
# under $FUZZ_OUT/work), then prints a table of executions per target. The C targets must be
# built in $FUZZ_OUT already (make fuzz does that); the Python targets (tests/fuzz/*.py) run
# under atheris with $PY.
# Exits non-zero when a target finds a crash, a leak, a timeout or an out-of-memory: the
# input is saved as $FUZZ_OUT/crash-<target>-... and the fuzzer's report is in
# $FUZZ_OUT/<target>.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_OUT=${FUZZ_OUT:-build/fuzz/libfuzzer}
PY=${PY:-.venv/bin/python}
# Inputs the size of real requests (a few tensors); -timeout catches hangs, -rss_limit_mb
# unbounded growth. Leaks are checked at exit by LeakSanitizer (-detect_leaks=1, the default).
COMMON=(-max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -max_len=16384 -timeout=25 -rss_limit_mb=3072)
failed=0
results=()
for target in "$@"; do
  corpus=tests/fuzz/corpus/$target
  work=$FUZZ_OUT/work/$target
  log=$FUZZ_OUT/$target.log
  rm -rf "$work" && mkdir -p "$work"
  echo "fuzz: $target for ${FUZZ_SECONDS}s (log: $log)"
  tmp=$FUZZ_OUT/tmp/$target  # a Python target's scratch files: libFuzzer's exit skips its atexit
  rm -rf "$tmp" && mkdir -p "$tmp"
  if [ -f "tests/fuzz/$target.py" ]; then
    cmd=(env PYTHONPATH=python TMPDIR="$tmp" "$PY" "tests/fuzz/$target.py")
  else
    cmd=("$FUZZ_OUT/$target")
  fi
  "${cmd[@]}" "${COMMON[@]}" -artifact_prefix="$FUZZ_OUT/crash-$target-" "$work" "$corpus" >"$log" 2>&1
  rc=$?
  rm -rf "$tmp"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc -ne 0 ]; then
    failed=1
    status="FAILED (exit $rc): $(grep -m1 -E 'ERROR|SUMMARY|Uncaught' "$log")"
    tail -40 "$log"
  else
    status=ok
  fi
  results+=("$(printf '%-20s %12s execs %8s/s  %-10s %s' "$target" "${execs:-?}" "${rate:-?}" "${cov:-}" "$status")")
done
echo
echo "fuzz: executions per target (${FUZZ_SECONDS}s each)"
printf '%s\n' "${results[@]}"
exit $failed
