#!/usr/bin/env bash
# kdn end to end on a real engine: two llama.cpp processes (SmolLM2-135M-Instruct) answer
# questions about the same long document; the second reuses the first one's KV through kdnd.
#
#   1. prepares everything if needed (scripts/setup.sh, scripts/setup-llama.sh, the build);
#   2. renders the bash(1) manual (or another long document under /usr/share) to text;
#   3. starts kdnd on a private socket;
#   4. engine process A answers question A about the document's first 4096 tokens: a miss,
#      it prefills everything and stores the document's chunks in kdnd;
#   5. engine process B, a separate process, answers question B: it loads A's chunks from
#      kdnd and prefills only its question;
#   6. engine process C answers question B without kdn (the cost of a miss), for comparison;
#   7. prints the TTFTs side by side with kdnd's counters;
#   8. a serving engine S (kdn-llama --serve) answers through a kdnd restart: from the arena,
#      then by prefilling while kdnd is away, then — kdnd back, its disk tier recovered —
#      from the disk tier, having reconnected by itself; then stops kdnd;
#   9. the same with two vLLM replicas (python/tools/vllm_demo.py, real vLLM on the CPU
#      backend, KdnConnector): A answers about the document and stores it, B (another
#      process) loads it from kdnd; B's TTFT and answer are shown beside B's without kdn.
#      Skipped, with the reason, when the vLLM environment (scripts/setup-vllm.sh) cannot be
#      set up on this machine, or with KDN_SKIP_VLLM=1.
#
#   KDN_BUILD_DIR=dir     build folder (default build/)
#   KDN_DEMO_TOKENS=n     document tokens (multiple of 256; default 4096)
#   KDN_DEMO_THREADS=n    llama.cpp threads per engine (default: every core)
#   KDN_SKIP_VLLM=1       leave out the vLLM part
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${KDN_BUILD_DIR:-build}
tokens=${KDN_DEMO_TOKENS:-4096}
threads=${KDN_DEMO_THREADS:-0}
question_a="What is the purpose of the program this manual describes?"
question_b="How do you make bash read commands from a string?"

# ---- 1. prepare (each step is a no-op when already done) ---------------------------------
scripts/setup-llama.sh
if ! grep -qs '^KDN_BUILD_LLAMA:BOOL=ON' "$build/CMakeCache.txt"; then
  KDN_BUILD_DIR=$build scripts/setup.sh
fi
cmake --build "$build" --target kdnd kdnctl kdn-llama >/dev/null
bin=$build/bin

work=$(mktemp -d /tmp/kdn-demo.XXXXXX)
kdnd_pid=
cleanup() {
  if [[ -n "$kdnd_pid" ]]; then kill "$kdnd_pid" 2>/dev/null || true; wait "$kdnd_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# ---- 2. the document ------------------------------------------------------------------------
doc=$work/document.txt
if [[ -f /usr/share/man/man1/bash.1.gz ]] && command -v man >/dev/null; then
  MANWIDTH=100 man -P cat bash 2>/dev/null | col -bx >"$doc" || true
  what="the bash(1) manual"
fi
if [[ ! -s "$doc" ]]; then
  : >"$doc"
  for f in /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GPL-2 /usr/share/doc/*/copyright; do
    [[ -f "$f" ]] && cat "$f" >>"$doc"
    [[ $(wc -c <"$doc") -gt 40000 ]] && break
  done
  what="license texts under /usr/share"
  question_a="What is the purpose of these terms?"
  question_b="Who may copy and distribute the work?"
fi
echo "demo: document: $what, first $tokens tokens"

# ---- 3. kdnd ---------------------------------------------------------------------------------
socket=$work/kdnd.sock
mkdir -p "$work/disk"
start_kdnd() {
  "$bin/kdnd" --socket "$socket" --host-arena-bytes 512M --log-level info \
    --set tier.disk.dirs="$work/disk" --set tier.disk.bytes=1G >>"$work/kdnd.log" 2>&1 &
  kdnd_pid=$!
  for _ in $(seq 100); do
    "$bin/kdnctl" --socket "$socket" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$bin/kdnctl" --socket "$socket" ping >/dev/null || { cat "$work/kdnd.log"; exit 1; }
}
start_kdnd
echo "demo: kdnd running (pid $kdnd_pid), its disk tier in $work/disk"

# ---- 4-6. the engines ----------------------------------------------------------------------
ask() {  # ask <out.json> <question> [flags...]
  local out=$1 q=$2
  shift 2
  "$bin/kdn-llama" --json --prompt-file "$doc" --context-tokens "$tokens" --threads "$threads" \
    --socket "$socket" --question "$q" "$@" >"$out"
}
echo "demo: engine A answers question A (cold: prefills the document, stores it in kdnd)..."
ask "$work/a.json" "$question_a"
echo "demo: engine B, another process, answers question B (reuses A's KV from kdnd)..."
ask "$work/b.json" "$question_b"
echo "demo: engine C answers question B without kdn (what B would have cost)..."
ask "$work/c.json" "$question_b" --no-cache
"$bin/kdnctl" --socket "$socket" stats >"$work/stats.txt" 2>&1 || true

# ---- 7. the comparison ---------------------------------------------------------------------
python3 - "$work" "$question_a" "$question_b" <<'EOF'
import json, sys
work, qa, qb = sys.argv[1:4]
a, b, c = (json.load(open(f"{work}/{n}.json")) for n in "abc")
print()
print(f"  {'':28} {'A (miss)':>12} {'B (hit)':>12} {'B, no kdn':>12}")
rows = [("prompt tokens", "prompt_tokens", "{:d}"), ("TTFT (s)", "ttft_s", "{:.3f}"),
        ("tokens reused from kdnd", "tokens_reused", "{:d}"), ("tokens computed", "tokens_computed", "{:d}"),
        ("KV loaded (MB)", "bytes_loaded", "{:.1f}"), ("KV stored (MB)", "bytes_stored", "{:.1f}")]
for label, key, fmt in rows:
    vals = [r[key] / 1e6 if key.startswith("bytes") else r[key] for r in (a, b, c)]
    print(f"  {label:28} " + " ".join(f"{fmt.format(v):>12}" for v in vals))
saved = c["ttft_s"] - b["ttft_s"]
print(f"\n  B's time to first token: {b['ttft_s']:.3f} s with kdn vs {c['ttft_s']:.3f} s without: "
      f"{saved:.3f} s saved ({c['ttft_s'] / b['ttft_s']:.1f}x faster)")
print(f"  B's answer equals C's (no kdn), token for token: {b['answer_tokens'] == c['answer_tokens']}")
print(f"\n  Q (A): {qa}\n  A: {a['answer'].strip()}\n")
print(f"  Q (B): {qb}\n  A: {b['answer'].strip()}\n")
EOF
echo "kdnd counters:"
sed 's/^/  /' "$work/stats.txt"

# ---- 8. serving through a kdnd restart ------------------------------------------------------
echo
echo "demo: engine S serves questions about the same document, one process throughout..."
coproc SERVE { "$bin/kdn-llama" --serve --json --prompt-file "$doc" --context-tokens "$tokens" --threads "$threads" \
  --socket "$socket" 2>"$work/serve.err"; }
serve() {  # serve <label>: asks question B, appends the answer line to serve.jsonl
  echo "$question_b" >&"${SERVE[1]}"
  local line
  IFS= read -r line <&"${SERVE[0]}" || { cat "$work/serve.err"; exit 1; }
  echo "$line" | python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); j["label"]=sys.argv[1]; print(json.dumps(j))' "$1" \
    >>"$work/serve.jsonl"
}
serve "kdnd up (arena)"
echo "demo: stopping kdnd (SIGTERM: it writes the arena down to its disk tier)..."
kill "$kdnd_pid"; wait "$kdnd_pid" 2>/dev/null || true
serve "kdnd down (prefill)"
echo "demo: starting kdnd again: it rebuilds its index from the slab headers..."
start_kdnd
grep "disk tier ready" "$work/kdnd.log" | tail -1 | sed 's/^.*\] /  kdnd: /'
sleep 0.3  # the engine reconnects on its next call (at most one attempt per 200 ms)
serve "kdnd back (disk)"
exec {SERVE[1]}>&-
"$bin/kdnctl" --socket "$socket" stats >"$work/stats2.txt" 2>&1 || true
python3 - "$work" <<'EOF2'
import json, sys
work = sys.argv[1]
rows = [json.loads(l) for l in open(f"{work}/serve.jsonl")]
print()
print(f"  {'engine S, question B':28} " + " ".join(f"{r['label']:>20}" for r in rows))
for label, key, fmt in [("TTFT (s)", "request_ttft_s", "{:.3f}"), ("tokens reused from kdnd", "tokens_reused", "{:d}"),
                        ("tokens computed", "tokens_computed", "{:d}")]:
    print(f"  {label:28} " + " ".join(f"{fmt.format(r[key]):>20}" for r in rows))
print(f"  {'cache':28} " + " ".join(f"{('ok' if r['cache_status'] == 'ok' else 'unavailable'):>20}" for r in rows))
same = all(r["answer_tokens"] == rows[0]["answer_tokens"] for r in rows)
print(f"\n  the same answer every time, token for token: {same}")
EOF2
echo "kdnd counters after the restart (tier.disk.*: what came back from disk):"
grep -E "^(promoted_chunks|tier\.disk\.(promoted_chunks|recovered_chunks|resident_chunks|reads|faults))" "$work/stats2.txt" | sed 's/^/  /'
echo "demo: stopping kdnd"
kill "$kdnd_pid" 2>/dev/null || true
wait "$kdnd_pid" 2>/dev/null || true
kdnd_pid=

# ---- 9. two vLLM replicas ------------------------------------------------------------------
vllm_skip() { echo "demo: vLLM part skipped: $*"; exit 0; }
[[ -n "${KDN_SKIP_VLLM:-}" ]] && vllm_skip "KDN_SKIP_VLLM is set"
echo
echo "demo: now two vLLM replicas (SmolLM2-135M-Instruct on vLLM's CPU backend, KdnConnector)"
vllm_dir=${KDN_VLLM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kdn/vllm}
if ! KDN_VLLM_DIR=$vllm_dir scripts/setup-vllm.sh >"$work/setup-vllm.log" 2>&1; then
  vllm_skip "the vLLM environment could not be set up ($(tail -1 "$work/setup-vllm.log"))"
fi
if ! grep -qs '^KDN_PYTHON:FILEPATH=..*' "$build/CMakeCache.txt"; then
  cmake -S . -B "$build" -DKDN_VLLM_DIR="$vllm_dir" >/dev/null
fi
cmake --build "$build" --target kdn_python >/dev/null
vllm_python=$(sed -n 's/^KDN_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
vllm_model=$(sed -n 's/^KDN_VLLM_MODEL:PATH=//p' "$build/CMakeCache.txt")
[[ -x "$vllm_python" && -f "$vllm_model/config.json" ]] || vllm_skip "the build has no vLLM venv or model"
KDN_PYTHON=$vllm_python KDN_VLLM_MODEL=$vllm_model KDN_BUILD_DIR=$build PYTHONPATH=$build/python \
  "$vllm_python" python/tools/vllm_demo.py "$doc" "$question_a" "$question_b" --tokens "$tokens"
