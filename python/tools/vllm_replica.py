"""One vLLM engine replica in its own process, driven line by line over stdin/stdout.

kdn's vLLM tests, benchmark and demo start several of these (separate processes, like engine
replicas on a node) and send them JSON commands, one per line; each reply is one line
starting with REPLY_PREFIX (vLLM's own logging goes to the same stream and is skipped).

    python vllm_replica.py --model DIR [--kdn-socket PATH] [--dtype bfloat16] [...]

Commands ({"op": ...}):
    encode      {"text"}                          -> {"token_ids"}
    generate    {"prompts": [[ids...], ...], "max_tokens", "kdn": "on"|"off"|{"load", "save"}}
                                                  -> {"outputs": [[ids...]], "texts", "seconds"}
                prompts are generated one request at a time unless "batch": true
    ttft        {"prompt": [ids], "repeat": 3, "reset_prefix_cache": bool, "kdn": "on"|"off"}
                                                  -> {"seconds": [...], "median": s, "token_ids"}
    serve       {"prompt": [ids], "max_tokens", "kdn": "on"|"off"}
                                                  -> {"ttft_s", "seconds", "token_ids", "cached_tokens"}
                one request as a server answers it: TTFT is when its first token came out
    reset_prefix_cache                            -> {}
    stats                                         -> {"connector": {...}} (kdn.vllm counters)
    desc                                          -> the kdn model descriptor fields (with --kdn-socket)
    quit
Prompts are token ids: the caller decides them exactly (the document's tokens, then the
question's), so chunk keys do not depend on how text would have been split.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

REPLY_PREFIX = "@@kdn-replica@@ "


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--kdn-socket", help="enable KdnConnector with kdnd on this socket")
    p.add_argument("--offload", action="store_true", help="enable vLLM's own CPU offloading connector")
    p.add_argument("--lmcache-port", type=int, default=0,
                   help="enable LMCacheMPConnector with the LMCache MP server on this port (LMCache's venv)")
    p.add_argument("--lmcache-mode", default="lmcache_driven", help="LMCache's mp_transfer_mode")
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=4608)
    p.add_argument("--max-num-batched-tokens", type=int, default=256,
                   help="prefill step size; the chunk size makes a hit compute exactly what a miss does")
    p.add_argument("--kv-space-gib", type=int, default=1)
    p.add_argument("--num-blocks", type=int, default=0, help="force this many KV blocks (0: from kv-space)")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--load-failure-policy", default="recompute")
    p.add_argument("--extra", default="{}", help="more kv_connector_extra_config, as JSON")
    return p.parse_args(argv)


def _core_process_stats(worker: object) -> dict:
    """Runs in the engine core's process (through collective_rpc): its connectors' counters."""
    from kdn.vllm import process_stats

    return process_stats()


def make_llm(a: argparse.Namespace):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(a.kv_space_gib))
    from vllm import LLM

    kw: dict = {}
    if a.kdn_socket and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        # op_stats hands the core process a function (collective_rpc), which vLLM's msgpack
        # encoder passes only through its pickle fallback; messages it can encode are unchanged.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    if a.kdn_socket:
        extra = {"socket_path": a.kdn_socket, "chunk_tokens": a.chunk_tokens, **json.loads(a.extra)}
        kw["kv_transfer_config"] = {"kv_connector": "KdnConnector", "kv_connector_module_path": "kdn.vllm",
                                    "kv_role": "kv_both", "kv_load_failure_policy": a.load_failure_policy,
                                    "kv_connector_extra_config": extra}
    elif a.lmcache_port:
        extra = {"lmcache.mp.host": "tcp://localhost", "lmcache.mp.port": a.lmcache_port,
                 "lmcache.mp.mp_transfer_mode": a.lmcache_mode, **json.loads(a.extra)}
        kw["kv_transfer_config"] = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                                    "kv_connector_extra_config": extra}
    elif a.offload:
        kw["kv_transfer_config"] = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                    "kv_connector_extra_config": json.loads(a.extra)}
    if a.num_blocks:
        kw["num_gpu_blocks_override"] = a.num_blocks
    return LLM(model=a.model, dtype=a.dtype, max_model_len=a.max_model_len, enforce_eager=True,
               max_num_batched_tokens=a.max_num_batched_tokens, enable_prefix_caching=not a.no_prefix_caching,
               seed=0, **kw)


class Replica:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.llm = make_llm(a)
        self.served = 0

    def _params(self, max_tokens: int, kdn_mode: str):
        from vllm import SamplingParams

        # "off", or {"load": bool, "save": bool} (kdn.vllm's per-request choice); "on": no choice
        extra = {"kv_transfer_params": {"kdn": kdn_mode}} if kdn_mode == "off" or isinstance(kdn_mode, dict) else None
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, extra_args=extra)

    def _run(self, prompts: list[list[int]], max_tokens: int, kdn_mode: str) -> list:
        from vllm.inputs import TokensPrompt

        return self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                 self._params(max_tokens, kdn_mode), use_tqdm=False)

    def op_encode(self, c: dict) -> dict:
        return {"token_ids": self.llm.get_tokenizer().encode(c["text"], add_special_tokens=False)}

    def op_generate(self, c: dict) -> dict:
        prompts, n, mode = c["prompts"], int(c.get("max_tokens", 16)), c.get("kdn", "on")
        t0 = time.perf_counter()
        if c.get("batch"):
            outs = self._run(prompts, n, mode)
        else:
            outs = [self._run([p], n, mode)[0] for p in prompts]
        seconds = time.perf_counter() - t0
        return {"outputs": [list(o.outputs[0].token_ids) for o in outs],
                "texts": [o.outputs[0].text for o in outs], "seconds": seconds}

    def op_ttft(self, c: dict) -> dict:
        times, cached, ids = [], [], None
        for _ in range(int(c.get("repeat", 3))):
            if c.get("reset_prefix_cache"):
                self.llm.reset_prefix_cache()
            t0 = time.perf_counter()
            out = self._run([c["prompt"]], 1, c.get("kdn", "on"))[0]
            times.append(time.perf_counter() - t0)
            cached.append(out.num_cached_tokens or 0)
            ids = list(out.outputs[0].token_ids)
        # cached_tokens: prompt tokens the engine did not compute (its prefix cache or a connector).
        return {"seconds": times, "median": statistics.median(times), "token_ids": ids, "cached_tokens": cached}

    def op_serve(self, c: dict) -> dict:
        from vllm.inputs import TokensPrompt

        params = self._params(int(c.get("max_tokens", 16)), c.get("kdn", "on"))
        engine = self.llm.llm_engine
        self.served += 1
        rid = f"serve-{self.served}"
        t0 = time.perf_counter()
        engine.add_request(rid, TokensPrompt(prompt_token_ids=c["prompt"]), params)
        ttft, last = None, None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id != rid:
                    continue
                if ttft is None and out.outputs and out.outputs[0].token_ids:
                    ttft = time.perf_counter() - t0
                last = out
        seconds = time.perf_counter() - t0
        if last is None or not last.finished:
            raise RuntimeError("the engine finished without answering the request")
        # cached_tokens: prompt tokens not computed here (the engine's prefix cache or a connector).
        return {"ttft_s": ttft if ttft is not None else seconds, "seconds": seconds,
                "token_ids": list(last.outputs[0].token_ids), "cached_tokens": last.num_cached_tokens or 0}

    def op_reset_prefix_cache(self, c: dict) -> dict:
        return {"reset": bool(self.llm.reset_prefix_cache())}

    def op_stats(self, c: dict) -> dict:
        if not self.a.kdn_socket:
            return {"connector": {}}
        from kdn.vllm import process_stats

        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
            return {"connector": process_stats()}
        # The engine core (scheduler and worker) runs in a process of its own: ask it there.
        return {"connector": self.llm.collective_rpc(_core_process_stats)[0]}

    def op_desc(self, c: dict) -> dict:
        from kdn.vllm.connector import last_descriptor

        d = last_descriptor()
        if d is None:
            return {"desc": None}
        return {"desc": {k: getattr(d, k) if k != "engine_salt" else d.engine_salt.hex()
                         for k in ("num_layers", "num_kv_heads", "head_dim", "dtype", "chunk_tokens", "rope_style",
                                   "rotary_dim", "rope_theta", "rope_scaling", "rope_scaling_params",
                                   "k_channel_order", "tp_rank", "tp_size", "name", "engine_salt")}}


def reply(obj: dict) -> None:
    sys.stdout.write(REPLY_PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    t0 = time.perf_counter()
    try:
        replica = Replica(a)
    except Exception as e:  # the driver sees why the engine did not start
        reply({"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})
        return 1
    reply({"ok": True, "ready": True, "start_seconds": time.perf_counter() - t0})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            cmd = json.loads(line)
            if cmd.get("op") == "quit":
                reply({"ok": True})
                break
            out = getattr(replica, "op_" + cmd["op"])(cmd)
            reply({"ok": True, **out})
        except Exception as e:
            reply({"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
