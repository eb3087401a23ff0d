#!/usr/bin/env bash
# Runs the whole kdn test suite: builds (via setup.sh), runs every ctest test (unit,
# multi-process, fault, llama.cpp end-to-end, and the Python package and vLLM connector
# against real vLLM when scripts/setup-vllm.sh prepared its venv), then the fuzzers (KVC1
# decoder, handshake, configuration, wire records) for a bounded time each. Exits non-zero if anything fails.
# Idempotent.
#
#   KDN_FUZZ_SECONDS=60 scripts/test.sh   # time per fuzzer (default 60 s; 0 skips building them)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${KDN_BUILD_DIR:-build}

scripts/setup.sh

echo "test: running ctest in $build/"
ctest --test-dir "$build" --output-on-failure -j "${KDN_TEST_JOBS:-2}" --timeout 900

fuzz_seconds=${KDN_FUZZ_SECONDS:-60}
if [[ "$fuzz_seconds" != 0 ]] && [[ -f tests/fuzz/CMakeLists.txt ]]; then
  echo "test: fuzzing the KVC1 decoder, handshake, configuration and wire records, ${fuzz_seconds}s each"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DKDN_WITH_CUDA=OFF -DKDN_FUZZ=ON -DKDN_BUILD_BENCH=OFF -DKDN_BUILD_TESTS=ON \
    -DKDN_BUILD_LLAMA=OFF >/dev/null
  cmake --build build-fuzz -j "${KDN_JOBS:-$(nproc)}" --target kdn_fuzz_targets
  KDN_FUZZ_SECONDS=$fuzz_seconds ctest --test-dir build-fuzz -L fuzz --output-on-failure \
    -j "${KDN_TEST_JOBS:-2}"
fi
echo "test: all passed"
