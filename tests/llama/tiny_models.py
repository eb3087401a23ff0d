"""Tiny llama.cpp model files, written with the standard library in well under a second, for the
tests of what kdn-llama-server must not serve: a sliding-window model (gemma2 architecture), a
recurrent one (mamba), a hybrid one (jamba), a plain one (llama) and a multimodal projector for
it (clip, the LLaVA "mlp" type). Their weights are pseudo-random from a fixed seed, so their answers are gibberish
but the same on every run; what the tests check is which requests kdn serves and that skipping
changes no token. Each model borrows the tokenizer (and chat template) of a real model file, so
llama-server tokenizes and renders chats as it does for that model."""
import random
import struct

# GGUF value types, and the ggml tensor types used here.
U32, I32, F32, BOOL, STR, ARR = 4, 5, 6, 7, 8, 9
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
GGML_F32, GGML_F16 = 0, 1
ALIGN = 32
N_EMBD = 64  # every text model's width (the projector's output)


def _str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


class _Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return v[0]

    def key(self):
        n = self.take("<Q")
        self.at += n
        return self.data[self.at - n:self.at]

    def skip_value(self, vtype):
        if vtype == STR:
            n = self.take("<Q")
            self.at += n
        elif vtype == ARR:
            etype, n = self.take("<I"), self.take("<Q")
            if etype in _SCALAR:
                self.at += _SCALAR[etype] * n
            else:
                for _ in range(n):
                    self.skip_value(etype)
        elif vtype in _SCALAR:
            self.at += _SCALAR[vtype]
        else:
            raise ValueError(f"GGUF value type {vtype} unknown")


def tokenizer_kvs(model_path):
    """The raw key-value records under `tokenizer.` of a GGUF file (vocabulary, merges, special
    ids, chat template), ready to be written into another file."""
    with open(model_path, "rb") as f:
        data = f.read(64 << 20)  # the metadata comes first; SmolLM2's is ~2 MB
    r = _Reader(data)
    if data[:4] != b"GGUF" or struct.unpack_from("<I", data, 4)[0] != 3:
        raise ValueError(f"{model_path}: not a GGUF v3 file")
    r.at = 8
    r.take("<Q")  # tensor count
    n_kv = r.take("<Q")
    out = []
    for _ in range(n_kv):
        start = r.at
        key = r.key()
        r.skip_value(r.take("<I"))
        if key.startswith(b"tokenizer."):
            out.append(data[start:r.at])
    if not any(b"tokenizer.ggml.tokens" in kv[:40] for kv in out):
        raise ValueError(f"{model_path}: no tokenizer in its metadata")
    return out


class Gguf:
    """A GGUF v3 file being assembled: key-values, then tensors (F32 or F16 payloads)."""

    def __init__(self, arch, seed):
        self.kvs, self.tensors = [], []
        self.rng = random.Random(seed)
        self.put(STR, "general.architecture", arch)

    def put(self, vtype, key, value):
        if vtype == STR:
            payload = _str(value)
        elif vtype == BOOL:
            payload = struct.pack("<B", 1 if value else 0)
        elif vtype == ARR:
            etype, items = value
            fmt = {F32: "f", I32: "i", U32: "I"}[etype]
            payload = struct.pack(f"<IQ{len(items)}{fmt}", etype, len(items), *items)
        else:
            payload = struct.pack({U32: "<I", I32: "<i", F32: "<f"}[vtype], value)
        self.kvs.append(_str(key) + struct.pack("<I", vtype) + payload)

    def raw(self, records):
        self.kvs.extend(records)

    def f32(self, name, dims, scale=1.0, value=None):
        n = 1
        for d in dims:
            n *= d
        vals = [value] * n if value is not None else [self.rng.uniform(-scale, scale) for _ in range(n)]
        self.tensors.append((name, dims, GGML_F32, struct.pack(f"<{n}f", *vals)))

    def f16(self, name, dims):
        """Pseudo-random halves of magnitude 2^-6 .. 2^-3, made bytewise (fast for a vocabulary)."""
        n = 1
        for d in dims:
            n *= d
        # high byte: sign, a 5-bit exponent of 9..12, the mantissa's top 2 bits
        table = bytes((b & 0x80) | ((9 + ((b >> 2) & 3)) << 2) | (b & 3) for b in range(256))
        out = bytearray(2 * n)
        out[0::2] = self.rng.randbytes(n)
        out[1::2] = self.rng.randbytes(n).translate(table)
        self.tensors.append((name, dims, GGML_F16, bytes(out)))

    def write(self, path):
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kvs)) + b"".join(self.kvs)
        infos, offset, blobs = [], 0, []
        for name, dims, ttype, payload in self.tensors:
            infos.append(_str(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ttype, offset))
            pad = (-len(payload)) % ALIGN
            blobs += [payload, bytes(pad)]
            offset += len(payload) + pad
        head += b"".join(infos)
        with open(path, "wb") as f:
            f.write(head + bytes((-len(head)) % ALIGN))
            for b in blobs:
                f.write(b)
        return path


def _text_model(arch, tokenizer, seed, n_layer=2, n_ctx=4096):
    g = Gguf(arch, seed)
    g.raw(tokenizer)
    g.put(U32, f"{arch}.context_length", n_ctx)
    g.put(U32, f"{arch}.embedding_length", N_EMBD)
    g.put(U32, f"{arch}.block_count", n_layer)
    g.put(F32, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    n_vocab = _vocab_size(tokenizer)
    g.f16("token_embd.weight", (N_EMBD, n_vocab))  # the output projection too (tied)
    g.f32("output_norm.weight", (N_EMBD,), value=1.0)
    return g


def _vocab_size(tokenizer):
    for kv in tokenizer:
        r = _Reader(kv)
        if r.key() == b"tokenizer.ggml.tokens":
            r.take("<I")  # ARR
            r.take("<I")  # STR
            return r.take("<Q")
    raise ValueError("no tokenizer.ggml.tokens")


def _attention(g, arch, n_layer, n_head=4, n_ff=128, post_norms=False):
    g.put(U32, f"{arch}.feed_forward_length", n_ff)
    g.put(U32, f"{arch}.attention.head_count", n_head)
    g.put(U32, f"{arch}.attention.head_count_kv", n_head)
    g.put(U32, f"{arch}.rope.dimension_count", N_EMBD // n_head)
    for i in range(n_layer):
        b = f"blk.{i}."
        g.f32(b + "attn_norm.weight", (N_EMBD,), value=1.0)
        for w in ("attn_q", "attn_k", "attn_v", "attn_output"):
            g.f32(b + w + ".weight", (N_EMBD, N_EMBD))
        g.f32(b + "ffn_norm.weight", (N_EMBD,), value=1.0)
        g.f32(b + "ffn_gate.weight", (N_EMBD, n_ff))
        g.f32(b + "ffn_up.weight", (N_EMBD, n_ff))
        g.f32(b + "ffn_down.weight", (n_ff, N_EMBD))
        if post_norms:
            g.f32(b + "post_attention_norm.weight", (N_EMBD,), value=1.0)
            g.f32(b + "post_ffw_norm.weight", (N_EMBD,), value=1.0)


def write_llama(path, tokenizer, n_layer=2):
    """A plain transformer (kdn serves it)."""
    g = _text_model("llama", tokenizer, seed=1, n_layer=n_layer)
    _attention(g, "llama", n_layer)
    return g.write(path)


def write_gemma2(path, tokenizer, n_layer=2, window=64):
    """Gemma-2's layout: every other layer attends to the last `window` tokens only."""
    g = _text_model("gemma2", tokenizer, seed=2, n_layer=n_layer)
    g.put(U32, "gemma2.attention.sliding_window", window)
    g.put(F32, "gemma2.attn_logit_softcapping", 50.0)
    g.put(F32, "gemma2.final_logit_softcapping", 30.0)
    _attention(g, "gemma2", n_layer, post_norms=True)
    return g.write(path)


def _ssm_keys(g, arch, d_state, d_conv, dt_rank):
    g.put(U32, f"{arch}.ssm.conv_kernel", d_conv)
    g.put(U32, f"{arch}.ssm.inner_size", 2 * N_EMBD)  # the only expansion llama.cpp supports
    g.put(U32, f"{arch}.ssm.state_size", d_state)
    g.put(U32, f"{arch}.ssm.time_step_rank", dt_rank)


def _ssm_layer(g, i, d_state, d_conv, dt_rank, norms=False):
    d_inner, b = 2 * N_EMBD, f"blk.{i}."
    g.f32(b + "attn_norm.weight", (N_EMBD,), value=1.0)
    g.f32(b + "ssm_in.weight", (N_EMBD, 2 * d_inner))
    g.f32(b + "ssm_conv1d.weight", (d_conv, d_inner))
    g.f32(b + "ssm_conv1d.bias", (d_inner,))
    g.f32(b + "ssm_x.weight", (d_inner, dt_rank + 2 * d_state))
    g.f32(b + "ssm_dt.weight", (dt_rank, d_inner))
    g.f32(b + "ssm_dt.bias", (d_inner,))
    g.f32(b + "ssm_a", (d_state, d_inner), value=-1.0)  # A = -exp(A_log): negative, decaying
    g.f32(b + "ssm_d", (d_inner,), value=1.0)
    g.f32(b + "ssm_out.weight", (d_inner, N_EMBD))
    if norms:  # Jamba's
        g.f32(b + "ssm_dt_norm.weight", (dt_rank,), value=1.0)
        g.f32(b + "ssm_b_norm.weight", (d_state,), value=1.0)
        g.f32(b + "ssm_c_norm.weight", (d_state,), value=1.0)


def write_mamba(path, tokenizer, n_layer=2, d_state=8, d_conv=4, dt_rank=4):
    """Mamba's layout: a recurrent state per sequence instead of a KV cache."""
    g = _text_model("mamba", tokenizer, seed=3, n_layer=n_layer)
    _ssm_keys(g, "mamba", d_state, d_conv, dt_rank)
    for i in range(n_layer):
        _ssm_layer(g, i, d_state, d_conv, dt_rank)
    return g.write(path)


def write_jamba(path, tokenizer, d_state=8, d_conv=4, dt_rank=4, n_head=4, n_ff=128):
    """Jamba's layout, a hybrid: a Mamba layer (recurrent state), then an attention layer (KV)."""
    g = _text_model("jamba", tokenizer, seed=5, n_layer=2)
    _ssm_keys(g, "jamba", d_state, d_conv, dt_rank)
    g.put(U32, "jamba.feed_forward_length", n_ff)
    g.put(U32, "jamba.attention.head_count", n_head)
    g.put(ARR, "jamba.attention.head_count_kv", (U32, [0, n_head]))  # 0: a recurrent layer
    _ssm_layer(g, 0, d_state, d_conv, dt_rank, norms=True)
    g.f32("blk.1.attn_norm.weight", (N_EMBD,), value=1.0)
    for w in ("attn_q", "attn_k", "attn_v", "attn_output"):
        g.f32(f"blk.1.{w}.weight", (N_EMBD, N_EMBD))
    for i in range(2):
        g.f32(f"blk.{i}.ffn_norm.weight", (N_EMBD,), value=1.0)
        g.f32(f"blk.{i}.ffn_gate.weight", (N_EMBD, n_ff))
        g.f32(f"blk.{i}.ffn_up.weight", (N_EMBD, n_ff))
        g.f32(f"blk.{i}.ffn_down.weight", (n_ff, N_EMBD))
    return g.write(path)


def write_mmproj(path, image_size=28, patch=14, width=32, n_ff=64, hidden=64):
    """A one-block CLIP vision encoder with LLaVA's two-layer MLP projector into N_EMBD: an
    image of image_size² pixels becomes (image_size / patch)² embeddings, i.e. that many media
    positions in the prompt."""
    g = Gguf("clip", seed=4)
    g.put(BOOL, "clip.has_vision_encoder", True)
    g.put(STR, "clip.projector_type", "mlp")
    g.put(BOOL, "clip.use_gelu", True)
    g.put(U32, "clip.vision.image_size", image_size)
    g.put(U32, "clip.vision.patch_size", patch)
    g.put(U32, "clip.vision.embedding_length", width)
    g.put(U32, "clip.vision.feed_forward_length", n_ff)
    g.put(U32, "clip.vision.block_count", 1)
    g.put(U32, "clip.vision.projection_dim", N_EMBD)
    g.put(U32, "clip.vision.attention.head_count", 2)
    g.put(F32, "clip.vision.attention.layer_norm_epsilon", 1e-6)
    g.put(ARR, "clip.vision.image_mean", (F32, [0.5, 0.5, 0.5]))
    g.put(ARR, "clip.vision.image_std", (F32, [0.5, 0.5, 0.5]))
    n_pos = (image_size // patch) ** 2
    g.f32("v.patch_embd.weight", (patch, patch, 3, width), scale=0.02)
    g.f32("v.position_embd.weight", (width, n_pos))
    b = "v.blk.0."
    for ln in ("ln1", "ln2"):
        g.f32(b + ln + ".weight", (width,), value=1.0)
        g.f32(b + ln + ".bias", (width,), value=0.0)
    for w in ("attn_q", "attn_k", "attn_v", "attn_out"):
        g.f32(b + w + ".weight", (width, width))
        g.f32(b + w + ".bias", (width,), value=0.0)
    g.f32(b + "ffn_up.weight", (width, n_ff))
    g.f32(b + "ffn_up.bias", (n_ff,), value=0.0)
    g.f32(b + "ffn_down.weight", (n_ff, width))
    g.f32(b + "ffn_down.bias", (width,), value=0.0)
    g.f32("mm.0.weight", (width, hidden))
    g.f32("mm.0.bias", (hidden,), value=0.0)
    g.f32("mm.2.weight", (hidden, N_EMBD))
    g.f32("mm.2.bias", (N_EMBD,), value=0.0)
    return g.write(path)


def png(width, height, seed):
    """An RGB PNG of pseudo-random pixels (zlib, no filter): a distinct image per seed."""
    import zlib
    rng = random.Random(seed)
    rows = b"".join(b"\x00" + rng.randbytes(3 * width) for _ in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
