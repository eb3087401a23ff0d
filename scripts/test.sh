#!/usr/bin/env bash
# Runs the whole kdn test suite: builds (via setup.sh), runs every ctest test (unit,
# multi-process, fault, llama.cpp end-to-end, and the Python package and vLLM connector
# against real vLLM when scripts/setup-vllm.sh prepared its venv), then the fuzzers (KVC1
# decoder, handshake, configuration, wire records) for a bounded time each and the rings,
# index, request and contract tests under ASan+UBSan (one clang build), then the threaded
# parts under TSan. Exits non-zero if anything fails. Idempotent.
#
#   KDN_FUZZ_SECONDS=600 scripts/test.sh  # time per fuzzer (default 30 s, CI's budget; 0 skips building them)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${KDN_BUILD_DIR:-build}

# How long each phase took and the ten slowest ctest tests, printed at the end of every run,
# a failed one included (CI's budget is kept from these, and a run that timed out or failed
# is where they are needed most).
phases=()
phase_start=$SECONDS
phase_done() {
  phases+=("$1 $((SECONDS - phase_start))s")
  phase_start=$SECONDS
}
ctest_log=$(mktemp)
print_times() {
  local rc=$?
  [[ $rc == 0 ]] || phases+=("then failed after $((SECONDS - phase_start))s")
  echo "test: the ten slowest ctest tests:"
  grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$ctest_log" |
    sed -E 's/^.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 \1/' |
    sort -rn | awk 'NR <= 10 {printf "  %8.1f s  %s\n", $1, $2}' || true
  local verdict="all passed"
  [[ $rc == 0 ]] || verdict="FAILED (exit $rc)"
  echo "test: $verdict in ${SECONDS}s ($(IFS=,; echo "${phases[*]}" | sed 's/,/, /g'))"
  rm -f "$ctest_log"
}
trap print_times EXIT

scripts/setup.sh
phase_done setup

echo "test: running ctest in $build/"
# A test whose component is missing skips, except where the run requires it: under CI every
# component the suite exercises is required (kdn/common/testing/require.h), and here the
# metrics test's promtool, which setup.sh unpacked.
export KDN_REQUIRE_PROMTOOL=1
ctest --test-dir "$build" --output-on-failure --no-tests=error -j "${KDN_TEST_JOBS:-2}" --timeout 900 |
  tee "$ctest_log"
phase_done ctest

# One clang build with ASan+UBSan (and -Wthread-safety as an error: the GUARDED_BY fields are
# checked) serves both the fuzzers and the sanitizer runs of the rings, the session protocol,
# the index, the request handler and kdnd itself (through the contract and bad-input tests);
# the threaded parts then run under ThreadSanitizer. KDN_SANITIZERS=0 skips the sanitizer runs,
# KDN_FUZZ_SECONDS=0 the fuzzers.
fuzz_seconds=${KDN_FUZZ_SECONDS:-30}
[[ -f tests/fuzz/CMakeLists.txt ]] || fuzz_seconds=0
asan_tests=(ipc_ring_test ipc_session_test ipc_doorbell_test ipc_payload_test ipc_handshake_test sidecar_core_test
  request_handler_test contract_test bad_input_test)
tsan_tests=(ipc_ring_test ipc_session_test ipc_doorbell_test sidecar_core_test request_handler_test)
sanitizers=${KDN_SANITIZERS:-1}
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1  # undefined behaviour fails the test
if [[ "$fuzz_seconds" != 0 || "$sanitizers" != 0 ]]; then
  targets=()
  [[ "$fuzz_seconds" != 0 ]] && targets+=(kdn_fuzz_targets)
  [[ "$sanitizers" != 0 ]] && targets+=("${asan_tests[@]}" kdnd)  # the contract tests start kdnd
  echo "test: clang ASan+UBSan build (build-fuzz/) of ${targets[*]}"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DKDN_WITH_CUDA=OFF -DKDN_FUZZ=ON -DKDN_BUILD_BENCH=OFF -DKDN_BUILD_TESTS=ON \
    -DKDN_BUILD_LLAMA=OFF -DKDN_BUILD_PYTHON=OFF -DKDN_THREAD_SAFETY=ON >/dev/null
  cmake --build build-fuzz -j "${KDN_JOBS:-$(nproc)}" --target "${targets[@]}"
  phase_done asan-build
fi
if [[ "$fuzz_seconds" != 0 ]]; then
  echo "test: fuzzing the KVC1 decoder, handshake, configuration, wire records, disk records, Redis replies and remote values, ${fuzz_seconds}s each"
  KDN_FUZZ_SECONDS=$fuzz_seconds ctest --test-dir build-fuzz -L fuzz --output-on-failure \
    -j "${KDN_TEST_JOBS:-2}"
  phase_done fuzz
fi
if [[ "$sanitizers" != 0 ]]; then
  for t in "${asan_tests[@]}"; do
    echo "test: asan: $t"
    build-fuzz/bin/$t --gtest_brief=1
  done
  phase_done asan
  echo "test: tsan build of ${tsan_tests[*]}"
  cmake --preset tsan -DKDN_BUILD_LLAMA=OFF -DKDN_BUILD_BENCH=OFF -DKDN_BUILD_PYTHON=OFF >/dev/null
  cmake --build build-tsan -j "${KDN_JOBS:-$(nproc)}" --target "${tsan_tests[@]}"
  for t in "${tsan_tests[@]}"; do
    echo "test: tsan: $t"
    build-tsan/bin/$t --gtest_brief=1
  done
  phase_done tsan
fi
