#!/bin/sh
# Runs a fuzzer for a bounded time: run_fuzz.sh FUZZER SEED_DIR WORK_DIR
# Time budget: $KDN_FUZZ_SECONDS (default 60). New inputs accumulate in WORK_DIR/corpus;
# crashes land in WORK_DIR/artifacts and fail the run.
set -eu
fuzzer=$1
seeds=$2
work=$3
mkdir -p "$work/corpus" "$work/artifacts"
exec "$fuzzer" -max_total_time="${KDN_FUZZ_SECONDS:-60}" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" "$seeds"
