"""A shared-document workload for node-level throughput benchmarks, engine-neutral.

D documents, each requested many times by many engine replicas: a request is one document
(chosen by a Zipf(s) law, so a few documents are hot) followed by one of many questions. Every
part is deterministic from its seed, so two systems measured in the same run see the same
requests in the same order at the same times.

Nothing here knows an engine: the caller passes a `tokenize(text) -> list[int]` callback to
cut documents to exact token counts, and a `send(request) -> dict` callback to the drivers.
Standard library only (the llama-server benchmark runs it with the system interpreter).

    w = Workload(WorkloadSpec(documents=8, min_tokens=2048, max_tokens=4096, zipf_s=1.1, seed=7))
    docs = w.document_tokens(tokenize)            # exact token counts, one list per document
    reqs = w.requests(64)                         # Zipf-chosen documents, questions cycling
    plan = poisson_arrivals(rate=0.5, count=64, seed=7)
    results = run_open_loop(reqs, plan, send)     # or run_closed_loop(reqs, concurrency, send)
    print(summarize(results))
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

# Plain words for generated prose; text from a seeded choice over them is different for every
# document, so no two documents share a prefix beyond their first few tokens.
_WORDS = (
    "the a of and to in is was that for on with as by at from this which be are or an it not "
    "have has had were their its one all there been more when will would can may than other "
    "into only some could time these two first new very after most also made over such where "
    "through back years much before great same under good well long little own should river "
    "valley harbour engine signal market letter winter summer garden council railway machine "
    "village mountain station library bridge island forest language history century border "
    "company factory parish orchard record weather journey measure silver copper timber salt "
    "grain wool cotton coal iron steam water stone glass paper ink clock lamp road canal ship "
    "north south east west early late quiet broad narrow steady careful sudden distant local "
    "public private common rare ancient modern simple heavy light bright dark warm cold dry wet "
    "built opened closed carried counted measured written traded repaired planted crossed "
    "described recorded followed divided joined raised lowered returned shipped stored sold"
).split()

_TOPICS = ("the river", "the harbour", "the railway", "the council", "the market", "the factory",
           "the village", "the library", "the bridge", "the weather", "the trade in grain",
           "the canal", "the station", "the orchard", "the mountain road", "the silver mine")
_ASKS = ("What does the document say about {t}?", "Summarise what happened to {t}.",
         "Who was responsible for {t}, according to the text?", "When is {t} first mentioned?",
         "List three facts about {t}.", "How did {t} change over the years described?",
         "What problem with {t} does the text describe?", "Why was {t} important here?")


def questions() -> list[str]:
    """The question pool: every ask about every topic (128 distinct questions)."""
    return [ask.format(t=t) for t in _TOPICS for ask in _ASKS]


def question_text(index: int) -> str:
    """Question `index` as appended after a document (engines see document, then this)."""
    pool = questions()
    return f"\n\nQuestion: {pool[index % len(pool)]}\nAnswer:"


def document_text(index: int, words: int, seed: int) -> str:
    """Document `index`'s first `words` words: prose from a seeded choice over a word list,
    in sentences, under a heading that names the document. A shorter document is a prefix of
    a longer one with the same index and seed (fit_text relies on it)."""
    rng = random.Random(f"shared-docs/{seed}/{index}")
    out: list[str] = []
    while len(out) < words:
        sentence = [rng.choice(_WORDS) for _ in range(rng.randint(8, 20))]
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        out.extend(sentence)
    return f"Record {index} of the county archive, volume {seed}.\n\n" + " ".join(out[:words])


Tokenize = Callable[[str], list[int]]


def fit_tokens(index: int, tokens: int, seed: int, tokenize: Tokenize) -> list[int]:
    """Document `index` as exactly `tokens` token ids: its text grown until it tokenizes to at
    least that many, then cut. Raises ValueError if the tokenizer gives nothing."""
    words = max(16, tokens)
    for _ in range(8):
        ids = tokenize(document_text(index, words, seed))
        if len(ids) >= tokens:
            return list(ids[:tokens])
        if not ids:
            raise ValueError("the tokenize callback returned no tokens")
        words = int(words * tokens / len(ids) * 1.2) + 16
    raise ValueError(f"document {index} did not reach {tokens} tokens")


def fit_text(index: int, tokens: int, seed: int, tokenize: Tokenize) -> str:
    """Document `index` as text of at most `tokens` tokens (the longest whole-word prefix),
    for engines that take text: a binary search over the word count."""
    lo, hi = 1, max(16, tokens)
    while len(tokenize(document_text(index, hi, seed))) <= tokens:
        lo, hi = hi, hi * 2
    while lo + 1 < hi:  # tokenize(lo words) <= tokens < tokenize(hi words)
        mid = (lo + hi) // 2
        if len(tokenize(document_text(index, mid, seed))) <= tokens:
            lo = mid
        else:
            hi = mid
    return document_text(index, lo, seed)


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    documents: int = 8
    min_tokens: int = 2048  # each document's size is drawn uniformly in [min, max]
    max_tokens: int = 4096
    zipf_s: float = 1.1  # P(document i) ~ 1 / (i + 1)^s; 0 is uniform
    seed: int = 1

    def check(self) -> None:
        if self.documents < 1:
            raise ValueError("documents must be at least 1")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError("need 1 <= min_tokens <= max_tokens")
        if self.zipf_s < 0 or math.isnan(self.zipf_s):
            raise ValueError("zipf_s must be >= 0")


@dataclasses.dataclass(frozen=True)
class Request:
    index: int  # position in the run
    document: int
    question: int  # index into questions()


class Workload:
    def __init__(self, spec: WorkloadSpec) -> None:
        spec.check()
        self.spec = spec
        rng = random.Random(f"shared-docs/sizes/{spec.seed}")
        self.sizes = [rng.randint(spec.min_tokens, spec.max_tokens) for _ in range(spec.documents)]
        weights = [1.0 / (i + 1) ** spec.zipf_s for i in range(spec.documents)]
        total = sum(weights)
        self.probabilities = [w / total for w in weights]
        self._cumulative = []
        acc = 0.0
        for p in self.probabilities:
            acc += p
            self._cumulative.append(acc)

    def document_tokens(self, tokenize: Tokenize) -> list[list[int]]:
        return [fit_tokens(i, n, self.spec.seed, tokenize) for i, n in enumerate(self.sizes)]

    def document_texts(self, tokenize: Tokenize) -> list[str]:
        return [fit_text(i, n, self.spec.seed, tokenize) for i, n in enumerate(self.sizes)]

    def requests(self, count: int) -> list[Request]:
        """`count` requests: documents by the Zipf law, questions drawn from the pool."""
        rng = random.Random(f"shared-docs/requests/{self.spec.seed}")
        pool = len(questions())
        out = []
        for i in range(count):
            doc = min(bisect.bisect_left(self._cumulative, rng.random()), self.spec.documents - 1)
            out.append(Request(i, doc, rng.randrange(pool)))
        return out


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """Open-loop arrival times (seconds from the start) of a Poisson process of `rate`/s."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = random.Random(f"shared-docs/arrivals/{seed}")
    t, out = 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def fixed_arrivals(rate: float, count: int) -> list[float]:
    """One request every 1/rate seconds."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    return [i / rate for i in range(count)]


Send = Callable[[Request], dict]


@dataclasses.dataclass
class Result:
    request: Request
    scheduled_s: float  # when it was due (open loop) or sent (closed loop), from the start
    started_s: float
    finished_s: float
    reply: dict  # what send returned (the engine's TTFT, tokens, cached tokens, ...)
    error: str = ""


def _timed(req: Request, due: float, t0: float, send: Send) -> Result:
    started = time.monotonic() - t0
    try:
        reply, error = send(req), ""
    except Exception as e:  # a failed request is a result, not the end of the run
        reply, error = {}, f"{type(e).__name__}: {e}"
    return Result(req, due, started, time.monotonic() - t0, reply, error)


def run_open_loop(requests: list[Request], arrivals: list[float], send: Send,
                  max_in_flight: int = 64) -> list[Result]:
    """Sends each request at its arrival time whether or not earlier ones are done (queueing
    delay counts in their latency: `finished_s - scheduled_s`)."""
    if len(arrivals) != len(requests):
        raise ValueError("one arrival time per request")
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max_in_flight) as pool:
        futures = []
        for req, due in zip(requests, arrivals):
            delay = due - (time.monotonic() - t0)
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(_timed, req, due, t0, send))
        return [f.result() for f in futures]


def run_closed_loop(requests: list[Request], concurrency: int, send: Send) -> list[Result]:
    """`concurrency` clients, each sending its next request when its last one is answered."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    t0 = time.monotonic()
    lock = threading.Lock()
    queue = list(reversed(requests))
    out: list[Result] = []

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                req = queue.pop()
            r = _timed(req, time.monotonic() - t0, t0, send)
            with lock:
                out.append(r)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(out, key=lambda r: r.request.index)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), nearest rank; None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def summarize(results: list[Result], ttft_key: str = "ttft_s") -> dict[str, Any]:
    """Completed requests/s over the span from the first send to the last answer, and TTFT
    p50/p99 from each reply's `ttft_key` (queueing before the send excluded; latency keeps it)."""
    done = [r for r in results if not r.error]
    span = max((r.finished_s for r in results), default=0.0) - min((r.scheduled_s for r in results), default=0.0)
    ttft = [float(r.reply[ttft_key]) for r in done if ttft_key in r.reply]
    latency = [r.finished_s - r.scheduled_s for r in done]
    return {"requests": len(results), "completed": len(done), "failed": len(results) - len(done),
            "span_s": span, "requests_per_s": len(done) / span if span > 0 else None,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "latency_p50_s": percentile(latency, 50), "latency_p99_s": percentile(latency, 99),
            "ttft_mean_s": statistics.fmean(ttft) if ttft else None}
