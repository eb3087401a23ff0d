"""Tensor parallelism: the KV of one TP layout is never served to another.

Under TP each rank holds its own shard of the KV heads. Two layouts can give shards of the same
shape (a 4-head model on two ranks, a 2-head model on one), and rank 0 and rank 1 of one layout
always do: only the fingerprint, which carries the TP rank and size, keeps them apart. The
descriptors come from the connector's own describe() (a stand-in for vLLM's config, same
weights), and a real kdnd answers the lookups.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tools"))
import replicas  # noqa: E402

import kdn  # noqa: E402
from kdn.vllm import describe  # noqa: E402

CHUNK = 16
TOKENS = list(range(1000, 1000 + 2 * CHUNK))


@pytest.fixture(scope="module")
def kdnd(tmp_path_factory):
    k = replicas.Kdnd(str(tmp_path_factory.mktemp("kdn-tp") / "kdnd.sock"), arena="64M").start()
    yield k
    k.stop()


def rank_desc(heads_per_rank: int, tp_rank: int, tp_size: int) -> kdn.ModelDesc:
    hf = SimpleNamespace(rope_theta=10000.0, to_dict=lambda: {"model_type": "llama", "num_key_value_heads": 4})
    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=hf, served_model_name="tp-model",
                                                          model="/models/tp-model", revision=None))
    geo = describe.KvGeometry(layer_names=("l0", "l1"), num_kv_heads=heads_per_rank, head_dim=8,
                              torch_dtype=torch.bfloat16, block_tokens=CHUNK)
    return describe.describe(config, geo, "cuda-paged", CHUNK, "org/tp-model@1", tp_rank, tp_size)


LAYOUTS = {"tp1": (2, 0, 1), "tp2-rank0": (2, 0, 2), "tp2-rank1": (2, 1, 2), "tp4-rank0": (1, 0, 4)}


def test_fingerprint_carries_tp_rank_and_size():
    prints = {name: rank_desc(*shape).fingerprint() for name, shape in LAYOUTS.items()}
    assert len(set(prints.values())) == len(prints), prints
    assert rank_desc(2, 1, 2).fingerprint() == prints["tp2-rank1"]  # deterministic


def test_chunks_of_one_tp_layout_never_serve_another(kdnd):
    with kdn.Client(kdnd.socket) as c:
        models = {name: c.register_model(rank_desc(*shape)) for name, shape in LAYOUTS.items()}
        writer = models["tp2-rank0"]
        assert writer.store(TOKENS, torch.ones(2, *writer.chunk_shape, dtype=torch.bfloat16)) == 2
        hits = {name: m.lookup(TOKENS).hit_chunks for name, m in models.items()}
        assert hits == {"tp1": 0, "tp2-rank0": 2, "tp2-rank1": 0, "tp4-rank0": 0}, hits
