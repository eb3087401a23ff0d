"""Requests kdn must not serve, with real model files: a sliding-window model (gemma2), a
recurrent one (mamba) and a hybrid one (jamba) run with kdn off for the server, and a server
with a multimodal projector (a llama model with a CLIP/LLaVA mmproj) skips kdn for prompts with
an image while its text prompts still load and store chunks. In each case the skip is counted (the exit summary),
logged once, reaches kdnd not at all, and changes no greedy token against the same server with
--no-kdn. The model files are tiny ones tests/llama/tiny_models.py writes at start (about a
second), with the tokenizer of the test's real model. Run by llama_server_test.py (one ctest),
whose environment it reads."""
import base64
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tools"))
from llama_server_procs import CHUNK, Kdnd, Server, request  # noqa: E402
import tiny_models  # noqa: E402

# The kdnd counters a request that reached kdn would move.
KDN_TRAFFIC = ("lookups", "leases", "lease_hit_chunks", "lease_miss_chunks", "stored_chunks", "retrieved_chunks")
QUESTIONS = ("Who may copy the program?", "What does the text say about warranties?")


def chat_image(server, text, image_png, max_tokens=8):
    """A greedy chat whose user message holds an image (a data URL) and text: the answer and the
    timings."""
    url = "data:image/png;base64," + base64.b64encode(image_png).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    r = request(server.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": content}],
                                                      "max_tokens": max_tokens, "temperature": 0})
    return r["choices"][0]["message"]["content"], r["timings"]


class SkipsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for var in ("KDN_KDND", "KDN_KDNCTL", "KDN_LLAMA_SERVER", "KDN_LLAMA_MODEL", "KDN_LLAMA_DOC"):
            if not os.path.exists(os.environ.get(var, "")):
                if os.environ.get("CI"):
                    raise RuntimeError(f"{var} not set or missing")
                raise unittest.SkipTest(f"{var} not set or missing")
        with open(os.environ["KDN_LLAMA_DOC"], errors="replace") as f:
            cls.doc = f.read()[5 * 1400:6 * 1400]  # one whole chunk and a bit in every prompt
        cls.dir = tempfile.mkdtemp(prefix="kdn-llama-server-skips-")
        tok = tiny_models.tokenizer_kvs(os.environ["KDN_LLAMA_MODEL"])
        p = lambda name: os.path.join(cls.dir, name)  # noqa: E731
        cls.models = {"llama": tiny_models.write_llama(p("llama.gguf"), tok),
                      "gemma2": tiny_models.write_gemma2(p("gemma2.gguf"), tok),
                      "mamba": tiny_models.write_mamba(p("mamba.gguf"), tok),
                      "jamba": tiny_models.write_jamba(p("jamba.gguf"), tok),
                      "mmproj": tiny_models.write_mmproj(p("mmproj.gguf"))}
        cls.kdnd = Kdnd(cls.dir).start()

    @classmethod
    def tearDownClass(cls):
        cls.kdnd.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def stats(self):
        return self.kdnd.counters(KDN_TRAFFIC)

    def server(self, name, model, kdn=True, extra=()):
        return Server(self.dir, name + ("" if kdn else "-off"), self.kdnd.sock, kdn=kdn, model=self.models[model],
                      extra=extra)

    def test_sliding_window_recurrent_and_hybrid_models_run_without_kdn(self):
        """kdn is off for the whole server (logged once at start), every request is answered and
        counted as server-wide, kdnd sees nothing, and the answers equal --no-kdn's."""
        for model, why in (("gemma2", "the model uses sliding-window attention"),
                           ("mamba", "the model keeps recurrent state"),
                           ("jamba", "the model keeps recurrent state")):
            with self.subTest(model):
                before = self.stats()
                answers = {}
                for kdn in (True, False):
                    with self.server(model, model, kdn) as s:
                        self.assertGreater(len(s.prompt_tokens(self.doc, QUESTIONS[0])), CHUNK)
                        answers[kdn] = [s.chat(self.doc, q, max_tokens=8)[0] for q in QUESTIONS]
                    if kdn:
                        log = s.log_text()
                self.assertEqual(answers[True], answers[False])
                self.assertTrue(all(answers[True]))
                self.assertEqual(log.count("off for this server: " + why), 1, log[-2000:])
                self.assertIn("2 server-wide", log)  # the exit summary
                self.assertNotIn("loaded from kdnd", log)
                self.assertEqual(self.stats(), before)

    def test_media_prompts_skip_kdn(self):
        """With a multimodal projector: a text prompt stores its chunk, two prompts with (other)
        images are answered without kdn (no lookup, no store; counted, logged once), and a later
        text prompt loads the first one's chunk from kdnd; every answer equals --no-kdn's."""
        images = [tiny_models.png(28, 28, seed) for seed in (1, 2)]
        mm = ["--mmproj", self.models["mmproj"], "--cache-ram", "0"]  # kdn the only cache beside the slot
        answers = {}
        for kdn in (True, False):
            with self.server("media", "llama", kdn, mm) as s:
                got = [s.chat(self.doc, QUESTIONS[0], max_tokens=8)[0]]
                before = self.stats()
                for img in images:
                    got.append(chat_image(s, "Describe the image.", img)[0])
                if kdn:
                    self.assertEqual(self.stats(), before)  # the image prompts never reached kdnd
                text, t = s.chat(self.doc, QUESTIONS[1], max_tokens=8)
                got.append(text)
                if kdn:  # the slot holds the last image prompt: the document's chunk came from kdnd
                    self.assertGreaterEqual(t["cache_n"], CHUNK)
                answers[kdn] = got
            if kdn:
                log = s.log_text()
        self.assertEqual(answers[True], answers[False])
        self.assertEqual(log.count("prompts with media skip kdn"), 1, log[-2000:])
        self.assertEqual(log.count("loaded from kdnd"), 1)
        self.assertIn("; 1 chunks stored; requests without kdn: 2 media,", log)  # the exit summary


if __name__ == "__main__":
    unittest.main(verbosity=2)
