"""kdn's vLLM GPU data path on a real device, without vLLM: torch CUDA views laid out as vLLM 0.32
lays them out (one backing allocation from PyTorch's caching allocator, [B, H, N, C] views per
layer ordered by a KVCacheLayout stride permutation), driven through kdn.torch.DeviceKV — the
calls the connector's device worker makes.

  python3 tests/gpu/vllm_gpu_check.py --bin <dir with kdnd> [--pkg <dir holding kdn/>]

Cases: process A stores a prompt's KV (LBNHC), process B loads it into other block ids of a
BLHNC cache and every byte is compared with what torch indexing writes; B killed mid-load, then
a new B loads whole; chunks only in kdnd's host arena prefetched into T0 (the connector's
off-step promotion on GPUs) and loaded from there, every byte; a retrieve whose copy fails (kdnd's fault seam) reported by the ticket;
kdnd killed while B's stream waits on its done event, bounded by B's timeout. Prints one line
per case and exits 0 when all passed, 77 when there is no device or no importable package.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
LAYERS, HEADS, HEAD_DIM, BLOCK, CHUNK, BLOCKS = 4, 4, 64, 16, 256, 256
PERMS = {"LBHNC": (0, 1, 2, 3, 4), "LBNHC": (0, 1, 3, 2, 4), "BLHNC": (1, 0, 2, 3, 4), "BLNHC": (1, 0, 3, 2, 4)}


def vllm_views(torch, layout: str, device="cuda"):
    """Per-layer [B, H, N, C] bf16 views over one int8 allocation, strides as vLLM's
    compute_layout_strides gives them for `layout` (dense, no padding)."""
    shape = (LAYERS, BLOCKS, HEADS, BLOCK, 2 * HEAD_DIM * 2)  # C in bytes
    order = PERMS[layout]
    strides, cur = [0] * 5, 1
    for dim in reversed(order):
        strides[dim] = cur
        cur *= shape[dim]
    raw = torch.zeros(cur, dtype=torch.int8, device=device)
    v5 = torch.as_strided(raw, shape, strides)
    return raw, [v5[i].view(torch.bfloat16) for i in range(LAYERS)]


def reference(torch, kv, block_ids, layout):
    """The same tokens written with torch indexing: view[block, head, token, :]."""
    raw, views = vllm_views(torch, layout)
    n = kv.shape[0] * CHUNK
    t = torch.arange(n, device="cuda")
    blocks = torch.as_tensor(block_ids, device="cuda")[t // BLOCK]
    off = t % BLOCK
    for layer, v in enumerate(views):
        k = kv[:, layer, 0].reshape(n, HEADS, HEAD_DIM)
        val = kv[:, layer, 1].reshape(n, HEADS, HEAD_DIM)
        v[blocks, :, off, :HEAD_DIM] = k
        v[blocks, :, off, HEAD_DIM:] = val
    return raw


def desc(kdn):
    return kdn.model_desc(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=HEAD_DIM, dtype=kdn.DType.BF16,
                          name="vllm-gpu-check", chunk_tokens=CHUNK)


def prompt(torch, n_chunks=4, seed=7):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 30000, (n_chunks * CHUNK,), generator=g).to(torch.int32).tolist()
    kv = torch.randn(n_chunks, LAYERS, 2, CHUNK, HEADS, HEAD_DIM, generator=g).to(torch.bfloat16).cuda()
    return tokens, kv


def role_store(sock):
    import torch
    import kdn
    import kdn.torch as kt

    tokens, kv = prompt(torch)
    raw, views = vllm_views(torch, "LBNHC")
    ids = list(range(10, 10 + kv.shape[0] * CHUNK // BLOCK))
    raw.copy_(reference(torch, kv, ids, "LBNHC"))
    with kdn.Client(sock) as c:
        dev = kt.DeviceKV(c.register_model(desc(kdn)), views)
        stored = dev.store(tokens, ids, BLOCK, 0, kv.shape[0])
        dev.close()
    print(f"stored {stored}")
    return 0 if stored == kv.shape[0] else 1


def role_load(sock, expect_ok=True):
    import torch
    import kdn
    import kdn.torch as kt

    tokens, kv = prompt(torch)
    raw, views = vllm_views(torch, "BLHNC")
    ids = [int(x) for x in torch.randperm(BLOCKS)[: kv.shape[0] * CHUNK // BLOCK]]
    with kdn.Client(sock, timeout_ms=5000) as c:
        dev = kt.DeviceKV(c.register_model(desc(kdn)), views)
        loaded = dev.retrieve(tokens, ids, BLOCK)
        torch.cuda.current_stream().synchronize()
        landed = dev.check()
        dev.close()
    if not expect_ok:
        print(f"loaded {loaded} landed {landed}")
        return 0 if (loaded > 0 and not landed) else 1
    wrong = int((raw != reference(torch, kv, ids, "BLHNC")).sum())
    print(f"loaded {loaded} landed {landed} wrong_bytes {wrong}")
    return 0 if (loaded == kv.shape[0] and landed and wrong == 0) else 1


def role_load_loop(sock):
    """Loads again and again until killed (the 'B killed mid-load' case)."""
    import torch
    import kdn
    import kdn.torch as kt

    tokens, _ = prompt(torch)
    raw, views = vllm_views(torch, "BLHNC")
    with kdn.Client(sock, timeout_ms=2000) as c:
        # The connector's guard: the stream waits on a word this process releases, at the latest
        # 2 s after a retrieve whose done event kdnd never fires.
        dev = kt.DeviceKV(c.register_model(desc(kdn)), views, guard_timeout_s=2.0)
        print("ready", flush=True)
        while True:
            dev.retrieve(tokens, list(range(64)), BLOCK)
            torch.cuda.current_stream().synchronize()
            if dev.settle():
                print("a load was not confirmed in time: failed, recomputed", flush=True)


def role_prefetch(sock):
    """The worker's off-step promotion on the device: chunks only in kdnd's host arena, brought
    into T0 by DeviceKV.prefetch (kdn_gpu_prefetch), then retrieved from T0: every byte."""
    import torch
    import kdn
    import kdn.torch as kt

    tokens, kv = prompt(torch, seed=11)
    raw, views = vllm_views(torch, "BLNHC")
    ids = [int(x) for x in torch.randperm(BLOCKS)[: kv.shape[0] * CHUNK // BLOCK]]
    with kdn.Client(sock, timeout_ms=5000) as c:
        model = c.register_model(desc(kdn))
        model.store(tokens, kv.cpu())  # the host path: into T1 only
        before = list(model.lookup(tokens).tier_chunks)
        dev = kt.DeviceKV(model, views)
        cached, queued = dev.prefetch(tokens)
        deadline = time.monotonic() + 30
        while model.lookup(tokens).tier_chunks[kdn.Tier.GPU] < kv.shape[0] and time.monotonic() < deadline:
            time.sleep(0.005)
        after = list(model.lookup(tokens).tier_chunks)
        loaded = dev.retrieve(tokens, ids, BLOCK)
        torch.cuda.current_stream().synchronize()
        landed = dev.check()
        dev.close()
    wrong = int((raw != reference(torch, kv, ids, "BLNHC")).sum())
    print(f"tiers before {before} prefetch ({cached}, {queued}) tiers after {after} loaded {loaded} "
          f"landed {landed} wrong_bytes {wrong}")
    n = kv.shape[0]
    ok = before[kdn.Tier.GPU] == 0 and after[kdn.Tier.GPU] == n and loaded == n and landed and wrong == 0
    return 0 if ok else 1


class Daemon:
    def __init__(self, bindir, sock, env=None):
        self.sock = sock
        self.log = open(sock + ".log", "ab")
        # A fault to inject needs kdnd-test, the build of kdnd with its test seams on.
        binary = os.path.join(bindir, "kdnd-test" if env else "kdnd")
        self.proc = subprocess.Popen([binary, "--socket", sock, "--host-arena-bytes", "1G",
                                      "--log-level", "warn", "--set", "tier.gpu.enable=on", "--set",
                                      "tier.gpu.bytes=512M"], stdout=self.log, stderr=self.log,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 30
        while not os.path.exists(sock) and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kdnd exited at start (rc {self.proc.returncode}), log {sock}.log")
            time.sleep(0.05)
        time.sleep(0.2)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)


def run_role(role, sock, timeout=120, env=None):
    cmd = [sys.executable, __file__, "--role", role, "--socket", sock]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return r.returncode, (r.stdout + r.stderr).strip().splitlines()[-3:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("KDN_BIN", ""))
    ap.add_argument("--pkg", default="")
    ap.add_argument("--role", default="")
    ap.add_argument("--socket", default="")
    a = ap.parse_args()
    if a.pkg:
        sys.path.insert(0, a.pkg)
    try:
        import torch
        import kdn.torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 — any reason the package is absent is a skip
        print(f"vllm_gpu_check: skipped: cannot import torch and kdn.torch ({e})")
        return SKIP
    if a.role:
        return {"store": role_store, "load": role_load, "load-fail": lambda s: role_load(s, False),
                "load-loop": role_load_loop, "prefetch": role_prefetch}[a.role](a.socket)
    if not torch.cuda.is_available():
        print("vllm_gpu_check: skipped: no CUDA device")
        return SKIP
    if a.pkg:
        os.environ["PYTHONPATH"] = a.pkg + os.pathsep + os.environ.get("PYTHONPATH", "")
    failures = 0

    def case(name, ok, detail):
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    with tempfile.TemporaryDirectory(prefix="kdn-vllm-gpu-") as tmp:
        sock = os.path.join(tmp, "kdnd.sock")
        d = Daemon(a.bin, sock)
        try:
            rc, out = run_role("store", sock)
            case("A stores (LBNHC)", rc == 0, out)
            rc, out = run_role("load", sock)
            case("B loads into other blocks (BLHNC), every byte", rc == 0, out)
            b = subprocess.Popen([sys.executable, __file__, "--role", "load-loop", "--socket", sock],
                                 stdout=subprocess.PIPE, text=True)
            b.stdout.readline()
            time.sleep(0.5)
            b.kill()
            b.wait()
            rc, out = run_role("load", sock)
            case("B killed mid-load, a new B loads whole", rc == 0 and d.proc.poll() is None, out)
            rc, out = run_role("prefetch", sock)
            case("prefetch brings T1 chunks into T0, then a load from T0, every byte", rc == 0, out)
        finally:
            d.stop()

        sock2 = os.path.join(tmp, "kdnd2.sock")
        d = Daemon(a.bin, sock2, env={"KDN_TEST_GPU_FAIL_RETRIEVE": "1"})
        try:
            run_role("store", sock2)
            rc, out = run_role("load-fail", sock2)
            case("a failing copy is reported by the ticket", rc == 0, out)
        finally:
            d.stop()

        sock3 = os.path.join(tmp, "kdnd3.sock")
        d = Daemon(a.bin, sock3)
        try:
            run_role("store", sock3)
            b = subprocess.Popen([sys.executable, __file__, "--role", "load-loop", "--socket", sock3],
                                 stdout=subprocess.PIPE, text=True)
            b.stdout.readline()
            time.sleep(0.3)
            d.stop(signal.SIGKILL)
            try:
                b.wait(timeout=60)
                case("kdnd killed while B's stream waits: B does not hang", True, f"B exited rc {b.returncode}")
            except subprocess.TimeoutExpired:
                b.kill()
                case("kdnd killed while B's stream waits: B does not hang", False, "B still running after 60 s")
        finally:
            d.stop(signal.SIGKILL)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
