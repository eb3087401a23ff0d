#!/usr/bin/env python3
"""kdn-llama-server processes sharing prompts through a real kdnd, over real HTTP on loopback.

Server A answers a chat about a document; server B, another process, answers another question
about it with timings.cache_n covering the document's whole chunks and the same answer as a
server without kdn; B and kdnd restarted (disk tier) hit again; kdnd down at start and killed
mid-request; streamed responses; two slots at once. Python's standard library only.

Environment: KDN_KDND, KDN_LLAMA_SERVER (binaries), KDN_LLAMA_MODEL (GGUF), KDN_LLAMA_DOC (a
long text). Missing ones skip the tests, or fail them under CI=1.
"""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tools"))
from llama_server_procs import CHUNK, Kdnd, Server  # noqa: E402
from llama_server_shared_test import SharedServersTest, shared_chunk_tokens  # noqa: E402,F401 (run here too)
from llama_server_skips_test import SkipsTest  # noqa: E402,F401 (run here too)

KDND = os.environ.get("KDN_KDND", "")
KDNCTL = os.environ.get("KDN_KDNCTL", "")
CLI = os.environ.get("KDN_LLAMA_CLI", "")
SERVER = os.environ.get("KDN_LLAMA_SERVER", "")
MODEL = os.environ.get("KDN_LLAMA_MODEL", "")
DOC = os.environ.get("KDN_LLAMA_DOC", "")
# Short documents (two whole chunks each) keep CI fast; long ones belong to kdn-bench.
DOC_CHARS = 2600


def missing():
    for name, path in (("KDN_KDND", KDND), ("KDN_LLAMA_SERVER", SERVER), ("KDN_LLAMA_MODEL", MODEL),
                       ("KDN_LLAMA_DOC", DOC), ("KDN_KDNCTL", KDNCTL), ("KDN_LLAMA_CLI", CLI)):
        if not path or not os.path.exists(path):
            return f"{name} not set or missing ({path!r})"
    return None


Q1 = "Summarize the text above in one sentence."
Q2 = "Who may copy the program?"
Q3 = "What does the text say about warranties?"


class LlamaServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = missing()
        if why:
            if os.environ.get("CI"):
                raise RuntimeError(why)
            raise unittest.SkipTest(why)
        with open(DOC, errors="replace") as f:
            text = f.read()
        cls.docs = [text[i * DOC_CHARS:(i + 1) * DOC_CHARS] for i in range(4)]

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kdn-llama-server-test-")

    def tearDown(self):
        if not self.failed():
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"logs kept in {self.dir}")

    def failed(self):
        outcome = getattr(self, "_outcome", None)
        result = getattr(outcome, "result", None)
        return bool(result and any(test is self for test, _ in result.failures + result.errors))

    def test_second_process_hits_and_restarts(self):
        """B hits what A prefilled, answers as a server without kdn, and hits again after B and
        kdnd restart (disk tier)."""
        doc = self.docs[0]
        kdnd = Kdnd(self.dir, disk=os.path.join(self.dir, "disk")).start()
        try:
            with Server(self.dir, "a", kdnd.sock) as a:
                expected = shared_chunk_tokens(a, doc, Q1, Q2)
                self.assertGreaterEqual(expected, 2 * CHUNK)
                _, t = a.chat(doc, Q1)
                self.assertEqual(t["cache_n"], 0)
            with Server(self.dir, "plain", kdnd.sock, kdn=False) as plain:
                want, t = plain.chat(doc, Q2)
                self.assertEqual(t["cache_n"], 0)
                want3, _ = plain.chat(doc, Q3, cache_prompt=False)
            with Server(self.dir, "b", kdnd.sock) as b:
                got, t = b.chat(doc, Q2)
                self.assertGreaterEqual(t["cache_n"], expected)
                self.assertEqual(got, want)
                self.assertIn("loaded from kdnd", b.log_text())
            kdnd.stop()
            kdnd.start()  # the same disk directory: the chunks come back from disk
            with Server(self.dir, "b2", kdnd.sock) as b:
                got, t = b.chat(doc, Q2)
                self.assertGreaterEqual(t["cache_n"], expected)
                self.assertEqual(got, want)
            with Server(self.dir, "b3", kdnd.sock) as b:
                # Streamed: the same answer as without kdn, the same reuse.
                text, t, events = b.chat_stream(doc, Q3)
                self.assertGreater(events, 2)
                self.assertGreaterEqual(t["cache_n"], expected)
                self.assertEqual(text, want3)
        finally:
            kdnd.stop()

    def test_kdnd_down_at_start_and_killed_mid_request(self):
        """A server started before kdnd answers by prefilling and connects once kdnd is up; kdnd
        killed while a response streams: the response completes, the next ones are prefilled,
        and libkdn reconnects to the restarted kdnd by itself."""
        kdnd = Kdnd(self.dir)
        with Server(self.dir, "s", kdnd.sock) as s:
            try:
                _, t = s.chat(self.docs[1], Q1)
                self.assertEqual(t["cache_n"], 0)
                self.assertIn("cannot reach kdnd", s.log_text())
                kdnd.start()
                time.sleep(1.2)  # the server retries at most once a second
                _, t = s.chat(self.docs[1], Q2)  # stores the document's chunks
                with Server(self.dir, "p", kdnd.sock) as p:
                    expected = shared_chunk_tokens(p, self.docs[1], Q1, Q3)
                    _, t = p.chat(self.docs[1], Q3)
                    self.assertGreaterEqual(t["cache_n"], expected)

                text, _, _ = s.chat_stream(self.docs[2], Q1, max_tokens=48,
                                           on_first=lambda: kdnd.stop(signal.SIGKILL))
                self.assertTrue(text)
                got, t = s.chat(self.docs[3], Q2)  # kdnd is gone: prefilled (but the chat template's head)
                self.assertTrue(got)
                self.assertLess(t["cache_n"], CHUNK)

                kdnd.start()
                time.sleep(0.5)
                s.chat(self.docs[3], Q1)  # libkdn reconnects; the document is stored
                with Server(self.dir, "q", kdnd.sock) as q:
                    expected = shared_chunk_tokens(q, self.docs[3], Q1, Q3)
                    _, t = q.chat(self.docs[3], Q3)
                    self.assertGreaterEqual(t["cache_n"], expected)
                self.assertIn("kdnd went away", s.log_text())
            finally:
                kdnd.stop()

    def test_two_slots_at_once(self):
        """Two requests at once on a server with two slots both reuse the document's chunks."""
        doc = self.docs[0]
        kdnd = Kdnd(self.dir).start()
        try:
            with Server(self.dir, "a", kdnd.sock) as a:
                a.chat(doc, Q1)
                expected = shared_chunk_tokens(a, doc, Q1, Q2)
            with Server(self.dir, "two", kdnd.sock, slots=2) as s:
                results = {}

                def ask(q):
                    results[q] = s.chat(doc, q)

                threads = [threading.Thread(target=ask, args=(q,)) for q in (Q2, Q3)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                for q in (Q2, Q3):
                    text, t = results[q]
                    self.assertTrue(text)
                    self.assertGreaterEqual(t["cache_n"], expected)
        finally:
            kdnd.stop()

    def test_bench_smoke(self):
        """kdn-bench llama-server end to end on a one-chunk document: every figure present and
        the ratios recomputed from the runs it lists."""
        bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tools",
                             "llama_server_bench.py")
        out = subprocess.run([sys.executable, bench, "--json", "--sizes", "256", "--reps", "2"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        report = json.loads(out.stdout)
        (size,) = report["sizes"]
        for key in ("ttft_miss_s", "ttft_kdn_hit_s", "ttft_cache_ram_hit_s", "tokens_identical"):
            self.assertIn(key, size)
        self.assertEqual(size["ttft_kdn_hit_s"], statistics.median(size["ttft_kdn_hit_runs_s"]))
        self.assertAlmostEqual(size["speedup"], size["ttft_miss_s"] / size["ttft_kdn_hit_s"])
        self.assertTrue(all(n >= CHUNK for n in size["kdn_cache_n"]))
        self.assertTrue(report["tokens_identical"])
        self.assertTrue(report["bars"]["tokens_identical"]["met"])
        bad = subprocess.run([sys.executable, bench, "--sizes", "10"], capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2)

    def test_help_lists_kdn_flags(self):
        out = subprocess.run([SERVER, "--help"], capture_output=True, text=True, timeout=60).stdout
        for flag in ("--kdn-socket", "--kdn-namespace", "--kdn-token", "--no-kdn", "LLAMA_ARG_KDN_SOCKET"):
            self.assertIn(flag, out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
