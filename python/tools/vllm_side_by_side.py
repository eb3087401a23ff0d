"""kdn-bench vllm --lmcache: kdn beside LMCache, the system a user would pick instead, in one run.

The same model, prompts and OpenMP threads for every engine, and every engine with its core in
a process of its own (VLLM_ENABLE_V1_MULTIPROCESSING=1: LMCache's connector needs it). For each
document size (a document followed by a fixed question):

  ttft_miss_none_s         a miss on an engine without a connector (its prefix cache reset);
  ttft_miss_kdn_s          a miss on a kdn engine, storing into kdnd included (distinct documents);
  ttft_miss_lmcache_s      a miss on an LMCache engine, storing into LMCache's server included;
  store_cost_kdn_s / store_cost_lmcache_s
                           what storing adds to a miss: the miss above minus ttft_miss_none_s;
  ttft_kdn_hit_s           another kdn engine (process) answers the document with another
                           question: it loads the document from kdnd (its prefix cache reset);
  ttft_lmcache_hit_s       the same for LMCache: another LMCache engine retrieves it from the
                           server (prefix caching off there: LMCache keeps finished requests'
                           blocks, so vLLM cannot reset its prefix cache and a stale own hit would
                           pass for an LMCache hit); the server's log must show the retrieve;
  ttft_own_prefix_hit_s    vLLM's own prefix hit (no connector): the in-process limit;
  kdn_hit_bytes / lmcache_hit_bytes
                           bytes one hit moved: kdnd's retrieved_bytes (kdnctl stats), and the
                           tokens LMCache's server logged as retrieved times the KV bytes a token
                           takes;
  tokens_identical_kdn / tokens_identical_lmcache
                           greedy tokens of each hit equal the connector-less miss's.

Each TTFT is the median of --reps runs. Bars: kdn's hit <= 0.8 x LMCache's at 4K; tokens
identical for both at every size; every hit loaded (kdnd served it, LMCache's server logged
the retrieve). A figure that could not be measured is null with its reason under errors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import lmcache_server
import replicas

MP_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
LOAD_BAR = 0.8  # kdn's hit TTFT over LMCache's, at 4K
START_TIMEOUT_S = 1800  # an engine starts in ~30 s alone, in many minutes on a busy 2-core machine


def kv_bytes_per_token(model: str, dtype: str) -> int:
    c = json.loads(Path(model, "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    element = 4 if dtype == "float32" else 2
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * head_dim * element  # K and V


@contextlib.contextmanager
def interpreter(path: str) -> Iterator[None]:
    """Replica.start runs replicas.python(), read from KDN_PYTHON at that moment."""
    old = os.environ.get("KDN_PYTHON")
    os.environ["KDN_PYTHON"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KDN_PYTHON", None)
        else:
            os.environ["KDN_PYTHON"] = old


def start_together(engines: list[replicas.Replica], python: str | None = None) -> None:
    """Starts the engines at once (their start-ups overlap), raising the first failure."""
    errors: list[BaseException] = []

    def one(r: replicas.Replica) -> None:
        try:
            r.start(timeout=START_TIMEOUT_S)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    with interpreter(python or replicas.python()):
        threads = [threading.Thread(target=one, args=(r,)) for r in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


def stop_engine(r: replicas.Replica) -> None:
    """Stops a replica and its engine-core process: the core is a child of the replica here
    (VLLM_ENABLE_V1_MULTIPROCESSING=1), and a replica killed mid-start leaves it running."""
    import psutil

    children = []
    if r.proc is not None:
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(r.proc.pid).children(recursive=True)
    r.stop()
    for c in children:
        with contextlib.suppress(psutil.Error):
            c.kill()


def kdnd_stats(socket: str) -> dict[str, float]:
    out = subprocess.run([str(replicas.build_dir() / "bin" / "kdnctl"), "--socket", socket, "stats", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


class SideBySide:
    def __init__(self, a: argparse.Namespace, work: str, log: Callable[[str], None]) -> None:
        self.a = a
        self.work = work
        self.log = log
        self.report: dict[str, Any] = {"errors": {}}
        self.engines: list[replicas.Replica] = []
        self.kdnd = replicas.Kdnd(os.path.join(work, "kdnd.sock"), arena=a.kdnd_arena)
        self.kv_token_bytes = kv_bytes_per_token(replicas.model_dir(), a.dtype)
        working_set = sum(a.sizes) * a.reps * self.kv_token_bytes
        self.server = lmcache_server.LMCacheServer(os.path.join(work, "lmcache-server.log"),
                                                   lmcache_server.l1_gib(working_set), a.chunk_tokens)
        self.max_len = max(a.sizes) + a.question_tokens + a.check_tokens + 256
        self.shared = None
        if a.throughput_requests:  # the throughput bench's workload on these engines
            import vllm_throughput

            self.shared = vllm_throughput.smoke(a.throughput_requests, work, self.kdnd, self.server)
            self.max_len = max(self.max_len, self.shared.max_len)

    def replica(self, name: str, *args: str) -> replicas.Replica:
        r = replicas.Replica(name, "--chunk-tokens", str(self.a.chunk_tokens), "--max-num-batched-tokens",
                             str(self.a.max_num_batched_tokens), "--max-model-len", str(self.max_len),
                             "--dtype", self.a.dtype, *args,
                             log_dir=self.work, env=MP_ENV)
        self.engines.append(r)
        return r

    def stop_all(self) -> None:
        for r in self.engines:
            stop_engine(r)
        self.engines = []

    def close(self) -> None:
        self.stop_all()
        self.kdnd.stop()
        self.server.stop()

    def row(self, size: int) -> dict[str, Any]:
        return self.report.setdefault(f"prompt_{size}", {"document_tokens": size})

    def error(self, size: int, field: str, why: str) -> None:
        self.report["errors"][f"prompt_{size}.{field}"] = why
        self.log(f"{size} tokens: {field}: {why}")

    # ---- prompts ---------------------------------------------------------------------------
    def prompts(self, r: replicas.Replica, question_b: str, question_a: str, unrelated: str) -> None:
        enc = lambda text: r.send("encode", text=text)["token_ids"]  # noqa: E731
        corpus = enc(replicas.corpus())
        need = sum(s + 17 for s in self.a.sizes) * self.a.reps
        if need > len(corpus):
            raise RuntimeError(f"the corpus has {len(corpus)} tokens, {need} are needed for distinct documents")
        n = self.a.question_tokens
        q_b, q_a = enc(question_b), enc(question_a)
        self.q_b = (q_b + q_a)[:n]
        self.q_a = (q_a + q_b)[:n]
        self.docs = replicas.documents(corpus, self.a.sizes, count=self.a.reps)
        self.unrelated = enc(unrelated)[:200]

    # ---- kdn and no connector --------------------------------------------------------------
    def run_kdn(self, questions: tuple[str, str, str]) -> None:
        self.kdnd.start()
        k_a = self.replica("kdn-A", "--kdn-socket", self.kdnd.socket)
        k_b = self.replica("kdn-B", "--kdn-socket", self.kdnd.socket)
        plain = self.replica("none") if not self.a.no_plain_engine else None
        self.log("starting the kdn engines" + (" and the engine without a connector" if plain else ""))
        start_together(list(self.engines))
        self.report["engine_start_s"] = {r.name: r.start_seconds for r in self.engines}
        self.prompts(k_b, *questions)
        for r in self.engines:
            r.generate([self.unrelated], max_tokens=4, kdn="off")
        for size in self.a.sizes:
            self.measure_none(plain or k_b, size)
            self.measure_kdn(k_a, k_b, size)
        if self.shared:
            self.shared.prepare(k_b)
            for name in ("none", "kdn"):
                for r in (k_a, k_b):
                    r.send("reset_prefix_cache")
                self.shared.run_system(name, [k_a, k_b], "off" if name == "none" else "on", self.shared.kdn_counters)
        self.stop_all()
        self.kdnd.stop()

    def measure_none(self, plain: replicas.Replica, size: int) -> None:
        prompt, reps, n = self.docs[size][0] + self.q_b, self.a.reps, self.a.check_tokens
        self.log(f"{size} tokens: miss without a connector")
        miss = plain.send("ttft", prompt=prompt, repeat=reps, reset_prefix_cache=True, kdn="off")
        plain.send("reset_prefix_cache")
        ref = plain.generate([prompt], max_tokens=n, kdn="off")[0]  # and fills the prefix cache
        own = plain.send("ttft", prompt=prompt, repeat=reps, reset_prefix_cache=False, kdn="off")
        self.row(size).update({
            "prompt_tokens": len(prompt), "ttft_miss_none_s": miss["median"], "ttft_miss_none_runs_s": miss["seconds"],
            "ttft_own_prefix_hit_s": own["median"], "ttft_own_prefix_hit_runs_s": own["seconds"],
            "tokens_reference": ref})

    def measure_kdn(self, k_a: replicas.Replica, k_b: replicas.Replica, size: int) -> None:
        docs, reps, n = self.docs[size], self.a.reps, self.a.check_tokens
        prompt = docs[0] + self.q_b
        self.log(f"{size} tokens: kdn misses (engine A stores {reps} documents)")
        s0 = kdnd_stats(self.kdnd.socket)
        misses = [k_a.send("ttft", prompt=d + self.q_a, repeat=1, reset_prefix_cache=True)["seconds"][0] for d in docs]
        s1 = kdnd_stats(self.kdnd.socket)
        self.log(f"{size} tokens: kdn hit (engine B)")
        b0 = k_b.stats()
        hit = k_b.send("ttft", prompt=prompt, repeat=reps, reset_prefix_cache=True, kdn="on")
        s2 = kdnd_stats(self.kdnd.socket)
        b1 = k_b.stats()
        k_b.send("reset_prefix_cache")
        tokens = k_b.generate([prompt], max_tokens=n, kdn="on")[0]
        row = self.row(size)
        miss = statistics.median(misses)
        row.update({
            "ttft_miss_kdn_s": miss, "ttft_miss_kdn_runs_s": misses,
            "store_cost_kdn_s": miss - row["ttft_miss_none_s"],
            "kdn_stored_bytes_per_miss": (s1["stored_bytes"] - s0["stored_bytes"]) / reps,
            "ttft_kdn_hit_s": hit["median"], "ttft_kdn_hit_runs_s": hit["seconds"],
            "kdn_hit_cached_tokens": hit["cached_tokens"],
            "kdn_hit_bytes": (s2["retrieved_bytes"] - s1["retrieved_bytes"]) / reps,
            "kdn_hit_chunks": (s2["retrieved_chunks"] - s1["retrieved_chunks"]) / reps,
            # The connector's own time in each load (lease, copy into the blocks, release).
            "kdn_hit_load_s": (b1["load_seconds"] - b0["load_seconds"]) / max(b1["loads"] - b0["loads"], 1),
            "tokens_kdn_hit": tokens,
            "tokens_identical_kdn": tokens == self.ref_tokens_for(size)
            and hit["token_ids"] == self.ref_tokens_for(size)[:1]})
        chunks = size // self.a.chunk_tokens
        row["kdn_hit_loaded"] = row["kdn_hit_chunks"] == chunks and min(hit["cached_tokens"]) >= size
        if not row["kdn_hit_loaded"]:
            self.error(size, "ttft_kdn_hit_s", f"kdnd served {row['kdn_hit_chunks']} chunks per hit "
                       f"(expected {chunks}); B computed all but {hit['cached_tokens']} tokens")

    # ---- LMCache ---------------------------------------------------------------------------
    def run_lmcache(self) -> None:
        py = lmcache_server.python()
        self.report["lmcache_config"] = self.server.config()
        self.log(f"starting LMCache's server (L1 {self.server.l1} GiB)")
        self.server.start()
        self.report["lmcache_config"]["server_start_s"] = self.server.start_seconds
        port = str(self.server.port)
        l_a = self.replica("lmcache-A", "--lmcache-port", port, "--no-prefix-caching")
        l_b = self.replica("lmcache-B", "--lmcache-port", port, "--no-prefix-caching")
        self.log("starting the LMCache engines")
        start_together([l_a, l_b], python=py)
        self.report["engine_start_s"].update({r.name: r.start_seconds for r in (l_a, l_b)})
        for r in (l_a, l_b):
            r.generate([self.unrelated], max_tokens=4)
        for size in self.a.sizes:
            self.measure_lmcache(l_a, l_b, size)
        if self.shared:
            self.shared.run_system("lmcache", [l_a, l_b], counters=self.shared.lmcache_counters)
            self.report["throughput"] = {k: self.shared.report[k] for k in ("workload", "systems")}
        self.stop_all()
        self.server.stop()

    def wait_stored(self, since: int, tokens: int, timeout: float = 60) -> dict[str, float]:
        """LMCache stores after the step that computed the KV: wait until its server logged it."""
        import time

        deadline = time.monotonic() + timeout
        t = self.server.transfers(since)
        while t["stored_tokens"] < tokens and time.monotonic() < deadline:
            time.sleep(0.1)
            t = self.server.transfers(since)
        return t

    def measure_lmcache(self, l_a: replicas.Replica, l_b: replicas.Replica, size: int) -> None:
        docs, reps, n = self.docs[size], self.a.reps, self.a.check_tokens
        prompt = docs[0] + self.q_b
        self.log(f"{size} tokens: LMCache misses (engine A stores {reps} documents)")
        m0 = self.server.mark()
        misses = [l_a.send("ttft", prompt=d + self.q_a, repeat=1)["seconds"][0] for d in docs]
        stored = self.wait_stored(m0, reps * size)
        self.log(f"{size} tokens: LMCache hit (engine B)")
        m1 = self.server.mark()
        hit = l_b.send("ttft", prompt=prompt, repeat=reps)
        got = self.server.transfers(m1)
        tokens = l_b.generate([prompt], max_tokens=n)[0]
        row = self.row(size)
        miss = statistics.median(misses)
        row.update({
            "ttft_miss_lmcache_s": miss, "ttft_miss_lmcache_runs_s": misses,
            "store_cost_lmcache_s": miss - row["ttft_miss_none_s"],
            "lmcache_stored_tokens_per_miss": stored["stored_tokens"] / reps,
            "ttft_lmcache_hit_s": hit["median"], "ttft_lmcache_hit_runs_s": hit["seconds"],
            "lmcache_hit_cached_tokens": hit["cached_tokens"],
            "lmcache_hit_retrieves_logged": got["retrieves"],
            "lmcache_hit_tokens_retrieved": got["retrieved_tokens"] / reps,
            "lmcache_hit_bytes": got["retrieved_tokens"] / reps * self.kv_token_bytes,
            "lmcache_server_retrieve_s": got["retrieve_seconds"] / max(got["retrieves"], 1),
            "tokens_lmcache_hit": tokens,
            "tokens_identical_lmcache": tokens == self.ref_tokens_for(size)
            and hit["token_ids"] == self.ref_tokens_for(size)[:1]})
        row["lmcache_hit_loaded"] = got["retrieved_tokens"] >= reps * size and min(hit["cached_tokens"]) >= size
        if not row["lmcache_hit_loaded"]:
            self.error(size, "ttft_lmcache_hit_s", f"LMCache's server logged {got['retrieves']} retrieves of "
                       f"{got['retrieved_tokens']} tokens for {reps} hits of {size}; B computed all but "
                       f"{hit['cached_tokens']} tokens")
        if row.get("ttft_kdn_hit_s") and hit["median"]:
            row["kdn_hit_over_lmcache_hit"] = row["ttft_kdn_hit_s"] / hit["median"]

    def ref_tokens_for(self, size: int) -> list[int]:
        return self.row(size).get("tokens_reference", [])

    # ---- bars ------------------------------------------------------------------------------
    def bars(self) -> bool:
        bars: dict[str, Any] = {}

        def bar(name: str, value: float | None, op: str, target: float) -> None:
            ok = None if value is None else (value >= target if op == ">=" else value <= target)
            bars[name] = {"value": value, "op": op, "target": target, "pass": ok}

        def every(field: str) -> float | None:
            vals = [self.report.get(f"prompt_{s}", {}).get(field) for s in self.a.sizes]
            return None if None in vals else float(all(vals))

        if 4096 in self.a.sizes:
            bar("hit_vs_lmcache_4k", self.report.get("prompt_4096", {}).get("kdn_hit_over_lmcache_hit"), "<=", LOAD_BAR)
        bar("tokens_identical_kdn", every("tokens_identical_kdn"), ">=", 1.0)
        bar("tokens_identical_lmcache", every("tokens_identical_lmcache"), ">=", 1.0)
        bar("kdn_hits_loaded", every("kdn_hit_loaded"), ">=", 1.0)
        bar("lmcache_hits_retrieved", every("lmcache_hit_loaded"), ">=", 1.0)
        self.report["bars"] = bars
        return all(b["pass"] for b in bars.values())


TABLE = ("ttft_miss_none_s", "ttft_miss_kdn_s", "ttft_miss_lmcache_s", "ttft_kdn_hit_s", "ttft_lmcache_hit_s",
         "ttft_own_prefix_hit_s", "kdn_hit_over_lmcache_hit", "kdn_hit_bytes", "lmcache_hit_bytes",
         "tokens_identical_kdn", "tokens_identical_lmcache")
