// KVC1 for the tiers that store chunks compressed: T2 at rest and T3 over the wire. Both record
// beside a payload the codec it is in, with the same ids (disk::DiskCodec, remote::RemoteCodec):
// 0 none, 1 lossless, 2 int8, 3 kivi4 (and kTransformCodecId below). A payload in any codec
// but none is a KVC1 blob, checked by its own CRCs and, for lossless, by the XXH3-128 of the chunk it came from. So a
// chunk moves between T2 and T3 without being re-encoded, and both tiers encode and decode here.
//
// ChunkGeometries: the geometry of each model's chunks, learnt from the model table, which an
// encoder needs (a decoder reads it from the blob).
//
// Ownership: callers own every buffer; encode_chunk allocates the blob it returns.
// Thread safety: encode_chunk, decode_chunk and chunk_hash are reentrant and meant for worker
// threads (encode_chunk keeps a thread-local scratch). ChunkGeometries: none (its tier's loop).
#pragma once

#include "aligned_buffer.h"
#include "chunk_calibration.h"

#include <kdn/common/model.h>
#include <kdn/common/status.h>
#include <kdn/kdn.h>
#include <kdn/kernels/codec.h>
#include <kdn/kernels/layout.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace kdn::sidecar {

// The tier codec id of the transform mode (codec_transform.h). No tier record accepts it yet:
// a tier stores transform chunks once it also stores their calibration (docs/codec.md §10.5).
constexpr uint8_t kTransformCodecId = 4;

// The KVC1 mode of a tier codec id (kRaw for 0 and for ids no tier knows).
kernels::CodecMode codec_mode_of(uint8_t codec_id) noexcept;
// The config a tier codec id encodes with: the mode's defaults. encode_chunk and kdnd's device
// encoder (gpu/t0_device_encode.h) both use it, so a device-made blob equals the host's.
kernels::CodecConfig codec_config_of(uint8_t codec_id) noexcept;

// XXH3-128 of a canonical chunk: the raw_hash lossless payloads are checked against.
kdn_key chunk_hash(const void* data, size_t n) noexcept;

class ChunkGeometries {
 public:
  // Remembers the geometry of `model`'s chunks (a failed allocation forgets it: its chunks are
  // then stored raw).
  void learn(const ModelInfo& model) noexcept;
  // The geometry of chunks of `fingerprint`, if known and if such a chunk is `chunk_bytes`
  // long (a partial chunk is not a KVC1 chunk of the model); null otherwise.
  const kernels::ChunkGeometry* find(const kdn_key& fingerprint, uint64_t chunk_bytes) const noexcept;

 private:
  std::unordered_map<kdn_key, kernels::ChunkGeometry, KeyHash> map_;
};

// A chunk as encode_chunk made it.
struct ChunkEncoding {
  AlignedBuffer blob;  // the KVC1 blob in its first `bytes` bytes
  uint64_t bytes = 0;
  uint32_t crc = 0;    // CRC32C of the blob
  kdn_key raw_hash{};  // lossless: chunk_hash() of the chunk; zero otherwise
};

// Encodes the canonical chunk at `chunk` (chunk_bytes(g) bytes) of the model `fingerprint` with
// the tier codec `codec_id` (1..3) into *out. False, with *out empty, when the chunk cannot be
// encoded (NaN or Inf in a quantized mode), when memory runs out, or when the blob would not be
// at least `min_saving` bytes smaller than the chunk: the caller stores the chunk raw. The
// transform mode (kTransformCodecId) codes with `calibration`, which must be of `fingerprint`'s
// model (false without one).
bool encode_chunk(const kernels::ChunkGeometry& g, const kdn_key& fingerprint, const std::byte* chunk, uint8_t codec_id,
                  uint64_t min_saving, ChunkEncoding* out,
                  const kernels::Kvc1Calibration* calibration = nullptr) noexcept;

// Decodes the KVC1 blob [blob, blob + blob_bytes) into the canonical chunk at out[0, raw_bytes).
// The blob must be in the tier codec `codec_id`, describe a chunk of exactly raw_bytes of the
// model `fingerprint`, decode whole, and — lossless — give back bytes whose chunk_hash() is
// raw_hash. Every failure is kCorrupt and leaves `out` holding undefined bytes (never a chunk
// to serve). Nothing outside out[0, raw_bytes) is written. The caller checks the blob's own
// CRC32C (the one its tier recorded) before. A blob that names a calibration decodes with that
// calibration from `calibrations`; when it is not there the result is kNotFound (a miss the
// tier may cure by fetching the object, calibration_store_key), never a decode without it.
Status decode_chunk(const std::byte* blob, uint64_t blob_bytes, uint8_t codec_id, const kdn_key& fingerprint,
                    const kdn_key& raw_hash, std::byte* out, uint64_t raw_bytes,
                    const CalibrationCatalog* calibrations = nullptr) noexcept;

}  // namespace kdn::sidecar
