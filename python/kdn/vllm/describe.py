"""What a vLLM engine's KV is, as a kdn model descriptor.

The descriptor — and so the fingerprint that every chunk key starts from — covers the layer
geometry, the KV dtype, the chunk size, RoPE, the tensor-parallel rank and an engine salt:
BLAKE2b-256 of the vLLM version, the KV block layout, the model's config.json and the
weights themselves (XXH3-128 of every weight file, or `model_identity` when the operator
names them). Two engines share KV only if all of it is equal.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import kdn

_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
_DIGESTS: dict[tuple, bytes] = {}  # (files, sizes, mtimes) -> digest: hash once per process


@dataclass(frozen=True)
class KvGeometry:
    """One full-attention KV cache group of the engine."""

    layer_names: tuple[str, ...]
    num_kv_heads: int
    head_dim: int
    block_tokens: int
    torch_dtype: Any


class Unsupported(Exception):
    """The engine's KV cannot go through kdn (the connector then stays out of the way)."""


def kv_geometry(kv_cache_config: Any) -> KvGeometry:
    """The single full-attention group of vLLM's KV cache config."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) != 1:
        raise Unsupported(f"{len(groups)} KV cache groups (hybrid or multi-attention models are not supported)")
    spec = groups[0].kv_cache_spec
    if type(spec) is not FullAttentionSpec or getattr(spec, "sliding_window", None):
        raise Unsupported(f"KV cache spec {type(spec).__name__} (only plain full attention is supported)")
    head_v = getattr(spec, "head_size_v", None) or spec.head_size
    if head_v != spec.head_size:
        raise Unsupported("K and V head sizes differ")
    if int(getattr(spec, "kv_quant_mode", 0) or 0) != 0:
        raise Unsupported("quantized KV caches are not supported")
    return KvGeometry(tuple(groups[0].layer_names), int(spec.num_kv_heads), int(spec.head_size),
                      int(spec.block_size), spec.dtype)


def kdn_dtype(torch_dtype: Any) -> kdn.DType:
    import torch

    table = {torch.bfloat16: kdn.DType.BF16, torch.float16: kdn.DType.F16, torch.float32: kdn.DType.F32}
    if torch_dtype not in table:
        raise Unsupported(f"KV dtype {torch_dtype}")
    return table[torch_dtype]


def on_device(vllm_config: Any) -> bool:
    """True on CUDA (kdnd's GPU tier), False on the CPU backend; Unsupported elsewhere."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return False
    if not current_platform.is_cuda():
        raise Unsupported(f"platform {current_platform.device_name}: kdn's GPU path needs CUDA")
    cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto"))
    if cache_dtype != "auto":
        raise Unsupported(f"KV cache dtype {cache_dtype} (quantized KV caches are not supported)")
    return True


def where(vllm_config: Any) -> str:
    """'backend B, layout L' of the engine, for the one line that says why kdn is off."""
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None) or "auto"
    try:
        layout = vllm_config.cache_config.get_resolved_kv_cache_layout().name
    except Exception:  # an engine too old or too odd to resolve it: the line still says why
        layout = "unresolved"
    backend = getattr(backend, "name", backend)
    return f"backend {backend}, layout {layout}"


def attention_isa(vllm_config: Any, geo: KvGeometry) -> str:
    """The ISA vLLM's CPU attention backend picks for this cache, which fixes its block layout."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise Unsupported(f"platform {current_platform.device_name}: kdn's vLLM connector runs on the CPU backend")
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
    return str(_get_attn_isa(geo.torch_dtype, geo.block_tokens, geo.head_dim, cache_dtype))


def _weight_files(model: str) -> list[str]:
    files: list[str] = []
    for pattern in _WEIGHT_PATTERNS:
        files.extend(glob.glob(os.path.join(model, pattern)))
    return sorted(set(files))


def _local_model_dir(model: str, revision: str | None) -> str | None:
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id=model, revision=revision, local_files_only=True)
    except Exception:  # not in the local cache, or not a hub id at all
        return None


def weights_identity(model_config: Any, model_identity: str | None) -> bytes:
    """Bytes naming the weights: the operator's model_identity, or a digest of the files."""
    if model_identity:
        return b"identity:" + model_identity.encode()
    model = str(model_config.model)
    revision = getattr(model_config, "revision", None)
    folder = _local_model_dir(model, revision)
    if folder is None:
        if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
            return f"hub:{model}@{revision}".encode()
        raise Unsupported(f"cannot find the weights of {model!r} to identify them; set "
                          "kv_connector_extra_config.model_identity")
    files = _weight_files(folder)
    config = os.path.join(folder, "config.json")
    if os.path.isfile(config):
        files.append(config)
    if not files:
        raise Unsupported(f"no weight files in {folder}; set kv_connector_extra_config.model_identity")
    key = tuple((f, os.path.getsize(f), os.path.getmtime(f)) for f in files)
    if key not in _DIGESTS:
        _DIGESTS[key] = kdn.file_digest(files)
    return b"files:" + _DIGESTS[key]


def _rope(hf_config: Any, head_dim: int) -> tuple[kdn.RopeStyle, int, float, kdn.RopeScaling, float]:
    params = getattr(hf_config, "rope_parameters", None) or {}
    if not isinstance(params, dict):
        params = {}
    theta = float(params.get("rope_theta", getattr(hf_config, "rope_theta", 0.0)) or 0.0)
    partial = float(params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0)) or 1.0)
    kind = str(params.get("rope_type", "default") or "default")
    scaling = {"default": kdn.RopeScaling.NONE, "linear": kdn.RopeScaling.LINEAR, "llama3": kdn.RopeScaling.LLAMA3,
               "yarn": kdn.RopeScaling.YARN}.get(kind, kdn.RopeScaling.NONE)
    factor = float(params.get("factor", 0.0) or 0.0)
    style = kdn.RopeStyle.NEOX if theta > 0 else kdn.RopeStyle.NONE
    return style, int(head_dim * partial), theta, scaling, factor


def engine_salt(vllm_version: str, layout: str, weights: bytes, hf_config: Any) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    try:
        config_text = json.dumps(hf_config.to_dict(), sort_keys=True, default=str)
    except Exception:
        config_text = repr(hf_config)
    for part in (b"kdn-vllm-1", vllm_version.encode(), layout.encode(), weights, config_text.encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


def describe(vllm_config: Any, geo: KvGeometry, layout: str, chunk_tokens: int, model_identity: str | None,
             tp_rank: int, tp_size: int) -> kdn.ModelDesc:
    """The kdn descriptor of this engine's KV (Unsupported when it has none kdn can hold)."""
    import vllm

    mc = vllm_config.model_config
    if chunk_tokens % geo.block_tokens != 0:
        raise ValueError(f"kdn connector: chunk_tokens {chunk_tokens} is not a multiple of vLLM's block size "
                         f"{geo.block_tokens}")
    style, rotary, theta, scaling, factor = _rope(mc.hf_config, geo.head_dim)
    weights = weights_identity(mc, model_identity)
    return kdn.model_desc(
        num_layers=len(geo.layer_names),
        num_kv_heads=geo.num_kv_heads,
        head_dim=geo.head_dim,
        dtype=kdn_dtype(geo.torch_dtype),
        name=os.path.basename(str(mc.served_model_name if isinstance(mc.served_model_name, str)
                                  else mc.model).rstrip("/"))[:63],
        chunk_tokens=chunk_tokens,
        rope_style=style,
        rotary_dim=rotary,
        rope_theta=theta,
        rope_scaling=scaling,
        rope_scaling_params=(factor, 0.0, 0.0, 0.0),
        tp_rank=tp_rank,
        tp_size=tp_size,
        engine_salt=engine_salt(vllm.__version__, layout, weights, mc.hf_config),
    )
