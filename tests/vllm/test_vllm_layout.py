"""kdn.PagedKV against vLLM's own CPU cache writer: for each CPU attention ISA kdn knows,
vLLM's cpu_attn_reshape_and_cache and kdn's load put every K and V element in the same
place, and kdn's save reads them back into the canonical chunk."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tools"))
import replicas  # noqa: E402

import kdn  # noqa: E402

L, H, D, B, T, NB = 3, 3, 64, 128, 256, 8


@pytest.fixture(scope="module")
def kdnd(tmp_path_factory):
    k = replicas.Kdnd(str(tmp_path_factory.mktemp("kdn-layout") / "kdnd.sock"), arena="64M").start()
    yield k
    k.stop()


def vllm_cache(isa: str, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """vLLM's cache for one layer, written by vLLM's kernel: [NB, H, B, 2D]."""
    from vllm import _custom_ops as ops

    cache = torch.zeros(NB, H, B, 2 * D, dtype=k.dtype)
    view = cache.view(NB, H, 2 * B, D)
    key_cache, value_cache = view.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa)
    return cache


def isa_runs(isa: str) -> bool:
    try:
        x = torch.zeros(1, H, D, dtype=torch.bfloat16)
        vllm_cache(isa, x, x, torch.zeros(1, dtype=torch.int64))
        return True
    except Exception:
        return False


ISAS = ["vec", "vec16", "amx"]


def test_some_isa_runs_here():
    """The comparisons below skip an ISA this CPU or vLLM build lacks; all of them skipping
    would leave the layout unchecked, so at least one must run."""
    assert any(isa_runs(isa) for isa in ISAS), f"none of {ISAS} runs with this vLLM build on this CPU"


@pytest.mark.parametrize("isa", ISAS)
def test_load_and_save_match_vllms_writer(kdnd, isa):
    if not isa_runs(isa):
        pytest.skip(f"this vLLM build or CPU cannot write the {isa} layout")
    torch.manual_seed(0)
    blocks = torch.tensor([5, 2], dtype=torch.int64)  # the chunk's two 128-token blocks
    slots = (blocks.repeat_interleave(B) * B + torch.arange(B).repeat(2)).to(torch.int64)
    ks = [torch.randn(T, H, D, dtype=torch.bfloat16) for _ in range(L)]
    vs = [torch.randn(T, H, D, dtype=torch.bfloat16) for _ in range(L)]
    want = [vllm_cache(isa, ks[l], vs[l], slots) for l in range(L)]

    # The same K and V as one canonical chunk: [layer][K|V][token][head][dim].
    chunk = torch.stack([torch.stack([ks[l], vs[l]]) for l in range(L)]).unsqueeze(0)
    tokens = np.arange(T + 1, dtype=np.int32)
    d = kdn.model_desc(num_layers=L, num_kv_heads=H, head_dim=D, dtype=kdn.DType.BF16, name=f"layout-{isa}",
                       chunk_tokens=T)
    with kdn.Client(kdnd.socket) as c:
        m = c.register_model(d)
        assert m.store(tokens, chunk) == 1
        layers = [torch.zeros(NB, H, B, 2 * D, dtype=torch.bfloat16) for _ in range(L)]
        paged = kdn.PagedKV(layers, isa, T, threads=2)
        out = paged.load(m, tokens, blocks.numpy(), 0, 1, 0)
        assert (out.loaded, out.status, out.corrupt) == (1, 0, 0)
        for l in range(L):
            assert torch.equal(layers[l][blocks], want[l][blocks]), f"layer {l}"

        # Save from vLLM's own cache under another model: kdn reads back the same chunk.
        d2 = kdn.model_desc(num_layers=L, num_kv_heads=H, head_dim=D, dtype=kdn.DType.BF16,
                            name=f"layout-{isa}-save", chunk_tokens=T)
        m2 = c.register_model(d2)
        paged2 = kdn.PagedKV(want, isa, T, threads=2)
        saved = paged2.save(m2, tokens, blocks.numpy(), 0, 1)
        assert (saved.stored, saved.status) == (1, 0)
        back = torch.zeros_like(chunk)
        assert m2.retrieve(tokens, back) == 1
        assert torch.equal(back, chunk)


def test_blocks_vllm_computed_itself_are_left_alone(kdnd):
    tokens = np.arange(2 * T + 5, dtype=np.int32)
    d = kdn.model_desc(num_layers=L, num_kv_heads=H, head_dim=D, dtype=kdn.DType.BF16, name="skip", chunk_tokens=T)
    with kdn.Client(kdnd.socket) as c:
        m = c.register_model(d)
        assert m.store(tokens, torch.randn(2, L, 2, T, H, D, dtype=torch.bfloat16)) == 2
        layers = [torch.full((NB, H, B, 2 * D), 7.0, dtype=torch.bfloat16) for _ in range(L)]
        paged = kdn.PagedKV(layers, "vec", T)
        blocks = np.array([0, 1, 2, 3], dtype=np.int64)
        # vLLM had the first three blocks (384 tokens); kdn loads from chunk 1, block 3 only.
        out = paged.load(m, tokens, blocks, 1, 2, 3)
        assert (out.loaded, out.status) == (1, 0)
        for l in range(L):
            assert bool((layers[l][:3] == 7.0).all()) and not bool((layers[l][3] == 7.0).all())
        with pytest.raises(kdn.KdnError):
            paged.load(m, tokens, np.array([0, 1, 2, NB], dtype=np.int64), 0, 2, 0)  # block beyond the cache
        # Not cached any more (another prefix): the load says so and writes nothing.
        other = tokens.copy()
        other[0] = 99999
        out = paged.load(m, other, blocks, 0, 2, 0)
        assert (out.loaded, out.status) == (0, int(kdn.Status.NOT_FOUND))
