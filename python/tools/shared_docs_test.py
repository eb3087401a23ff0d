"""Unit test of shared_docs.py (standard library only: python3 -m unittest shared_docs_test)."""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shared_docs as sd  # noqa: E402


def word_tokens(text: str) -> list[int]:
    """A stand-in tokenizer: one id per whitespace-separated word (stable across runs)."""
    return [sum(w.encode()) % 50000 for w in text.split()]


class SharedDocsTest(unittest.TestCase):
    def test_documents_exact_sizes_deterministic_and_distinct(self) -> None:
        w = sd.Workload(sd.WorkloadSpec(documents=5, min_tokens=200, max_tokens=400, seed=3))
        docs = w.document_tokens(word_tokens)
        self.assertEqual([len(d) for d in docs], w.sizes)
        self.assertTrue(all(200 <= n <= 400 for n in w.sizes))
        again = sd.Workload(sd.WorkloadSpec(documents=5, min_tokens=200, max_tokens=400, seed=3))
        self.assertEqual(again.document_tokens(word_tokens), docs)
        other = sd.Workload(sd.WorkloadSpec(documents=5, min_tokens=200, max_tokens=400, seed=4))
        self.assertNotEqual(other.document_tokens(word_tokens)[0][:50], docs[0][:50])
        # no two documents share a prefix past their heading's first few tokens
        for i in range(len(docs)):
            for j in range(i + 1, len(docs)):
                self.assertNotEqual(docs[i][:16], docs[j][:16])

    def test_fit_text_is_the_longest_prefix_within_the_count(self) -> None:
        text = sd.fit_text(2, 300, 1, word_tokens)
        self.assertLessEqual(len(word_tokens(text)), 300)
        self.assertEqual(len(word_tokens(text)), 300)  # one token per word here: exact
        self.assertTrue(sd.document_text(2, 1000, 1).startswith(text))

    def test_zipf_makes_the_first_document_hottest(self) -> None:
        w = sd.Workload(sd.WorkloadSpec(documents=8, min_tokens=10, max_tokens=10, zipf_s=1.2, seed=5))
        counts = collections.Counter(r.document for r in w.requests(4000))
        self.assertEqual(set(counts), set(range(8)))
        expect0 = w.probabilities[0] * 4000
        self.assertLess(abs(counts[0] - expect0), 0.15 * expect0)
        self.assertGreater(counts[0], counts[7] * 4)
        uniform = sd.Workload(sd.WorkloadSpec(documents=4, min_tokens=10, max_tokens=10, zipf_s=0.0))
        self.assertAlmostEqual(uniform.probabilities[0], 0.25)
        self.assertEqual(w.requests(50), w.requests(50))
        self.assertGreater(len({r.question for r in w.requests(200)}), 60)

    def test_arrivals(self) -> None:
        p = sd.poisson_arrivals(2.0, 2000, seed=1)
        self.assertEqual(p, sd.poisson_arrivals(2.0, 2000, seed=1))
        self.assertEqual(p, sorted(p))
        self.assertAlmostEqual(p[-1] / 1999, 0.5, delta=0.05)  # mean gap 1/rate
        self.assertEqual(sd.fixed_arrivals(4.0, 3), [0.0, 0.25, 0.5])
        with self.assertRaises(ValueError):
            sd.poisson_arrivals(0.0, 1, seed=1)

    def test_bad_specs_are_refused(self) -> None:
        for spec in (sd.WorkloadSpec(documents=0), sd.WorkloadSpec(min_tokens=10, max_tokens=5),
                     sd.WorkloadSpec(zipf_s=-1.0)):
            with self.assertRaises(ValueError):
                sd.Workload(spec)
        with self.assertRaises(ValueError):
            sd.fit_tokens(0, 10, 1, lambda text: [])

    def test_open_loop_keeps_the_schedule_and_closed_loop_the_concurrency(self) -> None:
        reqs = sd.Workload(sd.WorkloadSpec(documents=2, min_tokens=10, max_tokens=10)).requests(6)
        in_flight, peak, lock = [0], [0], threading.Lock()

        def send(r: sd.Request) -> dict:
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
            time.sleep(0.05)
            with lock:
                in_flight[0] -= 1
            if r.index == 3:
                raise RuntimeError("engine gone")
            return {"ttft_s": 0.01 * (r.index + 1)}

        res = sd.run_open_loop(reqs, sd.fixed_arrivals(100.0, 6), send)
        self.assertGreater(peak[0], 1)  # sent on schedule, not after the previous answer
        self.assertTrue(all(r.started_s >= r.scheduled_s - 0.005 for r in res))
        s = sd.summarize(res)
        self.assertEqual((s["completed"], s["failed"]), (5, 1))
        self.assertAlmostEqual(s["ttft_p50_s"], 0.03)
        self.assertAlmostEqual(s["ttft_p99_s"], 0.06)
        peak[0] = 0
        res = sd.run_closed_loop(reqs, 2, send)
        self.assertEqual([r.request.index for r in res], list(range(6)))
        self.assertLessEqual(peak[0], 2)


if __name__ == "__main__":
    unittest.main()
