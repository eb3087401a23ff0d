"""Drives kdnd and vLLM replicas (vllm_replica.py), each in its own process, for kdn's vLLM
tests, benchmark and demo: start, send a command, read its reply, stop or kill.

Environment: KDN_PYTHON (the venv's interpreter, default this one), KDN_BUILD_DIR (where
bin/kdnd and python/ are, default build/ of this tree), KDN_VLLM_MODEL (the converted model),
KDN_VLLM_OMP_THREADS (OpenMP threads per engine, default 1; "auto": vLLM's own binding).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REPLY_PREFIX = "@@kdn-replica@@ "


def build_dir() -> Path:
    return Path(os.environ.get("KDN_BUILD_DIR", ROOT / "build")).resolve()


def python() -> str:
    return os.environ.get("KDN_PYTHON", sys.executable)


def model_dir() -> str:
    m = os.environ.get("KDN_VLLM_MODEL", "")
    if not m or not Path(m, "config.json").is_file():
        raise RuntimeError("KDN_VLLM_MODEL must name the converted model folder (scripts/setup-vllm.sh)")
    return m


class Kdnd:
    """kdnd on a private socket."""

    def __init__(self, socket: str, arena: str = "512M", log: str | None = None,
                 extra: list[str] | None = None, binary: str = "kdnd", env: dict | None = None) -> None:
        """binary: "kdnd", or "kdnd-test" (built with the tests) for its fault seams, set in env."""
        self.socket = socket
        self.arena = arena
        self.extra = list(extra or [])
        self.binary = binary
        self.env = {**os.environ, **(env or {})}
        self.log_path = log or socket + ".log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> "Kdnd":
        """timeout: a disk tier's first start writes its slab files (a minute on a busy disk)."""
        Path(self.socket).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(build_dir() / "bin" / self.binary), "--socket", self.socket,
                                          "--host-arena-bytes", self.arena, "--log-level", "warn", *self.extra],
                                         stdout=log, stderr=log, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kdnd exited at start: {Path(self.log_path).read_text()[-2000:]}")
            if self.client_ok():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"kdnd did not answer within {timeout:g} s")

    def client_ok(self) -> bool:
        r = subprocess.run([str(build_dir() / "bin" / "kdnctl"), "--socket", self.socket, "ping"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return r.returncode == 0

    def log_count(self, text: str) -> int:
        """How many times kdnd's log (appended across restarts) holds `text`."""
        p = Path(self.log_path)
        return p.read_text(errors="replace").count(text) if p.exists() else 0

    def wait_for_log(self, text: str, seen: int, timeout: float = 120) -> None:
        """Until kdnd's log holds `text` more than `seen` times (log_count before the cause)."""
        deadline = time.monotonic() + timeout
        while self.log_count(text) <= seen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"kdnd did not log {text!r} within {timeout} s")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: no goodbye to anyone, as when it crashes."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class Replica:
    """One vLLM engine process (vllm_replica.py)."""

    def __init__(self, name: str, *args: str, log_dir: str | None = None, env: dict | None = None,
                 model: str | None = None) -> None:
        self.name = name
        self.model = model
        self.args = list(args)
        self.log_path = os.path.join(log_dir or tempfile.gettempdir(), f"replica-{name}-{os.getpid()}.log")
        e = dict(os.environ)
        e["PYTHONPATH"] = os.pathsep.join([str(build_dir() / "python"), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        e.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        e.setdefault("TOKENIZERS_PARALLELISM", "false")
        # vLLM's CPU backend binds one OpenMP thread per core and spins at every barrier: with
        # several engines (and anything else) on few cores, a barrier waits for a descheduled
        # thread and a step takes minutes instead of milliseconds. KDN_VLLM_OMP_THREADS=n runs
        # each engine on n unbound threads (default 1); "auto" keeps vLLM's binding.
        threads = os.environ.get("KDN_VLLM_OMP_THREADS", "1")
        if threads != "auto":
            e.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            e.setdefault("OMP_NUM_THREADS", threads)
        e.update(env or {})
        self._env = e
        self.proc: subprocess.Popen | None = None
        self.start_seconds = 0.0
        self._log = None
        self._lines: list[str] = []
        self._cv = threading.Condition()

    def start(self, timeout: float = 600) -> "Replica":
        self._log = open(self.log_path, "w")
        cmd = [python(), str(ROOT / "python" / "tools" / "vllm_replica.py"), "--model", self.model or model_dir(), *self.args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=self._env, text=True, bufsize=1)
        threading.Thread(target=self._pump, daemon=True).start()
        ready = self._reply(timeout)
        if not ready.get("ok"):
            raise RuntimeError(f"replica {self.name} did not start: {ready.get('error')}\n{ready.get('trace', '')}"
                               f"\n{self.log_tail()}")
        self.start_seconds = float(ready.get("start_seconds", 0.0))
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPLY_PREFIX):
                with self._cv:
                    self._lines.append(line[len(REPLY_PREFIX):])
                    self._cv.notify_all()
            elif not self._log.closed:  # a killed replica's last lines may come after stop()
                self._log.write(line)
                self._log.flush()
        with self._cv:
            self._cv.notify_all()

    def _reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._lines:
                if self.proc.poll() is not None and not self._lines:
                    raise RuntimeError(f"replica {self.name} exited ({self.proc.returncode})\n{self.log_tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"replica {self.name}: no reply in {timeout} s\n{self.log_tail()}")
                self._cv.wait(min(left, 1.0))
            return json.loads(self._lines.pop(0))

    def send(self, op: str, timeout: float = 600, **kw: Any) -> dict:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        r = self._reply(timeout)
        if not r.get("ok"):
            raise RuntimeError(f"replica {self.name}: {op} failed: {r.get('error')}\n{r.get('trace', '')}")
        return r

    def post(self, op: str, **kw: Any) -> None:
        """Sends without waiting; collect the reply with wait()."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()

    def wait(self, timeout: float = 600) -> dict:
        r = self._reply(timeout)
        if not r.get("ok"):
            raise RuntimeError(f"replica {self.name}: {r.get('error')}\n{r.get('trace', '')}")
        return r

    def generate(self, prompts: list[list[int]], max_tokens: int = 16, **kw: Any) -> list[list[int]]:
        return self.send("generate", prompts=prompts, max_tokens=max_tokens, **kw)["outputs"]

    def stats(self) -> dict:
        return self.send("stats")["connector"]

    def log_tail(self, n: int = 3000) -> str:
        try:
            return Path(self.log_path).read_text()[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.send("quit", timeout=60)
            except Exception:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log:
            self._log.close()
        self.proc = None


def corpus() -> str:
    """Plain English text that every clone has: kdn's own documentation."""
    parts = [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    return "\n\n".join(parts)


def documents(tokens: list[int], sizes: list[int], count: int = 1) -> dict[int, list[list[int]]]:
    """`count` distinct documents of each size, cut from the corpus's tokens, none overlapping."""
    out: dict[int, list[list[int]]] = {}
    at = 0
    for size in sizes:
        docs = []
        for _ in range(count):
            if at + size > len(tokens):
                at = 0
            docs.append(tokens[at:at + size])
            at += size + 17  # never a common prefix with the next one
        out[size] = docs
    return out
