// Model descriptors, fingerprints and chunk keys — the identity rules every component shares.
//
// A ModelInfo is the validated form of a kdn_model_desc: it knows the chunk geometry and the
// model fingerprint. Prefix keys chain chunk by chunk (see kdn/kdn.h); they depend only on the
// fingerprint and the token ids, never on the process, so every engine on the node and every
// restart of kdnd agree on them. Hash: XXH3-128 (not cryptographic: a namespace is a trust
// domain, keys only need to be collision-free among honest clients).
#pragma once

#include <kdn/common/status.h>
#include <kdn/kdn.h>

#include <cstddef>
#include <cstdint>
#include <span>

// kdn_key is a C type in the global namespace, so its equality lives there too (ADL).
inline bool operator==(const kdn_key& a, const kdn_key& b) noexcept { return a.lo == b.lo && a.hi == b.hi; }

namespace kdn {

struct KeyHash {
  size_t operator()(const kdn_key& k) const noexcept {
    return static_cast<size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
  }
};

constexpr uint32_t kDefaultChunkTokens = 256;
constexpr uint32_t kMaxLayers = 1024;
constexpr uint32_t kMaxHeads = 1024;
constexpr uint32_t kMaxHeadDim = 4096;
constexpr uint32_t kMaxChunkTokens = 1u << 16;
constexpr uint64_t kMaxChunkBytes = 1ull << 32;  // 4 GiB per chunk is far beyond any real model

uint32_t dtype_bytes(uint32_t dtype) noexcept;  // 0 for an unknown dtype

struct ModelInfo {
  kdn_model_desc desc;  // normalized: defaults filled in, name NUL-terminated
  kdn_key fingerprint;
  uint64_t chunk_bytes;  // L * 2 * T * H * D * elem
  uint64_t plane_bytes;  // T * H * D * elem (one K or V plane of one layer)
  uint32_t chunk_tokens;

  // Validates and normalizes a caller-supplied descriptor (untrusted: any bytes).
  static Result<ModelInfo> from_desc(const kdn_model_desc& desc) noexcept;
};

// Prefix keys of the whole chunks of `tokens`, at most keys.size(); returns how many.
size_t prefix_keys(const ModelInfo& model, std::span<const int32_t> tokens, std::span<kdn_key> keys) noexcept;

// One chaining step, exposed for tests: key of the chunk after `prev` (null for the first).
kdn_key chain_key(const kdn_key* prev, const kdn_key& fingerprint, std::span<const int32_t> chunk_tokens) noexcept;

// ---- segments (non-prefix reuse; docs/blend.md) ---------------------------------------------
// A segment is a span of tokens whose KV was computed at positions base_pos, base_pos + 1, ...
// right after a fixed context (the base: e.g. BOS and a system prompt), and which may be loaded
// at any other position with K re-rotated. Its chunks are keyed independently of where it is
// used:
//     context key   c   = H(fingerprint, tokens of the base context)            ("kdn-ctx1")
//     segment seed  s   = H(fingerprint, c, base_pos)                           ("kdn-sgb1")
//     chunk keys    k_0 = H(s, fingerprint, tokens[0, T)),
//                   k_i = H(k_{i-1}, fingerprint, tokens[iT, min((i+1)T, n)))    ("kdn-sgk1")
// The last chunk may be partial (n not a multiple of T): its key hashes fewer tokens, so it
// never equals a whole chunk's key. The segment's key is its last chunk's key. Every step
// carries the fingerprint, and each kind of key has its own hash domain, so segment keys never
// meet prefix keys or another model's keys.
constexpr uint64_t kMaxSegmentTokens = uint64_t{1} << 24;  // 16 Mi tokens
constexpr int64_t kMaxPosition = int64_t{1} << 40;         // |positions| and |deltas| (RoPE tables)

// The key of a base context (any length, including 0).
kdn_key context_key(const ModelInfo& model, std::span<const int32_t> tokens) noexcept;
// Chunks of a segment of n tokens: ceil(n / chunk_tokens).
uint64_t segment_chunks(const ModelInfo& model, uint64_t n_tokens) noexcept;
// The chunk keys of a segment, at most keys.size() of them; returns how many were written.
// base_key is a context_key (or {0, 0} for none); base_pos must be in [0, kMaxPosition].
size_t segment_keys(const ModelInfo& model, const kdn_key& base_key, int64_t base_pos, std::span<const int32_t> tokens,
                    std::span<kdn_key> keys) noexcept;

}  // namespace kdn
