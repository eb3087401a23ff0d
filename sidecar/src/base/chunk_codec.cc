#include "chunk_codec.h"

#include <kdn/kernels/crc32c.h>

#include <xxhash.h>

#include <new>
#include <vector>

namespace kdn::sidecar {

kernels::CodecMode codec_mode_of(uint8_t codec_id) noexcept {
  switch (codec_id) {
    case 1:
      return kernels::CodecMode::kLossless;
    case 2:
      return kernels::CodecMode::kInt8;
    case 3:
      return kernels::CodecMode::kKivi4;
    case kTransformCodecId:
      return kernels::CodecMode::kTransform;
    default:
      return kernels::CodecMode::kRaw;
  }
}

kdn_key chunk_hash(const void* data, size_t n) noexcept {
  const XXH128_hash_t h = XXH3_128bits(data, n);
  return kdn_key{h.low64, h.high64};
}

// ---- geometries ------------------------------------------------------------------------------------

void ChunkGeometries::learn(const ModelInfo& model) noexcept {
  try {
    map_.emplace(model.fingerprint, kernels::kvc1_geometry(model));
  } catch (const std::bad_alloc&) {}
}

const kernels::ChunkGeometry* ChunkGeometries::find(const kdn_key& fingerprint, uint64_t chunk_bytes) const noexcept {
  auto it = map_.find(fingerprint);
  if (it == map_.end() || kernels::chunk_bytes(it->second) != chunk_bytes) return nullptr;
  return &it->second;
}

kernels::CodecConfig codec_config_of(uint8_t codec_id) noexcept {
  kernels::CodecConfig cfg;
  cfg.mode = codec_mode_of(codec_id);
  return cfg;
}

// ---- encode and decode -----------------------------------------------------------------------------

bool encode_chunk(const kernels::ChunkGeometry& g, const kdn_key& fingerprint, const std::byte* chunk, uint8_t codec_id,
                  uint64_t min_saving, ChunkEncoding* out, const kernels::Kvc1Calibration* calibration) noexcept {
  *out = ChunkEncoding{};
  kernels::CodecConfig cfg = codec_config_of(codec_id);
  if (cfg.mode == kernels::CodecMode::kRaw) return false;
  if (cfg.mode == kernels::CodecMode::kTransform) {
    if (calibration == nullptr || !(calibration->fingerprint == fingerprint)) return false;
    cfg.calibration = calibration;
  }
  const size_t cap = kernels::kvc1_max_encoded_size(g, cfg);
  const size_t scratch_bytes = kernels::kvc1_encode_scratch_bytes(g, cfg);
  const uint64_t raw_bytes = kernels::chunk_bytes(g);
  // Grows to the largest chunk this thread encodes and stays: encoders run on a few
  // long-lived worker threads.
  thread_local std::vector<uint8_t> scratch;
  size_t written = 0;
  try {
    if (scratch.size() < scratch_bytes) scratch.resize(scratch_bytes);
    AlignedBuffer blob(cap);
    if (cap == 0 || blob.data() == nullptr) return false;
    Status st = kernels::kvc1_encode(g, fingerprint, chunk, cfg, reinterpret_cast<uint8_t*>(blob.data()), cap, &written,
                                     scratch.data(), scratch.size());
    if (!st.ok() || written + min_saving > raw_bytes || written >= raw_bytes) return false;
    out->blob = std::move(blob);
  } catch (const std::bad_alloc&) {
    return false;
  }
  out->bytes = written;
  out->crc = kernels::kvc1::crc32c(out->blob.data(), written);
  if (cfg.mode == kernels::CodecMode::kLossless) out->raw_hash = chunk_hash(chunk, raw_bytes);
  return true;
}

Status decode_chunk(const std::byte* blob, uint64_t blob_bytes, uint8_t codec_id, const kdn_key& fingerprint,
                    const kdn_key& raw_hash, std::byte* out, uint64_t raw_bytes,
                    const CalibrationCatalog* calibrations) noexcept {
  const auto* b = reinterpret_cast<const uint8_t*>(blob);
  const kernels::CodecMode mode = codec_mode_of(codec_id);
  kernels::Kvc1Info info;
  if (mode == kernels::CodecMode::kRaw || !kernels::kvc1_inspect(b, blob_bytes, &info).ok())
    return Status(Code::kCorrupt, "a compressed chunk is not a valid KVC1 blob");
  if (info.mode != mode) return Status(Code::kCorrupt, "a compressed chunk is in another codec than recorded");
  if (kernels::chunk_bytes(info.geometry) != raw_bytes || !(info.fingerprint == fingerprint))
    return Status(Code::kCorrupt, "a compressed chunk is of another model or size");
  // Held through the decode: the catalog may drop the object meanwhile.
  CalibrationRef calibration;
  kernels::DecodeOptions opts;
  if (!(info.calibration_id == kdn_key{})) {
    calibration = calibrations == nullptr ? nullptr : calibrations->find(info.calibration_id);
    if (calibration == nullptr) return Status(Code::kNotFound, "the calibration a compressed chunk names is not here");
    opts.calibration = &calibration->view;
  }
  if (!kernels::kvc1_decode(b, blob_bytes, info.geometry, info.fingerprint, out, raw_bytes, opts).ok())
    return Status(Code::kCorrupt, "a compressed chunk did not decode");
  if (mode == kernels::CodecMode::kLossless && !(chunk_hash(out, raw_bytes) == raw_hash))
    return Status(Code::kCorrupt, "a losslessly compressed chunk decoded to other bytes");
  return OkStatus();
}

}  // namespace kdn::sidecar
