#!/usr/bin/env python3
"""kdn-bench llama-server --throughput: two kdn-llama-server processes and concurrent clients on
the shared-document workload (python/tools/shared_docs.py, the one the vLLM throughput benchmark
uses): D documents drawn by a Zipf law, each request a document and one of many questions,
routed round-robin to the two servers.

For each cache mode, servers and kdnd start fresh (cold) for each of two runs:
  open    a fixed arrival schedule (--rate requests/s), sent whether or not earlier ones are done;
  closed  --concurrency clients, each sending its next request when its last one is answered
          (the maximum the node sustains).
Modes:
  kdn        kdn on, --cache-ram 0: a document one server prefilled is loaded by the other;
  cache-ram  kdn off, llama-server's own --cache-ram (8 GiB): each process caches its own prompts;
  none       kdn off, --cache-ram 0, cache_prompt false: every prompt prefilled.
Reported per run: requests/s, TTFT p50/p99 (client side, streamed, queueing in the server
included), prefill tokens per request (timings.prompt_n) and cached tokens per request.

Environment: KDN_KDND, KDN_LLAMA_SERVER, KDN_LLAMA_MODEL (kdn-bench sets them).
Exit: 0 measured, 1 a measurement failed, 2 usage.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shared_docs  # noqa: E402
from llama_server_procs import CHUNK, Kdnd, Server  # noqa: E402

MODES = {
    "kdn": {"kdn": True, "extra": ["--cache-ram", "0"], "cache_prompt": True},
    "cache-ram": {"kdn": False, "extra": [], "cache_prompt": True},
    "none": {"kdn": False, "extra": ["--cache-ram", "0"], "cache_prompt": False},
}


def stream_completion(server, tokens, max_tokens, cache_prompt):
    """One streamed /completion on token ids: client-side TTFT and the final timings."""
    body = {"prompt": tokens, "n_predict": max_tokens, "temperature": 0, "stream": True,
            "cache_prompt": cache_prompt}
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, timings = None, None
    with urllib.request.urlopen(req, timeout=1800) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if ttft is None and (ev.get("content") or ev.get("tokens")):
                ttft = time.perf_counter() - t0
            timings = ev.get("timings", timings)
    if ttft is None or timings is None:
        raise RuntimeError(f"no token or no timings streamed; see {server.log}")
    return {"ttft_s": ttft, "prompt_n": timings["prompt_n"], "cache_n": timings["cache_n"]}


class Prompts:
    """Token ids of every request's prompt: its document's, then its question's; tokenized once
    by one server (every run uses the same model, so the same ids)."""

    def __init__(self, server, workload, requests):
        self.docs = workload.document_tokens(server.tokenize)
        self.questions = {q: server.tokenize(shared_docs.question_text(q)) for q in {r.question for r in requests}}

    def of(self, req):
        return self.docs[req.document] + self.questions[req.question]


def summarize(results):
    out = shared_docs.summarize(results)
    done = [r.reply for r in results if not r.error]
    out["prefill_tokens_per_request"] = statistics.fmean(r["prompt_n"] for r in done) if done else None
    out["cached_tokens_per_request"] = statistics.fmean(r["cache_n"] for r in done) if done else None
    out["errors"] = sorted({r.error for r in results if r.error})[:3]
    return out


def run_load(servers, prompts, requests, mode, max_tokens, arrivals=None, concurrency=None):
    """The requests against running servers (round-robin by index), open loop when `arrivals`
    is given, else closed loop: shared_docs' summary plus prefill and cached tokens."""
    def send(req):
        return stream_completion(servers[req.index % len(servers)], prompts.of(req), max_tokens,
                                 MODES[mode]["cache_prompt"])

    if arrivals is not None:
        results = shared_docs.run_open_loop(requests, arrivals, send)
    else:
        results = shared_docs.run_closed_loop(requests, concurrency, send)
    return summarize(results)


def server_args(mode, slots, ctx, threads):
    m = MODES[mode]
    return dict(slots=slots, ctx=ctx, threads=threads, kdn=m["kdn"], extra=m["extra"])


def measure(work, mode, loop, a, workload, log, prompts_cache):
    """One cold run: kdnd and two servers started for it, stopped after."""
    run_dir = os.path.join(work, f"{mode}-{loop}")
    os.makedirs(run_dir)
    kdnd = Kdnd(run_dir, arena="1G").start()
    ctx = a.max_doc_tokens + 256
    try:
        with Server(run_dir, "s1", kdnd.sock, **server_args(mode, a.slots, ctx, a.threads)) as s1, \
             Server(run_dir, "s2", kdnd.sock, **server_args(mode, a.slots, ctx, a.threads)) as s2:
            requests = workload.requests(a.requests)
            if "p" not in prompts_cache:
                prompts_cache["p"] = Prompts(s1, workload, requests)
            log(f"{mode}: {loop} loop, {a.requests} requests")
            if loop == "open":
                arrivals = shared_docs.fixed_arrivals(a.rate, a.requests)
                return run_load([s1, s2], prompts_cache["p"], requests, mode, a.max_tokens, arrivals=arrivals)
            return run_load([s1, s2], prompts_cache["p"], requests, mode, a.max_tokens, concurrency=a.concurrency)
    finally:
        kdnd.stop()


def ratios(modes):
    out = {}
    for loop in ("open", "closed"):
        k = modes.get("kdn", {}).get(loop, {})
        for base in ("cache-ram", "none"):
            b = modes.get(base, {}).get(loop, {})
            if k.get("requests_per_s") and b.get("requests_per_s"):
                out[f"{loop}_rps_kdn_vs_{base}"] = k["requests_per_s"] / b["requests_per_s"]
            if k.get("ttft_p50_s") and b.get("ttft_p50_s"):
                out[f"{loop}_ttft_p50_{base}_vs_kdn"] = b["ttft_p50_s"] / k["ttft_p50_s"]
    return out


def parse(argv):
    p = argparse.ArgumentParser(prog="kdn-bench llama-server --throughput", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--documents", type=int, default=4, help="D: documents in the workload")
    p.add_argument("--min-doc-tokens", type=int, default=2048, help="shortest document (tokens)")
    p.add_argument("--max-doc-tokens", type=int, default=4096, help="longest document (tokens)")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the document choice (0: uniform)")
    p.add_argument("--seed", type=int, default=1, help="workload seed")
    p.add_argument("--requests", type=int, default=16, help="requests per run")
    p.add_argument("--rate", type=float, default=0.5, help="open loop: requests/s, fixed schedule")
    p.add_argument("--concurrency", type=int, default=4, help="closed loop: clients")
    p.add_argument("--slots", type=int, default=2, help="slots per server (continuous batching)")
    p.add_argument("--threads", type=int, default=1, help="compute threads per server")
    p.add_argument("--max-tokens", type=int, default=8, help="greedy tokens per answer")
    p.add_argument("--modes", default="kdn,cache-ram,none", help="comma-separated: kdn, cache-ram, none")
    p.add_argument("--loops", default="open,closed", help="comma-separated: open, closed")
    a = p.parse_args(argv)
    modes, loops = a.modes.split(","), a.loops.split(",")
    if not set(modes) <= set(MODES) or not set(loops) <= {"open", "closed"}:
        p.error("--modes takes kdn, cache-ram, none; --loops takes open, closed")
    if not CHUNK <= a.min_doc_tokens <= a.max_doc_tokens <= 7680:
        p.error(f"need {CHUNK} <= --min-doc-tokens <= --max-doc-tokens <= 7680 (the model's context is 8192)")
    if min(a.documents, a.requests, a.concurrency, a.slots, a.threads, a.max_tokens) < 1 or not a.rate > 0:
        p.error("documents, requests, concurrency, slots, threads and max-tokens at least 1; rate > 0")
    a.mode_list, a.loop_list = modes, loops
    return a


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    # SIGTERM unwinds like an exception, so the servers and kdnd are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for var in ("KDN_KDND", "KDN_LLAMA_SERVER", "KDN_LLAMA_MODEL"):
        if not os.path.exists(os.environ.get(var, "")):
            print(f"kdn-bench llama-server: {var} is not set to an existing file", file=sys.stderr)
            return 2

    def log(msg):
        print(f"kdn-bench llama-server --throughput: {msg}", file=sys.stderr, flush=True)

    spec = shared_docs.WorkloadSpec(documents=a.documents, min_tokens=a.min_doc_tokens,
                                    max_tokens=a.max_doc_tokens, zipf_s=a.zipf, seed=a.seed)
    workload = shared_docs.Workload(spec)
    work = tempfile.mkdtemp(prefix="kdn-bench-llama-server-throughput-")
    modes, prompts = {}, {}
    try:
        for mode in a.mode_list:
            modes[mode] = {}
            for loop in a.loop_list:
                modes[mode][loop] = measure(work, mode, loop, a, workload, log, prompts)
                log(f"{mode}, {loop} loop: {json.dumps(modes[mode][loop])}")
    except Exception as e:  # a server or kdnd that failed: say so, keep the logs
        log(f"measurement failed: {e}; logs in {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    report = {"bench": "llama-server-throughput", "servers": 2, "slots": a.slots, "threads": a.threads,
              "workload": {"documents": a.documents, "doc_tokens": workload.sizes, "zipf_s": a.zipf, "seed": a.seed,
                           "requests": a.requests, "rate": a.rate, "concurrency": a.concurrency,
                           "max_tokens": a.max_tokens},
              "modes": modes, "ratios": ratios(modes)}
    if a.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{'mode':>10} {'loop':>6} {'req/s':>7} {'ttft p50':>9} {'ttft p99':>9} {'prefill/req':>11} "
          f"{'cached/req':>10} {'failed':>6}")
    for mode, loops in modes.items():
        for loop, r in loops.items():
            f = lambda v, w, d: f"{v:>{w}.{d}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
            print(f"{mode:>10} {loop:>6} {f(r['requests_per_s'], 7, 3)} {f(r['ttft_p50_s'], 9, 2)} "
                  f"{f(r['ttft_p99_s'], 9, 2)} {f(r['prefill_tokens_per_request'], 11, 0)} "
                  f"{f(r['cached_tokens_per_request'], 10, 0)} {r['failed']:>6}")
    for name, v in report["ratios"].items():
        print(f"{name}: {v:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
