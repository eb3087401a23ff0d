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
#   8. blending (docs/blend.md): engine D answers a question about four manual pages given as
#      separate documents (RAG mode): their first use, each is prefilled and stored as a
#      segment; engine E asks about the same pages in another order: every page's KV is
#      loaded at its new position (K re-rotated) and 15% of their tokens recomputed (hkvd);
#      engine F answers E's prompt without kdn and engine G with prefix caching only (which
#      reuses nothing: the first page differs);
#   9. a serving engine S (kdn-llama --serve) answers through a kdnd restart: from the arena,
#      then by prefilling while kdnd is away, then — kdnd back, its disk tier recovered —
#      from the disk tier, having reconnected by itself; then stops kdnd;
#  9b. a second node (docs/remote.md): kdnd has had a remote tier on a Redis server (Debian's
#      redis-server, started here) all along, so what engine A prefilled in step 4 is there;
#      a second kdnd with its own socket and arena stands for another machine, and its engine
#      answers question B from the remote tier without prefilling the document. Skipped, with
#      the reason, without redis-server;
#  9c. two llama-server processes (kdn-llama-server, docs/llama-server.md) on one kdnd: the curl
#      commands a reader can copy, server B's cache_n and prompt time beside server A's;
#  10. the same with two vLLM replicas (python/tools/vllm_demo.py, real vLLM on the CPU
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
cmake --build "$build" --target kdnd kdnctl kdn-llama kdn-llama-server >/dev/null
bin=$build/bin

work=$(mktemp -d /tmp/kdn-demo.XXXXXX)
kdnd_pid=
redis_pid=
server_a_pid=
server_b_pid=
cleanup() {
  for pid in "$server_a_pid" "$server_b_pid"; do
    if [[ -n "$pid" ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  done
  if [[ -n "$kdnd_pid" ]]; then kill "$kdnd_pid" 2>/dev/null || true; wait "$kdnd_pid" 2>/dev/null || true; fi
  if [[ -n "$redis_pid" ]]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
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
# The store every node shares (step 9b): a standalone redis-server on a free loopback port.
remote_flags=()
redis_skip=
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  redis_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    --maxmemory 1gb --maxmemory-policy allkeys-lru >"$work/redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  remote_flags=(--set tier.remote.seeds="127.0.0.1:$redis_port" --set tier.remote.mode=standalone)
else
  redis_skip="redis-server is not installed (Debian: apt-get install redis-server)"
fi
wait_kdnd() {  # wait_kdnd <socket> <log>
  for _ in $(seq 100); do
    "$bin/kdnctl" --socket "$1" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$bin/kdnctl" --socket "$1" ping >/dev/null || { cat "$2"; exit 1; }
}
start_kdnd() {
  "$bin/kdnd" --socket "$socket" --host-arena-bytes 512M --log-level info \
    --set tier.disk.dirs="$work/disk" --set tier.disk.bytes=1G "${remote_flags[@]}" >>"$work/kdnd.log" 2>&1 &
  kdnd_pid=$!
  wait_kdnd "$socket" "$work/kdnd.log"
}
start_kdnd
echo "demo: kdnd running (pid $kdnd_pid), its disk tier in $work/disk"

# ---- 4-6. the engines ----------------------------------------------------------------------
ask() {  # ask <out.json> <question> [flags...]
  local out=$1 q=$2
  shift 2
  "$bin/kdn-llama" --json --progress --prompt-file "$doc" --context-tokens "$tokens" --threads "$threads" \
    --socket "${ask_socket:-$socket}" --question "$q" "$@" >"$out"
}
echo "demo: engine A answers question A. Nothing is cached yet, so A prefills all $tokens tokens of the"
echo "      document, which is what every engine pays for every request without kdn, and stores the KV in kdnd..."
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

# ---- 8. blending: the same documents in another order ---------------------------------------
pages=()
for page in ls cp tar grep; do
  f=$work/page-$page.txt
  if command -v man >/dev/null && MANWIDTH=80 man -P cat 1 "$page" 2>/dev/null | col -bx | head -c 3200 >"$f" &&
    [[ -s "$f" ]]; then
    pages+=("$f")
  fi
done
if ((${#pages[@]} < 4)); then  # no manual pages on this machine: license texts instead
  pages=()
  for lic in GPL-3 Apache-2.0 MPL-2.0 LGPL-2.1; do
    f=$work/page-$lic.txt
    head -c 3200 "/usr/share/common-licenses/$lic" >"$f"
    pages+=("$f")
  done
fi
rag_question="Which of these documents tells how to copy files, and how?"
rag() {  # rag <out.json> <order of page indices> [flags...]
  local out=$1 order=$2
  shift 2
  local args=()
  for i in $order; do args+=(--segment "${pages[$i]}"); done
  "$bin/kdn-llama" --json --progress --threads "$threads" --socket "$socket" --question "$rag_question" "${args[@]}" "$@" >"$out"
}
echo
echo "demo: blending. Engine D asks about 4 documents (first use: each is prefilled and stored as a segment)..."
rag "$work/d.json" "0 1 2 3"
echo "demo: engine E asks about the same documents in another order (each loaded at its new position)..."
rag "$work/e.json" "3 2 0 1"
echo "demo: engine F asks E's prompt without kdn; engine G with prefix caching only..."
rag "$work/f.json" "3 2 0 1" --no-cache
rag "$work/g.json" "3 2 0 1" --blend prefix
python3 - "$work" "$rag_question" "${pages[@]}" <<'EOF'
import json, os, sys
work, q, pages = sys.argv[1], sys.argv[2], sys.argv[3:]
d, e, f, g = (json.load(open(f"{work}/{n}.json")) for n in "defg")
names = [os.path.basename(p)[5:-4] for p in pages]
print()
print(f"  D: {' + '.join(names[i] for i in (0, 1, 2, 3))}    E, F, G: {' + '.join(names[i] for i in (3, 2, 0, 1))}")
print(f"  {'':30} {'D (first use)':>14} {'E (blended)':>14} {'F (no kdn)':>14} {'G (prefix)':>14}")
rows = [("prompt tokens", lambda r: r["prompt_tokens"], "{:d}"), ("TTFT (s)", lambda r: r["ttft_s"], "{:.3f}"),
        ("tokens reused from kdnd", lambda r: r["tokens_reused"], "{:d}"),
        ("documents reused", lambda r: r.get("blend", {}).get("segments_reused", 0), "{:d}"),
        ("document tokens recomputed", lambda r: r.get("blend", {}).get("tokens_recomputed", 0), "{:d}")]
for label, get, fmt in rows:
    print(f"  {label:30} " + " ".join(f"{fmt.format(get(r)):>14}" for r in (d, e, f, g)))
print(f"\n  E's time to first token: {e['ttft_s']:.3f} s blended vs {f['ttft_s']:.3f} s without kdn "
      f"({f['ttft_s'] / e['ttft_s']:.1f}x faster) and {g['ttft_s']:.3f} s with prefix caching")
print(f"  E's answer equals F's (a full prefill), token for token: {e['answer_tokens'] == f['answer_tokens']}")
print(f"\n  Q: {q}\n  E (blended): {e['answer'].strip()}\n  F (full):    {f['answer'].strip()}\n")
EOF
echo "kdnd counters after blending:"
"$bin/kdnctl" --socket "$socket" stats 2>&1 | sed 's/^/  /' || true

# ---- 9. serving through a kdnd restart ------------------------------------------------------
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

# ---- 9b. a second node, through the remote tier ----------------------------------------------
echo
if [[ -n "$redis_skip" ]]; then
  echo "demo: second node skipped: $redis_skip"
else
  echo "demo: a second node: kdnd B (its own socket, arena and disk directory) shares only the Redis server"
  echo "      with the first kdnd, which uploaded engine A's chunks there in step 4..."
  mkdir -p "$work/disk-b"
  "$bin/kdnd" --socket "$work/kdnd-b.sock" --host-arena-bytes 512M --log-level info \
    --set tier.disk.dirs="$work/disk-b" --set tier.disk.bytes=1G "${remote_flags[@]}" >>"$work/kdnd-b.log" 2>&1 &
  kdnd_pid=$!  # cleanup stops it if the demo ends early
  wait_kdnd "$work/kdnd-b.sock" "$work/kdnd-b.log"
  echo "demo: engine H, on node B, answers question B..."
  ask_socket=$work/kdnd-b.sock ask "$work/h.json" "$question_b"
  "$bin/kdnctl" --socket "$work/kdnd-b.sock" stats >"$work/stats-b.txt" 2>&1 || true
  python3 - "$work" <<'EOF3'
import json, sys
work = sys.argv[1]
h, c = (json.load(open(f"{work}/{n}.json")) for n in "hc")
print()
print(f"  {'question B':28} {'node B (remote)':>16} {'no kdn':>12}")
for label, key, fmt in [("TTFT (s)", "ttft_s", "{:.3f}"), ("tokens reused from kdnd", "tokens_reused", "{:d}"),
                        ("tokens computed", "tokens_computed", "{:d}")]:
    print(f"  {label:28} {fmt.format(h[key]):>16} {fmt.format(c[key]):>12}")
print(f"\n  node B answered {c['ttft_s'] / h['ttft_s']:.1f}x sooner than a prefill, with the same tokens: "
      f"{h['answer_tokens'] == c['answer_tokens']}")
EOF3
  echo "kdnd B counters (tier.remote.*: what came from the other node):"
  grep -E "^tier\.remote\.(found_chunks|promoted_chunks|reads|read_bytes|faults)" "$work/stats-b.txt" | sed 's/^/  /'
  kill "$kdnd_pid" 2>/dev/null || true
  wait "$kdnd_pid" 2>/dev/null || true
  kdnd_pid=
fi

# ---- 9c. two llama-server processes (docs/llama-server.md) ------------------------------------
echo
echo "demo: two llama-server processes (kdn-llama-server: llama.cpp's OpenAI-compatible server with kdnd"
echo "      as its prompt cache) on one kdnd; any HTTP client talks to them..."
"$bin/kdnd" --socket "$work/kdnd-s.sock" --host-arena-bytes 512M --log-level info >>"$work/kdnd-s.log" 2>&1 &
kdnd_pid=$!
wait_kdnd "$work/kdnd-s.sock" "$work/kdnd-s.log"
server_threads=$threads
[[ "$server_threads" == 0 ]] && server_threads=$(nproc)
start_server() {  # start_server NAME PORT: one slot, batches of one kdn chunk
  "$bin/kdn-llama-server" -m "$model" --host 127.0.0.1 --port "$2" -np 1 -c 8192 -b 256 -ub 256 \
    -t "$server_threads" --kdn-socket "$work/kdnd-s.sock" >>"$work/server-$1.log" 2>&1 &
  eval "server_$1_pid=$!"
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$2/health" >/dev/null && return; sleep 0.2; done
  cat "$work/server-$1.log"; exit 1
}
model=$(sed -n 's/^set(KDN_LLAMA_MODEL "\(.*\)")$/\1/p' "${KDN_LLAMA_DIR:-third_party/.cache/llama}/llama-pin.cmake")
port_a=$((20000 + RANDOM % 20000)); port_b=$((port_a + 1))
start_server a "$port_a"
start_server b "$port_b"
# The request bodies: the document (cut to the first $tokens tokens by the server's tokenizer)
# and a question, as a chat message.
python3 - "$doc" "$port_a" "$tokens" "$question_a" "$question_b" "$work" <<'EOF4'
import json, sys, urllib.request
doc, port, n, qa, qb, work = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())
toks = post("/tokenize", {"content": open(doc, errors="replace").read()})["tokens"][:n]
text = post("/detokenize", {"tokens": toks})["content"]
for name, q in (("a", qa), ("b", qb)):
    json.dump({"messages": [{"role": "user", "content": text + "\n\n" + q}], "max_tokens": 48, "temperature": 0},
              open(f"{work}/request-{name}.json", "w"))
EOF4
echo "demo: server A (port $port_a) answers question A; nothing is cached yet, so it prefills the document:"
echo "  curl -s http://127.0.0.1:$port_a/v1/chat/completions -H 'Content-Type: application/json' -d @$work/request-a.json"
curl -s "http://127.0.0.1:$port_a/v1/chat/completions" -H 'Content-Type: application/json' -d @"$work/request-a.json" >"$work/reply-a.json"
echo "demo: server B (port $port_b), another process, answers question B:"
echo "  curl -s http://127.0.0.1:$port_b/v1/chat/completions -H 'Content-Type: application/json' -d @$work/request-b.json"
curl -s "http://127.0.0.1:$port_b/v1/chat/completions" -H 'Content-Type: application/json' -d @"$work/request-b.json" >"$work/reply-b.json"
python3 - "$work" <<'EOF5'
import json, sys
work = sys.argv[1]
a, b = (json.load(open(f"{work}/reply-{n}.json")) for n in "ab")
print()
print(f"  {'':34} {'server A':>10} {'server B':>10}")
for label, key, fmt in [("prompt tokens from a cache (cache_n)", "cache_n", "{:d}"),
                        ("prompt tokens computed (prompt_n)", "prompt_n", "{:d}"),
                        ("prompt processing (ms)", "prompt_ms", "{:.0f}")]:
    print(f"  {label:34} {fmt.format(a['timings'][key]):>10} {fmt.format(b['timings'][key]):>10}")
print(f"\n  B's answer: {b['choices'][0]['message']['content'].strip()[:200]}")
EOF5
echo "demo: server B's log says where its prompt came from:"
grep -h "kdn: slot" "$work/server-b.log" | sed 's/^/  /'
echo "demo: / serves no web UI in this build (the API is all there is): HTTP $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port_b/")"
kill "$server_a_pid" "$server_b_pid" 2>/dev/null || true
wait "$server_a_pid" "$server_b_pid" 2>/dev/null || true
server_a_pid=
server_b_pid=
kill "$kdnd_pid" 2>/dev/null || true
wait "$kdnd_pid" 2>/dev/null || true
kdnd_pid=

# ---- 10. two vLLM replicas -----------------------------------------------------------------
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
# LMCache beside kdn where its environment is set up (empty: the demo says it was not run).
lmcache_python=$(sed -n 's/^KDN_LMCACHE_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt")
KDN_LMCACHE_PYTHON=$lmcache_python \
  KDN_PYTHON=$vllm_python KDN_VLLM_MODEL=$vllm_model KDN_BUILD_DIR=$build PYTHONPATH=$build/python \
  "$vllm_python" python/tools/vllm_demo.py "$doc" "$question_a" "$question_b" --tokens "$tokens"
