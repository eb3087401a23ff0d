#include <kdn/common/model.h>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack: no allocation per key
#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace kdn {
namespace {

// Domain separators keep fingerprints and chunk keys in different hash spaces.
constexpr uint64_t kFingerprintDomain = 0x6b646e2d66707631ull;  // "kdn-fpv1"
constexpr uint64_t kChunkKeyDomain = 0x6b646e2d6b657931ull;     // "kdn-key1"
constexpr uint64_t kContextDomain = 0x6b646e2d63747831ull;      // "kdn-ctx1"
constexpr uint64_t kSegmentSeedDomain = 0x6b646e2d73676231ull;  // "kdn-sgb1"
constexpr uint64_t kSegmentKeyDomain = 0x6b646e2d73676b31ull;   // "kdn-sgk1"

kdn_key to_key(XXH128_hash_t h) noexcept { return kdn_key{h.low64, h.high64}; }

// The canonical byte image of a descriptor: fixed-width little-endian fields in a fixed
// order, so padding and struct_size never enter the fingerprint.
struct CanonicalDesc {
  uint32_t fields[12];
  uint64_t theta_bits;
  uint32_t scaling_bits[4];
  char name[64];
  uint8_t salt[32];
};

}  // namespace

uint32_t dtype_bytes(uint32_t dtype) noexcept {
  switch (dtype) {
    case KDN_DTYPE_F16:
      return 2;
    case KDN_DTYPE_BF16:
      return 2;
    case KDN_DTYPE_F32:
      return 4;
    case KDN_DTYPE_FP8_E4M3:
      return 1;
    default:
      return 0;
  }
}

Result<ModelInfo> ModelInfo::from_desc(const kdn_model_desc& in) noexcept {
  if (in.struct_size != sizeof(kdn_model_desc))
    return Status(Code::kVersion, "model descriptor struct_size does not match this library");
  ModelInfo m{};
  m.desc = in;
  kdn_model_desc& d = m.desc;
  d.name[sizeof(d.name) - 1] = '\0';
  if (d.chunk_tokens == 0) d.chunk_tokens = kDefaultChunkTokens;
  if (d.tp_size == 0) d.tp_size = 1;
  if (d.num_layers == 0 || d.num_layers > kMaxLayers)
    return Status(Code::kInvalidArgument, "num_layers must be in 1..1024");
  if (d.num_kv_heads == 0 || d.num_kv_heads > kMaxHeads)
    return Status(Code::kInvalidArgument, "num_kv_heads must be in 1..1024");
  if (d.head_dim == 0 || d.head_dim > kMaxHeadDim) return Status(Code::kInvalidArgument, "head_dim must be in 1..4096");
  if (d.chunk_tokens > kMaxChunkTokens) return Status(Code::kInvalidArgument, "chunk_tokens must be at most 65536");
  if (dtype_bytes(d.dtype) == 0) return Status(Code::kInvalidArgument, "unknown dtype");
  if (d.rope_style > KDN_ROPE_GPTJ) return Status(Code::kInvalidArgument, "unknown rope_style");
  if (d.rotary_dim == 0) d.rotary_dim = d.head_dim;
  if (d.rotary_dim > d.head_dim || d.rotary_dim % 2 != 0)
    return Status(Code::kInvalidArgument, "rotary_dim must be even and at most head_dim");
  if (d.rope_scaling > KDN_ROPE_SCALING_YARN) return Status(Code::kInvalidArgument, "unknown rope_scaling");
  if (d.k_channel_order > 1) return Status(Code::kInvalidArgument, "unknown k_channel_order");
  if (d.tp_rank >= d.tp_size) return Status(Code::kInvalidArgument, "tp_rank must be < tp_size");
  if (!(d.rope_theta >= 0.0) || d.rope_theta > 1e12) return Status(Code::kInvalidArgument, "rope_theta out of range");
  m.chunk_tokens = d.chunk_tokens;
  m.plane_bytes = uint64_t{d.chunk_tokens} * d.num_kv_heads * d.head_dim * dtype_bytes(d.dtype);
  m.chunk_bytes = m.plane_bytes * 2 * d.num_layers;
  if (m.chunk_bytes > kMaxChunkBytes)
    return Status(Code::kInvalidArgument, "chunk larger than 4 GiB; lower chunk_tokens");

  CanonicalDesc c{};
  const uint32_t f[12] = {1 /* canonical form version */,
                          d.num_layers,
                          d.num_kv_heads,
                          d.head_dim,
                          d.dtype,
                          d.chunk_tokens,
                          d.rope_style,
                          d.rotary_dim,
                          d.rope_scaling,
                          d.k_channel_order,
                          d.tp_rank,
                          d.tp_size};
  std::memcpy(c.fields, f, sizeof f);
  std::memcpy(&c.theta_bits, &d.rope_theta, sizeof c.theta_bits);
  std::memcpy(c.scaling_bits, d.rope_scaling_params, sizeof c.scaling_bits);
  std::memcpy(c.name, d.name, sizeof c.name);
  std::memcpy(c.salt, d.engine_salt, sizeof c.salt);
  m.fingerprint = to_key(XXH3_128bits_withSeed(&c, sizeof c, kFingerprintDomain));
  return m;
}

kdn_key chain_key(const kdn_key* prev, const kdn_key& fingerprint, std::span<const int32_t> chunk_tokens) noexcept {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);  // a stack state must start from a known seed field
  XXH3_128bits_reset_withSeed(&st, kChunkKeyDomain);
  const kdn_key zero{0, 0};
  const kdn_key& p = prev ? *prev : zero;
  const uint8_t has_prev = prev ? 1 : 0;
  XXH3_128bits_update(&st, &has_prev, 1);
  XXH3_128bits_update(&st, &p, sizeof p);
  XXH3_128bits_update(&st, &fingerprint, sizeof fingerprint);
  XXH3_128bits_update(&st, chunk_tokens.data(), chunk_tokens.size_bytes());
  return to_key(XXH3_128bits_digest(&st));
}

namespace {

// H(domain; parts...) over fixed-width fields, on a stack state (no allocation).
class KeyHasher {
 public:
  explicit KeyHasher(uint64_t domain) noexcept {
    XXH3_INITSTATE(&st_);
    XXH3_128bits_reset_withSeed(&st_, domain);
  }
  KeyHasher& add(const void* p, size_t n) noexcept {
    XXH3_128bits_update(&st_, p, n);
    return *this;
  }
  KeyHasher& add(const kdn_key& k) noexcept { return add(&k, sizeof k); }
  kdn_key digest() noexcept { return to_key(XXH3_128bits_digest(&st_)); }

 private:
  XXH3_state_t st_;
};

}  // namespace

kdn_key context_key(const ModelInfo& model, std::span<const int32_t> tokens) noexcept {
  const uint64_t n = tokens.size();
  return KeyHasher(kContextDomain)
      .add(model.fingerprint)
      .add(&n, sizeof n)
      .add(tokens.data(), tokens.size_bytes())
      .digest();
}

uint64_t segment_chunks(const ModelInfo& model, uint64_t n_tokens) noexcept {
  return (n_tokens + model.chunk_tokens - 1) / model.chunk_tokens;
}

size_t segment_keys(const ModelInfo& model, const kdn_key& base_key, int64_t base_pos, std::span<const int32_t> tokens,
                    std::span<kdn_key> keys) noexcept {
  const size_t t = model.chunk_tokens;
  size_t n = static_cast<size_t>(segment_chunks(model, tokens.size()));
  if (n > keys.size()) n = keys.size();
  kdn_key prev =
      KeyHasher(kSegmentSeedDomain).add(model.fingerprint).add(base_key).add(&base_pos, sizeof base_pos).digest();
  for (size_t i = 0; i < n; ++i) {
    const std::span<const int32_t> chunk = tokens.subspan(i * t, std::min(t, tokens.size() - i * t));
    const uint32_t count = static_cast<uint32_t>(chunk.size());
    keys[i] = KeyHasher(kSegmentKeyDomain)
                  .add(prev)
                  .add(model.fingerprint)
                  .add(&count, sizeof count)
                  .add(chunk.data(), chunk.size_bytes())
                  .digest();
    prev = keys[i];
  }
  return n;
}

size_t prefix_keys(const ModelInfo& model, std::span<const int32_t> tokens, std::span<kdn_key> keys) noexcept {
  const size_t t = model.chunk_tokens;
  size_t n = tokens.size() / t;
  if (n > keys.size()) n = keys.size();
  for (size_t i = 0; i < n; ++i)
    keys[i] = chain_key(i ? &keys[i - 1] : nullptr, model.fingerprint, tokens.subspan(i * t, t));
  return n;
}

}  // namespace kdn
