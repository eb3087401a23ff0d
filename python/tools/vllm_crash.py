"""The crash schedule of kdn-bench vllm --throughput (--phases ...,crash): the shared-document
workload on an open-loop schedule while engines are SIGKILLed every --crash-every seconds and
restarted, and the cache server (kdnd with its disk tier, or LMCache's server as it comes) is
SIGKILLed and restarted once, at --server-kill-at seconds.

A request whose engine died under it goes to another live engine (as a router retries), and
counts as retried. Reported per system: completions per --bucket seconds (throughput over
time), wrong answers against the connector-less reference, the cache process's memory and the
/dev/shm bytes this run added after each engine kill, and the hits lost after the server's
restart (requests after it that computed a document stored before it). Each replacement engine,
once started, is first asked the most recently answered request before it joins the pool: its
own cache is empty, so what it did not compute came from the cache server.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import replicas
import shared_docs

SHM = Path("/dev/shm")


def memory(pid: int | None) -> dict[str, int] | None:
    """Resident bytes of a process (all, anonymous, shared memory), or None when it is gone."""
    if not pid:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssShmem"):
            out[key.lower() + "_bytes"] = int(value.split()[0]) * 1024
    return out


def shm_bytes(before: set[str]) -> dict[str, Any]:
    """What /dev/shm holds that it did not hold when the phase started (by kind: LMCache's
    per-engine KV segments, torch's psm_ segments, ...; other users of the machine add theirs)."""
    kinds: dict[str, int] = {}
    for p in SHM.iterdir():
        if p.name in before:
            continue
        kind = "lmcache_kv" if p.name.startswith("lmcache_kv_") else p.name.split("_")[0].split(".")[0]
        with contextlib.suppress(OSError):
            kinds[kind] = kinds.get(kind, 0) + p.stat().st_blocks * 512
    return {"dev_shm_new_bytes": sum(kinds.values()), "dev_shm_new_bytes_by_kind": kinds}


def kill_engine(r: replicas.Replica) -> None:
    """SIGKILL for the replica and its engine-core process, as when a machine's OOM killer or a
    crash takes them."""
    import psutil

    if r.proc is None:
        return
    with contextlib.suppress(psutil.Error):
        for c in psutil.Process(r.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c.send_signal(signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        r.proc.send_signal(signal.SIGKILL)
    r.proc.wait()


class LivePool:
    """Engines that come and go: a request takes a free live engine; a killed one is not given
    back, its replacement joins when it has started."""

    def __init__(self, engines: list[replicas.Replica]) -> None:
        self.cv = threading.Condition()
        self.free = list(engines)
        self.live = set(id(r) for r in engines)

    def take(self) -> replicas.Replica:
        with self.cv:
            while not self.free:
                self.cv.wait()
            return self.free.pop(0)

    def give(self, r: replicas.Replica) -> None:
        with self.cv:
            if id(r) in self.live:
                self.free.append(r)
                self.cv.notify()

    def retire(self, r: replicas.Replica) -> None:
        with self.cv:
            self.live.discard(id(r))
            if r in self.free:
                self.free.remove(r)

    def join(self, r: replicas.Replica) -> None:
        with self.cv:
            self.live.add(id(r))
            self.free.append(r)
            self.cv.notify()


class CrashRun:
    """One system's crash phase. `spawn(name)` starts a replacement engine; `server` has
    kill(), restart() and pid() for the cache process."""

    def __init__(self, a: Any, engines: list[replicas.Replica], spawn: Callable[[str], replicas.Replica],
                 server: Any, prompt: Callable[[shared_docs.Request], list[int]], kdn_mode: str,
                 log: Callable[[str], None]) -> None:
        self.a, self.spawn, self.server, self.prompt, self.kdn_mode, self.log = a, spawn, server, prompt, kdn_mode, log
        self.all = list(engines)
        self.pool = LivePool(engines)
        self.events: list[dict[str, Any]] = []
        self.retried = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.shm_before = {p.name for p in SHM.iterdir()}
        self.t0 = 0.0
        self.server_restart_s: float | None = None
        self.restarts: list[threading.Thread] = []
        self.answered: list[shared_docs.Request] = []  # in the order they were answered
        self.probes: list[dict[str, Any]] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def send(self, req: shared_docs.Request) -> dict:
        for attempt in range(4):
            r = self.pool.take()
            try:
                reply = r.send("serve", timeout=self.a.request_timeout, prompt=self.prompt(req),
                               max_tokens=self.a.answer_tokens, kdn=self.kdn_mode)
                self.pool.give(r)
                with self.lock:
                    self.answered.append(req)
                return {**reply, "engine": r.name, "attempts": attempt + 1, "sent_s": self.now()}
            except Exception:
                if r.proc is not None and r.proc.poll() is None:
                    self.pool.give(r)
                    raise
                with self.lock:
                    self.retried += 1
        raise RuntimeError("no live engine answered in 4 attempts")

    def killer(self) -> None:
        n, next_kill = 0, self.a.crash_every
        server_due = self.a.server_kill_at
        while not self.done.wait(0.2):
            if server_due is not None and self.now() >= server_due:
                server_due = None
                self.kill_server()
            if self.now() >= next_kill:
                next_kill += self.a.crash_every
                self.kill_one(n)
                n += 1

    def kill_one(self, n: int) -> None:
        live = [r for r in self.all if r.proc is not None and r.proc.poll() is None]
        if len(live) <= 1:
            return  # one engine keeps serving while the others restart
        r = live[n % len(live)]
        self.pool.retire(r)
        kill_engine(r)
        self.all.remove(r)
        self.log(f"killed engine {r.name} at {self.now():.1f} s")
        time.sleep(1.0)  # the cache process notices the dead peer
        self.events.append({"event": "engine_killed", "engine": r.name, "at_s": round(self.now(), 2),
                            "cache_process_memory": memory(self.server.pid()), **shm_bytes(self.shm_before)})
        t = threading.Thread(target=self.replace, args=(f"{r.name}r",), daemon=True)
        t.start()
        self.restarts.append(t)

    def replace(self, name: str) -> None:
        try:
            r = self.spawn(name)
        except Exception as e:  # noqa: BLE001 - recorded; the run goes on with fewer engines
            self.events.append({"event": "engine_restart_failed", "engine": name, "error": str(e)[:300]})
            return
        self.all.append(r)
        self.probe(r)
        self.pool.join(r)
        self.events.append({"event": "engine_restarted", "engine": name, "at_s": round(self.now(), 2),
                            "start_s": r.start_seconds})

    def probe(self, r: replicas.Replica) -> None:
        """A request aimed at a freshly restarted engine, for a document already answered."""
        with self.lock:
            req = self.answered[-1] if self.answered else None
        if req is None:
            return
        sent = self.now()
        try:
            reply = r.send("serve", timeout=self.a.request_timeout, prompt=self.prompt(req),
                           max_tokens=self.a.answer_tokens, kdn=self.kdn_mode)
        except Exception as e:  # noqa: BLE001 - recorded; the engine still joins the pool
            self.probes.append({"engine": r.name, "index": req.index, "error": str(e)[:300]})
            return
        prompt_tokens = len(self.prompt(req))
        self.probes.append({"engine": r.name, "index": req.index, "document": req.document,
                            "question": req.question, "sent_s": round(sent, 2), "ttft_s": round(reply["ttft_s"], 4),
                            "prompt_tokens": prompt_tokens, "computed_tokens": prompt_tokens - reply["cached_tokens"],
                            "token_ids": reply["token_ids"]})

    def kill_server(self) -> None:
        before = memory(self.server.pid())
        self.server.kill()
        t = self.now()
        self.log(f"killed the cache server at {t:.1f} s")
        self.server.restart()
        self.server_restart_s = self.now()
        self.events.append({"event": "server_restarted", "killed_at_s": round(t, 2),
                            "ready_at_s": round(self.server_restart_s, 2), "memory_before_kill": before})

    def run(self, reqs: list[shared_docs.Request], arrivals: list[float]) -> list[shared_docs.Result]:
        self.t0 = time.monotonic()
        killer = threading.Thread(target=self.killer, daemon=True)
        killer.start()
        try:
            results = shared_docs.run_open_loop(reqs, arrivals, self.send)
        finally:
            self.done.set()
            killer.join()
            for t in self.restarts:
                t.join()
        self.events.append({"event": "end", "at_s": round(self.now(), 2),
                            "cache_process_memory": memory(self.server.pid()), **shm_bytes(self.shm_before)})
        return results

    def summary(self, results: list[shared_docs.Result], chunk_tokens: int) -> dict[str, Any]:
        bucket = self.a.crash_bucket
        buckets: dict[int, int] = {}
        for r in results:
            if not r.error:
                buckets[int(r.finished_s // bucket)] = buckets.get(int(r.finished_s // bucket), 0) + 1
        span = max((r.finished_s for r in results), default=0.0)
        series = [buckets.get(i, 0) / bucket for i in range(int(span // bucket) + 1)]
        probes = [p for p in self.probes if "error" not in p]
        return {"events": self.events, "retried_requests": self.retried, "bucket_s": bucket,
                "requests_per_s_over_time": series, **self.hits_after_restart(results, chunk_tokens),
                "restarted_engine_probes": self.probes,
                # None when no replacement was probed: nothing was measured.
                "restarted_engine_hits": sum(p["computed_tokens"] < chunk_tokens for p in probes) if probes else None}

    def hits_after_restart(self, results: list[shared_docs.Result], chunk_tokens: int) -> dict[str, Any]:
        """Requests sent after the server came back whose document was answered before it was
        killed: each that computed a chunk or more of its document lost a hit."""
        if self.server_restart_s is None:
            return {"hits_lost_after_restart": None}
        done_before = {r.request.document for r in results if not r.error and r.finished_s < self.server_restart_s}
        after = [r for r in results if not r.error and r.reply.get("sent_s", 0) >= self.server_restart_s
                 and r.request.document in done_before]
        seen: set[int] = set()
        lost, first = 0, []
        for r in sorted(after, key=lambda r: r.reply["sent_s"]):
            if r.request.document in seen:
                continue  # the first request per document after the restart
            seen.add(r.request.document)
            computed = len(self.prompt(r.request)) - r.reply["cached_tokens"]
            lost += computed >= chunk_tokens  # a question is shorter than a chunk
            first.append({"index": r.request.index, "document": r.request.document, "computed_tokens": computed,
                          "engine": r.reply["engine"]})
        # None when no request qualified: nothing was measured, which is not the same as 0 lost.
        return {"hits_lost_after_restart": lost if first else None, "first_requests_after_restart": first}

