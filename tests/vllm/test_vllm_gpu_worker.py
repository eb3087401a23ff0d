"""The connector's GPU worker logic (kdn.vllm.device_worker) on the CPU, against a real kdnd.

The copies go through kdn.torch.HostKV (kdn's CPU scatter and gather through the layout derived
from views vLLM's allocate_kv_cache built), the rest is the code the connector runs on GPUs:
loads with their error reports, stores handed to the store thread, and the hold on a finished
or preempted request's blocks until its store landed. The race this hold prevents is provoked:
a store that lands after the next step overwrote its source blocks would publish wrong KV under
a valid key, and does so here when the blocks are not held."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tools"))
import replicas  # noqa: E402

import kdn  # noqa: E402
import kdn.torch as kt  # noqa: E402
from kdn.vllm import describe  # noqa: E402
from kdn.vllm.config import KdnConfig  # noqa: E402
from kdn.vllm.device_worker import DeviceWorkerSide, unsupported_views  # noqa: E402
from kdn.vllm.link import KdnLink  # noqa: E402
from kdn.vllm.metadata import KdnConnectorMetadata, LoadSpec, SaveSpec  # noqa: E402
from kdn.vllm.scheduler import SchedulerSide  # noqa: E402
from kdn.vllm.stats import new_stats  # noqa: E402

from test_vllm_gpu_layout import CHUNK, HEAD_DIM, HEADS, LAYERS, vllm_views, write_by_indexing  # noqa: E402
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

BLOCK = 16
log = logging.getLogger("kdn-test")


@pytest.fixture(scope="module")
def kdnd(tmp_path_factory):
    k = replicas.Kdnd(str(tmp_path_factory.mktemp("kdn-gpu-worker") / "kdnd.sock"), arena="64M").start()
    yield k
    k.stop()


def desc(name: str) -> kdn.ModelDesc:
    return kdn.model_desc(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=HEAD_DIM, dtype=kdn.DType.BF16,
                          name=name, chunk_tokens=CHUNK)


class SlowStores:
    """HostKV whose stores start gathering only `delay_s` after they were handed over, as a
    store kdnd serves after the engine's next step began would."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.started = threading.Event()

    def __call__(self, model, views):
        kv = kt.HostKV(model, views)
        inner = kv.store

        def store(*args, **kw):
            self.started.set()
            time.sleep(self.delay_s)
            return inner(*args, **kw)

        kv.store = store
        return kv


def worker(kdnd, name, views, factory=kt.HostKV):
    cfg = KdnConfig(socket_path=kdnd.socket, chunk_tokens=CHUNK)
    link = KdnLink(cfg, desc(name), new_stats(), log, read_only=False)
    w = DeviceWorkerSide(cfg, link, BLOCK, new_stats(), log, factory, where="backend TEST, layout LBNHC")
    w.register_kv_caches(views)
    return w


def prompt(seed: int, n_chunks: int = 2):
    gen = torch.Generator().manual_seed(seed)
    tokens = np.asarray(torch.randint(0, 30000, (n_chunks * CHUNK,), generator=gen), dtype=np.int32)
    kv = torch.randn(n_chunks, LAYERS, 2, CHUNK, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    return tokens, kv


def stored_kv(kdnd, name, tokens, n):
    with kdn.Client(kdnd.socket) as c:
        m = c.register_model(desc(name))
        out = torch.zeros(n, LAYERS, 2, CHUNK, HEADS, HEAD_DIM, dtype=torch.bfloat16)
        got = m.retrieve(tokens.tolist(), out)
    return got, out


def save_meta(rid, tokens, blocks, n_chunks):
    return KdnConnectorMetadata(saves=[SaveSpec(rid, tokens, np.asarray(blocks, dtype=np.int64), 0, n_chunks)])


def overwrite(views, blocks):
    for v in views:
        v[blocks] = 7.0


def test_finished_request_blocks_are_held_until_its_store_landed(kdnd):
    views = vllm_views(KVCacheLayout.LBNHC, BLOCK, 16)
    slow = SlowStores(0.5)
    w = worker(kdnd, "race-held", views, slow)
    tokens, kv = prompt(1)
    blocks = [3, 9, 5, 12]
    write_by_indexing(views, kv, blocks, BLOCK)
    w.wait_for_save(save_meta("R", tokens, blocks, 2))  # returns at once: the store runs behind
    assert slow.started.wait(5)
    sched = SchedulerSide(KdnConfig(chunk_tokens=CHUNK), object(), BLOCK, new_stats(), log, async_stores=True)
    held, _ = sched.request_finished(type("Req", (), {"request_id": "R"})())
    assert held  # vLLM keeps R's blocks until a worker reports R
    # vLLM's loop: each step asks get_finished; R's blocks go to the next request only once
    # R is reported, and that request's prefill then overwrites them at once.
    finished = {"R"}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sending, _ = w.get_finished(finished)
        finished = set()
        if sending and "R" in sending:
            assert not w._stores.pending("R")
            break
        time.sleep(0.01)
    else:
        pytest.fail("the finished request was never reported")
    overwrite(views, blocks)
    got, out = stored_kv(kdnd, "race-held", tokens, 2)
    assert got == 2 and torch.equal(out, kv)
    w.shutdown()


def test_without_the_hold_the_race_publishes_wrong_kv(kdnd):
    """The control: the same slow store with blocks reused at once (a connector that answered
    request_finished with False) stores the next request's bytes under R's keys."""
    views = vllm_views(KVCacheLayout.LBNHC, BLOCK, 16)
    slow = SlowStores(0.5)
    w = worker(kdnd, "race-unheld", views, slow)
    tokens, kv = prompt(2)
    blocks = [1, 2, 3, 4]
    write_by_indexing(views, kv, blocks, BLOCK)
    w.wait_for_save(save_meta("R", tokens, blocks, 2))
    assert slow.started.wait(5)
    overwrite(views, blocks)  # the next step reused the blocks
    w.handle_preemptions({"R"})  # waits for the store, for the comparison below
    got, out = stored_kv(kdnd, "race-unheld", tokens, 2)
    assert got == 2 and not torch.equal(out, kv)
    w.shutdown()


def test_preemption_waits_for_the_store(kdnd):
    views = vllm_views(KVCacheLayout.LBNHC, BLOCK, 16)
    w = worker(kdnd, "preempt", views, SlowStores(0.4))
    tokens, kv = prompt(3)
    blocks = [6, 7, 8, 10]
    write_by_indexing(views, kv, blocks, BLOCK)
    w.wait_for_save(save_meta("P", tokens, blocks, 2))
    t0 = time.monotonic()
    w.handle_preemptions({"P"})
    assert time.monotonic() - t0 >= 0.3 and not w._stores.pending("P")
    overwrite(views, blocks)  # vLLM gives the blocks away only now
    got, out = stored_kv(kdnd, "preempt", tokens, 2)
    assert got == 2 and torch.equal(out, kv)
    w.shutdown()


def test_loads_land_and_evicted_chunks_are_reported(kdnd):
    views = vllm_views(KVCacheLayout.BLHNC, BLOCK, 16)
    w = worker(kdnd, "loads", views)
    tokens, kv = prompt(4, n_chunks=3)
    with kdn.Client(kdnd.socket) as c:
        assert c.register_model(desc("loads")).store(tokens[: 2 * CHUNK].tolist(), kv[:2]) == 2
    blocks = np.asarray([11, 0, 4, 13, 2, 15], dtype=np.int64)
    # vLLM computed block 0 itself (first_block 1); the third chunk is not cached.
    meta = KdnConnectorMetadata(loads=[LoadSpec("L", tokens, blocks, 0, 3, 1)])
    own = views[0][11].clone()
    w.start_load_kv(meta)
    assert w.get_block_ids_with_load_errors() == {2, 15}
    expect = vllm_views(KVCacheLayout.BLHNC, BLOCK, 16)
    write_by_indexing(expect, kv[:2], [int(b) for b in blocks[:4]], BLOCK)
    for got, want in zip(views, expect):
        assert torch.equal(got[[0, 4, 13]], want[[0, 4, 13]])
    assert torch.equal(views[0][11], own)  # the block vLLM computed is left alone
    w.shutdown()


def test_kdnd_down_fails_the_load_at_once(tmp_path):
    k = replicas.Kdnd(str(tmp_path / "kdnd.sock"), arena="64M").start()
    views = vllm_views(KVCacheLayout.LBHNC, BLOCK, 8)
    w = worker(k, "down", views)
    k.stop()
    tokens, _ = prompt(5)
    t0 = time.monotonic()
    w.start_load_kv(KdnConnectorMetadata(loads=[LoadSpec("D", tokens, np.arange(4, dtype=np.int64), 0, 2, 0)]))
    assert w.get_block_ids_with_load_errors() == {0, 1, 2, 3}
    assert time.monotonic() - t0 < 5
    w.shutdown()


def test_unsupported_caches_turn_the_connector_off_with_one_line(kdnd, caplog, monkeypatch):
    views = vllm_views(KVCacheLayout.LBHNC, BLOCK, 8)
    stray = vllm_views(KVCacheLayout.LBHNC, BLOCK, 8)[1]
    assert "several backing allocations" in unsupported_views([views[0], stray, views[2]])
    fp8 = vllm_views(KVCacheLayout.LBHNC, BLOCK, 8, dtype=torch.float8_e4m3fn)
    assert "quantized" in unsupported_views(fp8)
    with caplog.at_level(logging.WARNING, logger="kdn-test"):
        w = worker(kdnd, "off", [views[0], stray, views[2]])
    lines = [r.getMessage() for r in caplog.records if "inactive" in r.getMessage()]
    assert lines == ["kdn: connector inactive (backend TEST, layout LBNHC): the layers' KV lives in several "
                     "backing allocations"]
    tokens, _ = prompt(6)
    w.start_load_kv(KdnConnectorMetadata(loads=[LoadSpec("X", tokens, np.arange(4, dtype=np.int64), 0, 2, 0)]))
    assert w.get_block_ids_with_load_errors() == {0, 1, 2, 3}  # vLLM computes everything
    w.shutdown()

    # The platform and the KV dtype, decided before any view exists.
    from vllm.platforms import current_platform

    cfg = type("Cfg", (), {"cache_config": type("C", (), {"cache_dtype": "fp8_e4m3"})()})()
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    with pytest.raises(describe.Unsupported, match="fp8_e4m3"):
        describe.on_device(cfg)
    cfg.cache_config.cache_dtype = "auto"
    assert describe.on_device(cfg) is True
    monkeypatch.setattr(current_platform, "is_cuda", lambda: False)
    with pytest.raises(describe.Unsupported, match="needs CUDA"):
        describe.on_device(cfg)


def test_a_reallocated_cache_is_registered_afresh(kdnd):
    views = vllm_views(KVCacheLayout.LBNHC, BLOCK, 8)
    w = worker(kdnd, "rereg", views)
    tokens, kv = prompt(7)
    with kdn.Client(kdnd.socket) as c:
        assert c.register_model(desc("rereg")).store(tokens.tolist(), kv) == 2
    fresh = vllm_views(KVCacheLayout.BLNHC, BLOCK, 8)  # vLLM woke up with a new allocation
    w.register_kv_caches(fresh)
    blocks = np.asarray([5, 1, 7, 2], dtype=np.int64)
    w.start_load_kv(KdnConnectorMetadata(loads=[LoadSpec("W", tokens, blocks, 0, 2, 0)]))
    assert w.get_block_ids_with_load_errors() == set()
    expect = vllm_views(KVCacheLayout.BLNHC, BLOCK, 8)
    write_by_indexing(expect, kv, blocks.tolist(), BLOCK)
    assert all(torch.equal(a, b) for a, b in zip(fresh, expect))
    assert not any(v.any() for v in views)  # the old cache is not written
    w.shutdown()


def test_mla_and_hybrid_caches_are_refused():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec

    def config(*specs):
        groups = [KVCacheGroupSpec([f"layer.{i}"], s) for i, s in enumerate(specs)]
        return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=groups)

    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_DIM, dtype=torch.bfloat16)
    mla = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    assert describe.kv_geometry(config(full)).num_kv_heads == HEADS
    with pytest.raises(describe.Unsupported, match="MLAAttentionSpec"):
        describe.kv_geometry(config(mla))
    with pytest.raises(describe.Unsupported, match="2 KV cache groups"):
        describe.kv_geometry(config(full, full))


def test_two_tensor_parallel_layouts_never_share(kdnd):
    """Each rank stores its own shard of the heads: the fingerprint keeps ranks and sizes apart."""
    def shard(rank, size):
        return kdn.model_desc(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=HEAD_DIM, dtype=kdn.DType.BF16,
                              name="tp", chunk_tokens=CHUNK, tp_rank=rank, tp_size=size)

    layouts = [(0, 1), (0, 2), (1, 2), (0, 4)]
    assert len({shard(r, s).fingerprint() for r, s in layouts}) == len(layouts)
    tokens, kv = prompt(8)
    with kdn.Client(kdnd.socket) as c:
        assert c.register_model(shard(0, 2)).store(tokens.tolist(), kv) == 2
        hits = [c.register_model(shard(r, s)).lookup(tokens.tolist()).hit_chunks for r, s in layouts]
    assert hits == [0, 2, 0, 0]


def test_done_gate_opens_on_the_event_or_after_its_bound():
    waits = []
    word = torch.zeros(1, dtype=torch.int32)
    fired = threading.Event()
    gate = kt.DoneGate(fired.is_set, 0.3, word, lambda stream, value: waits.append((stream, value)))
    assert gate.arm("s") == 1
    threading.Timer(0.05, fired.set).start()
    assert gate.settle() == set() and int(word[0]) == 1
    fired.clear()  # kdnd died before its event fired: the gate opens after the bound, the load failed
    t0 = time.monotonic()
    assert gate.arm("s") == 2
    assert gate.settle() == {2} and int(word[0]) == 2
    assert 0.25 <= time.monotonic() - t0 < 3
    assert waits == [("s", 1), ("s", 2)]
    gate.close()


class GatedHostKV(kt.HostKV):
    """HostKV with DeviceKV's done gate, whose kdnd event fires only when `fires` is set."""

    fires = threading.Event()

    def __init__(self, model, views):
        super().__init__(model, views)
        self.gate = kt.DoneGate(self.fires.is_set, 0.3, torch.zeros(1, dtype=torch.int32))
        self.last_gate = 0

    def retrieve(self, *args, **kw):
        loaded = super().retrieve(*args, **kw)
        self.last_gate = self.gate.arm() if loaded else 0
        return loaded

    def settle(self):
        return self.gate.settle()


def test_a_load_kdnd_never_confirms_is_recomputed(kdnd):
    views = vllm_views(KVCacheLayout.LBHNC, BLOCK, 8)
    w = worker(kdnd, "gate", views, GatedHostKV)
    tokens, kv = prompt(9)
    with kdn.Client(kdnd.socket) as c:
        assert c.register_model(desc("gate")).store(tokens.tolist(), kv) == 2
    blocks = np.asarray([4, 5, 6, 7], dtype=np.int64)
    GatedHostKV.fires.set()
    w.start_load_kv(KdnConnectorMetadata(loads=[LoadSpec("G", tokens, blocks, 0, 2, 0)]))
    assert w.get_block_ids_with_load_errors() == set()
    GatedHostKV.fires.clear()  # the done event never comes (kdnd died while the stream waited)
    t0 = time.monotonic()
    w.start_load_kv(KdnConnectorMetadata(loads=[LoadSpec("G2", tokens, blocks, 0, 2, 1)]))
    assert w.get_block_ids_with_load_errors() == {5, 6, 7}
    assert time.monotonic() - t0 < 3
    w.shutdown()


def test_disk_chunks_load_off_the_step(tmp_path):
    """vLLM's asynchronous load on the device worker: kdnd brings disk chunks up while steps
    run, a later step loads them and reports the request finished, in the same pass as any
    blocks that failed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    k = replicas.Kdnd(str(tmp_path / "kdnd.sock"), arena="64M",
                      extra=["--set", f"tier.disk.dirs={disk}", "--set", "tier.disk.bytes=32M",
                             "--set", "tier.disk.slab_bytes=16M", "--set", "tier.disk.read_ahead=0"]).start()
    try:
        views = vllm_views(KVCacheLayout.LBNHC, BLOCK, 16)
        w = worker(k, "off-step", views)
        tokens, kv = prompt(6, n_chunks=3)
        with kdn.Client(k.socket) as c:
            m = c.register_model(desc("off-step"))
            assert m.store(tokens[: 2 * CHUNK].tolist(), kv[:2]) == 2
            subprocess.run([str(replicas.build_dir() / "bin" / "kdnctl"), "--socket", k.socket, "evict", "--all",
                            "--tier", "host"], check=True, stdout=subprocess.DEVNULL)
            assert m.lookup(tokens.tolist()).tier_chunks[kdn.Tier.DISK] == 2
        blocks = np.asarray([5, 1, 14, 7, 3, 9], dtype=np.int64)
        # The scheduler planned three chunks; the third is gone by the time the step loads.
        meta = KdnConnectorMetadata(loads=[LoadSpec("A", tokens, blocks, 0, 3, 0, off_step=True)])
        w.start_load_kv(meta)
        received, errors = set(), set()
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:
            _, got = w.get_finished(set())
            received |= got or set()
            errors |= w.get_block_ids_with_load_errors()
            if not received:
                time.sleep(0.01)
                w.start_load_kv(KdnConnectorMetadata())  # the next step
        assert received == {"A"} and errors == {3, 9}
        expect = vllm_views(KVCacheLayout.LBNHC, BLOCK, 16)
        write_by_indexing(expect, kv[:2], [int(b) for b in blocks[:4]], BLOCK)
        for got_v, want_v in zip(views, expect):
            assert torch.equal(got_v[blocks[:4]], want_v[blocks[:4]])
        assert w._stats.off_step_loads == 1
        with kdn.Client(k.socket) as c:
            assert c.register_model(desc("off-step")).lookup(tokens.tolist()).tier_chunks[kdn.Tier.HOST] == 2
        w.shutdown()
    finally:
        k.stop()
