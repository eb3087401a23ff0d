"""Checks that share one kdnd and one kdn-llama-server (started once for the class): kdn-llama
and kdn-llama-server share chunks both ways; bad input over HTTP gets llama-server's own errors
and reaches kdnd not at all; per-slot KV streams (--no-kv-unified) load and store chunks; LoRA
requests and a draft model skip kdn (counted, logged once); the throughput driver's smoke run.
Run by llama_server_test.py (one ctest), whose environment it reads."""
import http.client
import json
import os
import subprocess
import sys
import tempfile
import shutil
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tools"))
from llama_server_procs import CHUNK, Kdnd, Server, request  # noqa: E402
from tiny_lora import write_lora  # noqa: E402
import llama_server_throughput  # noqa: E402
import shared_docs  # noqa: E402

# The kdnd counters a request that reached kdn would move.
KDN_TRAFFIC = ("lookups", "leases", "lease_hit_chunks", "lease_miss_chunks", "stored_chunks",
               "retrieved_chunks", "protocol_errors", "limit_errors", "expired_reservations")


def kdn_llama_prompt(server, doc, question):
    """The token ids kdn-llama builds for a question about a document: the model's chat template
    around one user message (llama.cpp's built-in ChatML for SmolLM2), tokenized in three parts
    so the document's tokens never depend on the question (engines/llama/src/prompt.cc)."""
    head = server.tokenize("<|im_start|>user\n", add_special=True, parse_special=True)
    body = server.tokenize(doc)
    tail = server.tokenize("\n\n" + question + "<|im_end|>\n<|im_start|>assistant\n", parse_special=True)
    return head + body + tail


def shared_chunk_tokens(server, doc, q1, q2):
    """Tokens of the whole chunks two questions' chat prompts share (the document's)."""
    a, b = server.prompt_tokens(doc, q1), server.prompt_tokens(doc, q2)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n // CHUNK * CHUNK


def post_raw(port, path, body, content_type="application/json"):
    """POSTs bytes as they are (no JSON encoding): the status and the decoded reply."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    try:
        return r.status, json.loads(data)
    except json.JSONDecodeError:
        return r.status, {"raw": data[:200].decode(errors="replace")}


class SharedServersTest(unittest.TestCase):
    env = {}

    @classmethod
    def setUpClass(cls):
        for var in ("KDN_KDND", "KDN_KDNCTL", "KDN_LLAMA_SERVER", "KDN_LLAMA_MODEL", "KDN_LLAMA_DOC", "KDN_LLAMA_CLI"):
            if not os.path.exists(os.environ.get(var, "")):
                if os.environ.get("CI"):
                    raise RuntimeError(f"{var} not set or missing")
                raise unittest.SkipTest(f"{var} not set or missing")
        with open(os.environ["KDN_LLAMA_DOC"], errors="replace") as f:
            text = f.read()
        # Other slices of the document than llama_server_test's (their chunks are new here), each
        # one whole chunk and a bit in every prompt: short prefills.
        cls.docs = [text[(20 + i) * 1400:(21 + i) * 1400] for i in range(4)]
        cls.dir = tempfile.mkdtemp(prefix="kdn-llama-server-shared-")
        cls.kdnd = Kdnd(cls.dir).start()
        cls.server = Server(cls.dir, "k", cls.kdnd.sock).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)
        cls.kdnd.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def stats(self):
        return self.kdnd.counters(KDN_TRAFFIC)

    def kdn_llama(self, doc_path, question):
        out = subprocess.run([os.environ["KDN_LLAMA_CLI"], "--model", os.environ["KDN_LLAMA_MODEL"], "--prompt-file",
                              doc_path, "--question", question, "--n-predict", "8", "--threads", "1", "--ctx", "2048",
                              "--socket", self.kdnd.sock, "--json"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)

    def test_kdn_llama_and_server_share_chunks(self):
        """kdn-llama prefills, the server loads its chunks; the server prefills, kdn-llama loads
        its chunks; greedy tokens identical both ways."""
        s = self.server
        for doc, first in ((self.docs[0], "cli"), (self.docs[1], "server")):
            q = "Summarize the text above in one sentence."
            tokens = kdn_llama_prompt(s, doc, q)
            whole = (len(tokens) - 1) // CHUNK * CHUNK
            self.assertGreaterEqual(whole, CHUNK)
            path = os.path.join(self.dir, f"doc-{first}.txt")
            with open(path, "w") as f:
                f.write(doc)
            if first == "cli":
                cli = self.kdn_llama(path, q)
                self.assertEqual(cli["prompt_tokens"], len(tokens))
                self.assertEqual(cli["tokens_reused"], 0)
                got, t = s.complete(tokens)
                self.assertEqual(t["cache_n"], whole)  # the slot held nothing of it: all from kdnd
            else:
                got, t = s.complete(tokens)
                self.assertLess(t["cache_n"], CHUNK)  # the chat head the slot held; nothing from kdnd
                cli = self.kdn_llama(path, q)
                self.assertEqual(cli["tokens_reused"], whole)
            self.assertEqual(got, cli["answer_tokens"], f"{first} prefilled")

    def test_bad_input_over_http(self):
        """llama-server's own errors for malformed JSON, wrong types, out-of-vocabulary and
        media-marker token ids, a prompt longer than the context and an oversized one; kdnd sees
        none of it, and the server answers afterwards."""
        s = self.server
        before = self.stats()
        chat = "/v1/chat/completions"
        long_text = " ".join(["word"] * 3000)  # > 2048 tokens: the slot's context
        cases = [
            ("malformed JSON", chat, b'{"messages": [{"role": "user", "content": "hi"}'),
            ("not JSON", "/completion", b"\xff\xfe garbage"),
            ("messages not a list", chat, json.dumps({"messages": "hello"}).encode()),
            ("max_tokens a string", chat, json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": "many"}).encode()),
            ("prompt an object", "/completion", json.dumps({"prompt": {"a": 1}}).encode()),
            ("token id past the vocabulary", "/completion", json.dumps({"prompt": [1, 2, 10**7]}).encode()),
            ("media marker token id", "/completion", json.dumps({"prompt": [-1] * 300 + [5]}).encode()),
            ("prompt longer than the context", chat, json.dumps({"messages": [{"role": "user", "content": long_text}],
                                                                 "max_tokens": 4}).encode()),
            ("oversized prompt", "/completion", json.dumps({"prompt": "word " * 400_000, "n_predict": 1}).encode()),
        ]
        for what, path, body in cases:
            with self.subTest(what):
                status, reply = post_raw(s.port, path, body)
                self.assertGreaterEqual(status, 400, f"{what}: {reply}")
                self.assertIn("error", reply, f"{what}: {reply}")
        self.assertEqual(self.stats(), before)
        self.assertEqual(request(s.port, "/health")["status"], "ok")
        text, _ = s.chat(self.docs[3][:300], "Say hi.", max_tokens=2)
        self.assertTrue(text)

    def test_per_slot_kv_streams(self):
        """A server with one KV stream per slot (-np 2 --no-kv-unified) loads the chunks a
        one-slot server stored, and stores chunks the one-slot server loads."""
        s, doc = self.server, self.docs[2]
        q1, q2 = "Who may copy the program?", "What does the text say about warranties?"
        s.chat(doc, q1)
        with Server(self.dir, "streams", self.kdnd.sock, slots=2, kv_unified=False) as p:
            expected = shared_chunk_tokens(p, doc, q1, q2)
            self.assertGreaterEqual(expected, CHUNK)
            _, t = p.chat(doc, q2)
            self.assertGreaterEqual(t["cache_n"], expected)
            self.assertIn("loaded from kdnd", p.log_text())
            fresh = self.docs[3]
            p.chat(fresh, q1)
        expected = shared_chunk_tokens(s, fresh, q1, q2)
        self.assertGreaterEqual(expected, CHUNK)
        _, t = s.chat(fresh, q2)
        self.assertGreaterEqual(t["cache_n"], expected)

    def test_lora_and_draft_skip_kdn(self):
        """A request that enables a LoRA adapter skips kdn (counted, logged once) while requests
        without one on the same server hit (the adapter is loaded at scale 0: llama-server applies
        an adapter loaded at a non-zero scale to every request that does not say otherwise); a
        server with a draft model runs without kdn."""
        lora = os.path.join(self.dir, "tiny-lora.gguf")
        write_lora(lora)
        doc = self.docs[0]
        self.server.chat(doc, "Summarize the text above in one sentence.")  # its chunk in kdnd
        with Server(self.dir, "lora", self.kdnd.sock, extra=["--lora-scaled", lora + ":0"]) as l:
            _, t = l.chat(doc, "Who may copy the program?")
            self.assertGreaterEqual(t["cache_n"], CHUNK)  # without the adapter: a hit
            # The slot drops its own cache when the adapters change; kdn's chunk would load.
            _, t = l.complete(l.prompt_tokens(doc, "What is the text about?"), 2, lora=[{"id": 0, "scale": 1.0}])
            self.assertEqual(t["cache_n"], 0)
            _, t = l.complete(l.tokenize("Say hi."), 2, lora=[{"id": 0, "scale": 1.0}])  # counted too
        log = l.log_text()
        self.assertEqual(log.count("requests with a LoRA adapter enabled skip kdn"), 1)
        self.assertIn(", 2 LoRA,", log)  # the exit summary
        # -md alone loads a draft model that nothing uses (llama-server drops it): kdn stays on.
        model = os.environ["KDN_LLAMA_MODEL"]
        spec = ["-md", model, "--spec-type", "draft-simple", "--spec-draft-n-max", "2"]
        with Server(self.dir, "draft", self.kdnd.sock, extra=spec) as d:
            text, t = d.chat("Say hi.", "", max_tokens=2)
            self.assertTrue(text)
        log = d.log_text()
        self.assertIn("off for this server: a speculative decoder", log)
        self.assertIn("1 server-wide", log)

    def test_throughput_smoke(self):
        """The throughput driver on the shared-document workload (one document of 300 tokens,
        three requests, one client): every request answered and summarized, the later ones
        reusing the document the first one prefilled."""
        w = shared_docs.Workload(shared_docs.WorkloadSpec(documents=1, min_tokens=300, max_tokens=300, seed=3))
        requests = w.requests(3)
        prompts = llama_server_throughput.Prompts(self.server, w, requests)
        self.assertEqual(len(prompts.docs[0]), 300)
        r = llama_server_throughput.run_load([self.server], prompts, requests, "kdn", 2, concurrency=1)
        self.assertEqual((r["completed"], r["failed"]), (3, 0), r["errors"])
        self.assertGreater(r["requests_per_s"], 0)
        self.assertLessEqual(r["ttft_p50_s"], r["ttft_p99_s"])
        # 1 miss of 300+ tokens, then 2 hits of at least one chunk each (the slot's or kdn's).
        self.assertGreaterEqual(r["cached_tokens_per_request"], 2 * CHUNK / 3)
        self.assertLess(r["prefill_tokens_per_request"], 300)


if __name__ == "__main__":
    unittest.main(verbosity=2)
