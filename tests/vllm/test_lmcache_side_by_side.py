"""kdn-bench vllm --lmcache at its smallest: one 512-token document, one run of each figure.

kdn and LMCache both hit in a second engine process (kdnd served the chunks; LMCache's server
logged the retrieve and the engine computed only the question), and both hits' greedy tokens
equal a miss's. The same engines then serve the throughput bench's shared-document workload
(--throughput-requests): every request answered by each system, kdn's and LMCache's answers
equal the connector-less ones. The engines are shared by all of these checks: one bench run
(four engines, one OpenMP thread each). Without LMCache's environment (scripts/setup-lmcache.sh) the test
skips, and fails under CI, where it must run.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

SIZE = 512
SHARED_REQUESTS = 4


def required() -> bool:
    v = os.environ.get("CI", "") or os.environ.get("KDN_REQUIRE_LMCACHE", "")
    return v not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def report():
    lmcache = os.environ.get("KDN_LMCACHE_PYTHON", "")
    if not lmcache or not os.path.isfile(lmcache):
        why = "no LMCache environment (scripts/setup-lmcache.sh)"
        if required():
            pytest.fail(f"missing LMCACHE (required under CI or KDN_REQUIRE_LMCACHE=1): {why}")
        pytest.skip(why)
    bench = os.environ["KDN_BENCH"]
    # float32: without AVX512-BF16 vLLM computes bf16 ~7x slower, and the figures here are checks.
    r = subprocess.run([bench, "vllm", "--lmcache", "--json", "--sizes", str(SIZE), "--reps", "1",
                        "--no-plain-engine", "--dtype", "float32", "--throughput-requests", str(SHARED_REQUESTS)], capture_output=True, text=True, timeout=1400)
    assert r.returncode == 0, f"kdn-bench vllm --lmcache exited {r.returncode}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout)


def test_both_hit_in_another_process(report):
    row = report[f"prompt_{SIZE}"]
    assert row["kdn_hit_loaded"], report["errors"]
    assert row["kdn_hit_chunks"] == SIZE // 256
    assert row["kdn_hit_bytes"] > 0
    assert min(row["kdn_hit_cached_tokens"]) >= SIZE
    assert row["lmcache_hit_loaded"], report["errors"]
    assert min(row["lmcache_hit_cached_tokens"]) >= SIZE


def test_lmcache_server_logged_the_retrieve(report):
    row = report[f"prompt_{SIZE}"]
    assert row["lmcache_hit_retrieves_logged"] >= 1
    assert row["lmcache_hit_tokens_retrieved"] >= SIZE
    assert row["lmcache_stored_tokens_per_miss"] >= SIZE


def test_tokens_identical(report):
    row = report[f"prompt_{SIZE}"]
    assert len(row["tokens_reference"]) > 0
    assert row["tokens_kdn_hit"] == row["tokens_reference"]
    assert row["tokens_lmcache_hit"] == row["tokens_reference"]
    for name in ("tokens_identical_kdn", "tokens_identical_lmcache", "kdn_hits_loaded", "lmcache_hits_retrieved"):
        assert report["bars"][name]["pass"], report["bars"][name]


def test_configuration_reported(report):
    c = report["lmcache_config"]
    assert c["mp_transfer_mode"] == "lmcache_driven" and c["chunk_tokens"] == 256
    assert c["l1_size_gb"] >= 1 and c["fresh_server_per_run"]
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=1" in report["config"]["engines"]
    assert not report["errors"], report["errors"]


def test_throughput_workload_on_the_same_engines(report):
    t = report["throughput"]
    assert len(t["workload"]["document_tokens"]) == 2
    for name in ("none", "kdn", "lmcache"):
        s = t["systems"][name]["closed"]
        assert (s["completed"], s["failed"]) == (SHARED_REQUESTS, 0), (name, s["requests_detail"])
        assert s["requests_per_s"] > 0 and s["ttft_p99_s"] >= s["ttft_p50_s"] > 0
        assert 0 <= s["computed_tokens_per_request"] <= s["prompt_tokens_per_request"]
    for name in ("kdn", "lmcache"):  # answers checked against the connector-less ones
        s = t["systems"][name]["closed"]
        assert s["answers_checked"] == SHARED_REQUESTS and s["wrong_answers"] == 0, (name, s["requests_detail"])
    assert t["systems"]["none"]["closed"]["cache_counters"]["stored_bytes"] == 0  # kdn off: nothing stored
    assert t["systems"]["kdn"]["closed"]["cache_counters"]["stored_bytes"] > 0
    assert t["systems"]["lmcache"]["closed"]["cache_counters"]["stored_tokens"] > 0
