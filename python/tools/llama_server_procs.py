"""kdn-llama-server and kdnd processes on loopback, driven over real HTTP with Python's standard
library: shared by tests/llama/llama_server_test.py and kdn-bench llama-server
(python/tools/llama_server_bench.py)."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

CHUNK = 256  # kdn's chunk tokens (the server's)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, path, body=None, timeout=300):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Kdnd:
    """One kdnd process; with `disk`, its disk tier keeps chunks across restarts."""

    def __init__(self, workdir, disk=None, arena="256M"):
        self.sock = os.path.join(workdir, "kdnd.sock")
        self.log = os.path.join(workdir, "kdnd.log")
        self.disk = disk
        self.arena = arena
        self.proc = None

    def start(self):
        args = [os.environ["KDN_KDND"], "--socket", self.sock, "--host-arena-bytes", self.arena, "--log-level", "warn"]
        if self.disk:
            os.makedirs(self.disk, exist_ok=True)
            args += ["--set", f"tier.disk.dirs={self.disk}", "--set", "tier.disk.bytes=256M",
                     "--set", "tier.disk.slab_bytes=16M", "--set", "tier.disk.policy=write_through"]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kdnd exited with {self.proc.returncode}; see {self.log}")
            if os.path.exists(self.sock):
                try:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                        s.connect(self.sock)
                    return self
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError("kdnd did not come up")

    def counters(self, names):
        """The named counters of `kdnctl stats --json` (KDN_KDNCTL)."""
        out = subprocess.run([os.environ["KDN_KDNCTL"], "-s", self.sock, "stats", "--json"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        s = json.loads(out)
        return {k: s[k] for k in names}

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        self.proc = None


class Server:
    """One kdn-llama-server process on a loopback port: one slot unless told otherwise, one
    thread, batches of one chunk (so a hit's suffix is computed in the batches a miss uses)."""

    def __init__(self, workdir, name, kdnd_sock, slots=1, kdn=True, ctx=2048, threads=1, extra=(), kv_unified=True,
                 model=None):
        self.port = free_port()
        self.log = os.path.join(workdir, f"{name}.log")
        self.args = [os.environ["KDN_LLAMA_SERVER"], "-m", model or os.environ["KDN_LLAMA_MODEL"], "--host", "127.0.0.1", "--port", str(self.port), "-np", str(slots),
                     "-c", str(ctx * slots), "-b", str(CHUNK), "-ub", str(CHUNK), "-t", str(threads),
                     "--kdn-socket", kdnd_sock, *extra]
        if slots > 1:  # one KV buffer for every slot, or one stream per slot
            self.args.append("--kv-unified" if kv_unified else "--no-kv-unified")
        if not kdn:
            self.args.append("--no-kdn")
        self.proc = None

    def __enter__(self):
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log}")
            try:
                if request(self.port, "/health", timeout=5).get("status") == "ok":
                    return self
            except (OSError, json.JSONDecodeError):  # refused, reset or slow (a loaded machine)
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server did not come up; see {self.log}")

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    # ---- the OpenAI-compatible API ----
    def body(self, doc, question, max_tokens, cache_prompt=True):
        return {"messages": [{"role": "user", "content": doc + "\n\n" + question}],
                "max_tokens": max_tokens, "temperature": 0, "cache_prompt": cache_prompt}

    def chat(self, doc, question, max_tokens=16, cache_prompt=True):
        """cache_prompt=False: a full prefill, neither the slot's own cache nor kdn."""
        r = request(self.port, "/v1/chat/completions", self.body(doc, question, max_tokens, cache_prompt))
        return r["choices"][0]["message"]["content"], r["timings"]

    def chat_stream(self, doc, question, max_tokens=16, on_first=None, cache_prompt=True):
        """Streams the answer (server-sent events): its text, the last event's timings and the
        event count; self.ttft_s is the time to the first content delta, when on_first() runs."""
        body = dict(self.body(doc, question, max_tokens, cache_prompt), stream=True)
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        text, timings, events = "", None, 0
        self.ttft_s = None
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                events += 1
                for choice in ev.get("choices", []):
                    delta = choice.get("delta", {}).get("content") or ""
                    if delta and not text:
                        self.ttft_s = time.perf_counter() - t0
                        if on_first:
                            on_first()
                    text += delta
                timings = ev.get("timings", timings)
        return text, timings, events

    def complete(self, tokens, max_tokens=8, **extra):
        """/completion on a prompt given as token ids, greedy: the answer's token ids and the
        timings."""
        body = dict({"prompt": tokens, "n_predict": max_tokens, "temperature": 0, "return_tokens": True,
                     "cache_prompt": True}, **extra)
        r = request(self.port, "/completion", body)
        return r["tokens"], r["timings"]

    def tokenize(self, text, add_special=False, parse_special=False):
        return request(self.port, "/tokenize", {"content": text, "add_special": add_special,
                                                "parse_special": parse_special})["tokens"]

    def prompt_tokens(self, doc, question):
        tmpl = request(self.port, "/apply-template", {"messages": [{"role": "user", "content": doc + "\n\n" + question}]})
        return request(self.port, "/tokenize", {"content": tmpl["prompt"], "add_special": True,
                                                "parse_special": True})["tokens"]


