"""kdn-bench vllm --gpu: the connector's device data path on vLLM-shaped blocks, without vLLM.

    python vllm_gpu_bench.py --bin <dir with kdnd> [--pkg <dir holding kdn/>] [--tokens 4096,16384,65536]
                             [--layout LBHNC] [--json] [--require-bars]

A llama3-8b-shaped KV cache (32 layers, 8 KV heads of 128, bf16, 16-token blocks) laid out as
vLLM 0.32 lays it out (one backing allocation from PyTorch's caching allocator, per-layer
[B, H, N, C] views ordered by a KVCacheLayout), registered through kdn.torch.DeviceKV — the
calls the connector's device worker makes — with a kdnd this script starts (T0 on). For each
prompt size, timed from the call to the drained stream, median of --reps:
  load_t1   chunks in kdnd's pinned host arena -> the cache's blocks, against a pinned
            host-to-device copy of the same bytes (bar >= 0.85x)
  load_t0   the same chunks after DeviceKV.prefetch put them in T0, against a device-to-device
            copy of the same bytes (bar >= 0.7x)
  store     fresh chunks gathered from the cache's blocks (DeviceKV.store, returns once
            committed), against a device-to-host copy into pinned memory (no bar)
Every load is compared, every byte, with the same tokens written by torch indexing
(view[block, head, token, :]). Without a CUDA device it says so and measures nothing.
Exit: 0 measured (or no device), 1 wrong bytes or a failed step, 3 a bar missed under --require-bars.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

LAYERS, HEADS, HEAD_DIM, BLOCK, CHUNK = 32, 8, 128, 16, 256
PERMS = {"LBHNC": (0, 1, 2, 3, 4), "LBNHC": (0, 1, 3, 2, 4), "BLHNC": (1, 0, 2, 3, 4), "BLNHC": (1, 0, 3, 2, 4)}
BARS = {"load_t1": 0.85, "load_t0": 0.7}


def views(torch, layout: str, blocks: int):
    """Per-layer [B, H, N, C] bf16 views over one allocation, strides as vLLM's KVCacheLayout gives them."""
    shape = (LAYERS, blocks, HEADS, BLOCK, 2 * HEAD_DIM * 2)  # C in bytes
    strides, cur = [0] * 5, 1
    for dim in reversed(PERMS[layout]):
        strides[dim] = cur
        cur *= shape[dim]
    raw = torch.zeros(cur, dtype=torch.int8, device="cuda")
    v5 = torch.as_strided(raw, shape, strides)
    return raw, [v5[i].view(torch.bfloat16) for i in range(LAYERS)]


def write_reference(torch, vs, kv, block_ids) -> None:
    n = kv.shape[0] * CHUNK
    t = torch.arange(n, device="cuda")
    blocks = torch.as_tensor(block_ids, device="cuda")[t // BLOCK]
    off = t % BLOCK
    for layer, v in enumerate(vs):
        v[blocks, :, off, :HEAD_DIM] = kv[:, layer, 0].reshape(n, HEADS, HEAD_DIM)
        v[blocks, :, off, HEAD_DIM:] = kv[:, layer, 1].reshape(n, HEADS, HEAD_DIM)


def timed(torch, fn, reps: int) -> float:
    """Median seconds of fn() followed by a drained stream (after one untimed run)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Kdnd:
    def __init__(self, bindir: str, sock: str, host_bytes: str, gpu_bytes: str) -> None:
        self.log = open(sock + ".log", "ab")
        self.proc = subprocess.Popen([os.path.join(bindir, "kdnd"), "--socket", sock, "--host-arena-bytes", host_bytes,
                                      "--log-level", "warn", "--set", "tier.gpu.enable=on", "--set",
                                      f"tier.gpu.bytes={gpu_bytes}"], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 120  # the arena is pre-faulted at start
        while not os.path.exists(sock) and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kdnd exited at start (rc {self.proc.returncode}), log {sock}.log")
            time.sleep(0.05)
        time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


def measure_size(torch, kdn, kt, model, layout: str, n_tokens: int, reps: int) -> dict:
    n = n_tokens // CHUNK
    nbytes = n * model.chunk_bytes
    g = torch.Generator(device="cuda").manual_seed(n_tokens)
    tokens = torch.randint(0, 120000, (n_tokens,), device="cuda", generator=g).to(torch.int32).tolist()
    kv = torch.randn(n, LAYERS, 2, CHUNK, HEADS, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16)
    blocks = n_tokens // BLOCK + 16
    raw, vs = views(torch, layout, blocks)
    ref_raw, ref_vs = views(torch, layout, blocks)
    ids = [int(x) for x in torch.randperm(blocks)[: n_tokens // BLOCK]]
    write_reference(torch, ref_vs, kv, ids)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned.copy_(kv.view(torch.uint8).reshape(-1))
    model.store(tokens, pinned.view(torch.bfloat16).view(kv.shape))  # the host path: T1 only
    out = {"tokens": n_tokens, "bytes": nbytes}
    dev = kt.DeviceKV(model, vs)
    try:
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        tiers = list(model.lookup(tokens).tier_chunks)
        out["load_t1"] = _load(torch, dev, tokens, ids, raw, ref_raw, reps, tiers[kdn.Tier.HOST] == n,
                               lambda: dst.copy_(pinned, non_blocking=True), "h2d")
        dev.prefetch(tokens)
        deadline = time.monotonic() + 120
        while model.lookup(tokens).tier_chunks[kdn.Tier.GPU] < n and time.monotonic() < deadline:
            time.sleep(0.01)
        in_t0 = model.lookup(tokens).tier_chunks[kdn.Tier.GPU] == n
        src = kv.view(torch.uint8).reshape(-1)
        out["load_t0"] = _load(torch, dev, tokens, ids, raw, ref_raw, reps, in_t0, lambda: dst.copy_(src), "d2d")
        out["store"] = _store(torch, dev, ids, n, reps, pinned, src)
    finally:
        dev.close()
    return out


def _load(torch, dev, tokens, ids, raw, ref_raw, reps, in_tier, baseline, base_name) -> dict:
    if not in_tier:
        return {"gbps": None, "why": "the chunks were not in the tier this figure names"}
    raw.zero_()
    loaded = []
    seconds = timed(torch, lambda: loaded.append(dev.retrieve(tokens, ids, BLOCK)), reps)
    landed = dev.check()
    wrong = int((raw != ref_raw).sum())
    base = timed(torch, baseline, reps)
    nbytes = len(tokens) // CHUNK * dev.model.chunk_bytes
    return {"gbps": nbytes / seconds / 1e9, base_name + "_gbps": nbytes / base / 1e9, "ratio": base / seconds,
            "loaded_chunks": min(loaded), "landed": bool(landed), "wrong_bytes": wrong}


def _store(torch, dev, ids, n, reps, pinned, src) -> dict:
    g = torch.Generator().manual_seed(7919 + n)
    fresh = iter([torch.randint(0, 120000, (n * CHUNK,), generator=g).to(torch.int32).tolist()
                  for _ in range(reps + 1)])

    def store_fresh():  # new tokens each time: chunks kdnd does not hold
        stored.append(dev.store(next(fresh), ids, BLOCK, 0, n))

    stored: list[int] = []
    seconds = timed(torch, store_fresh, reps)
    base = timed(torch, lambda: pinned.copy_(src, non_blocking=True), reps)
    nbytes = n * dev.model.chunk_bytes
    return {"gbps": nbytes / seconds / 1e9, "d2h_gbps": nbytes / base / 1e9, "ratio": base / seconds,
            "stored_chunks": min(stored)}


def report(results: list[dict], as_json: bool) -> tuple[bool, bool]:
    """Prints the figures; (every byte right and every step whole, every bar met)."""
    right, bars = True, True
    for r in results:
        for name in ("load_t1", "load_t0"):
            f = r[name]
            if f["gbps"] is None:
                right = False
                continue
            right &= f["wrong_bytes"] == 0 and f["landed"] and f["loaded_chunks"] == r["tokens"] // CHUNK
            f["bar"] = BARS[name]
            f["bar_met"] = f["ratio"] >= BARS[name]
            bars &= f["bar_met"]
        right &= r["store"]["stored_chunks"] == r["tokens"] // CHUNK
    if as_json:
        print(json.dumps({"bench": "vllm-gpu", "results": results}, indent=1))
        return right, bars
    for r in results:
        t1, t0, st = r["load_t1"], r["load_t0"], r["store"]
        print(f"{r['tokens']:>6} tokens ({r['bytes'] / 2**20:.0f} MiB):")
        for label, f, base in (("load from T1", t1, "h2d"), ("load from T0", t0, "d2d")):
            if f["gbps"] is None:
                print(f"  {label}: not measured ({f['why']})")
            else:
                print(f"  {label}: {f['gbps']:.1f} GB/s, {f['ratio']:.2f}x of {base} {f[base + '_gbps']:.1f} GB/s "
                      f"(bar {f['bar']}x: {'met' if f['bar_met'] else 'MISSED'}), wrong bytes {f['wrong_bytes']}")
        print(f"  store: {st['gbps']:.1f} GB/s, {st['ratio']:.2f}x of d2h {st['d2h_gbps']:.1f} GB/s")
    return right, bars


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.environ.get("KDN_BIN", ""), help="the folder holding kdnd")
    ap.add_argument("--pkg", default="", help="a folder holding the kdn package (default: importable)")
    ap.add_argument("--tokens", default="4096,16384,65536")
    ap.add_argument("--layout", default="LBHNC", choices=sorted(PERMS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--require-bars", action="store_true")
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.tokens.split(",")]
    if any(s <= 0 or s % CHUNK for s in sizes):
        print(f"kdn-bench vllm --gpu: --tokens must be positive multiples of {CHUNK}", file=sys.stderr)
        return 2
    if a.pkg:
        sys.path.insert(0, a.pkg)
    import torch

    if not torch.cuda.is_available():
        print("kdn-bench vllm --gpu: no device (torch finds no CUDA device): nothing measured")
        return 0
    import kdn
    import kdn.torch as kt

    if not a.bin or not os.path.exists(os.path.join(a.bin, "kdnd")):
        print("kdn-bench vllm --gpu: --bin must name the folder holding kdnd", file=sys.stderr)
        return 2
    need = max(sizes) // CHUNK * LAYERS * 2 * CHUNK * HEADS * HEAD_DIM * 2  # the largest prompt's KV
    host_gib = -(-2 * need // 2**30) + 1  # its chunks, and room for the stores (older chunks are evicted)
    gpu_gib = -(-2 * need // 2**30) + 1   # T0 holds the largest prompt's chunks at once, beside earlier ones
    with tempfile.TemporaryDirectory(prefix="kdn-vllm-gpu-bench-") as tmp:
        sock = os.path.join(tmp, "kdnd.sock")
        d = Kdnd(a.bin, sock, f"{host_gib}G", f"{gpu_gib}G")
        try:
            with kdn.Client(sock, timeout_ms=120000) as c:
                desc = kdn.model_desc(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=HEAD_DIM, dtype=kdn.DType.BF16,
                                      name="llama3-8b-shape", chunk_tokens=CHUNK)
                model = c.register_model(desc)
                results = []
                for s in sizes:
                    results.append(measure_size(torch, kdn, kt, model, a.layout, s, a.reps))
                    torch.cuda.empty_cache()
        finally:
            d.stop()
    right, bars = report(results, a.json)
    if not right:
        return 1
    return 3 if a.require_bars and not bars else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
