"""A rank-1 LoRA adapter GGUF for one attention weight of a llama-architecture model, written
with the standard library: enough for llama.cpp to load it (`--lora`), so the tests can send
requests with an adapter enabled. Its B matrix is zero, so it changes no output; what the tests
check is that kdn refuses requests that enable it, whatever it computes."""
import struct

GGUF_STRING, GGUF_FLOAT32, GGML_F32, ALIGN = 8, 6, 0, 32


def _str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv_str(key, value):
    return _str(key) + struct.pack("<I", GGUF_STRING) + _str(value)


def _kv_f32(key, value):
    return _str(key) + struct.pack("<If", GGUF_FLOAT32, value)


def write_lora(path, weight="blk.0.attn_q.weight", n_in=576, n_out=576, arch="llama"):
    """A with shape [n_in, 1] (all 0.01), B with shape [1, n_out] (zeros), alpha 1."""
    tensors = [(weight + ".lora_a", (n_in, 1), struct.pack(f"<{n_in}f", *([0.01] * n_in))),
               (weight + ".lora_b", (1, n_out), bytes(4 * n_out))]
    kvs = [_kv_str("general.architecture", arch), _kv_str("general.type", "adapter"),
           _kv_str("adapter.type", "lora"), _kv_f32("adapter.lora.alpha", 1.0)]
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    offset, data = 0, b""
    for name, dims, payload in tensors:
        out += _str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", GGML_F32, offset)
        pad = (-len(payload)) % ALIGN
        data += payload + bytes(pad)
        offset += len(payload) + pad
    out += bytes((-len(out)) % ALIGN)
    with open(path, "wb") as f:
        f.write(out + data)
