"""Counters of the connectors in this process (both roles), for logs, tests and benchmarks."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass
class ConnectorStats:
    lookups: int = 0               # scheduler: kdnd lookups
    lookup_hit_tokens: int = 0     # scheduler: tokens kdnd offered beyond vLLM's own prefix hit
    lookup_errors: int = 0         # scheduler: lookups that failed (kdnd unreachable, ...)
    rescheduled: int = 0           # scheduler: requests allocated again after a preemption
    reloads: int = 0               # scheduler: of those, requests that load from kdnd again
    loads: int = 0                 # worker: requests that loaded from kdnd
    loaded_chunks: int = 0
    loaded_bytes: int = 0
    load_failures: int = 0         # worker: loads that stopped short (their rest recomputed)
    failed_blocks: int = 0         # worker: blocks reported through get_block_ids_with_load_errors
    corrupt_chunks: int = 0        # worker: chunks that failed their check
    evicted_chunks: int = 0        # worker: chunks gone between lookup and load
    off_step_lookups: int = 0      # scheduler: hits answered as asynchronous loads (chunks below the host tier)
    off_step_loads: int = 0        # worker: of the loads, those kdnd brought up off the step first
    unavailable: int = 0           # either: calls that found kdnd unreachable
    saves: int = 0                 # worker: store requests sent to kdnd
    saved_chunks: int = 0          # worker: chunks gathered and published
    saved_bytes: int = 0
    present_chunks: int = 0        # worker: chunks kdnd already had (not gathered)
    save_failures: int = 0
    skipped_saves: int = 0         # worker: saves dropped because the request's load failed this step
    load_seconds: float = 0.0      # worker: time in loads (lease + copy + release)
    save_seconds: float = 0.0      # worker: time in saves (reserve + gather + commit)
    reconnects: int = 0            # either: connections made to kdnd after the first


_lock = threading.Lock()
_all: list[ConnectorStats] = []


def new_stats() -> ConnectorStats:
    s = ConnectorStats()
    with _lock:
        _all.append(s)
    return s


def process_stats() -> dict[str, float]:
    """The sum of every connector's counters in this process."""
    total: dict[str, float] = asdict(ConnectorStats())
    with _lock:
        for s in _all:
            for k, v in asdict(s).items():
                total[k] += v
    return total
