// Where a chunk bound for a T0 with a codec is encoded, and how an encode on the device lays out
// the bounce buffer and the host landing area (docs/gpu.md, "Which copy is encoded where").
//
// A GPU_STORE gathers each chunk into the bounce buffer; with a device codec (int8, kivi4) the
// same stream then encodes it there (kvc1_encode_cuda) and copies the encoder's result head and
// the blob's room into a pinned landing area on the host. Once the store committed, each landed
// blob goes through the encode job's validation (T0EncodeJob with device_blob set) into T0, as a
// host-made blob would: the host checks the bytes but never encodes a chunk that came from a GPU.
//
// Pure C++ (no CUDA): the service and the CPU tests share these plans.
#pragma once

#include "aligned_buffer.h"
#include "pinned_landings.h"
#include "t0_index.h"

#include <kdn/common/status.h>
#include <kdn/kdn.h>
#include <kdn/kernels/codec.h>
#include <kdn/kernels/layout.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kdn::sidecar::gpu {

// How one chunk's device encode uses the bounce buffer [0, bounce_bytes): the chunk at 0, the
// blob at out_offset (room for the worst case, cap), the encoder's scratch at scratch_offset.
// On the host, chunk i of a store lands at i * landing_stride: the result head (head_bytes),
// then the blob's room at head_room.
struct EncodeArea {
  uint64_t out_offset = 0, cap = 0;
  uint64_t scratch_offset = 0, scratch_bytes = 0;
  uint64_t head_bytes = 0, head_room = 0, landing_stride = 0;
  bool fits() const noexcept { return landing_stride != 0; }
};
using EncodeScratchOf = size_t (*)(const kernels::ChunkGeometry&, const kernels::CodecConfig&, uint32_t);
// The area for chunks of `geo` in tier codec `codec_id`; !fits() when the codec has no device
// encoder (scratch_of answers 0: lossless, or a build without CUDA) or the bounce buffer is too
// small for the chunk, the blob and the scratch together.
EncodeArea plan_encode_area(uint64_t bounce_bytes, const kernels::ChunkGeometry& geo, uint8_t codec_id,
                            EncodeScratchOf scratch_of) noexcept;

// Where a chunk bound for T0 is encoded. kDevice: a chunk a GPU_STORE brought, with a codec the
// device encodes and an area that fits. kHost: a chunk that came from T1 (a retrieve's miss, a
// prefetch), or a GPU store's chunk the device cannot encode (lossless; a chunk too large).
enum class EncodeSite : uint8_t { kNone, kDevice, kHost };
EncodeSite t0_encode_site(uint8_t codec_id, bool from_gpu_store, const EncodeArea& area) noexcept;

// The two copies store() queues after chunk i's encode, from the bounce buffer to the landing:
// the result head, then the blob's room (its size is known only once it landed).
struct LandingCopy {
  uint64_t from = 0, to = 0, bytes = 0;
};
std::array<LandingCopy, 2> landing_copies(const EncodeArea& a, uint32_t i) noexcept;

// The size of landed chunk i's blob: the encoder's error (kInvalidArgument for NaN or Inf), or
// kInvalidArgument when the blob would not be smaller than the chunk (it stays in T1 only, as a
// host encode that saves nothing), or kCorrupt for a size past the blob's room.
Result<uint64_t> landed_blob_bytes(const std::byte* landing, const EncodeArea& a, uint32_t i,
                                   uint64_t raw_bytes) noexcept;
inline const std::byte* landed_blob(const std::byte* landing, const EncodeArea& a, uint32_t i) noexcept {
  return landing + uint64_t{i} * a.landing_stride + a.head_room;
}

// One GPU_STORE's device encodes, from queueing until the store committed: the landing (a
// pinned buffer of the service's pool, back in the pool once the last job let go of it), the
// area, and which chunk each landing holds.
struct StoreEncodes {
  PinnedLandings::Landing landing;
  EncodeArea area;
  kernels::ChunkGeometry geo;
  std::vector<T0Key> keys;  // chunk i of the landing
  bool landed = false;      // the batch landed whole: the landings may be read
};

// The landing that holds `key`, or -1 (none, or the store's batch has not landed whole). The
// committed keys come in the store's own order, so the search starts at `cursor`, one past the
// last match, and wraps: one step per key in the usual case, never more than one pass.
int64_t find_landed(const StoreEncodes& enc, const T0Key& key, uint32_t& cursor) noexcept;

}  // namespace kdn::sidecar::gpu
