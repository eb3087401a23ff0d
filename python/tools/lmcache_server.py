"""LMCache's multiprocess (MP) cache server, run beside kdnd so benchmarks compare the two in
one run: start a fresh server on free ports, read what it stored and retrieved from its log,
stop it and remove the shared-memory segments its engines left behind.

LMCache runs from its own venv (scripts/setup-lmcache.sh); KDN_LMCACHE_PYTHON names its
interpreter. Its engines use LMCacheMPConnector in "lmcache_driven" mode, LMCache's fast mode
on CPU (the server copies straight into the engine's KV cache, moved into /dev/shm): see
vllm_replica.py --lmcache-port.
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

CHUNK_TOKENS = 256
READY_LINE = "LMCache cache server is running"
RETRIEVED = re.compile(r"Retrieved (\d+) tokens in ([0-9.]+) seconds")
STORED = re.compile(r"Stored (\d+) tokens in ([0-9.]+) seconds")
SHM = Path("/dev/shm")


def python() -> str:
    """LMCache's interpreter, or "" when this machine has no LMCache environment."""
    p = os.environ.get("KDN_LMCACHE_PYTHON", "")
    return p if p and Path(p).is_file() else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def l1_gib(working_set_bytes: int) -> int:
    """L1 sized to hold the working set with a quarter to spare (whole GiB, as its flag takes)."""
    return max(1, math.ceil(working_set_bytes * 1.25 / (1 << 30)))


def segments() -> set[str]:
    return {p.name for p in SHM.glob("lmcache_kv_*")}


class LMCacheServer:
    def __init__(self, log_path: str, l1_gib: int, chunk_tokens: int = CHUNK_TOKENS) -> None:
        self.log_path = log_path
        self.l1 = l1_gib
        self.chunk_tokens = chunk_tokens
        self.port = free_port()
        self.http_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start_seconds = 0.0
        self._segments_before: set[str] = set()

    def args(self) -> list[str]:
        return ["--port", str(self.port), "--http-port", str(self.http_port), "--chunk-size", str(self.chunk_tokens),
                "--l1-size-gb", str(self.l1), "--l1-init-size-gb", str(self.l1), "--supported-transfer-mode", "auto",
                "--disable-observability", "--eviction-policy", "LRU"]

    def config(self) -> dict[str, Any]:
        """What the JSON reports, so a reader can judge the comparison."""
        return {"version": lmcache_version(), "server": "lmcache.cli.main server (MP)", "connector": "LMCacheMPConnector",
                "mp_transfer_mode": "lmcache_driven", "chunk_tokens": self.chunk_tokens, "l1_size_gb": self.l1,
                "l1_init_size_gb": self.l1, "eviction_policy": "LRU", "observability": "off",
                "server_omp_threads": 1, "fresh_server_per_run": True,
                "engine_prefix_caching": "off (a failed reset_prefix_cache would fake an LMCache hit)"}

    def start(self, timeout: float = 300) -> "LMCacheServer":
        py = python()
        if not py:
            raise RuntimeError("no LMCache environment (KDN_LMCACHE_PYTHON; scripts/setup-lmcache.sh)")
        self._segments_before = segments()
        env = dict(os.environ, LMCACHE_DISABLE_BANNER="1", OMP_NUM_THREADS="1")
        t0 = time.monotonic()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([py, "-m", "lmcache.cli.main", "server", *self.args()], stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"LMCache server exited at start:\n{self.log()[-3000:]}")
            if READY_LINE in self.log():
                self.start_seconds = time.monotonic() - t0
                return self
            time.sleep(0.2)
        raise RuntimeError(f"LMCache server not ready within {timeout} s:\n{self.log()[-3000:]}")

    def restart(self) -> None:
        """Starts it again after it was killed, on the same ports and with a log of its own;
        segments its engines made before stay this run's to clean."""
        before = self._segments_before
        self.log_path += ".restarted"
        self.start()
        self._segments_before = before

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def mark(self) -> int:
        """A position in the log; transfers() counts what was logged after it."""
        return len(self.log())

    def transfers(self, since: int = 0) -> dict[str, float]:
        text = self.log()[since:]
        got = [(int(n), float(s)) for n, s in RETRIEVED.findall(text)]
        put = [(int(n), float(s)) for n, s in STORED.findall(text)]
        return {"retrieves": len(got), "retrieved_tokens": sum(n for n, _ in got),
                "retrieve_seconds": sum(s for _, s in got), "stores": len(put),
                "stored_tokens": sum(n for n, _ in put), "store_seconds": sum(s for _, s in put)}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.clean_segments()

    def clean_segments(self) -> None:
        """Removes the /dev/shm segments this run's engines created and no live process holds
        (an engine that did not end cleanly leaves its segment behind)."""
        for name in segments() - self._segments_before:
            pid = name.split("_")[2] if name.count("_") >= 3 else ""
            if pid.isdigit() and Path(f"/proc/{pid}").exists():
                continue
            try:
                (SHM / name).unlink()
            except OSError:
                pass


def lmcache_version() -> str:
    py = python()
    if not py:
        return ""
    r = subprocess.run([py, "-c", "from importlib.metadata import version; print(version('lmcache'))"],
                       capture_output=True, text=True)
    return r.stdout.strip()
