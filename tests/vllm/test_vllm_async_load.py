"""Chunks on kdnd's disk tier load asynchronously: the scheduler side alone, driven as vLLM
drives it (no engine), against a kdnd with a disk tier that does not read ahead.

The same with a real engine runs in test_vllm_connector.py (tests 8 and 9), on an engine that
suite has already started: the engine stores a prompt's chunks; kdnctl pushes every chunk
out of the host arena onto disk; the engine, its own prefix cache reset, answers the prompt
again: the scheduler offers the hit as an asynchronous load (vLLM parks the request), the
worker has kdnd bring the chunks up off the step, a later step copies them and reports the
request finished. The tokens equal those of the same engine with kdn turned off for the
request. Then the same with damaged chunks on disk (NaN): the asynchronous load fails, its
blocks are reported in the pass that finishes it, and vLLM recomputes them: still the same
tokens.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tools"))
import replicas  # noqa: E402

import kdn  # noqa: E402
from kdn.vllm.config import KdnConfig  # noqa: E402
from kdn.vllm.link import KdnLink  # noqa: E402
from kdn.vllm.scheduler import SchedulerSide  # noqa: E402
from kdn.vllm.stats import new_stats  # noqa: E402


def disk_kdnd(path: Path) -> replicas.Kdnd:
    disk = path / "disk"
    disk.mkdir()
    return replicas.Kdnd(str(path / "kdnd.sock"), arena="64M",
                         extra=["--set", f"tier.disk.dirs={disk}", "--set", "tier.disk.bytes=32M",
                                "--set", "tier.disk.slab_bytes=16M", "--set", "tier.disk.read_ahead=0"]).start()


def test_scheduler_plans_disk_hits_as_asynchronous_loads(tmp_path):
    """The scheduler side as vLLM drives it for an asynchronous load (no engine): (n, True) for a
    hit on disk, the load handed to the worker while the request is not scheduled, vLLM's second
    allocation keeping the plan, and a load that failed from its first block not offered again."""
    k = disk_kdnd(tmp_path)
    try:
        desc = kdn.model_desc(num_layers=2, num_kv_heads=2, head_dim=8, dtype=kdn.DType.BF16, name="sched",
                              chunk_tokens=16)
        cfg = KdnConfig(socket_path=k.socket, chunk_tokens=16)
        log = logging.getLogger("kdn-test")
        sched = SchedulerSide(cfg, KdnLink(cfg, desc, new_stats(), log, read_only=True), 4, new_stats(), log)
        disk, host = list(range(100, 150)), list(range(500, 550))  # 3 whole chunks, and 2 tokens each
        with kdn.Client(k.socket) as c:
            m = c.register_model(desc)
            assert m.store(disk, torch.ones(3, *m.chunk_shape, dtype=torch.bfloat16)) == 3
            subprocess.run([str(replicas.build_dir() / "bin" / "kdnctl"), "--socket", k.socket, "evict", "--all",
                            "--tier", "host"], check=True, stdout=subprocess.DEVNULL)
            assert m.store(host, torch.ones(3, *m.chunk_shape, dtype=torch.bfloat16)) == 3

        def req(rid, tokens):
            return SimpleNamespace(request_id=rid, prompt_token_ids=tokens, num_computed_tokens=0,
                                   kv_transfer_params=None)

        blocks = SimpleNamespace(get_block_ids=lambda: (list(range(20, 33)),))
        sched.bind_kv_cache_manager(SimpleNamespace(get_block_ids=lambda rid: (list(range(20, 33)),)))
        a, b = req("A", disk), req("B", host)
        assert sched.get_num_new_matched_tokens(a, 0) == (48, True)
        assert sched.get_num_new_matched_tokens(b, 0) == (48, False)
        sched.update_state_after_alloc(a, blocks, 48)
        sched.update_state_after_alloc(b, blocks, 48)
        meta = sched.build_connector_meta(SimpleNamespace(num_scheduled_tokens={"B": 2}))  # A waits
        assert sorted((x.req_id, x.off_step) for x in meta.loads) == [("A", True), ("B", False)]
        assert not sched.build_connector_meta(SimpleNamespace(num_scheduled_tokens={})).loads
        # A's load landed: vLLM allocates again without asking; the plan (nothing to store) stands.
        a.num_computed_tokens = 48
        sched.update_state_after_alloc(a, blocks, 0)
        assert not sched.build_connector_meta(SimpleNamespace(num_scheduled_tokens={"A": 2})).saves
        # C's load failed from its first block: vLLM freed the blocks and asks again.
        c_req = req("C", disk)
        assert sched.get_num_new_matched_tokens(c_req, 0) == (48, True)
        sched.update_state_after_alloc(c_req, blocks, 48)
        sched.build_connector_meta(SimpleNamespace(num_scheduled_tokens={}))
        assert sched.get_num_new_matched_tokens(c_req, 0) == (0, False)
    finally:
        k.stop()
