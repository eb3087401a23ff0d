// KVC1 transform coding: the calibration object and its use (docs/codec.md §10).
//
// A calibration holds, for every (layer, plane, kv head) of one model, the mean of that head's
// rows and an orthonormal basis of head_dim vectors (the principal axes of the rows' covariance,
// Karhunen-Loeve), with the variance of the rows along each axis, in descending order. It is
// computed once per model from stored chunks (kvc1_calibrate) and is itself a versioned,
// CRC-checked object ("KDNKVT1") whose 128-bit id (a hash of all its bytes) a transform-coded
// blob records: a blob decodes only with the calibration it was coded with.
//
// The transform mode (CodecMode::kTransform) codes each head's row x as y = U (x - mean),
// gives each coordinate of y a width by its calibrated variance (greedy reverse water-filling
// to CodecConfig::transform_mean_bits per element), quantizes it uniformly with a step fitted
// to the chunk's own spread of that coordinate and entropy-codes the codes with the codec's
// rANS, one segment per width.
//
// Ownership: every function works on caller memory. kvc1_calibrate allocates its accumulators
// (calibration is an offline step); kvc1_calibration_open does not allocate, and the view it
// fills points into the caller's bytes, which must outlive it.
// Thread safety: reentrant; a Kvc1Calibration view may be shared by any number of threads.
// Untrusted input: kvc1_calibration_open validates everything (magic, version, sizes, CRCs,
// finite values, |basis entries| <= 1, non-negative variances) before a view exists.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kdn.h>
#include <kdn/kernels/codec.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace kdn::kernels {

// A validated calibration object (the bytes stay the caller's).
struct Kvc1Calibration {
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  kdn_key id{};           // names the object in the blobs coded with it
  kdn_key fingerprint{};  // the model it belongs to
  uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  uint32_t samples = 0;  // token rows per head it was computed from
};

// Size of the calibration object of a geometry (only layers, kv_heads and head_dim matter);
// 0 if the geometry is out of the codec's range.
size_t kvc1_calibration_bytes(const ChunkGeometry& g) noexcept;

// One canonical chunk to learn from. A chunk that starts its sequence (pos_base 0) leaves its
// first kDefaultSinkTokens rows out: the codec stores them exactly, and their outliers would
// tilt the axes every other row is coded on.
struct Kvc1CalibrationSample {
  const void* chunk = nullptr;
  int64_t pos_base = 0;
};

// Computes the calibration of `fingerprint`'s model from `samples` (chunks of geometry g, NaN
// and Inf rows skipped) into out[0, cap). Errors: kInvalidArgument (bad geometry, no samples,
// fewer than 2 usable rows), kNoSpace (cap < kvc1_calibration_bytes), kNoMemory.
// Deterministic: the same samples give the same bytes, hence the same id.
Status kvc1_calibrate(const ChunkGeometry& g, const kdn_key& fingerprint,
                      std::span<const Kvc1CalibrationSample> samples, uint8_t* out, size_t cap,
                      size_t* written) noexcept;

// Validates a calibration object (4-byte aligned) and describes it. kCorrupt for anything
// damaged, kVersion for an unknown major version.
Status kvc1_calibration_open(const uint8_t* object, size_t len, Kvc1Calibration* out) noexcept;

}  // namespace kdn::kernels
