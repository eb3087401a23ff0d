#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build with CUDA, run every test (GPU tests included) and
# the GPU benchmarks, and collect the results under ${OUT:-gpu-results}/.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/gpu-results}
mkdir -p "$out"
nvidia-smi | tee "$out/nvidia-smi.txt" || { echo "gpu-check: no NVIDIA GPU here"; exit 2; }
KDN_SKIP_LLAMA=${KDN_SKIP_LLAMA:-1} KDN_CUDA_ARCHS=90 KDN_BUILD_DIR=build-gpu KDN_JOBS=$(nproc) \
  scripts/setup.sh 2>&1 | tail -20 | tee "$out/build.txt"
rc=0
ctest --test-dir build-gpu --output-on-failure -j 4 2>&1 | tee "$out/ctest.txt" | tail -40 || rc=1
grep -q "tests passed" "$out/ctest.txt" || rc=1
# GPU tests skip without a device; here they must have run: list any that still skipped.
grep -i "skipped" "$out/ctest.txt" | tee "$out/skipped.txt" || true
build-gpu/bin/kdn-bench kernels --json --gpu > "$out/kernels-gpu.json" 2> "$out/kernels-gpu.log" || rc=1
cat "$out/kernels-gpu.json"
# kdnd's GPU tier with the bench as the engine, against cudaMemcpyAsync (docs/gpu-engine.md).
build-gpu/bin/kdn-bench gpu --json > "$out/gpu-tier.json" 2> "$out/gpu-tier.log" || rc=1
cat "$out/gpu-tier.json"
exit $rc
