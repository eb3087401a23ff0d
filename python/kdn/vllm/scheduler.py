"""The scheduler side of the connector: what to load from kdnd and what to store in it.

Per request:
  * get_num_new_matched_tokens asks kdnd (one LOOKUP) how many leading whole chunks of the
    prompt it holds, never counting the chunk that holds the prompt's last token (its logits
    choose the first output token, so at least one token is always computed), and offers
    vLLM the tokens beyond its own prefix-cache hit. It has no side effect vLLM could
    observe, so vLLM may ask again while the request waits. A hit with chunks on kdnd's disk
    or remote tier is offered as an asynchronous load (off_step.py): vLLM parks the request
    with its blocks allocated until the worker reports the load finished.
  * update_state_after_alloc turns vLLM's decision (num_external_tokens) into a load: the
    chunks, and the blocks vLLM allocated for them.
  * build_connector_meta hands this step's loads to the workers, and a save for every whole
    prompt chunk that is complete after this step and that kdnd did not hold at the lookup.
    If vLLM rewinds a request (a load failed, so it recomputes from there), the chunks past
    the rewind are saved again once recomputed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import KdnConfig
from .link import KdnLink
from .metadata import KdnConnectorMetadata, LoadSpec, SaveSpec
from .off_step import below_host
from .stats import ConnectorStats

import kdn


def request_opted_out(request: Any) -> tuple[bool, bool]:
    """(no_load, no_save) from kv_transfer_params={"kdn": "off" | {"load": bool, "save": bool}}."""
    params = getattr(request, "kv_transfer_params", None) or {}
    choice = params.get("kdn") if isinstance(params, dict) else None
    if choice in ("off", False):
        return True, True
    if isinstance(choice, dict):
        return not choice.get("load", True), not choice.get("save", True)
    return False, False


@dataclass
class _Tracked:
    request: Any
    tokens: np.ndarray       # the prompt, int32
    saved_through: int       # chunks [0, saved_through) are in kdnd or being saved
    save: bool
    load: LoadSpec | None = None
    off_step: bool = False   # an asynchronous load was planned and vLLM has not allocated again


class SchedulerSide:
    def __init__(self, cfg: KdnConfig, link: KdnLink | None, block_tokens: int, stats: ConnectorStats,
                 log: logging.Logger, async_stores: bool = False) -> None:
        self._cfg = cfg
        self._link = link          # None: kdn is off for this engine
        # Workers store after the step (GPU): a finished request's blocks stay in use until the
        # worker reports its stores landed (get_finished).
        self._async_stores = async_stores
        self._T = cfg.chunk_tokens
        self._B = block_tokens
        self._stats = stats
        self._log = log
        self._tokens: dict[str, np.ndarray] = {}
        self._lookups: dict[str, tuple[int, int, bool]] = {}  # req -> (kdnd chunks, vLLM's local hit, off step)
        self._tracked: dict[str, _Tracked] = {}
        self._due: list[str] = []  # requests with a load planned since the last build_connector_meta
        self._kv_cache_manager: Any = None

    def bind_kv_cache_manager(self, manager: Any) -> None:
        self._kv_cache_manager = manager

    def _prompt(self, request: Any) -> np.ndarray:
        t = self._tokens.get(request.request_id)
        if t is None:
            t = np.asarray(request.prompt_token_ids or [], dtype=np.int32)
            self._tokens[request.request_id] = t
        return t

    # ---- vLLM hooks ----------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        rid = request.request_id
        self._lookups[rid] = (0, num_computed_tokens, False)
        tracked = self._tracked.get(rid)
        if tracked is not None and tracked.off_step:
            # vLLM asks again only after an asynchronous load failed from its first block on
            # (it freed the blocks): compute the prompt rather than meet the same failure again.
            tracked.off_step = False
            return 0, False
        no_load, _ = request_opted_out(request)
        if self._link is None or no_load or not self._cfg.load:
            return 0, False
        tokens = self._prompt(request)
        usable = (len(tokens) - 1) // self._T
        if usable <= 0 or usable * self._T <= num_computed_tokens:
            return 0, False
        found = self._lookup(tokens[: usable * self._T])
        if found is None:
            return 0, False
        hit = int(found.hit_chunks)
        self._stats.lookups += 1
        self._lookups[rid] = (hit, num_computed_tokens, False)
        new = hit * self._T - num_computed_tokens
        if new <= 0:
            return 0, False
        off_step = self._cfg.async_loads and below_host(found) > 0
        self._lookups[rid] = (hit, num_computed_tokens, off_step)
        self._stats.lookup_hit_tokens += new
        self._stats.off_step_lookups += off_step
        return new, off_step

    def _lookup(self, tokens: np.ndarray) -> Any:
        """kdnd's answer for the whole chunks of tokens (None if unreachable), retried once on a
        new session if the old one broke."""
        for _ in range(2):
            model = self._link.model()
            if model is None:
                return None
            try:
                return model.lookup(tokens)
            except kdn.KdnError as e:
                self._stats.lookup_errors += 1
                if not self._link.failed(e.code):
                    return None
        return None

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        rid = request.request_id
        lookup = self._lookups.pop(rid, None)
        known = self._tracked.get(rid)
        if lookup is None and known is not None and known.off_step:
            # vLLM's second call for an asynchronous load, once it landed (or failed in part:
            # vLLM rewound the request, and _save_for stores what it recomputes): the plan stands.
            known.off_step = False
            return
        if known is not None:  # preempted and scheduled again: plan afresh
            self._stats.rescheduled += 1
            self._stats.reloads += num_external_tokens > 0
        hit, local, off_step = lookup or (0, 0, False)
        _, no_save = request_opted_out(request)
        tokens = self._prompt(request)
        tracked = _Tracked(request, tokens, saved_through=hit,
                           save=self._link is not None and self._cfg.save and not no_save)
        self._tracked[rid] = tracked
        if num_external_tokens <= 0:
            return
        end = local + num_external_tokens
        block_ids = np.asarray(blocks.get_block_ids()[0], dtype=np.int64)
        valid = local % self._B == 0 and end % self._T == 0 and end <= len(tokens)
        if not valid:
            # Not a range get_num_new_matched_tokens offered: the worker loads nothing and
            # reports the range's blocks as failed, so vLLM computes them.
            self._log.error("kdn: unexpected external range [%d, %d) for %s", local, end, rid)
        n_blocks = -(-end // self._B)
        tracked.load = LoadSpec(rid, tokens[:end], block_ids[:n_blocks], first_chunk=local // self._T,
                                end_chunk=end // self._T, first_block=local // self._B, fail=not valid,
                                off_step=off_step)
        tracked.off_step = off_step
        self._due.append(rid)

    def build_connector_meta(self, scheduler_output: Any) -> KdnConnectorMetadata:
        meta = KdnConnectorMetadata(preempted=set(getattr(scheduler_output, "preempted_req_ids", None) or ()))
        # Loads go out whether or not the request computes in this step: an asynchronous one
        # waits, unscheduled, until the worker reports it.
        for rid in self._due:
            tracked = self._tracked.get(rid)
            if tracked is not None and tracked.load is not None:
                meta.loads.append(tracked.load)
                tracked.load = None
        self._due.clear()
        for rid, n_scheduled in scheduler_output.num_scheduled_tokens.items():
            tracked = self._tracked.get(rid)
            if tracked is None:
                continue
            if tracked.save:
                save = self._save_for(rid, tracked, n_scheduled)
                if save is not None:
                    meta.saves.append(save)
        return meta

    def _save_for(self, rid: str, tracked: _Tracked, n_scheduled: int) -> SaveSpec | None:
        before = tracked.request.num_computed_tokens
        tracked.saved_through = min(tracked.saved_through, before // self._T)  # a rewind recomputes
        done = min(before + n_scheduled, len(tracked.tokens)) // self._T
        first = tracked.saved_through
        if done <= first or self._kv_cache_manager is None:
            return None
        block_ids = np.asarray(self._kv_cache_manager.get_block_ids(rid)[0], dtype=np.int64)
        needed = done * self._T // self._B
        if len(block_ids) < needed:
            return None
        tracked.saved_through = done
        return SaveSpec(rid, tracked.tokens[: done * self._T], block_ids[:needed], first, done - first)

    def request_finished(self, request: Any) -> tuple[bool, None]:
        """(True: the blocks stay in use until the workers report the request in get_finished), None"""
        rid = request.request_id
        self._tracked.pop(rid, None)
        self._lookups.pop(rid, None)
        self._tokens.pop(rid, None)
        return self._async_stores and self._link is not None, None
