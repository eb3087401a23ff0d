#!/usr/bin/env python3
"""Entropy bounds of KIVI-style codes on real KV chunks (a --dump-kv directory).

For each chunk file STEM.kv (canonical layout [layer][K|V][token][kv_head][head_dim], described
by STEM.json) this quantizes K per channel over token groups and V per token over the head's
channels, as KVC1's kivi modes do (docs/codec.md 5.1, f32 scales here), and prints the average
bits per code that an entropy coder could reach under three models:

  order0    one table per (layer, plane, head): what KVC1's rANS segments use
  channel   one table per channel, the better of plain codes and token deltas, tables free
  context   one table per previous code of the same channel (order-1 context), tables free

plus the bits of the scales and zero points, and the ratio to fp16 each bound allows.
Usage: scripts/kv-entropy.py DIR [--bits 4] [--k-group 128]
"""
import argparse
import glob
import json
import os

try:
    import numpy as np
except ImportError:
    raise SystemExit("kv-entropy: needs numpy (apt-get install python3-numpy)")


def bits(counts):
    c = counts[counts > 0].astype(np.float64)
    return float(-(c * np.log2(c / c.sum())).sum())


def codes(x, levels, axis, group):
    """Min-max codes of x (T x D), groups along `axis` (0: per channel over `group` tokens)."""
    q = np.zeros(x.shape, dtype=np.int64)
    if axis == 0:
        for g in range(0, x.shape[0], group):
            blk = x[g:g + group]
            mn, mx = blk.min(0), blk.max(0)
            s = np.where(mx > mn, (mx - mn) / levels, 1.0)
            q[g:g + group] = np.clip(np.rint((blk - mn) / s), 0, levels)
    else:
        mn, mx = x.min(1, keepdims=True), x.max(1, keepdims=True)
        s = np.where(mx > mn, (mx - mn) / levels, 1.0)
        q = np.clip(np.rint((x - mn) / s), 0, levels).astype(np.int64)
    return q


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--k-group", type=int, default=128)
    a = ap.parse_args()
    n_sym = 1 << a.bits
    total = {p: {"n": 0, "order0": 0.0, "channel": 0.0, "context": 0.0, "params": 0.0} for p in "KV"}
    files = sorted(glob.glob(os.path.join(a.dir, "*.kv")))
    if not files:
        raise SystemExit(f"kv-entropy: no .kv files in {a.dir}")
    for f in files:
        meta = json.load(open(f[:-3] + ".json"))
        if meta["dtype"] != "f16":
            raise SystemExit(f"kv-entropy: {f}: only f16 chunks")
        L, T, H, D = meta["layers"], meta["tokens"], meta["kv_heads"], meta["head_dim"]
        kv = np.fromfile(f, dtype="<f2").astype(np.float32).reshape(L, 2, T, H, D)
        for l in range(L):
            for p, name in enumerate("KV"):
                for h in range(H):
                    x = kv[l, p, :, h, :]
                    q = codes(x, n_sym - 1, 0 if p == 0 else 1, a.k_group)
                    prev = np.vstack([np.zeros((1, D), np.int64), q[:-1]])
                    delta = (q - prev) % n_sym
                    t = total[name]
                    t["n"] += q.size
                    t["order0"] += bits(np.bincount(q.ravel(), minlength=n_sym))
                    t["channel"] += sum(min(bits(np.bincount(q[:, d], minlength=n_sym)),
                                            bits(np.bincount(delta[:, d], minlength=n_sym))) for d in range(D))
                    joint = np.bincount((prev * n_sym + q).ravel(), minlength=n_sym * n_sym).reshape(n_sym, n_sym)
                    t["context"] += sum(bits(row) for row in joint)
                    groups = -(-T // a.k_group) * D if p == 0 else T
                    t["params"] += groups * 32  # f16 scale + f16 zero point
    n = sum(t["n"] for t in total.values())
    print(f"{len(files)} chunk(s), {a.bits}-bit codes, K groups of {a.k_group} tokens, V groups of head_dim")
    print("plane  order0  channel  context  params  (bits per value)")
    for name, t in total.items():
        print(f"{name:5}  {t['order0'] / t['n']:6.3f}  {t['channel'] / t['n']:7.3f}  {t['context'] / t['n']:7.3f}  "
              f"{t['params'] / t['n']:6.3f}")
    params = sum(t["params"] for t in total.values()) / n
    for model in ("order0", "channel", "context"):
        b = sum(t[model] for t in total.values()) / n + params
        print(f"{model:8} bound with parameters: {b:.3f} bits per value, ratio_vs_fp16 <= {16 / b:.2f}")


if __name__ == "__main__":
    main()
