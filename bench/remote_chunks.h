// The chunks `kdn-bench remote` stores in T3, and the checks of what comes back.
//
// Chunks are 4 KiB-aligned in pre-faulted memory (a stride of the chunk size rounded up to
// 4 KiB, as arena slots are). With the model's chunk size they hold the disk benchmark's
// synthetic KV (kernels/synthetic.h: outlier channels, token-wise locality), so a codec sees
// realistic data: 8 chunks of their own seeds, and every later chunk the layers of one of
// those in a rotated order (no two alike for the first 8 x layers chunks); with any other
// size, a pseudo-random pattern per chunk.
//
// Wrong bytes are counted, not just detected: bytes that differ from what a read should have
// produced. For codec none and lossless that is the chunk itself; a lossy codec's output is
// compared with an independent decode (kvc1_decode on this thread) of the value the store
// holds, whose error against the original is reported beside it.
//
// Thread safety: none.
#pragma once

#include "page_buffer.h"

#include <kdn/common/model.h>
#include <kdn/common/status.h>
#include <kdn/kdn.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kdn::bench {

constexpr uint64_t kSlotAlign = 4096;

inline uint64_t slot_stride(uint64_t chunk_bytes) { return (chunk_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign; }

struct ChunkSet {
  uint64_t chunk_bytes = 0;
  uint64_t stride = 0;
  uint32_t count = 0;
  bool synthetic_kv = false;  // the model's KV (codecs apply); else a pattern
  PageBuffer data;            // chunk i at i * stride
  std::vector<kdn_key> keys;  // chunk i's key

  std::byte* chunk(uint32_t i) noexcept { return data.data() + uint64_t(i) * stride; }
  const std::byte* chunk(uint32_t i) const noexcept { return data.data() + uint64_t(i) * stride; }
};

// `count` chunks of `chunk_bytes`: synthetic KV of `model` when chunk_bytes is its chunk size.
Result<ChunkSet> make_chunks(const ModelInfo& model, uint64_t chunk_bytes, uint32_t count) noexcept;

// Pre-faulted destination slots for `count` chunks of `chunk_bytes` (same stride).
Result<PageBuffer> make_slots(uint64_t chunk_bytes, uint32_t count) noexcept;

// Bytes of got[0, n) that differ from want[0, n).
uint64_t wrong_bytes(const std::byte* got, const std::byte* want, uint64_t n) noexcept;

// Wrong bytes over a whole set read into `slots` (chunk i at i * stride).
uint64_t wrong_bytes(const PageBuffer& slots, const ChunkSet& set) noexcept;

// A stored value checked and decoded here, independently of RemoteTier: the remote header
// (remote_format.h decode_value) against the expectation, then its payload (codec none: as is;
// KVC1: kvc1_decode on this thread) into `out` (chunk_bytes of `model`).
struct ReferenceDecode {
  uint8_t codec = 0;          // remote::RemoteCodec
  uint64_t stored_bytes = 0;  // the payload's size
};
Result<ReferenceDecode> decode_stored_value(const std::string& value, const std::string& name_space, const kdn_key& key,
                                            const ModelInfo& model, std::byte* out) noexcept;

// ||decoded - original||_F / ||original||_F over the chunk (kvc1_quality).
double relative_error(const ModelInfo& model, const std::byte* original, const std::byte* decoded) noexcept;

}  // namespace kdn::bench
