#!/usr/bin/env python3
"""kdn-bench llama-server: time to the first streamed token over HTTP, llama-server with kdn.

For each document size (license texts Debian installs, cut to N tokens), three kdn-llama-server
processes on loopback, one kdnd:

  miss          server A (--cache-ram 0), cache_prompt false: the whole prompt prefilled;
                A stores the document's chunks in kdnd after its first token.
  kdn hit       server B, another process (--cache-ram 0): a slot evicted by another prompt,
                then a new question about the document; its chunks come from kdnd.
  cache-ram hit server C (llama-server's own --cache-ram, 8 GiB by default): the same slot
                eviction and question; the slot's state comes back from C's prompt cache.

B and C answer the same questions, one pair per repetition, B first then C, so both see the
same drift of a shared machine; the figures are medians and the median of the pairs' ratios.
tokens_identical: B's greedy answer to A's question (its first request) equals A's miss.
Every server runs one slot, --threads threads and batches of one chunk (256 tokens), so a
hit's suffix is computed in the batches a miss uses.

With --throughput, the two-server throughput benchmark instead (llama_server_throughput.py,
its own options).

Environment: KDN_KDND, KDN_LLAMA_SERVER, KDN_LLAMA_MODEL (kdn-bench sets them).
Exit: 0 measured, 1 a measurement failed, 2 usage, 3 a bar failed under --require-bars.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_server_procs import CHUNK, Kdnd, Server, request  # noqa: E402

QUESTION = "Summarize the text above in one sentence."
# The hit pairs' questions start with different words, so a --cache-ram entry of one question
# shares no more of the next one's prompt than kdn's chunks do (the document).
PAIR_QUESTIONS = ["What does the text above say about copying?", "Which rights does the text above grant?",
                  "List the conditions the text above sets.", "Explain the warranty terms of the text above.",
                  "Who is bound by the text above?", "Describe the purpose of the text above.",
                  "How may the work above be modified?", "Does the text above allow selling copies?",
                  "Name the obligations of a distributor above.", "Give the main point of the text above."]


def license_text():
    parts = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, errors="replace") as f:
                parts.append(f.read())
    return "\n\n".join(parts)


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def cut_document(server, text, n_tokens):
    """The text cut so that the chat prompt up to the document's end is about n_tokens long
    (the chat template's head, a system prompt for SmolLM2, comes first): the document's
    last chunk is then whole, as with kdn-llama --context-tokens."""
    head = common_prefix(server.prompt_tokens("Alpha", "x"), server.prompt_tokens("Beta", "x"))
    tokens = request(server.port, "/tokenize", {"content": text, "add_special": False})["tokens"]
    if len(tokens) < n_tokens - head:
        raise RuntimeError(f"the license texts hold {len(tokens)} tokens, fewer than {n_tokens - head}")
    doc = request(server.port, "/detokenize", {"tokens": tokens[:n_tokens - head]})["content"]
    shared = common_prefix(server.prompt_tokens(doc, PAIR_QUESTIONS[0]), server.prompt_tokens(doc, PAIR_QUESTIONS[1]))
    return doc, shared


def evict(server):
    """Another prompt takes the one slot (C saves the old one in its prompt cache)."""
    request(server.port, "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0})


def timed(server, doc, question, max_tokens, cache_prompt=True):
    text, timings, _ = server.chat_stream(doc, question, max_tokens, cache_prompt=cache_prompt)
    if server.ttft_s is None:
        raise RuntimeError(f"no token streamed; see {server.log}")
    return {"ttft_s": server.ttft_s, "text": text, "cache_n": timings["cache_n"],
            "prompt_n": timings["prompt_n"], "prompt_ms": timings["prompt_ms"]}


def measure_size(a, b, c, text, n_tokens, reps, max_tokens, log):
    doc, shared = cut_document(a, text, n_tokens)
    log(f"{n_tokens} tokens: miss")
    miss = timed(a, doc, QUESTION, max_tokens, cache_prompt=False)
    evict(b)
    first_hit = timed(b, doc, QUESTION, max_tokens)
    evict(c)
    timed(c, doc, QUESTION, max_tokens)  # C's slot gets the document (from kdnd), then its cache
    kdn, cram = [], []
    for i in range(reps):
        log(f"{n_tokens} tokens: hit pair {i + 1} / {reps}")
        q = PAIR_QUESTIONS[i % len(PAIR_QUESTIONS)] + ("" if i < len(PAIR_QUESTIONS) else f" ({i})")
        evict(b)
        kdn.append(timed(b, doc, q, max_tokens))
        evict(c)
        cram.append(timed(c, doc, q, max_tokens))
    med = statistics.median
    out = {
        "doc_tokens": n_tokens,
        "prompt_tokens": miss["prompt_n"] + miss["cache_n"],
        "prompt_tokens_to_document_end": shared,
        "ttft_miss_s": miss["ttft_s"],
        "ttft_kdn_hit_s": med(r["ttft_s"] for r in kdn),
        "ttft_cache_ram_hit_s": med(r["ttft_s"] for r in cram),
        "kdn_vs_cache_ram_paired": med(k["ttft_s"] / r["ttft_s"] for k, r in zip(kdn, cram)),
        "ttft_kdn_first_hit_s": first_hit["ttft_s"],
        "kdn_cache_n": [r["cache_n"] for r in kdn],
        "cache_ram_cache_n": [r["cache_n"] for r in cram],
        "ttft_kdn_hit_runs_s": [r["ttft_s"] for r in kdn],
        "ttft_cache_ram_hit_runs_s": [r["ttft_s"] for r in cram],
        "tokens_identical": first_hit["text"] == miss["text"],
        "hit_answers_identical": all(k["text"] == r["text"] for k, r in zip(kdn, cram)),
    }
    out["speedup"] = out["ttft_miss_s"] / out["ttft_kdn_hit_s"]
    return out


def bars(sizes):
    four = next((s for s in sizes if s["doc_tokens"] == 4096), None)
    out = {"tokens_identical": {"value": all(s["tokens_identical"] for s in sizes), "bar": "true"}}
    out["tokens_identical"]["met"] = out["tokens_identical"]["value"]
    if four:
        sp = four["speedup"]
        ratio = four["ttft_kdn_hit_s"] / four["ttft_cache_ram_hit_s"]
        diff = four["ttft_kdn_hit_s"] - four["ttft_cache_ram_hit_s"]
        out["speedup_4k"] = {"value": sp, "bar": ">= 20", "met": sp >= 20}
        out["vs_cache_ram_4k"] = {"value": ratio, "diff_s": diff, "bar": "<= 1.2x or within 30 ms",
                                  "met": ratio <= 1.2 or diff <= 0.030}
    return out


def main():
    if "--throughput" in sys.argv[1:]:  # the two-server throughput benchmark, its own options
        import llama_server_throughput
        return llama_server_throughput.main([x for x in sys.argv[1:] if x != "--throughput"])
    p = argparse.ArgumentParser(prog="kdn-bench llama-server", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--sizes", default="1024,4096,6144", help="document tokens, comma-separated")
    p.add_argument("--reps", type=int, default=5, help="hit pairs per size (kdn hit, then cache-ram hit)")
    p.add_argument("--threads", type=int, default=1, help="compute threads of every server")
    p.add_argument("--max-tokens", type=int, default=16, help="greedy tokens per answer")
    p.add_argument("--keep-logs", action="store_true", help="keep the servers' and kdnd's logs")
    p.add_argument("--require-bars", action="store_true", help="exit 3 when a bar is not met")
    p.add_argument("--throughput", action="store_true",
                   help="instead: the throughput benchmark (two servers, concurrent clients; its own --help)")
    a = p.parse_args()
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        p.error("--sizes takes comma-separated token counts")
    if not sizes or any(n < CHUNK or n > 7680 for n in sizes) or a.reps < 1 or a.threads < 1 or a.max_tokens < 1:
        p.error(f"sizes must lie in [{CHUNK}, 7680] (the model's context is 8192); reps, threads and "
                "max-tokens at least 1")
    for var in ("KDN_KDND", "KDN_LLAMA_SERVER", "KDN_LLAMA_MODEL"):
        if not os.path.exists(os.environ.get(var, "")):
            print(f"kdn-bench llama-server: {var} is not set to an existing file", file=sys.stderr)
            return 2

    def log(msg):
        print(f"kdn-bench llama-server: {msg}", file=sys.stderr, flush=True)

    work = tempfile.mkdtemp(prefix="kdn-bench-llama-server-")
    kdnd = Kdnd(work, arena="1G")
    results, rc = [], 0
    try:
        kdnd.start()
        common = dict(ctx=8192, threads=a.threads)
        with Server(work, "a", kdnd.sock, extra=["--cache-ram", "0"], **common) as sa, \
             Server(work, "b", kdnd.sock, extra=["--cache-ram", "0"], **common) as sb, \
             Server(work, "c", kdnd.sock, **common) as sc:
            text = license_text()
            for n in sizes:
                results.append(measure_size(sa, sb, sc, text, n, a.reps, a.max_tokens, log))
    except Exception as e:  # a server or kdnd that failed: say so, keep the logs
        log(f"measurement failed: {e}; logs in {work}")
        return 1
    finally:
        kdnd.stop()
    report = {"bench": "llama-server", "threads": a.threads, "batch_tokens": CHUNK, "reps": a.reps,
              "max_tokens": a.max_tokens, "sizes": results, "tokens_identical": all(r["tokens_identical"] for r in results)}
    report["bars"] = bars(results)
    if a.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{'doc tokens':>10} {'miss s':>8} {'kdn hit s':>10} {'cache-ram s':>12} {'speedup':>8} "
              f"{'kdn/cram':>9} {'identical':>9}")
        for r in results:
            print(f"{r['doc_tokens']:>10} {r['ttft_miss_s']:>8.3f} {r['ttft_kdn_hit_s']:>10.4f} "
                  f"{r['ttft_cache_ram_hit_s']:>12.4f} {r['speedup']:>8.1f} {r['kdn_vs_cache_ram_paired']:>9.3f} "
                  f"{str(r['tokens_identical']):>9}")
        for name, b in report["bars"].items():
            print(f"bar {name}: {b['value']} ({b['bar']}): {'met' if b['met'] else 'NOT met'}")
    if not a.keep_logs:
        shutil.rmtree(work, ignore_errors=True)
    else:
        log(f"logs in {work}")
    if a.require_bars and not all(b["met"] for b in report["bars"].values()):
        rc = 3
    return rc


if __name__ == "__main__":
    sys.exit(main())
