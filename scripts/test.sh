#!/usr/bin/env bash
# Runs the whole kdn test suite: builds (via setup.sh), runs every ctest test (unit,
# multi-process, fault, llama.cpp end-to-end, and the Python package and vLLM connector
# against real vLLM when scripts/setup-vllm.sh prepared its venv), then the fuzzers (KVC1
# decoder, handshake, configuration, wire records) for a bounded time each, then the rings,
# index, request and contract tests under ASan+UBSan and TSan. Exits non-zero if anything
# fails. Idempotent.
#
#   KDN_FUZZ_SECONDS=600 scripts/test.sh  # time per fuzzer (default 30 s, CI's budget; 0 skips building them)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${KDN_BUILD_DIR:-build}

# How long each phase took, printed at the end (CI's budget is kept from these).
phases=()
phase_start=$SECONDS
phase_done() {
  phases+=("$1 $((SECONDS - phase_start))s")
  phase_start=$SECONDS
}

scripts/setup.sh
phase_done setup

echo "test: running ctest in $build/"
# A test whose component is missing skips, except where the run requires it: under CI every
# component the suite exercises is required (kdn/common/testing/require.h), and here the
# metrics test's promtool, which setup.sh unpacked.
export KDN_REQUIRE_PROMTOOL=1
ctest_log=$(mktemp)
trap 'rm -f "$ctest_log"' EXIT
ctest --test-dir "$build" --output-on-failure --no-tests=error -j "${KDN_TEST_JOBS:-2}" --timeout 900 |
  tee "$ctest_log"
phase_done ctest

fuzz_seconds=${KDN_FUZZ_SECONDS:-30}
if [[ "$fuzz_seconds" != 0 ]] && [[ -f tests/fuzz/CMakeLists.txt ]]; then
  echo "test: fuzzing the KVC1 decoder, handshake, configuration, wire records, disk records, Redis replies and remote values, ${fuzz_seconds}s each"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DKDN_WITH_CUDA=OFF -DKDN_FUZZ=ON -DKDN_BUILD_BENCH=OFF -DKDN_BUILD_TESTS=ON \
    -DKDN_BUILD_LLAMA=OFF -DKDN_THREAD_SAFETY=ON >/dev/null  # clang: the GUARDED_BY fields are checked
  cmake --build build-fuzz -j "${KDN_JOBS:-$(nproc)}" --target kdn_fuzz_targets
  KDN_FUZZ_SECONDS=$fuzz_seconds ctest --test-dir build-fuzz -L fuzz --output-on-failure \
    -j "${KDN_TEST_JOBS:-2}"
  phase_done fuzz
fi
# The lock-free rings, the session protocol, the index, the request handler and kdnd itself
# (through the contract tests) under AddressSanitizer + UndefinedBehaviorSanitizer, and the
# threaded parts under ThreadSanitizer. KDN_SANITIZERS=0 skips them.
if [[ "${KDN_SANITIZERS:-1}" != 0 ]]; then
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1  # undefined behaviour fails the test
  declare -A sanitizer_tests=(
    [asan]="ipc_ring_test ipc_session_test ipc_doorbell_test ipc_payload_test ipc_handshake_test sidecar_core_test request_handler_test contract_test bad_input_test"
    [tsan]="ipc_ring_test ipc_session_test ipc_doorbell_test sidecar_core_test request_handler_test")
  for preset in asan tsan; do
    read -r -a targets <<<"${sanitizer_tests[$preset]}"
    echo "test: ${preset} build of ${targets[*]}"
    cmake --preset "$preset" -DKDN_BUILD_LLAMA=OFF -DKDN_BUILD_BENCH=OFF >/dev/null
    daemon=()
    [[ "$preset" == asan ]] && daemon=(kdnd)  # the contract and bad-input tests start kdnd
    cmake --build "build-$preset" -j "${KDN_JOBS:-$(nproc)}" --target "${targets[@]}" "${daemon[@]}"
    for t in "${targets[@]}"; do
      echo "test: ${preset}: $t"
      "build-$preset/bin/$t" --gtest_brief=1
    done
    phase_done "$preset"
  done
fi
echo "test: the ten slowest ctest tests:"
grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$ctest_log" | sed -E 's/^.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 \1/' |
  sort -rn | awk 'NR <= 10 {printf "  %8.1f s  %s\n", $1, $2}'
echo "test: all passed in ${SECONDS}s ($(IFS=,; echo "${phases[*]}" | sed 's/,/, /g'))"
