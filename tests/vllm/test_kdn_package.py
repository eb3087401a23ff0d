"""The kdn Python package against a real kdnd: store, lookup, retrieve, lease, reserve/commit,
stats, errors and the GIL (no vLLM engine here)."""

from __future__ import annotations

import socket
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


@pytest.fixture(scope="module")
def kdnd(tmp_path_factory):
    k = replicas.Kdnd(str(tmp_path_factory.mktemp("kdn-py") / "kdnd.sock"), arena="64M").start()
    yield k
    k.stop()


def desc(dtype=kdn.DType.BF16, name="py-test", salt=b"") -> kdn.ModelDesc:
    return kdn.model_desc(num_layers=2, num_kv_heads=2, head_dim=8, dtype=dtype, name=name, chunk_tokens=16,
                          engine_salt=salt)


TOKENS = list(range(100, 150))  # 3 whole chunks of 16, and 2 tokens


def test_store_lookup_retrieve_torch(kdnd):
    with kdn.Client(kdnd.socket) as c:
        m = c.register_model(desc())
        assert m.chunk_shape == (2, 2, 16, 2, 8) and m.chunk_bytes == 2 * 2 * 16 * 2 * 8 * 2
        kv = torch.randn(3, *m.chunk_shape, dtype=torch.bfloat16)
        assert m.lookup(TOKENS).hit_chunks == 0
        assert m.store(TOKENS, kv) == 3
        assert m.store(TOKENS, kv) == 0  # already cached: nothing written
        hit = m.lookup(np.asarray(TOKENS, dtype=np.int32))
        assert (hit.hit_chunks, hit.hit_tokens) == (3, 48)
        out = torch.zeros(4, *m.chunk_shape, dtype=torch.bfloat16)
        assert m.retrieve(TOKENS, out) == 3
        assert torch.equal(out[:3], kv) and not out[3].any()
        with m.lease(TOKENS, max_chunks=2) as lease:
            assert len(lease) == 2
            assert torch.equal(torch.from_dlpack(lease.chunk(1)), kv[1])
        assert lease.released
        other = TOKENS[:16] + [7] * 34  # same first chunk, then another prefix
        assert m.lookup(other).hit_chunks == 1


def test_prefetch_brings_disk_chunks_into_the_arena(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    k = replicas.Kdnd(str(tmp_path / "kdnd.sock"), arena="64M",
                      extra=["--set", f"tier.disk.dirs={disk}", "--set", "tier.disk.bytes=32M",
                             "--set", "tier.disk.slab_bytes=16M"]).start()
    try:
        with kdn.Client(k.socket) as c:
            m = c.register_model(desc(name="prefetch"))
            kv = torch.randn(3, *m.chunk_shape, dtype=torch.bfloat16)
            assert m.store(TOKENS, kv) == 3
            # Every unleased chunk leaves the arena for the disk tier (the daemon's uid is admin).
            subprocess.run([str(replicas.build_dir() / "bin" / "kdnctl"), "--socket", k.socket, "evict", "--all",
                            "--tier", "host"], check=True, stdout=subprocess.DEVNULL)
            assert m.lookup(TOKENS).tier_chunks[kdn.Tier.DISK] == 3
            assert m.prefetch(TOKENS) is True
            deadline = time.monotonic() + 10
            while m.lookup(TOKENS).tier_chunks[kdn.Tier.HOST] < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            hit = m.lookup(TOKENS)
            assert hit.hit_chunks == 3 and hit.tier_chunks[kdn.Tier.HOST] == 3
            out = torch.zeros(3, *m.chunk_shape, dtype=torch.bfloat16)
            assert m.retrieve(TOKENS, out) == 3 and torch.equal(out, kv)
            assert m.prefetch(list(range(5000, 5040))) is True  # nothing cached: not an error
    finally:
        k.stop()


def test_numpy_and_reservations(kdnd):
    with kdn.Client(kdnd.socket) as c:
        m = c.register_model(desc(kdn.DType.F32, name="np"))
        kv = np.random.default_rng(1).standard_normal((1, *m.chunk_shape), dtype=np.float32)
        res = m.reserve(TOKENS, 0, 2)
        assert len(res) == 2
        np.from_dlpack(res.slot(0))[...] = kv[0]
        np.from_dlpack(res.slot(1))[...] = kv[0] * 2
        pending = res.commit_post()
        pending.wait(5000)
        assert pending.poll()
        with m.lease(TOKENS) as lease:
            assert np.array_equal(np.from_dlpack(lease.chunk(1)), kv[0] * 2)
            with pytest.raises(ValueError):
                np.from_dlpack(lease.chunk(0))[0, 0, 0, 0, 0] = 1  # read-only
        again = m.reserve(TOKENS, 0, 2)
        assert again.slot(0) is None and again.slot(1) is None  # cached: nothing to write
        again.abort()
        stats = c.stats()
        assert stats["stored_chunks"] >= 2 and len(stats["tier_resident_chunks"]) == kdn.TIER_COUNT


def test_fingerprints_separate_models(kdnd):
    with kdn.Client(kdnd.socket) as c:
        a = c.register_model(desc(name="fp", salt=b"weights-a"))
        b = c.register_model(desc(name="fp", salt=b"weights-b"))
        assert a.desc.fingerprint() != b.desc.fingerprint()
        assert a.store(TOKENS, torch.ones(1, *a.chunk_shape, dtype=torch.bfloat16)) == 1
        assert a.lookup(TOKENS).hit_chunks == 1 and b.lookup(TOKENS).hit_chunks == 0
        assert desc().prefix_keys(TOKENS) == desc().prefix_keys(TOKENS[:48])
        assert len(desc().prefix_keys(TOKENS)[0]) == 16


def test_errors_carry_the_kdn_status(kdnd, tmp_path):
    with pytest.raises(kdn.KdnError) as e:
        kdn.Client(str(tmp_path / "nobody.sock"))
    assert e.value.code == kdn.Status.UNAVAILABLE
    with kdn.Client(kdnd.socket) as c:
        m = c.register_model(desc(name="err"))
        with pytest.raises(kdn.KdnError) as e:
            m.store(TOKENS, torch.zeros(1, 3, 2, 16, 2, 8, dtype=torch.bfloat16))  # wrong shape
        assert e.value.code == kdn.Status.INVALID_ARGUMENT
        with pytest.raises(kdn.KdnError) as e:
            m.store(TOKENS, torch.zeros(1, *m.chunk_shape, dtype=torch.float16))  # wrong dtype
        assert e.value.code == kdn.Status.INVALID_ARGUMENT
        bad = desc()
        bad.num_layers = 0
        with pytest.raises(kdn.KdnError) as e:
            c.register_model(bad)
        assert e.value.code == kdn.Status.INVALID_ARGUMENT
        with pytest.raises(kdn.KdnError):
            kdn.model_desc(num_layers=1, num_kv_heads=1, head_dim=8, dtype=kdn.DType.F16, name="x" * 64)
    with pytest.raises(kdn.KdnError) as e:
        c.ping()
    assert e.value.code == kdn.Status.UNAVAILABLE  # closed


def test_read_only_client_cannot_store(kdnd):
    with kdn.Client(kdnd.socket, read_only=True) as c:
        m = c.register_model(desc(name="ro"))
        assert c.store_max_chunks(m) == 0
        with pytest.raises(kdn.KdnError) as e:
            m.store(TOKENS, torch.zeros(1, *m.chunk_shape, dtype=torch.bfloat16))
        assert e.value.code == kdn.Status.LIMIT


def test_calls_release_the_gil(tmp_path):
    # A daemon that accepts and never answers: the handshake waits out its timeout in C.
    path = str(tmp_path / "mute.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(1)
    ticks = 0
    done = threading.Event()

    def connect():
        try:
            kdn.Client(path, timeout_ms=1500)
        except kdn.KdnError:
            pass
        done.set()

    t = threading.Thread(target=connect)
    t0 = time.monotonic()
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    srv.close()
    assert time.monotonic() - t0 >= 1.0
    assert ticks > 100  # the main thread ran while the call waited


def test_stubs_and_version():
    pkg = Path(kdn.__file__).parent
    assert (pkg / "_kdn.pyi").is_file() and (pkg / "py.typed").is_file()
    assert kdn.abi_version() == kdn.ABI_VERSION == 2
    assert kdn.strerror(int(kdn.Status.CORRUPT))
