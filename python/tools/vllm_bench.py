"""kdn-bench vllm: what kdn saves vLLM replicas on one node (real vLLM on the CPU backend).

For documents of 1K, 2K and 4K tokens followed by a fixed 16-token question, with
SmolLM2-135M-Instruct in vLLM engines that each run in their own process:

  ttft_miss_s             engine B computes the whole prompt (kdn off for the request, B's
                          prefix cache reset before each run);
  ttft_kdn_hit_s          engine A (another process) answered the same document with another
                          question and stored it in kdnd; B, its prefix cache reset before each
                          run, loads the document's chunks from kdnd and computes the question;
  ttft_own_prefix_hit_s   B's own prefix cache holds the prompt (kdn off): the in-process limit;
  ttft_offload_hit_s      vLLM's own CPU offloading connector in one engine, its prefix cache
                          reset (so the blocks come back from the offload store), and
  ttft_offload_cross_process_s
                          the same document asked of a second offloading engine (another
                          process): its offload store is its own, so this is a miss;
  tokens_identical        B's greedy tokens (--check-tokens of them) with kdn equal those
                          without kdn;
  kdn_hit_bytes_loaded    bytes one hit copied from kdnd into B's KV cache.

Each TTFT is the median of --reps wall times of generate(max_tokens=1) after B answered an
unrelated prompt. Engines run on KDN_VLLM_OMP_THREADS unbound OpenMP threads each (default 1,
see replicas.py; "auto" keeps vLLM's one bound thread per core). Every figure comes from this run; a figure that could not be measured is
null with its reason under errors.<name>. Bars: miss/kdn hit >= 20 at 4K; kdn hit <= own
prefix hit + 0.03 s at every size; tokens identical at every size.

    python vllm_bench.py [--json] [--sizes 1024,2048,4096] [--reps 3] [--no-offload]

With --lmcache the run is kdn beside LMCache instead (vllm_side_by_side.py: every engine's core
in its own process, LMCache's MP server from its venv, KDN_LMCACHE_PYTHON):

    python vllm_bench.py --lmcache [--json] [--sizes 1024,2048,4096] [--reps 3] [--no-plain-engine]

With --throughput: replicas serving a shared-document workload, no connector vs LMCache vs kdn
(vllm_throughput.py; its own options, --help there).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmcache_server  # noqa: E402
import replicas  # noqa: E402
import vllm_side_by_side  # noqa: E402

QUESTION_B = "\n\nQuestion: Which component of the system does this text describe first?\nAnswer:"
QUESTION_A = "\n\nQuestion: What is this text about? Answer in one sentence.\nAnswer:"
UNRELATED = "The quick brown fox jumps over the lazy dog. " * 40


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kdn-bench vllm", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--sizes", default="1024,2048,4096", help="document tokens, multiples of --chunk-tokens")
    p.add_argument("--reps", type=int, default=3, help="timed runs per figure (the median is reported)")
    p.add_argument("--question-tokens", type=int, default=16)
    p.add_argument("--check-tokens", type=int, default=16, help="greedy tokens compared with and without kdn")
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="the engines' dtype (bf16 is ~7x slower than float32 on CPUs without AVX512-BF16)")
    p.add_argument("--max-num-batched-tokens", type=int, default=256,
                   help="vLLM's prefill step (the chunk size: a hit then computes exactly what a miss does)")
    p.add_argument("--kdnd-arena", default="1G")
    p.add_argument("--no-offload", action="store_true", help="skip vLLM's own offloading connector")
    p.add_argument("--require-bars", action="store_true", help="exit 3 when a bar fails")
    p.add_argument("--lmcache", action="store_true", help="kdn beside LMCache in one run (vllm_side_by_side.py)")
    p.add_argument("--throughput-requests", type=int, default=0,
                   help="with --lmcache: also serve this many shared-document requests per system on the same "
                        "engines (the throughput bench's workload at its smallest)")
    p.add_argument("--no-plain-engine", action="store_true",
                   help="with --lmcache: the miss without a connector and vLLM's own prefix hit come from kdn's "
                        "engine B with kdn off for the request (one engine fewer to start)")
    a = p.parse_args(argv)
    a.sizes = [int(s) for s in a.sizes.split(",") if s]
    if not a.sizes or any(s <= 0 or s % a.chunk_tokens for s in a.sizes):
        p.error(f"--sizes must be positive multiples of --chunk-tokens ({a.chunk_tokens})")
    if a.reps < 1 or a.question_tokens < 1 or a.check_tokens < 1:
        p.error("--reps, --question-tokens and --check-tokens must be at least 1")
    return a


def log(msg: str) -> None:
    print(f"vllm bench: {msg}", file=sys.stderr, flush=True)


def exact(tokens: list[int], n: int, filler: list[int]) -> list[int]:
    """`tokens` cut or padded (with `filler`) to exactly n tokens."""
    out = list(tokens[:n])
    while len(out) < n:
        out += filler[: n - len(out)]
    return out


class Bench:
    def __init__(self, a: argparse.Namespace, work: str) -> None:
        self.a = a
        self.work = work
        self.report: dict[str, Any] = {"errors": {}}
        self.kdnd = replicas.Kdnd(os.path.join(work, "kdnd.sock"), arena=a.kdnd_arena)
        self.engines: list[replicas.Replica] = []

    def replica(self, name: str, *args: str) -> replicas.Replica:
        r = replicas.Replica(name, "--chunk-tokens", str(self.a.chunk_tokens), "--max-num-batched-tokens",
                             str(self.a.max_num_batched_tokens), "--dtype", self.a.dtype, *args, log_dir=self.work)
        self.engines.append(r)
        log(f"starting engine {name}")
        r.start()
        log(f"engine {name} ready in {r.start_seconds:.1f} s")
        return r

    def stop(self, r: replicas.Replica) -> None:
        r.stop()
        self.engines.remove(r)

    def close(self) -> None:
        for r in list(self.engines):
            r.stop()
        self.kdnd.stop()

    # ---- prompts ---------------------------------------------------------------------------
    def prompts(self, b: replicas.Replica) -> None:
        enc = lambda text: b.send("encode", text=text)["token_ids"]  # noqa: E731
        corpus = enc(replicas.corpus())
        q_b = enc(QUESTION_B)
        q_a = enc(QUESTION_A)
        n = self.a.question_tokens
        self.q_b, self.q_a = exact(q_b, n, q_a), exact(q_a, n, q_b)
        self.docs = {s: d[0] for s, d in replicas.documents(corpus, self.a.sizes).items()}
        self.unrelated = enc(UNRELATED)[:200]

    # ---- kdn: miss, hit, own prefix hit -----------------------------------------------------
    def run_kdn(self) -> None:
        self.kdnd.start()
        a = self.replica("A", "--kdn-socket", self.kdnd.socket)
        b = self.replica("B", "--kdn-socket", self.kdnd.socket)
        self.report["engine_start_s"] = b.start_seconds
        self.prompts(b)
        for r in (a, b):
            r.generate([self.unrelated], max_tokens=4, kdn="off")
        for size in self.a.sizes:
            self.one_size(a, b, size)
        self.stop(a)
        self.stop(b)
        self.kdnd.stop()

    def one_size(self, a: replicas.Replica, b: replicas.Replica, size: int) -> None:
        k = f"prompt_{size}"
        doc = self.docs[size]
        prompt = doc + self.q_b
        reps, n = self.a.reps, self.a.check_tokens
        log(f"{size} tokens: miss")
        miss = b.send("ttft", prompt=prompt, repeat=reps, reset_prefix_cache=True, kdn="off")
        b.send("reset_prefix_cache")
        miss_tokens = b.generate([prompt], max_tokens=n, kdn="off")[0]
        log(f"{size} tokens: A stores the document")
        before_a = a.stats()
        a.generate([doc + self.q_a], max_tokens=1)
        stored = a.stats()["saved_chunks"] - before_a["saved_chunks"]
        log(f"{size} tokens: kdn hit")
        before = b.stats()
        hit = b.send("ttft", prompt=prompt, repeat=reps, reset_prefix_cache=True, kdn="on")
        mid = b.stats()
        b.send("reset_prefix_cache")
        hit_tokens = b.generate([prompt], max_tokens=n, kdn="on")[0]
        after = b.stats()
        log(f"{size} tokens: own prefix hit")
        b.send("reset_prefix_cache")
        b.generate([prompt], max_tokens=1, kdn="off")  # fills B's own prefix cache
        own = b.send("ttft", prompt=prompt, repeat=reps, reset_prefix_cache=False, kdn="off")

        chunks = size // self.a.chunk_tokens
        loads = mid["loads"] - before["loads"]
        self.report[k] = {
            "document_tokens": size,
            "prompt_tokens": len(prompt),
            "ttft_miss_s": miss["median"],
            "ttft_kdn_hit_s": hit["median"],
            "ttft_own_prefix_hit_s": own["median"],
            "ttft_miss_runs_s": miss["seconds"],
            "ttft_kdn_hit_runs_s": hit["seconds"],
            "ttft_own_prefix_hit_runs_s": own["seconds"],
            "speedup_kdn": miss["median"] / hit["median"],
            "kdn_hit_minus_own_prefix_hit_s": hit["median"] - own["median"],
            "chunks_stored_by_a": stored,
            "kdn_hit_chunks_loaded": (mid["loaded_chunks"] - before["loaded_chunks"]) / max(loads, 1),
            "kdn_hit_bytes_loaded": (mid["loaded_bytes"] - before["loaded_bytes"]) / max(loads, 1),
            "kdn_hit_load_s": (mid["load_seconds"] - before["load_seconds"]) / max(loads, 1),
            "kdn_hit_loads": loads,
            "kdn_load_failures": after["load_failures"] - before["load_failures"],
            "tokens_identical": hit_tokens == miss_tokens and hit["token_ids"] == miss["token_ids"],
            "first_token_identical": hit["token_ids"] == miss["token_ids"],
        }
        if loads != reps or mid["loaded_chunks"] - before["loaded_chunks"] != reps * chunks:
            self.report["errors"][f"{k}.ttft_kdn_hit_s"] = (
                f"B loaded {mid['loaded_chunks'] - before['loaded_chunks']} chunks in {loads} loads, "
                f"expected {reps * chunks} in {reps}")
        log(f"{size} tokens: miss {miss['median']:.3f} s, kdn hit {hit['median']:.3f} s, "
            f"own prefix hit {own['median']:.3f} s")

    # ---- vLLM's own offloading connector ---------------------------------------------------
    def run_offload(self) -> None:
        try:
            self.measure_offload()
        except Exception as e:  # noqa: BLE001 - reported, not raised: the rest of the run stands
            lines = str(e).strip().splitlines()
            why = next((line for line in reversed(lines) if "Error" in line), lines[0] if lines else "")
            for size in self.a.sizes:
                for f in ("ttft_offload_hit_s", "ttft_offload_cross_process_s"):
                    if self.report[f"prompt_{size}"].get(f) is None:
                        self.report[f"prompt_{size}"][f] = None
                        self.report["errors"][f"prompt_{size}.{f}"] = f"vLLM's OffloadingConnector failed: {why}"
            for r in [r for r in self.engines if r.name.startswith("offload")]:
                self.stop(r)

    def measure_offload(self) -> None:
        extra = json.dumps({"cpu_bytes_to_use": 1 << 30})
        o1 = self.replica("offload-1", "--offload", "--extra", extra)
        o1.generate([self.unrelated], max_tokens=4)
        o2 = self.replica("offload-2", "--offload", "--extra", extra)
        o2.generate([self.unrelated], max_tokens=4)
        for size in self.a.sizes:
            prompt = self.docs[size] + self.q_b
            o1.generate([self.docs[size] + self.q_a], max_tokens=1)
            o1.send("reset_prefix_cache")
            o1.generate([prompt], max_tokens=1)  # the offload store holds the prompt's blocks now
            hit = o1.send("ttft", prompt=prompt, repeat=self.a.reps, reset_prefix_cache=True)
            cross = o2.send("ttft", prompt=prompt, repeat=self.a.reps, reset_prefix_cache=True)
            self.report[f"prompt_{size}"].update({"ttft_offload_hit_s": hit["median"],
                                                  "ttft_offload_cross_process_s": cross["median"],
                                                  "ttft_offload_hit_runs_s": hit["seconds"],
                                                  "ttft_offload_cross_process_runs_s": cross["seconds"]})
            log(f"{size} tokens: offload hit {hit['median']:.3f} s, cross-process {cross['median']:.3f} s")
        self.stop(o1)
        self.stop(o2)

    # ---- bars ------------------------------------------------------------------------------
    def bars(self) -> bool:
        bars: dict[str, Any] = {}

        def bar(name: str, value: float | None, op: str, target: float) -> None:
            ok = None if value is None else (value >= target if op == ">=" else value <= target)
            bars[name] = {"value": value, "op": op, "target": target, "pass": ok}

        big = max(self.a.sizes)
        r = self.report.get(f"prompt_{big}", {})
        bar(f"speedup_{big}", r.get("speedup_kdn"), ">=", 20.0)
        for size in self.a.sizes:
            r = self.report.get(f"prompt_{size}", {})
            bar(f"kdn_hit_vs_own_prefix_hit_{size}_s", r.get("kdn_hit_minus_own_prefix_hit_s"), "<=", 0.03)
        ident = [self.report.get(f"prompt_{s}", {}).get("tokens_identical") for s in self.a.sizes]
        bar("tokens_identical", None if None in ident else float(all(ident)), ">=", 1.0)
        self.report["bars"] = bars
        return all(b["pass"] for b in bars.values())


def config(a: argparse.Namespace) -> dict[str, Any]:
    import vllm

    return {"date": datetime.date.today().isoformat(), "host_cpus": os.cpu_count(), "machine": platform.machine(),
            "vllm": vllm.__version__, "model": os.path.basename(replicas.model_dir()), "dtype": a.dtype,
            "sizes": a.sizes, "reps": a.reps, "question_tokens": a.question_tokens,
            "chunk_tokens": a.chunk_tokens, "max_num_batched_tokens": a.max_num_batched_tokens,
            "kdnd_arena": a.kdnd_arena,
            "engines": "one process each, VLLM_ENABLE_V1_MULTIPROCESSING=" + ("1" if a.lmcache else "0"),
            "omp_threads_per_engine": os.environ.get("KDN_VLLM_OMP_THREADS", "1"),
            "load_average_at_start": list(os.getloadavg())}


TABLE = ("ttft_miss_s", "ttft_kdn_hit_s", "ttft_own_prefix_hit_s", "ttft_offload_hit_s",
         "ttft_offload_cross_process_s", "speedup_kdn", "kdn_hit_bytes_loaded", "tokens_identical")


def print_table(report: dict[str, Any], sizes: list[int], cols: tuple[str, ...], width: int) -> None:
    print("tokens  " + "  ".join(f"{c:>{width}}" for c in cols))
    for s in sizes:
        r = report.get(f"prompt_{s}", {})
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{'null' if v is None else (f'{v:.4f}' if isinstance(v, float) else v):>{width}}")
        print(f"{s:>6}  " + "  ".join(cells))
    for name, b in report.get("bars", {}).items():
        print(f"bar {name}: {b['value']} {b['op']} {b['target']}: {'pass' if b['pass'] else 'FAIL'}")
    for name, why in report.get("errors", {}).items():
        print(f"error {name}: {why}")


def main(argv: list[str]) -> int:
    if "--throughput" in argv:
        import vllm_throughput

        return vllm_throughput.main([x for x in argv if x != "--throughput"])
    a = parse_args(argv)
    try:
        replicas.model_dir()
    except RuntimeError as e:
        print(f"kdn-bench vllm: {e}", file=sys.stderr)
        return 2
    if a.lmcache:
        return side_by_side(a)
    work = tempfile.mkdtemp(prefix="kdn-vllm-bench.")
    bench = Bench(a, work)
    bench.report["config"] = config(a)

    def steps() -> None:
        bench.run_kdn()
        if a.no_offload:
            for s in a.sizes:
                bench.report[f"prompt_{s}"].update({"ttft_offload_hit_s": None, "ttft_offload_cross_process_s": None})
                bench.report["errors"][f"prompt_{s}.ttft_offload_hit_s"] = "skipped (--no-offload)"
        else:
            bench.run_offload()

    return run_and_report(a, bench, work, steps, lambda r: print_table(r, a.sizes, TABLE, 28), "engine logs")


def run_and_report(a: argparse.Namespace, bench: Any, work: str, steps: Callable[[], None],
                   printer: Callable[[dict[str, Any]], None], kept: str) -> int:
    """Runs the steps, closes every process, prints the report; 1 when a step failed (the
    logs stay in `work`), 3 when --require-bars and a bar failed."""
    failed = False
    try:
        steps()
    except Exception as e:  # noqa: BLE001 - the report says what failed
        bench.report["errors"]["run"] = f"{type(e).__name__}: {e}"
        log(f"failed: {e}")
        failed = True
    finally:
        bench.close()
    passed = bench.bars()
    if a.json:
        print(json.dumps(bench.report, indent=2))
    else:
        printer(bench.report)
    if failed:
        print(f"kdn-bench vllm: {kept} kept in {work}", file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 3 if a.require_bars and not passed else 0


def side_by_side(a: argparse.Namespace) -> int:
    if not lmcache_server.python():
        print("kdn-bench vllm: --lmcache needs LMCache's environment (KDN_LMCACHE_PYTHON; scripts/setup-lmcache.sh)",
              file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="kdn-vllm-lmcache.")
    bench = vllm_side_by_side.SideBySide(a, work, log)
    bench.report["config"] = config(a)
    bench.report["config"]["plain_engine"] = "kdn engine B, kdn off" if a.no_plain_engine else "its own engine"

    def steps() -> None:
        bench.run_kdn((QUESTION_B, QUESTION_A, UNRELATED))
        bench.run_lmcache()

    return run_and_report(a, bench, work, steps, lambda r: print_table(r, a.sizes, vllm_side_by_side.TABLE, 24),
                          "engine and server logs")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
