"""What the scheduler side tells the worker side each step (pickled between processes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass
class LoadSpec:
    """Load chunks [first_chunk, end_chunk) of a request into its blocks.

    tokens: the prompt's first end_chunk * chunk_tokens tokens (int32); blocks: the engine
    block of every block_tokens of them (int64); blocks before first_block hold tokens vLLM
    computed itself and are left alone. fail: the scheduler could not plan this load; the
    worker loads nothing and reports the range's blocks as failed. off_step: vLLM's
    asynchronous load: the request waits (WAITING_FOR_REMOTE_KVS) while the worker loads off
    the step, and is reported through get_finished once its blocks are written or failed.
    """

    req_id: str
    tokens: np.ndarray
    blocks: np.ndarray
    first_chunk: int
    end_chunk: int
    first_block: int
    fail: bool = False
    off_step: bool = False


@dataclass
class SaveSpec:
    """Store chunks [first_chunk, first_chunk + n_chunks) of a request after this step."""

    req_id: str
    tokens: np.ndarray
    blocks: np.ndarray
    first_chunk: int
    n_chunks: int


@dataclass
class KdnConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)  # their blocks go to others after this step
