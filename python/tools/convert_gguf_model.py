"""Converts a llama-family GGUF (SmolLM2-135M-Instruct Q4_1 here) into a Hugging Face model
folder that vLLM loads: config.json, tokenizer files and model.safetensors in bfloat16.

vLLM has no GGUF loader of its own, and transformers cannot save_pretrained a model it loaded
from a quantized GGUF, so the weights go through transformers' GGUF reader into a skeleton
model built on the meta device and are written with safetensors directly. The weights are the
dequantized GGUF weights: the same numbers llama.cpp runs.

    python convert_gguf_model.py MODEL.gguf OUT_DIR

OUT_DIR is written through a temporary folder and renamed at the end, so a folder that exists
is complete.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    folder, name = str(gguf.parent), gguf.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.torch_dtype = torch.bfloat16
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    loaded = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton,
                                  torch_dtype=torch.bfloat16)
    tensors = loaded["tensors"] if isinstance(loaded, dict) and "tensors" in loaded else loaded
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    expected = set(skeleton.state_dict().keys())
    if getattr(config, "tie_word_embeddings", False):
        expected.discard("lm_head.weight")
        weights.pop("lm_head.weight", None)
    missing = expected - set(weights)
    if missing:
        raise SystemExit(f"convert: the GGUF lacks {sorted(missing)[:5]}")
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    convert(Path(argv[1]).resolve(), Path(argv[2]).resolve())
    print(f"convert: wrote {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
