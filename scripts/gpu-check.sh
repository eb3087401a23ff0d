#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, from the bundle scripts/gpu-bundle.sh packed (no build, no
# install, no package registry needed): runs the GPU tests, the GPU benchmarks, then every
# other test binary, and writes what it found under ${OUT:-gpu-results}/ — summary.txt (one
# line per test binary and benchmark), machine.txt, the benchmarks' JSON and logs.tar.gz.
# docs/gpu-results.md says how to carry the bundle and records what the runs measured.
#
#   scripts/gpu-check.sh [bundle]          # gpu-bundle/ or gpu-bundle.tar.xz (default: either)
#   KDN_GPU_CHECK_BUDGET_S=420             # stop starting test binaries after this many seconds
#                                          # (exit 3 when one did not finish within it)
#   KDN_GPU_CHECK_SUITE=0                  # the GPU tests and benchmarks only
#   KDN_GPU_CHECK_KERNELS=0                # without kdn-bench kernels
#   KDN_GPU_BENCH_ARGS="--quick"           # passed to kdn-bench gpu
#   KDN_VLLM_GPU_BENCH_ARGS="--tokens 4096"  # passed to python/tools/vllm_gpu_bench.py (kdn-bench vllm --gpu)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bundle=${1:-$root/gpu-bundle}
[[ -e "$bundle" || ! -f "$bundle.tar.xz" ]] || bundle="$bundle.tar.xz"
if [[ -f "$bundle" && "$bundle" == *.tar.xz ]]; then  # the archive that travels: unpack it first
  unpacked=$(mktemp -d /tmp/kdn-gpu-bundle-XXXXXX)
  # tar needs the xz program; Python's lzma is the fallback where xz-utils is missing.
  tar -C "$unpacked" -xJf "$bundle" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle" "$unpacked" ||
    { echo "gpu-check: cannot unpack $bundle"; exit 2; }
  bundle=$(find "$unpacked" -mindepth 1 -maxdepth 1 -type d -print -quit)
fi
bundle=$(cd "$bundle" 2>/dev/null && pwd) || { echo "gpu-check: no bundle at ${1:-$root/gpu-bundle} (scripts/gpu-bundle.sh makes it)"; exit 2; }
out=${OUT:-$root/gpu-results}
mkdir -p "$out"
logs=$(mktemp -d /tmp/kdn-gpu-check-XXXXXX)
mkdir -p "$logs/tests"
start=$(date +%s)
budget=${KDN_GPU_CHECK_BUDGET_S:-420}
summary="$out/summary.txt"
: > "$summary"

{
  echo "bundle: $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)"
  nvidia-smi 2>&1 || true
  nvidia-smi topo -m 2>&1 || true
  uname -a
  grep -E '^(PRETTY_NAME)=' /etc/os-release 2>/dev/null || true
  ldd --version 2>&1 | head -1
  echo "cpus: $(nproc)"
  ulimit -l | sed 's/^/memlock: /'
} > "$out/machine.txt" 2>&1
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi -L failed)" | tee -a "$summary"
  exit 2
fi

export PATH="$bundle/bin:$PATH" KDN_SOURCE_DIR="$root"

# One test binary: its gtest totals in one line of the summary.
run_test() {
  local bin=$1 name log rc passed failed skipped
  name=$(basename "$bin")
  log="$logs/tests/$name.log"
  timeout "${KDN_TEST_TIMEOUT_S:-300}" "$bin" --gtest_brief=1 > "$log" 2>&1
  rc=$?
  passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  failed=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' || echo 0)
  skipped=$(grep -oE '\[  SKIPPED \] [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  printf '%-32s rc=%-3s passed=%-4s failed=%-3s skipped=%s\n' "$name" "$rc" "${passed:-0}" "${failed:-0}" "${skipped:-0}"
  if ((rc != 0)); then grep -E '^\[  FAILED  \]|Failure|error' "$log" | awk 'NR <= 20' | sed 's/^/    /'; fi
  return 0
}
export -f run_test
export logs

echo "== GPU tests" >> "$summary"
gpu_tests=()
for b in "$bundle"/bin/*gpu*_test; do [[ -x "$b" ]] && gpu_tests+=("$b"); done
printf '%s\n' "${gpu_tests[@]}" | xargs -P 4 -I{} bash -c 'run_test {}' >> "$summary"
# A GPU test that skipped here did not run where it had to.
for b in "${gpu_tests[@]}"; do
  grep -h '\[  SKIPPED \]' "$logs/tests/$(basename "$b").log" 2>/dev/null | grep -v 'tests,' | sed 's/^/    skipped: /' >> "$summary"
done

# kdn.torch on the device with views laid out as vLLM lays them out (no vLLM there).
echo "== vLLM GPU data path (tests/gpu/vllm_gpu_check.py)" >> "$summary"
timeout "${KDN_VLLM_GPU_TIMEOUT_S:-240}" python3 "$root/tests/gpu/vllm_gpu_check.py" --bin "$bundle/bin" \
  --pkg "$bundle/python" > "$logs/vllm_gpu_check.log" 2>&1
rc=$?
sed 's/^/    /' "$logs/vllm_gpu_check.log" | tail -12 >> "$summary"
# 77: skipped (no importable package for this Python, or no device) — said in the lines above.
if ((rc == 77)); then echo "vllm_gpu_check skipped" >> "$summary"; else echo "vllm_gpu_check rc=$rc" >> "$summary"; fi

echo "== benchmarks" >> "$summary"
bench() {
  local name=$1; shift
  local t0=$(date +%s)
  timeout "${KDN_BENCH_TIMEOUT_S:-240}" "$bundle/bin/kdn-bench" "$@" > "$out/$name.json" 2> "$logs/$name.log"
  local rc=$?
  echo "$name rc=$rc ($(( $(date +%s) - t0 )) s)" >> "$summary"
  if ((rc != 0)); then tail -15 "$logs/$name.log" | sed 's/^/    /' >> "$summary"; fi
}
[[ "${KDN_GPU_CHECK_KERNELS:-1}" != 0 ]] && bench kernels-gpu kernels --json --gpu
bench gpu gpu --json ${KDN_GPU_BENCH_ARGS:-}
# kdn-bench vllm --gpu: the script itself (the bundle's kdn-bench has no vLLM venv to point at).
t0=$(date +%s)
timeout "${KDN_BENCH_TIMEOUT_S:-240}" python3 "$root/python/tools/vllm_gpu_bench.py" --bin "$bundle/bin" \
  --pkg "$bundle/python" --json ${KDN_VLLM_GPU_BENCH_ARGS:-} > "$out/vllm-gpu.json" 2> "$logs/vllm-gpu.log"
rc=$?
echo "vllm-gpu rc=$rc ($(( $(date +%s) - t0 )) s)" >> "$summary"
if ((rc != 0)); then tail -15 "$logs/vllm-gpu.log" | sed 's/^/    /' >> "$summary"; fi

if [[ "${KDN_GPU_CHECK_SUITE:-1}" != 0 ]]; then
  echo "== the rest of the suite (budget ${budget} s from the start)" >> "$summary"
  rest=()
  for b in "$bundle"/bin/*_test; do
    [[ " ${gpu_tests[*]} " == *" $b "* ]] && continue
    rest+=("$b")
  done
  left=$(( budget - ($(date +%s) - start) ))
  if ((left > 30)); then
    export KDN_TEST_TIMEOUT_S=$(( left < 300 ? left : 300 ))
    printf '%s\n' "${rest[@]}" | timeout "$left" xargs -P "$(( $(nproc) > 8 ? 8 : $(nproc) ))" -I{} bash -c 'run_test {}' >> "$summary"
    for b in "${rest[@]}"; do
      grep -q "^$(basename "$b") " "$summary" || printf '%-32s not finished within the budget\n' "$(basename "$b")" >> "$summary"
    done
  else
    echo "    not run: the budget is spent" >> "$summary"
  fi
fi

echo "== done in $(( $(date +%s) - start )) s" >> "$summary"
tar -C "$logs" -czf "$out/logs.tar.gz" . 2>/dev/null
cat "$summary"
grep -qE 'rc=[1-9]' "$summary" && exit 1
# A binary the budget left unfinished (or unstarted) checked nothing: not a pass.
grep -qE 'not finished within the budget|not run: the budget is spent' "$summary" && exit 3
exit 0
