"""kdn's layout of vLLM's device KV cache, derived from the views vLLM itself builds.

vLLM 0.32 views every attention layer's cache as [B, H, N, C] (K and V packed in C), all carved
out of one backing allocation, ordered in memory by a KVCacheLayout. Here vLLM's own
allocate_kv_cache builds those views on the CPU for each layout (and with kernel blocks that
subdivide the scheduler's blocks); kdn.torch derives kdn's layout from them; kdnd's chunks are
scattered through it by libkdn's CPU scatter (the same layout struct a GPU retrieve sends to
kdnd) and must equal the same data written with plain torch indexing, byte for byte over the
whole backing allocation. The store direction is checked the same way. Also: the errors of the
device path, without a device."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tools"))
import replicas  # noqa: E402

import kdn  # noqa: E402
import kdn.torch as kt  # noqa: E402

from vllm.v1.core.kv_cache_utils import _get_kv_cache_bytes_per_block  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    compute_layout_strides,
)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

LAYERS, HEADS, HEAD_DIM, CHUNK = 3, 2, 8, 32


@pytest.fixture(scope="module")
def kdnd(tmp_path_factory):
    k = replicas.Kdnd(str(tmp_path_factory.mktemp("kdn-gpu-layout") / "kdnd.sock"), arena="64M").start()
    yield k
    k.stop()


def kv_config(layout: KVCacheLayout, block_size: int, num_blocks: int, dtype=torch.bfloat16) -> KVCacheConfig:
    """A one-group config as vLLM's get_kv_cache_config lays it out for `layout`."""
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=HEADS, head_size=HEAD_DIM, dtype=dtype)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    groups = [KVCacheGroupSpec(names, spec)]
    per_block = _get_kv_cache_bytes_per_block(groups, layout)
    block_stride = per_block if layout.is_block_outermost else None
    layer_stride, block_stride, _, _, _ = compute_layout_strides(
        spec, num_blocks, LAYERS, layout, fixed_strides=(None, block_stride, None, None, None))
    tensor = KVCacheTensor(size=per_block * num_blocks, layers=names, layer_stride=layer_stride,
                           block_stride=block_stride)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[tensor], kv_cache_groups=groups)


def vllm_views(layout, block_size, num_blocks, kernel_block=None, dtype=torch.bfloat16) -> list[torch.Tensor]:
    cfg = kv_config(layout, block_size, num_blocks, dtype)
    caches = allocate_kv_cache(cfg, torch.device("cpu"), layout,
                               kernel_block_sizes=[kernel_block] if kernel_block else None)
    return [caches[n] for n in cfg.kv_cache_tensors[0].layers]


def write_by_indexing(views, kv: torch.Tensor, block_ids, block_size: int) -> None:
    """Token i of the canonical chunks kv [n, L, 2, T, H, D] into view[block, head, token, :]."""
    n = kv.shape[0] * CHUNK
    kernel = views[0].shape[2]
    ratio = block_size // kernel
    for i in range(n):
        c, t = divmod(i, CHUNK)
        b = block_ids[i // block_size]
        kb, off = b * ratio + (i % block_size) // kernel, i % kernel
        for layer, v in enumerate(views):
            for h in range(HEADS):
                v[kb, h, off, :HEAD_DIM] = kv[c, layer, 0, t, h]
                v[kb, h, off, HEAD_DIM:] = kv[c, layer, 1, t, h]


def backing(views) -> torch.Tensor:
    return kt.host_backing(views[0])


def model(client, name: str, dtype=kdn.DType.BF16):
    return client.register_model(kdn.model_desc(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=HEAD_DIM,
                                                dtype=dtype, name=name, chunk_tokens=CHUNK))


CASES = [(layout, 16, None) for layout in (KVCacheLayout.LBHNC, KVCacheLayout.LBNHC, KVCacheLayout.BLHNC,
                                           KVCacheLayout.BLNHC, KVCacheLayout.LHBNC, KVCacheLayout.BHLNC)]
# Kernel blocks of 16 tokens inside scheduler blocks of 32. vLLM refuses the split for
# layouts whose blocks are not dense pages (block-outermost with several layers, LHBNC).
CASES += [(KVCacheLayout.LBHNC, 32, 16), (KVCacheLayout.LBNHC, 64, 16)]


@pytest.mark.parametrize("layout,block_size,kernel", CASES,
                         ids=[f"{c[0].name}-b{c[1]}" + (f"-k{c[2]}" if c[2] else "") for c in CASES])
def test_scatter_and_gather_match_torch_indexing(kdnd, layout, block_size, kernel):
    num_blocks = 12
    views = vllm_views(layout, block_size, num_blocks, kernel)
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1  # one backing allocation
    lay = kt.layout_of(views)
    assert lay.block_tokens == (kernel or block_size)
    gen = torch.Generator().manual_seed(hash(layout.name) & 0xFFFF)
    n_chunks = 3
    tokens = [int(x) for x in torch.randint(0, 30000, (n_chunks * CHUNK + 5,), generator=gen)]
    kv = torch.randn(n_chunks, LAYERS, 2, CHUNK, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    blocks_needed = -(-n_chunks * CHUNK // block_size)
    block_ids = [int(b) for b in torch.randperm(num_blocks, generator=gen)[:blocks_needed]]
    with kdn.Client(kdnd.socket) as c:
        m = model(c, f"layout-{layout.name}-{block_size}-{kernel}")
        assert m.store(tokens, kv) == n_chunks
        assert kt.host_retrieve(m, lay, views, tokens, block_ids, block_size) == n_chunks

        expect = vllm_views(layout, block_size, num_blocks, kernel)
        write_by_indexing(expect, kv, block_ids, block_size)
        assert torch.equal(backing(views), backing(expect))  # every byte, untouched blocks included
        for got, want in zip(views, expect):
            assert torch.equal(got, want)

        # The other direction: KV written by indexing into other blocks, stored through the
        # layout under new tokens, comes back canonical.
        kv2 = torch.randn(n_chunks, LAYERS, 2, CHUNK, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
        others = [b for b in range(num_blocks) if b not in block_ids][:blocks_needed]
        src = vllm_views(layout, block_size, num_blocks, kernel)
        write_by_indexing(src, kv2, others, block_size)
        tokens2 = [t + 1 for t in tokens]
        assert kt.host_store(m, kt.layout_of(src), src, tokens2, others, block_size, 0, n_chunks) == n_chunks
        out = torch.zeros_like(kv2)
        assert m.retrieve(tokens2, out) == n_chunks
        assert torch.equal(out, kv2)


def test_a_layout_outside_its_allocation_is_refused():
    views = vllm_views(KVCacheLayout.BLNHC, 16, 8)
    lay = kt.layout_of(views)
    raw = backing(views)
    base, size = raw.data_ptr(), raw.numel()
    lay.engine.check_within(base, size)
    for b, n in ((base, size - 1), (base + 2, size), (base - 4096, 4096)):
        with pytest.raises(kdn.KdnError) as e:
            lay.engine.check_within(b, n)
        assert e.value.code == kdn.Status.INVALID_ARGUMENT and "reaches bytes" in str(e.value)
    # A view of another allocation among the layers: the first layer's allocation does not hold it.
    stray = vllm_views(KVCacheLayout.BLNHC, 16, 8)[1]
    mixed = kt.layout_of([views[0], stray, views[2]])
    with pytest.raises(kdn.KdnError) as e:
        mixed.engine.check_within(base, size)
    assert e.value.code == kdn.Status.INVALID_ARGUMENT and "layer 1" in str(e.value)


def test_what_one_layout_cannot_express_is_refused():
    views = vllm_views(KVCacheLayout.LBHNC, 16, 8)
    cases = [
        ([views[0], views[1].transpose(1, 2)], kdn.Status.INVALID_ARGUMENT),  # strides differ per layer
        ([views[0][:4], views[1][:5]], kdn.Status.INVALID_ARGUMENT),          # shapes differ
        ([views[0][..., :15]], kdn.Status.INVALID_ARGUMENT),                  # C is not K|V of one head size
        ([views[0][0]], kdn.Status.INVALID_ARGUMENT),                         # not [B, H, N, C]
        ([], kdn.Status.INVALID_ARGUMENT),
        (vllm_views(KVCacheLayout.LBHNC, 16, 8, dtype=torch.float8_e4m3fn), kdn.Status.UNSUPPORTED),
        ([torch.zeros(4, 2, 16, 16, dtype=torch.int8)], kdn.Status.UNSUPPORTED),
    ]
    for layer_views, code in cases:
        with pytest.raises(kdn.KdnError) as e:
            kt.layout_of(layer_views)
        assert e.value.code == code, str(e.value)


def test_device_calls_refuse_without_a_device(kdnd):
    views = vllm_views(KVCacheLayout.LBHNC, 16, 8)
    with kdn.Client(kdnd.socket) as c:
        m = model(c, "device-errors")
        with pytest.raises(kdn.KdnError) as e:
            kt.DeviceKV(m, views)  # host tensors
        assert e.value.code == kdn.Status.INVALID_ARGUMENT and "needs CUDA" in str(e.value)
        meta = [torch.empty(8, HEADS, 16, 2 * HEAD_DIM, dtype=torch.bfloat16, device="meta")] * LAYERS
        with pytest.raises(kdn.KdnError) as e:
            kt.DeviceKV(m, meta)
        assert e.value.code == kdn.Status.INVALID_ARGUMENT
        lay = kt.layout_of(views)
        with pytest.raises(kdn.KdnError) as e:
            kdn._kdn.GpuKV(m, lay.engine, b"\0" * 10)
        assert e.value.code == kdn.Status.INVALID_ARGUMENT and "engine_event" in str(e.value)
        # Host memory is no CUDA allocation: refused by the driver, or (no driver here) unsupported.
        with pytest.raises(kdn.KdnError) as e:
            kdn._kdn.GpuKV(m, lay.engine, b"\0" * 64)
        assert e.value.code in (kdn.Status.UNSUPPORTED, kdn.Status.INVALID_ARGUMENT)
        ok, why = kdn._kdn.cuda_available()
        assert ok or (e.value.code == kdn.Status.UNSUPPORTED and why in str(e.value))
        wrong = c.register_model(kdn.model_desc(num_layers=LAYERS + 1, num_kv_heads=HEADS, head_dim=HEAD_DIM,
                                                dtype=kdn.DType.BF16, name="other-shape", chunk_tokens=CHUNK))
        with pytest.raises(kdn.KdnError) as e:
            lay.engine.retrieve_to(wrong, kt._tokens(range(64)), backing(views), kt.slots_for([0, 1], 32, 16))
        assert e.value.code == kdn.Status.MODEL_MISMATCH


def test_slots_past_the_cache_are_refused(kdnd):
    views = vllm_views(KVCacheLayout.LBHNC, 16, 4)
    lay = kt.layout_of(views)
    with kdn.Client(kdnd.socket) as c:
        m = model(c, "slots")
        with pytest.raises(kdn.KdnError) as e:
            kt.host_retrieve(m, lay, views, list(range(CHUNK)), [1, 4], 16)  # block 4 of 4
        assert e.value.code == kdn.Status.INVALID_ARGUMENT
        with pytest.raises(kdn.KdnError) as e:
            kt.slots_for([0], 17, 16)
        assert e.value.code == kdn.Status.INVALID_ARGUMENT
