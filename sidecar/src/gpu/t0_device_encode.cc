#include "t0_device_encode.h"

#include "chunk_codec.h"

#include <kdn/kernels/codec_cuda.h>

namespace kdn::sidecar::gpu {
namespace {

constexpr uint64_t kAlign = 256;

uint64_t round_up(uint64_t v) noexcept { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

EncodeArea plan_encode_area(uint64_t bounce_bytes, const kernels::ChunkGeometry& geo, uint8_t codec_id,
                            EncodeScratchOf scratch_of) noexcept {
  const kernels::CodecConfig cfg = codec_config_of(codec_id);
  if (cfg.mode != kernels::CodecMode::kInt8 && cfg.mode != kernels::CodecMode::kKivi4) return {};
  const uint64_t chunk = kernels::chunk_bytes(geo), cap = kernels::kvc1_max_encoded_size(geo, cfg);
  const uint64_t scratch = scratch_of(geo, cfg, 1);
  if (chunk == 0 || cap == 0 || scratch == 0) return {};
  EncodeArea a;
  a.out_offset = round_up(chunk);
  a.cap = cap;
  a.scratch_offset = a.out_offset + round_up(cap);
  a.scratch_bytes = scratch;
  if (a.scratch_offset + scratch > bounce_bytes) return {};
  a.head_bytes = kernels::kvc1_cuda_encode_head_bytes(1);
  a.head_room = round_up(a.head_bytes);
  a.landing_stride = a.head_room + round_up(cap);
  return a;
}

EncodeSite t0_encode_site(uint8_t codec_id, bool from_gpu_store, const EncodeArea& area) noexcept {
  if (codec_id == 0) return EncodeSite::kNone;
  return from_gpu_store && area.fits() ? EncodeSite::kDevice : EncodeSite::kHost;
}

std::array<LandingCopy, 2> landing_copies(const EncodeArea& a, uint32_t i) noexcept {
  const uint64_t at = uint64_t{i} * a.landing_stride;
  return {LandingCopy{a.scratch_offset, at, a.head_bytes}, LandingCopy{a.out_offset, at + a.head_room, a.cap}};
}

Result<uint64_t> landed_blob_bytes(const std::byte* landing, const EncodeArea& a, uint32_t i,
                                   uint64_t raw_bytes) noexcept {
  uint64_t size = 0;
  KDN_RETURN_IF_ERROR(kernels::kvc1_cuda_encode_result_of(landing + uint64_t{i} * a.landing_stride, 1, &size));
  if (size == 0 || size > a.cap) return Status(Code::kCorrupt, "the device encoder reported a blob past its room");
  if (size >= raw_bytes) return Status(Code::kInvalidArgument, "the blob would not be smaller than the chunk");
  return size;
}

int64_t find_landed(const StoreEncodes& enc, const T0Key& key, uint32_t& cursor) noexcept {
  const size_t n = enc.keys.size();
  if (!enc.landed || n == 0) return -1;
  for (size_t step = 0; step < n; ++step) {
    const size_t i = (cursor + step) % n;
    if (enc.keys[i] == key) {
      cursor = uint32_t((i + 1) % n);
      return int64_t(i);
    }
  }
  return -1;
}

}  // namespace kdn::sidecar::gpu
