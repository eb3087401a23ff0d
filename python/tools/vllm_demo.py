"""Two vLLM replicas sharing a document's KV through kdnd (the vLLM part of scripts/demo.sh).

    python vllm_demo.py DOCUMENT.txt QUESTION_A QUESTION_B [--tokens 4096]

Engine A (its own process) answers question A about the document's first --tokens tokens:
a miss, so it computes the whole prompt and stores the document's chunks in kdnd. Engine B
(another process, its prefix cache empty) answers question B about the same document: it
loads A's chunks from kdnd and computes only its question. B then answers question B again
with kdn turned off for the request and its own prefix cache reset: what B costs without
kdn. Prints the three TTFTs (generate(max_tokens=1)), the answers, and whether B's answer
with kdn equals its answer without, token for token.

Where LMCache's environment is set up (KDN_LMCACHE_PYTHON, scripts/setup-lmcache.sh), the same
two steps run on two LMCache engines with a fresh LMCache server, and B's TTFT with LMCache is
printed beside B's with kdn; otherwise the demo says LMCache was not run and why.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmcache_server  # noqa: E402
import replicas  # noqa: E402

ANSWER_TOKENS = 40


def ask(r: replicas.Replica, prompt: list[int], kdn: str) -> tuple[float, dict, list[int], str]:
    """TTFT, the connector's counters moved by it, and the greedy answer (each from an empty prefix cache)."""
    before = r.stats()
    ttft = r.send("ttft", prompt=prompt, repeat=1, reset_prefix_cache=True, kdn=kdn)["median"]
    after = r.stats()
    r.send("reset_prefix_cache")
    out = r.send("generate", prompts=[prompt], max_tokens=ANSWER_TOKENS, kdn=kdn)
    moved = {k: after[k] - before[k] for k in ("loaded_chunks", "loaded_bytes", "saved_chunks", "saved_bytes")}
    return ttft, moved, out["outputs"][0], out["texts"][0]


def lmcache_hit(pa: list[int], pb: list[int], work: str) -> tuple[float, list[int]]:
    """B's TTFT and greedy answer when A stored the document in LMCache's server (engines with
    their core in its own process and prefix caching off, as LMCache needs)."""
    import vllm_side_by_side as sbs

    server = lmcache_server.LMCacheServer(os.path.join(work, "lmcache.log"), l1_gib=1)
    engines = [replicas.Replica(f"lmcache-{n}", "--lmcache-port", "0", "--no-prefix-caching", log_dir=work,
                                env=sbs.MP_ENV) for n in ("A", "B")]
    try:
        print("demo (vLLM): starting LMCache's server and two LMCache engines...", flush=True)
        server.start()
        for r in engines:
            r.args[r.args.index("0")] = str(server.port)
        sbs.start_together(engines, python=lmcache_server.python())
        a_eng, b_eng = engines
        a_eng.send("ttft", prompt=pa, repeat=1)
        deadline = time.monotonic() + 60  # LMCache stores after the step that computed the KV
        while server.transfers()["stored_tokens"] < len(pa) // lmcache_server.CHUNK_TOKENS * lmcache_server.CHUNK_TOKENS:
            if time.monotonic() > deadline:
                raise RuntimeError("LMCache's server did not log the store within 60 s")
            time.sleep(0.1)
        ttft = b_eng.send("ttft", prompt=pb, repeat=1)["median"]
        return ttft, b_eng.send("generate", prompts=[pb], max_tokens=ANSWER_TOKENS)["outputs"][0]
    finally:
        for r in engines:
            sbs.stop_engine(r)
        server.stop()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("document")
    p.add_argument("question_a")
    p.add_argument("question_b")
    p.add_argument("--tokens", type=int, default=4096, help="document tokens (a multiple of 256)")
    a = p.parse_args(argv)
    if a.tokens <= 0 or a.tokens % 256:
        p.error("--tokens must be a positive multiple of 256")
    work = tempfile.mkdtemp(prefix="kdn-vllm-demo.")
    kdnd = replicas.Kdnd(os.path.join(work, "kdnd.sock"), arena="512M")
    engines: list[replicas.Replica] = []
    try:
        kdnd.start()
        print(f"demo (vLLM): kdnd running on {kdnd.socket}", flush=True)
        for name in ("A", "B"):
            print(f"demo (vLLM): starting engine {name} (vLLM {name}, its own process, KdnConnector)...", flush=True)
            r = replicas.Replica(name, "--kdn-socket", kdnd.socket, log_dir=work).start()
            engines.append(r)
        a_eng, b_eng = engines
        enc = lambda text: b_eng.send("encode", text=text)["token_ids"]  # noqa: E731
        doc = enc(Path(a.document).read_text(errors="replace"))
        if len(doc) < a.tokens:
            print(f"demo (vLLM): the document has only {len(doc)} tokens", file=sys.stderr)
            return 1
        doc = doc[: a.tokens]
        pa = doc + enc(f"\n\nQuestion: {a.question_a}\nAnswer:")
        pb = doc + enc(f"\n\nQuestion: {a.question_b}\nAnswer:")
        for r in engines:  # warm both engines on an unrelated prompt
            r.generate([enc("Hello! " * 20)], max_tokens=2, kdn="off")

        print("demo (vLLM): engine A answers question A (a miss: computes the document, stores it in kdnd)...",
              flush=True)
        ta, ma, _, ans_a = ask(a_eng, pa, "on")
        print("demo (vLLM): engine B answers question B (loads A's KV from kdnd)...", flush=True)
        tb, mb, tok_b, ans_b = ask(b_eng, pb, "on")
        print("demo (vLLM): engine B answers question B again without kdn (its prefix cache reset)...", flush=True)
        tc, _, tok_c, _ = ask(b_eng, pb, "off")

        print()
        print(f"  {'':28} {'A (miss)':>12} {'B (kdn hit)':>12} {'B, no kdn':>12}")
        print(f"  {'prompt tokens':28} {len(pa):>12} {len(pb):>12} {len(pb):>12}")
        print(f"  {'TTFT (s)':28} {ta:>12.3f} {tb:>12.3f} {tc:>12.3f}")
        print(f"  {'KV stored in kdnd (MB)':28} {ma['saved_bytes'] / 1e6:>12.1f} {mb['saved_bytes'] / 1e6:>12.1f} "
              f"{0.0:>12.1f}")
        print(f"  {'KV loaded from kdnd (MB)':28} {ma['loaded_bytes'] / 1e6:>12.1f} {mb['loaded_bytes'] / 1e6:>12.1f} "
              f"{0.0:>12.1f}")
        print(f"\n  B's time to first token: {tb:.3f} s with kdn vs {tc:.3f} s without ({tc / tb:.1f}x faster)")
        print(f"  B's answer with kdn equals its answer without kdn, token for token: {tok_b == tok_c}")
        if lmcache_server.python():
            try:
                tl, tok_l = lmcache_hit(pa, pb, work)
                print(f"  B's time to first token with LMCache (its MP server, lmcache_driven): {tl:.3f} s "
                      f"(kdn: {tb:.3f} s); LMCache's answer equals B's without kdn: {tok_l == tok_c}")
            except Exception as e:  # noqa: BLE001 - the peer failing is reported, kdn's figures stand
                print(f"  LMCache run failed: {type(e).__name__}: {str(e)[:500]}")
        else:
            print("  LMCache not run: no LMCache environment (KDN_LMCACHE_PYTHON; scripts/setup-lmcache.sh)")
        first = lambda text: text.strip().split("\n\n")[0]  # noqa: E731 - the answer's first paragraph
        print(f"\n  Q (A): {a.question_a}\n  A: {first(ans_a)}\n")
        print(f"  Q (B): {a.question_b}\n  A: {first(ans_b)}\n")
        return 0 if tok_b == tok_c and mb["loaded_bytes"] > 0 else 1
    finally:
        for r in engines:
            r.stop()
        kdnd.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
