"""kdn: the Python client of kdnd, the per-node KV-cache sidecar.

    import kdn
    client = kdn.Client()                      # $KDN_SOCKET or the default socket
    model = client.register_model(desc)        # a kdn.ModelDesc
    hit = model.lookup(tokens)                 # leading cached chunks: hit.hit_chunks
    model.retrieve(tokens, out)                # copy into a [n, L, 2, T, H, D] tensor
    with model.lease(tokens) as lease:         # or read them in place, zero-copy
        first = torch.from_dlpack(lease.chunk(0))
    model.store(tokens, kv)                    # publish whole chunks
    model.prefetch(tokens)                     # start reading a disk-resident prefix into memory

Every call releases the GIL. Failures raise kdn.KdnError, whose `code` is a kdn.Status.
`kdn.vllm` holds the vLLM KV connector (KdnConnector).
"""

import enum

from ._kdn import (
    ABI_VERSION,
    PROTOCOL_VERSION,
    TIER_COUNT,
    Client,
    DType,
    KdnError,
    Lease,
    LoadOutcome,
    LookupResult,
    Model,
    ModelDesc,
    PagedKV,
    PendingCommit,
    Reservation,
    RopeScaling,
    RopeStyle,
    SaveOutcome,
    Status,
    abi_version,
    file_digest,
    strerror,
)

__version__ = "0.1.0"


class Tier(enum.IntEnum):
    """Index of LookupResult.tier_chunks: where each cached chunk's fastest copy is."""

    GPU = 0
    HOST = 1
    DISK = 2
    REMOTE = 3


__all__ = [
    "ABI_VERSION",
    "PROTOCOL_VERSION",
    "TIER_COUNT",
    "Client",
    "DType",
    "KdnError",
    "Lease",
    "LoadOutcome",
    "LookupResult",
    "Model",
    "ModelDesc",
    "PagedKV",
    "PendingCommit",
    "Reservation",
    "RopeScaling",
    "RopeStyle",
    "SaveOutcome",
    "Status",
    "Tier",
    "abi_version",
    "file_digest",
    "strerror",
    "model_desc",
]


def model_desc(
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: DType,
    name: str = "",
    chunk_tokens: int = 0,
    rope_style: RopeStyle = RopeStyle.NONE,
    rotary_dim: int = 0,
    rope_theta: float = 0.0,
    rope_scaling: RopeScaling = RopeScaling.NONE,
    rope_scaling_params: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    k_channel_order: int = 0,
    tp_rank: int = 0,
    tp_size: int = 1,
    engine_salt: bytes = b"",
) -> ModelDesc:
    """A validated ModelDesc from explicit fields (kdn.vllm.describe builds one from vLLM)."""
    d = ModelDesc()
    d.num_layers = num_layers
    d.num_kv_heads = num_kv_heads
    d.head_dim = head_dim
    d.dtype = int(dtype)
    d.name = name
    d.chunk_tokens = chunk_tokens
    d.rope_style = int(rope_style)
    d.rotary_dim = rotary_dim
    d.rope_theta = rope_theta
    d.rope_scaling = int(rope_scaling)
    d.rope_scaling_params = rope_scaling_params
    d.k_channel_order = k_channel_order
    d.tp_rank = tp_rank
    d.tp_size = tp_size
    d.engine_salt = engine_salt
    d.validate()
    return d
