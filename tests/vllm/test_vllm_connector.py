"""vLLM replicas sharing KV through kdnd: real vLLM (CPU), real kdnd, separate processes.

One scenario, in order (module-scoped engines, so each engine starts once):
  1. A, started while kdnd is down, answers the prompts below (the counting ones in step 7)
     with kdn off for the request and its own prefix cache emptied before each: the
     reference answers ("ref"), computed without kdn (A's counters show no lookup, load or
     store) and without a cached prefix;
  2. B starts while kdnd is down and still answers (correctly: as ref does);
  3. kdnd starts; A answers doc1 + q1 and stores doc1's chunks;
  4. B (another process, its own prefix cache empty) answers doc1 + q2: it reconnects to
     kdnd and loads A's chunks; a prompt shorter than a chunk is simply computed;
  5. a damaged chunk (NaN bytes stored under doc3's keys) fails its check on the way into
     B's cache: B recomputes, answers as ref does, and counts it;
  6. kdnd is SIGKILLed while B works through a batch; B keeps answering correctly, with kdnd
     gone and after it is back (A stores, B loads again);
  7. B's cache is small: in a batch of four requests that load from kdnd, a decoding request
     runs out of blocks and is preempted, and its load is planned afresh when it is admitted
     again (from what vLLM's prefix cache still holds, then kdnd); every answer is still the
     reference, which A computes here without loading anything while it stores the chunks;
  8. an engine of another dtype (bfloat16) never loads these chunks, and loads its own (its
     prefix cache off, so the second answer comes from kdnd); an engine of another model
     (other weights) never loads them;
  9. kdnd restarts with a disk tier that does not read ahead, and B loads chunks pushed onto
     disk asynchronously (vLLM parks the request while kdnd brings them up off the step);
     damaged chunks on disk fail that load, and B recomputes them (test_vllm_async_load.py
     drives the scheduler side of this without an engine).
Every engine runs chunk-aligned prefill steps (max_num_batched_tokens = chunk_tokens, as the
docs recommend), so a hit computes exactly what a miss computes and tokens compare equal.
The engines run float32: without AVX512-BF16 (this suite's CI machines), vLLM's CPU backend
computes bfloat16 ~7x slower, and the suite's time is mostly prefill.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tools"))
import replicas  # noqa: E402

import kdn  # noqa: E402

CHUNK = 256
OUT = 16
COUNT_OUT = 128  # long enough for the preemption of test 6
DTYPE = ("--dtype", "float32")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("kdn-vllm")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def kdnd(workdir):
    # kdnd-test: while workdir/stall-leases exists it holds each lease (test 5 kills it then).
    k = replicas.Kdnd(str(workdir / "kdnd.sock"), arena="1G", binary="kdnd-test",
                      env={"KDN_TEST_STALL_LEASE_FILE": str(workdir / "stall-leases"), "KDN_TEST_STALL_LEASE_MS": "20000"})
    yield k
    k.stop()


class Prompts:
    """Token-id prompts: documents cut from kdn's docs, questions, counting sequences."""

    def __init__(self, encode) -> None:
        self.corpus = corpus = encode(replicas.corpus())
        self.q1 = q1 = encode("\n\nQuestion: What is this text about? Answer in one sentence.\nAnswer:")
        self.q2 = q2 = encode("\n\nQuestion: Which component does this text describe first?\nAnswer:")
        doc = lambda at, n: corpus[at:at + n]  # noqa: E731
        self.doc1 = doc(0, 3 * CHUNK)
        self.p1, self.p2 = self.doc1 + q1, self.doc1 + q2
        self.short = doc(9000, 100) + q1
        self.doc3 = doc(12000, 2 * CHUNK)
        self.p3 = self.doc3 + q2
        self.batch = [doc(15000 + i * 1000, 2 * CHUNK) + q1 for i in range(3)]
        self.p5 = doc(19000, 2 * CHUNK) + q2
        self.p6a, self.p6b = doc(21000, 2 * CHUNK) + q1, doc(21000, 2 * CHUNK) + q2
        # Counting: the continuation is unambiguous, so a wrong KV byte shows at once.
        self.counting = [encode("Count: " + ", ".join(str(start + i) for i in range(260)) + ",")
                         for start in (1, 1001, 5001, 20001)]

    def all(self) -> dict[str, tuple[list[int], int]]:
        d = {"p1": (self.p1, OUT), "p2": (self.p2, OUT), "short": (self.short, OUT), "p3": (self.p3, OUT),
             "p5": (self.p5, OUT), "p6a": (self.p6a, OUT), "p6b": (self.p6b, OUT)}
        for i, p in enumerate(self.batch):
            d[f"batch{i}"] = (p, 48)
        return d


@pytest.fixture(scope="module")
def engines(workdir, kdnd):
    sock = kdnd.socket
    started: dict[str, replicas.Replica] = {}

    def start(name: str, *args: str) -> replicas.Replica:
        r = replicas.Replica(name, "--kdn-socket", sock, "--extra", json.dumps({"reconnect_interval_s": 0.2}),
                             *DTYPE, *args, log_dir=str(workdir)).start()
        started[name] = r
        return r

    yield start, started
    for r in started.values():
        r.stop()


def reference(r: replicas.Replica, prompts: list[list[int]], max_tokens: int) -> list:
    """r's answers with kdn off for the request and nothing in r's own prefix cache: what an
    engine without kdn and without prefix caching computes (one engine start-up fewer)."""
    assert r.send("reset_prefix_cache")["reset"]
    outs = r.generate(prompts, max_tokens=max_tokens, kdn="off")
    assert r.send("reset_prefix_cache")["reset"]
    return outs


@pytest.fixture(scope="module")
def refs(engines):
    """Every prompt's answer, computed by A (started here, kdnd down) without kdn."""
    start, _ = engines
    a = start("A")
    prompts = Prompts(lambda text: a.send("encode", text=text)["token_ids"])
    answers = {}
    for name, (p, n) in prompts.all().items():
        answers[name] = reference(a, [p], n)[0]
    # The counting prompts' answers come in test 6, where A also stores their chunks.
    c = counters(a)  # kdn took no part in the references
    assert c["lookups"] == 0 and c["loaded_chunks"] == 0 and c["saved_chunks"] == 0, c
    return prompts, answers


def counters(r: replicas.Replica) -> dict:
    return r.stats()


def test_1_kdnd_down_at_start(refs, engines, kdnd):
    prompts, want = refs
    start, _ = engines
    # B: small cache (24 blocks of 128 tokens) so that step 7 preempts.
    b = start("B", "--num-blocks", "24", "--max-model-len", "2048")
    assert b.generate([prompts.p5])[0] == want["p5"]
    c = counters(b)
    assert c["unavailable"] >= 1 and c["loaded_chunks"] == 0


def test_2_cross_process_share(refs, engines, kdnd):
    prompts, want = refs
    start, e = engines
    kdnd.start()
    time.sleep(0.3)  # A's and B's next connection attempts are due
    a = e["A"]
    assert a.generate([prompts.p1])[0] == want["p1"]
    assert counters(a)["saved_chunks"] == 3
    b = e["B"]
    before = counters(b)
    assert b.generate([prompts.p2])[0] == want["p2"]
    after = counters(b)
    assert after["loaded_chunks"] - before["loaded_chunks"] == 3, after
    assert after["reconnects"] == 0 and after["lookups"] >= 1  # first connection since start
    assert after["load_failures"] == before["load_failures"]


def test_3_prompt_shorter_than_a_chunk(refs, engines):
    prompts, want = refs
    _, e = engines
    before = counters(e["B"])
    assert e["B"].generate([prompts.short])[0] == want["short"]
    after = counters(e["B"])
    assert after["loaded_chunks"] == before["loaded_chunks"]
    assert after["saved_chunks"] == before["saved_chunks"]  # no whole chunk to store


def test_4_damaged_chunk_is_recomputed_and_counted(refs, engines, kdnd):
    prompts, want = refs
    _, e = engines
    desc_fields = e["B"].send("desc")["desc"]
    desc = kdn.ModelDesc()
    for k, v in desc_fields.items():
        setattr(desc, k, bytes.fromhex(v) if k == "engine_salt" else (tuple(v) if isinstance(v, list) else v))
    with kdn.Client(kdnd.socket) as client:
        model = client.register_model(desc)
        tokens = np.asarray(prompts.doc3, dtype=np.int32)
        res = model.reserve(tokens, 0, 2)
        for i in range(2):
            torch.from_dlpack(res.slot(i)).view(torch.float32).fill_(float("nan"))
        res.commit()
        assert model.lookup(tokens).hit_chunks == 2
    before = counters(e["B"])
    assert e["B"].generate([prompts.p3])[0] == want["p3"]
    after = counters(e["B"])
    assert after["corrupt_chunks"] - before["corrupt_chunks"] >= 1
    assert after["load_failures"] - before["load_failures"] == 1
    assert after["loaded_chunks"] == before["loaded_chunks"]


def test_5_kdnd_killed_mid_run(refs, engines, kdnd, workdir):
    prompts, want = refs
    _, e = engines
    a, b = e["A"], e["B"]
    # A stores the batch's documents, so B's requests load while kdnd dies.
    for i, p in enumerate(prompts.batch):
        assert a.generate([p], max_tokens=48)[0] == want[f"batch{i}"]
    before = counters(b)
    stall = workdir / "stall-leases"
    stall.touch()
    stalls = kdnd.log_count("test seam: stalling a lease")
    b.post("generate", prompts=prompts.batch, max_tokens=48)
    kdnd.wait_for_log("test seam: stalling a lease", stalls)  # B's load waits on kdnd's answer
    kdnd.kill()
    stall.unlink()
    outs = b.wait()["outputs"]
    assert outs == [want[f"batch{i}"] for i in range(len(prompts.batch))]
    after = counters(b)
    assert after["load_failures"] > before["load_failures"], after  # the load in flight failed and was recomputed
    # kdnd gone: still served, correctly.
    assert b.generate([prompts.p5])[0] == want["p5"]
    # kdnd back (empty): A stores, B reconnects and loads.
    kdnd.start()
    time.sleep(0.3)
    assert a.generate([prompts.p6a])[0] == want["p6a"]
    before = counters(b)
    assert b.generate([prompts.p6b])[0] == want["p6b"]
    after = counters(b)
    assert after["loaded_chunks"] - before["loaded_chunks"] == 2
    assert after["reconnects"] >= 1


def test_6_preempted_loading_requests(refs, engines):
    prompts, _ = refs
    _, e = engines
    a, b = e["A"], e["B"]
    # The references, in one batch as B is asked below (128 decode steps instead of 512): A,
    # its prefix cache empty, loads nothing (a load cannot shape them) and stores every whole
    # chunk of each prompt, for B to load.
    assert a.send("reset_prefix_cache")["reset"]
    before = counters(a)
    want = a.generate(prompts.counting, max_tokens=COUNT_OUT, batch=True, kdn={"load": False, "save": True})
    d = delta(a, before)
    assert d["lookups"] == 0 and d["loaded_chunks"] == 0 and d["saved_chunks"] > 0, d
    # The first two requests (1194 and 1562 tokens) load and take 23 of B's 24 blocks; the
    # others wait. Decoding, the first takes the last free block after 86 tokens and the
    # second needs one after 102: it is preempted, and planned afresh when admitted again.
    before = counters(b)
    outs = b.generate(prompts.counting, max_tokens=COUNT_OUT, batch=True)
    after = counters(b)
    assert outs == want
    assert after["loaded_chunks"] > before["loaded_chunks"]
    assert after["rescheduled"] > before["rescheduled"], "no request was preempted"
    # Admitted again, a preempted request loads only what vLLM's own prefix cache no longer
    # holds (its freed blocks usually still do: then it loads nothing); no load may fail.
    assert after["load_failures"] == before["load_failures"]


def test_7_other_dtype_or_model_never_shares(refs, engines, workdir):
    prompts, _ = refs
    start, e = engines
    e.pop("A").stop()
    # p6a's first chunk is in kdnd as float32 (A stored it in test 5). One chunk, not two:
    # bfloat16 prefill is the slowest step of the suite on CPUs without AVX512-BF16.
    p = prompts.p6a[:CHUNK] + prompts.q1
    d = start("BF16", "--dtype", "bfloat16", "--no-prefix-caching")
    first = d.generate([p])[0]
    c = counters(d)
    assert c["lookups"] >= 1 and c["lookup_hit_tokens"] == 0 and c["loaded_chunks"] == 0
    assert c["saved_chunks"] == 1  # its own chunk, under its own fingerprint
    # Its own prefix cache is off: the same prompt again loads the bfloat16 chunk from kdnd.
    assert d.generate([p])[0] == first
    c = counters(d)
    assert c["loaded_chunks"] == 1 and c["load_failures"] == 0, c
    e.pop("BF16").stop()

    other = workdir / "other-model"
    other.mkdir()
    src = Path(replicas.model_dir())
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (other / f.name).symlink_to(f)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(src / "model.safetensors"))
    name = sorted(weights)[-1]
    weights[name] = weights[name] * 1.01  # another fine-tune of the same architecture
    save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})
    m = replicas.Replica("other-model", "--kdn-socket", str(Path(workdir) / "kdnd.sock"), *DTYPE,
                         log_dir=str(workdir), model=str(other))
    e["other"] = m
    m.start()
    m.generate([prompts.p2])
    c = counters(m)
    assert c["lookups"] >= 1 and c["lookup_hit_tokens"] == 0 and c["loaded_chunks"] == 0
    e.pop("other").stop()


ASYNC_OUT = 8


@pytest.fixture(scope="module")
def disk_kdnd(kdnd, workdir):
    """The suite's kdnd again, now with a disk tier that does not read ahead (so the only
    promotion is the one the connector asks for); B reconnects to it."""
    disk = workdir / "disk"
    disk.mkdir()
    kdnd.stop()
    kdnd.extra += ["--set", f"tier.disk.dirs={disk}", "--set", "tier.disk.bytes=128M",
                   "--set", "tier.disk.slab_bytes=32M", "--set", "tier.disk.read_ahead=0"]
    kdnd.start(timeout=120)
    time.sleep(0.3)  # B's next connection attempt is due
    return kdnd


def to_disk(k: replicas.Kdnd) -> None:
    subprocess.run([str(replicas.build_dir() / "bin" / "kdnctl"), "--socket", k.socket, "evict", "--all",
                    "--tier", "host"], check=True, stdout=subprocess.DEVNULL)


def engine_model(r: replicas.Replica, client: kdn.Client) -> kdn.Model:
    desc = kdn.ModelDesc()
    for key, v in r.send("desc")["desc"].items():
        setattr(desc, key, bytes.fromhex(v) if key == "engine_salt" else (tuple(v) if isinstance(v, list) else v))
    return client.register_model(desc)


def delta(r: replicas.Replica, before: dict) -> dict:
    after = counters(r)
    return {key: after[key] - before[key] for key in after}


def test_8_async_disk_chunks_load_off_the_step(refs, engines, disk_kdnd):
    prompts, _ = refs
    b = engines[1]["B"]
    doc = prompts.corpus[30000:30000 + 2 * CHUNK]
    prompt = doc + prompts.q1
    want = reference(b, [prompt], ASYNC_OUT)[0]
    before = counters(b)
    assert b.generate([prompt], max_tokens=ASYNC_OUT)[0] == want
    assert delta(b, before)["saved_chunks"] == 2
    to_disk(disk_kdnd)
    with kdn.Client(disk_kdnd.socket) as c:
        hit = engine_model(b, c).lookup(np.asarray(doc, dtype=np.int32))
        assert hit.hit_chunks == 2 and hit.tier_chunks[kdn.Tier.DISK] == 2, hit.tier_chunks

    assert b.send("reset_prefix_cache")["reset"]
    before = counters(b)
    assert b.generate([prompt], max_tokens=ASYNC_OUT)[0] == want
    diff = delta(b, before)
    assert diff["off_step_lookups"] == 1 and diff["off_step_loads"] == 1, diff
    assert diff["loaded_chunks"] == 2 and diff["load_failures"] == 0 and diff["failed_blocks"] == 0, diff


def test_9_async_failed_off_step_load_is_recomputed(refs, engines, disk_kdnd):
    prompts, _ = refs
    b = engines[1]["B"]
    doc = prompts.corpus[31000:31000 + CHUNK]  # one chunk: the recompute costs least
    prompt = doc + prompts.q2
    want = reference(b, [prompt], ASYNC_OUT)[0]
    with kdn.Client(disk_kdnd.socket) as c:
        model = engine_model(b, c)
        tokens = np.asarray(doc, dtype=np.int32)
        res = model.reserve(tokens, 0, 1)
        torch.from_dlpack(res.slot(0)).view(torch.float32).fill_(float("nan"))  # fails the load's check
        res.commit()
        to_disk(disk_kdnd)
        assert model.lookup(tokens).tier_chunks[kdn.Tier.DISK] == 1

    before = counters(b)
    assert b.generate([prompt], max_tokens=ASYNC_OUT)[0] == want
    diff = delta(b, before)
    assert diff["off_step_loads"] == 1 and diff["load_failures"] == 1, diff
    assert diff["corrupt_chunks"] >= 1 and diff["failed_blocks"] >= 1 and diff["loaded_chunks"] == 0, diff
