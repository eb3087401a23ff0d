"""kdn-bench vllm --throughput: R vLLM replicas serving a shared-document workload, for three
systems in one run — no connector (each engine's own prefix cache only), LMCache's MP server,
and kdn.

The workload (shared_docs.py): D documents of --min-tokens..--max-tokens tokens, each request a
Zipf(s)-chosen document plus one of 128 questions, answered with --answer-tokens greedy tokens.
Every system gets the same requests in two phases:

  open     the requests arrive on a fixed schedule (Poisson at --rate/s, or --arrivals fixed)
           whatever the engines' state, queueing for the first free engine;
  closed   R clients, each sending its next request when its last is answered: the most the
           replicas complete per second.

Each engine answers one request at a time (its prefill is compute-bound on a CPU core), and a
request goes to whichever engine is free first: no cache-aware routing, so a document lands on
every replica over time. Every engine's own KV cache is capped at --engine-kv-tokens (by
default two of the largest documents), as a GPU's memory holds a few documents beside the
weights; the cap is the same for all three systems. The connector-less figures come from kdn's
engines with kdn off per request (no load, no store), their prefix caches reset before and
after. Reported per system and phase: completed requests/s, TTFT p50/p99 (measured in the
engine, queueing excluded; the latency figures include it), prompt tokens computed per request
(prompt minus what the engine's cache or connector supplied), and wrong answers: greedy tokens
that differ from the connector-less answer to the same document and question.

Bars: kdn's closed-loop requests/s >= 1.2 x LMCache's and >= 2 x no connector's; kdn's TTFT
p99 <= LMCache's (open loop); 0 wrong answers with kdn.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import random
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmcache_server  # noqa: E402
import replicas  # noqa: E402
import shared_docs  # noqa: E402
import vllm_crash  # noqa: E402
import vllm_side_by_side as sbs  # noqa: E402

SYSTEMS = ("none", "lmcache", "kdn")
BLOCK_TOKENS = 128  # vLLM's CPU attention block
UNRELATED = "The quick brown fox jumps over the lazy dog. " * 20


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kdn-bench vllm --throughput", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--replicas", type=int, default=2, help="engine processes per system")
    p.add_argument("--documents", type=int, default=4)
    p.add_argument("--min-tokens", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the document choice")
    p.add_argument("--requests", type=int, default=16, help="requests per phase")
    p.add_argument("--rate", type=float, default=0.2, help="open-loop arrivals per second")
    p.add_argument("--arrivals", choices=["poisson", "fixed"], default="poisson")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--answer-tokens", type=int, default=8)
    p.add_argument("--engine-kv-tokens", type=int, default=0,
                   help="each engine's KV cache in tokens (0: two of the largest documents plus a question)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="any of none,lmcache,kdn")
    p.add_argument("--phases", default="open,closed", help="any of open,closed,crash (in that order)")
    p.add_argument("--crash-every", type=float, default=60.0, help="crash phase: SIGKILL an engine every K s")
    p.add_argument("--server-kill-at", type=float, default=90.0,
                   help="crash phase: SIGKILL and restart the cache server at this second (<0: never)")
    p.add_argument("--crash-requests", type=int, default=0, help="requests of the crash phase (0: --requests)")
    p.add_argument("--crash-bucket", type=float, default=30.0, help="seconds per point of throughput over time")
    p.add_argument("--request-timeout", type=float, default=900.0, help="seconds an engine may take per request")
    p.add_argument("--dtype", default="float32", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--kdnd-arena", default="2G")
    p.add_argument("--require-bars", action="store_true", help="exit 3 when a bar fails")
    a = p.parse_args(argv)
    a.systems = [s for s in a.systems.split(",") if s]
    a.phases = [s for s in a.phases.split(",") if s]
    if not a.systems or any(s not in SYSTEMS for s in a.systems):
        p.error(f"--systems takes any of {','.join(SYSTEMS)}")
    if not a.phases or any(s not in ("open", "closed", "crash") for s in a.phases):
        p.error("--phases takes any of open,closed,crash")
    if a.crash_every <= 0 or a.crash_bucket <= 0 or a.request_timeout <= 0 or a.crash_requests < 0:
        p.error("--crash-every, --crash-bucket and --request-timeout must be positive")
    a.server_kill_at = None if a.server_kill_at < 0 else a.server_kill_at
    if min(a.replicas, a.documents, a.requests, a.answer_tokens) < 1 or a.rate <= 0:
        p.error("--replicas, --documents, --requests, --answer-tokens and --rate must be positive")
    try:
        shared_docs.WorkloadSpec(a.documents, a.min_tokens, a.max_tokens, a.zipf, a.seed).check()
    except ValueError as e:
        p.error(str(e))
    return a


def log(msg: str) -> None:
    print(f"throughput bench: {msg}", file=sys.stderr, flush=True)


class EnginePool:
    """Free engines; a request takes the first free one and gives it back when answered."""

    def __init__(self, engines: list[replicas.Replica]) -> None:
        self.free: queue.Queue[replicas.Replica] = queue.Queue()
        for r in engines:
            self.free.put(r)

    @contextlib.contextmanager
    def engine(self):
        r = self.free.get()
        try:
            yield r
        finally:
            self.free.put(r)


class KdndControl:
    """The crash schedule's hold on kdnd: SIGKILL, restart on the same socket and disk."""

    def __init__(self, kdnd: replicas.Kdnd) -> None:
        self.kdnd = kdnd

    def kill(self) -> None:
        self.kdnd.kill()

    def restart(self) -> None:
        self.kdnd.start(timeout=600)

    def pid(self) -> int | None:
        return self.kdnd.proc.pid if self.kdnd.proc else None


class LMCacheControl:
    """The same for LMCache's server, restarted on the same port (a new log)."""

    def __init__(self, server: lmcache_server.LMCacheServer) -> None:
        self.server = server

    def kill(self) -> None:
        if self.server.proc is not None:
            self.server.proc.kill()
            self.server.proc.wait()

    def restart(self) -> None:
        self.server.restart()

    def pid(self) -> int | None:
        return self.server.proc.pid if self.server.proc else None


class Throughput:
    def __init__(self, a: argparse.Namespace, work: str) -> None:
        self.a = a
        self.work = work
        self.report: dict[str, Any] = {"errors": {}, "systems": {}}
        self.spec = shared_docs.WorkloadSpec(a.documents, a.min_tokens, a.max_tokens, a.zipf, a.seed)
        self.workload = shared_docs.Workload(self.spec)
        self.kv_token_bytes = sbs.kv_bytes_per_token(replicas.model_dir(), a.dtype)
        working_set = sum(self.workload.sizes) * self.kv_token_bytes
        self.kdnd = replicas.Kdnd(os.path.join(work, "kdnd.sock"), arena=a.kdnd_arena, extra=self.kdnd_disk(working_set))
        self.server = lmcache_server.LMCacheServer(os.path.join(work, "lmcache-server.log"),
                                                   lmcache_server.l1_gib(working_set), a.chunk_tokens)
        self.max_len = a.max_tokens + 64 + a.answer_tokens + BLOCK_TOKENS
        kv = a.engine_kv_tokens or 2 * self.max_len
        self.kv_blocks = max(-(-kv // BLOCK_TOKENS), -(-self.max_len // BLOCK_TOKENS))
        self.engines: list[replicas.Replica] = []
        n = a.requests
        reqs = self.workload.requests(n * 2)
        self.phase_requests = {"open": reqs[:n], "closed": reqs[n:]}
        if a.arrivals == "poisson":
            self.arrivals = shared_docs.poisson_arrivals(a.rate, n, a.seed)
        else:
            self.arrivals = shared_docs.fixed_arrivals(a.rate, n)
        self.reference: dict[tuple[int, int], list[int]] = {}
        # The crash phase asks again what the other phases asked (so each answer has its
        # connector-less reference), in another order.
        again = [q for p in ("open", "closed") if p in a.phases for q in self.phase_requests[p]] or list(reqs)
        random.Random(a.seed).shuffle(again)
        count = a.crash_requests or n
        self.crash_requests = [shared_docs.Request(i, q.document, q.question)
                               for i, q in enumerate((again * (count // len(again) + 1))[:count])]
        self.crash_arrivals = shared_docs.poisson_arrivals(a.rate, count, a.seed + 1)

    def kdnd_disk(self, working_set: int) -> list[str]:
        """With the crash phase, kdnd writes every chunk through to a disk tier, so a restarted
        kdnd still has them."""
        if "crash" not in self.a.phases:
            return []
        disk = Path(self.work, "disk")
        disk.mkdir()
        size = max(64, -(-working_set * 3 // 2 // (64 << 20)) * 64)
        self.disk_config = {"tier.disk.dirs": str(disk), "tier.disk.bytes": f"{size}M",
                            "tier.disk.policy": "write_through"}
        return [x for k, v in self.disk_config.items() for x in ("--set", f"{k}={v}")]

    # ---- engines ---------------------------------------------------------------------------
    def engine(self, name: str, args: list[str]) -> replicas.Replica:
        r = replicas.Replica(name, "--chunk-tokens", str(self.a.chunk_tokens), "--max-num-batched-tokens",
                             str(self.a.chunk_tokens), "--max-model-len", str(self.max_len), "--num-blocks",
                             str(self.kv_blocks), "--dtype", self.a.dtype, *args, log_dir=self.work, env=sbs.MP_ENV)
        self.engines.append(r)
        return r

    def warm(self, r: replicas.Replica) -> None:
        """First-request costs (allocations, kernel choice) out of the measurement."""
        r.generate([self.encode(r, UNRELATED)[:200]], max_tokens=2, kdn="off")

    def start_engines(self, kind: str, args: list[str], python: str | None = None) -> list[replicas.Replica]:
        engines = [self.engine(f"{kind}-{i}", args) for i in range(self.a.replicas)]
        log(f"starting {len(engines)} {kind} engines")
        sbs.start_together(engines, python=python)
        self.report.setdefault("engine_start_s", {}).update({r.name: r.start_seconds for r in engines})
        for r in engines:
            self.warm(r)
        return engines

    def spawner(self, args: list[str], python: str | None) -> Callable[[str], replicas.Replica]:
        """Starts one replacement engine (the crash schedule)."""
        def spawn(name: str) -> replicas.Replica:
            r = self.engine(name, args)
            with sbs.interpreter(python or replicas.python()):
                r.start(timeout=sbs.START_TIMEOUT_S)
            self.warm(r)
            return r
        return spawn

    def stop_engines(self) -> None:
        for r in self.engines:
            sbs.stop_engine(r)
        self.engines = []

    def close(self) -> None:
        self.stop_engines()
        self.kdnd.stop()
        self.server.stop()

    @staticmethod
    def encode(r: replicas.Replica, text: str) -> list[int]:
        return r.send("encode", text=text)["token_ids"]

    def prepare(self, r: replicas.Replica) -> None:
        """Documents and questions as token ids (the engine's own tokenizer)."""
        log(f"tokenizing {self.a.documents} documents")
        self.docs = self.workload.document_tokens(lambda text: self.encode(r, text))
        used = {q.question for reqs in self.phase_requests.values() for q in reqs}
        self.questions = {q: self.encode(r, shared_docs.question_text(q)) for q in used}
        self.report["workload"] = {
            "documents": self.a.documents, "document_tokens": self.workload.sizes, "zipf_s": self.a.zipf,
            "document_probabilities": [round(p, 4) for p in self.workload.probabilities],
            "requests_per_phase": self.a.requests, "arrivals": self.a.arrivals, "rate_per_s": self.a.rate,
            "seed": self.a.seed, "answer_tokens": self.a.answer_tokens, "questions_used": len(used),
            "working_set_bytes": sum(self.workload.sizes) * self.kv_token_bytes,
            "engine_kv_tokens": self.kv_blocks * BLOCK_TOKENS}

    def prompt(self, req: shared_docs.Request) -> list[int]:
        return self.docs[req.document] + self.questions[req.question]

    # ---- one system ------------------------------------------------------------------------
    def run_system(self, name: str, engines: list[replicas.Replica], kdn_mode: str = "on",
                   counters: Callable[[], dict[str, float]] | None = None) -> None:
        pool = EnginePool(engines)
        out: dict[str, Any] = self.report["systems"].setdefault(name, {})

        def send(req: shared_docs.Request) -> dict:
            with pool.engine() as r:
                reply = r.send("serve", timeout=self.a.request_timeout, prompt=self.prompt(req),
                               max_tokens=self.a.answer_tokens, kdn=kdn_mode)
                return {**reply, "engine": r.name}

        for phase in [p for p in self.a.phases if p != "crash"]:
            reqs = self.phase_requests[phase]
            before = counters() if counters else {}
            log(f"{name}: {phase} loop, {len(reqs)} requests")
            if phase == "open":
                results = shared_docs.run_open_loop(reqs, self.arrivals, send)
            else:
                results = shared_docs.run_closed_loop(reqs, len(engines), send)
            after = counters() if counters else {}
            out[phase] = self.phase_summary(name, results)
            if counters:
                out[phase]["cache_counters"] = {k: after[k] - before.get(k, 0) for k in after}

    def run_crash(self, name: str, engines: list[replicas.Replica], kdn_mode: str,
                  spawn: Callable[[str], replicas.Replica], server: Any) -> None:
        run = vllm_crash.CrashRun(self.a, engines, spawn, server, self.prompt, kdn_mode, log)
        log(f"{name}: crash schedule, {len(self.crash_requests)} requests, an engine killed every "
            f"{self.a.crash_every:g} s, the server at {self.a.server_kill_at} s")
        results = run.run(self.crash_requests, self.crash_arrivals)
        out = self.phase_summary(name, results)
        out.update(run.summary(results, self.a.chunk_tokens))
        for probe in out["restarted_engine_probes"]:
            key = (probe.get("document"), probe.get("question"))
            if key in self.reference:
                probe["tokens_match_reference"] = probe.pop("token_ids") == self.reference[key]
                out["wrong_answers"] = (out["wrong_answers"] or 0) + (not probe["tokens_match_reference"])
            probe.pop("token_ids", None)
        self.report["systems"][name]["crash"] = out

    def phase_summary(self, name: str, results: list[shared_docs.Result]) -> dict[str, Any]:
        s = shared_docs.summarize(results)
        rows, computed, wrong, checked = [], [], 0, 0
        for r in results:
            q = r.request
            row = {"index": q.index, "document": q.document, "question": q.question,
                   "scheduled_s": round(r.scheduled_s, 3), "latency_s": round(r.finished_s - r.scheduled_s, 3)}
            if r.error:
                row["error"] = r.error
            else:
                prompt_tokens = len(self.prompt(q))
                row.update({"engine": r.reply["engine"], "ttft_s": round(r.reply["ttft_s"], 4),
                            "prompt_tokens": prompt_tokens, "computed_tokens": prompt_tokens - r.reply["cached_tokens"]})
                computed.append(row["computed_tokens"])
                key = (q.document, q.question)
                if name == "none":
                    self.reference.setdefault(key, r.reply["token_ids"])
                if key in self.reference:
                    checked += 1
                    row["tokens_match_reference"] = r.reply["token_ids"] == self.reference[key]
                    wrong += not row["tokens_match_reference"]
            rows.append(row)
        s.update({"computed_tokens_per_request": sum(computed) / len(computed) if computed else None,
                  "prompt_tokens_per_request": sum(len(self.prompt(r.request)) for r in results) / len(results),
                  "answers_checked": checked, "wrong_answers": wrong if checked else None, "requests_detail": rows})
        return s

    # ---- the three systems -----------------------------------------------------------------
    def kdn_counters(self) -> dict[str, float]:
        s = sbs.kdnd_stats(self.kdnd.socket)
        return {k: s[k] for k in ("stored_bytes", "retrieved_bytes", "retrieved_chunks") if k in s}

    def run_kdn_engines(self) -> None:
        """No connector first (kdn off per request), then kdn, on the same engines."""
        want = [s for s in ("none", "kdn") if s in self.a.systems]
        if not want:
            return
        self.kdnd.start(timeout=600)  # a disk tier writes its slab file first
        args = ["--kdn-socket", self.kdnd.socket]
        engines = self.start_engines("kdn", args)
        self.prepare(engines[0])
        for name in want:
            for r in engines:
                r.send("reset_prefix_cache")
            self.run_system(name, engines, kdn_mode="off" if name == "none" else "on", counters=self.kdn_counters)
        self.report["kdn_config"] = {"kdnd_arena": self.a.kdnd_arena, "chunk_tokens": self.a.chunk_tokens,
                                     "connector": "kdn.vllm KdnConnector", "engine_prefix_caching": "on",
                                     "disk_tier": getattr(self, "disk_config", None)}
        if "crash" in self.a.phases and "kdn" in want:
            self.run_crash("kdn", engines, "on", self.spawner(args, None), KdndControl(self.kdnd))
        self.stop_engines()
        self.kdnd.stop()

    def lmcache_counters(self) -> dict[str, float]:
        return self.server.transfers(0)

    def run_lmcache(self) -> None:
        if "lmcache" not in self.a.systems:
            return
        self.report["lmcache_config"] = {**self.server.config(), "engine_prefix_caching": "on"}
        log(f"starting LMCache's server (L1 {self.server.l1} GiB)")
        self.server.start()
        self.report["lmcache_config"]["server_start_s"] = self.server.start_seconds
        args = ["--lmcache-port", str(self.server.port)]
        engines = self.start_engines("lmcache", args, python=lmcache_server.python())
        if not hasattr(self, "docs"):
            self.prepare(engines[0])
        self.run_system("lmcache", engines, counters=self.lmcache_counters)
        if "crash" in self.a.phases:
            self.run_crash("lmcache", engines, "on", self.spawner(args, lmcache_server.python()),
                           LMCacheControl(self.server))
        self.stop_engines()
        self.server.stop()

    # ---- bars ------------------------------------------------------------------------------
    def figure(self, system: str, phase: str, field: str) -> float | None:
        return self.report["systems"].get(system, {}).get(phase, {}).get(field)

    def bars(self) -> bool:
        bars: dict[str, Any] = {}

        def bar(name: str, value: float | None, op: str, target: float) -> None:
            ok = None if value is None else (value >= target if op == ">=" else value <= target)
            bars[name] = {"value": value, "op": op, "target": target, "pass": ok}

        def ratio(x: float | None, y: float | None) -> float | None:
            return x / y if x is not None and y else None

        phase = "closed" if "closed" in self.a.phases else "open"
        kdn = self.figure("kdn", phase, "requests_per_s")
        bar("throughput_vs_lmcache", ratio(kdn, self.figure("lmcache", phase, "requests_per_s")), ">=", 1.2)
        bar("throughput_vs_none", ratio(kdn, self.figure("none", phase, "requests_per_s")), ">=", 2.0)
        p99 = "open" if "open" in self.a.phases else "closed"
        bar("ttft_p99_kdn_over_lmcache", ratio(self.figure("kdn", p99, "ttft_p99_s"),
                                               self.figure("lmcache", p99, "ttft_p99_s")), "<=", 1.0)
        wrong = [self.figure("kdn", p, "wrong_answers") for p in self.a.phases]
        bar("wrong_answers_kdn", None if None in wrong else float(sum(wrong)), "<=", 0.0)
        self.report["bars"] = bars
        return all(b["pass"] for b in bars.values())


TABLE = ("requests_per_s", "ttft_p50_s", "ttft_p99_s", "latency_p99_s", "computed_tokens_per_request",
         "completed", "wrong_answers")


def print_table(report: dict[str, Any]) -> None:
    print(f"{'system':<8} {'phase':<7}" + "".join(f"{c:>30}" for c in TABLE))
    for name, phases in report.get("systems", {}).items():
        for phase, s in phases.items():
            cells = [s.get(c) for c in TABLE]
            print(f"{name:<8} {phase:<7}" + "".join(
                f"{'null' if v is None else (f'{v:.4f}' if isinstance(v, float) else v):>30}" for v in cells))
    for name, b in report.get("bars", {}).items():
        print(f"bar {name}: {b['value']} {b['op']} {b['target']}: {'pass' if b['pass'] else 'FAIL'}")
    for name, why in report.get("errors", {}).items():
        print(f"error {name}: {why}")


def smoke(requests: int, work: str, kdnd: replicas.Kdnd, server: lmcache_server.LMCacheServer) -> Throughput:
    """The workload at its smallest on another benchmark's engines (kdn-bench vllm --lmcache
    --throughput-requests N): two documents of 256-512 tokens, one closed loop per system."""
    a = parse_args(["--documents", "2", "--min-tokens", "256", "--max-tokens", "512", "--requests", str(requests),
                    "--phases", "closed"])
    t = Throughput(a, work)
    t.kdnd, t.server = kdnd, server
    return t


def config(a: argparse.Namespace) -> dict[str, Any]:
    import datetime
    import platform

    import vllm

    return {"date": datetime.date.today().isoformat(), "host_cpus": os.cpu_count(), "machine": platform.machine(),
            "vllm": vllm.__version__, "model": os.path.basename(replicas.model_dir()), "dtype": a.dtype,
            "chunk_tokens": a.chunk_tokens, "max_num_batched_tokens": a.chunk_tokens,
            "engines": "one process each, VLLM_ENABLE_V1_MULTIPROCESSING=1",
            "omp_threads_per_engine": os.environ.get("KDN_VLLM_OMP_THREADS", "1"),
            "load_average_at_start": list(os.getloadavg())}


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    try:
        replicas.model_dir()
    except RuntimeError as e:
        print(f"kdn-bench vllm --throughput: {e}", file=sys.stderr)
        return 2
    if "lmcache" in a.systems and not lmcache_server.python():
        print("kdn-bench vllm --throughput: LMCache needs its environment (KDN_LMCACHE_PYTHON; "
              "scripts/setup-lmcache.sh), or leave it out with --systems none,kdn", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="kdn-vllm-throughput.")
    bench = Throughput(a, work)
    bench.report["config"] = {**config(a), "replicas": a.replicas, "routing": "first free engine",
                              "engine_kv_blocks": bench.kv_blocks, "block_tokens": BLOCK_TOKENS,
                              "requests_per_engine_at_once": 1}
    import vllm_bench

    def steps() -> None:
        bench.run_kdn_engines()
        bench.run_lmcache()
        bench.report["load_average_at_end"] = list(os.getloadavg())

    return vllm_bench.run_and_report(a, bench, work, steps, print_table, "engine and server logs")
