#include "remote_chunks.h"

#include "remote_format.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/synthetic.h>

#include <algorithm>
#include <cstring>
#include <span>

namespace kdn::bench {
namespace {

constexpr uint32_t kDistinctKvChunks = 8;  // generated; the rest are their layers rotated

void fill_pattern(std::byte* p, uint64_t n, uint64_t seed) noexcept {
  uint64_t x = (seed * 0x9E3779B97F4A7C15ull) | 1;
  for (uint64_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, size_t(std::min<uint64_t>(8, n - i)));
  }
}

}  // namespace

Result<ChunkSet> make_chunks(const ModelInfo& model, uint64_t chunk_bytes, uint32_t count) noexcept {
  if (chunk_bytes == 0 || count == 0) return Status(Code::kInvalidArgument, "no chunks");
  ChunkSet set;
  set.chunk_bytes = chunk_bytes;
  set.stride = slot_stride(chunk_bytes);
  set.count = count;
  set.synthetic_kv = chunk_bytes == model.chunk_bytes;
  Result<PageBuffer> data = PageBuffer::allocate(set.stride * count, true);
  if (!data.ok()) return data.status();
  set.data = std::move(data).value();
  const kernels::ChunkGeometry g = kernels::chunk_geometry_of(model);
  const uint32_t layers = g.layers;
  const uint64_t layer_bytes = chunk_bytes / std::max<uint32_t>(1, layers);
  for (uint32_t i = 0; i < count; ++i) {
    if (!set.synthetic_kv) {
      fill_pattern(set.chunk(i), chunk_bytes, 1000 + i);
    } else if (i < kDistinctKvChunks) {
      kernels::SyntheticKvParams p;
      p.seed = 1000 + i;
      if (Status st = kernels::fill_synthetic_kv(set.chunk(i), g, p); !st.ok()) return st;
    } else {
      // The generator is slow (~0.3 s per SmolLM2 chunk); later chunks take the layers of one
      // of the first ones in a rotated order: the same statistics per layer, other bytes.
      const uint32_t from = i % kDistinctKvChunks, shift = (i / kDistinctKvChunks) % layers;
      for (uint32_t l = 0; l < layers; ++l) {
        std::memcpy(set.chunk(i) + uint64_t(l) * layer_bytes,
                    set.chunk(from) + uint64_t((l + shift) % layers) * layer_bytes, layer_bytes);
      }
    }
    set.keys.push_back(kdn_key{(i + 1) * 0x9E3779B97F4A7C15ull, 0x6b646e2d62656e63ull ^ i});
  }
  return set;
}

Result<PageBuffer> make_slots(uint64_t chunk_bytes, uint32_t count) noexcept {
  return PageBuffer::allocate(slot_stride(chunk_bytes) * count, true);
}

uint64_t wrong_bytes(const std::byte* got, const std::byte* want, uint64_t n) noexcept {
  uint64_t wrong = 0;
  for (uint64_t at = 0; at < n; at += kSlotAlign) {
    const size_t len = size_t(std::min<uint64_t>(kSlotAlign, n - at));
    if (std::memcmp(got + at, want + at, len) == 0) continue;
    for (size_t i = 0; i < len; ++i) wrong += got[at + i] != want[at + i];
  }
  return wrong;
}

uint64_t wrong_bytes(const PageBuffer& slots, const ChunkSet& set) noexcept {
  uint64_t wrong = 0;
  for (uint32_t i = 0; i < set.count; ++i) {
    wrong += wrong_bytes(slots.data() + uint64_t(i) * set.stride, set.chunk(i), set.chunk_bytes);
  }
  return wrong;
}

Result<ReferenceDecode> decode_stored_value(const std::string& value, const std::string& name_space, const kdn_key& key,
                                            const ModelInfo& model, std::byte* out) noexcept {
  const sidecar::remote::ValueExpectation want{name_space, key, model.fingerprint};
  sidecar::remote::ValueHeader header;
  std::span<const std::byte> payload;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(value.data()), value.size());
  if (Status st = sidecar::remote::decode_value(bytes, want, &header, &payload); !st.ok()) return st;
  if (header.raw_bytes != model.chunk_bytes) return Status(Code::kCorrupt, "a value of another chunk size");
  ReferenceDecode r{uint8_t(header.codec), payload.size()};
  if (header.codec == sidecar::remote::RemoteCodec::kNone) {
    std::memcpy(out, payload.data(), payload.size());
    return r;
  }
  const kernels::ChunkGeometry g = kernels::kvc1_geometry(model);
  Status st = kernels::kvc1_decode(reinterpret_cast<const uint8_t*>(payload.data()), payload.size(), g,
                                   model.fingerprint, out, model.chunk_bytes);
  if (!st.ok()) return st;
  return r;
}

double relative_error(const ModelInfo& model, const std::byte* original, const std::byte* decoded) noexcept {
  const kernels::ChunkGeometry g = kernels::kvc1_geometry(model);
  return kernels::kvc1_quality(g, original, decoded, model.chunk_bytes).rel_frobenius_error;
}

}  // namespace kdn::bench
