// Encoder internals of transform-coded planes (encode_transform.cc), used by encoder.cc.
#pragma once

#include "encoder.h"

#include <kdn/kernels/codec_transform.h>

#include <cstddef>
#include <cstdint>

namespace kdn::kernels::kvc1 {

// Scratch of a transform plane, beside the segment writer's EncodeScratch (whose rows are
// band rows of up to kv_heads * head_dim codes).
struct TransformScratch {
  float* coords;      // tokens x kv_heads x head_dim: the rows on the calibrated axes
  float* basis_t;     // head_dim x head_dim: one head's axes, transposed
  float* row;         // head_dim: one source row as f32
  double* mean;       // kv_heads x head_dim: per coordinate (first the calibrated variances)
  double* stdev;      // kv_heads x head_dim
  float* scale;       // kv_heads x head_dim: stored S widened to f32
  float* zero;        // kv_heads x head_dim: stored Z
  float* lo;          // kv_heads x head_dim: smallest value of each coordinate
  float* hi;          // kv_heads x head_dim: largest
  uint8_t* widths;    // kv_heads x head_dim: allotted (the step's resolution)
  uint8_t* coded;     // kv_heads x head_dim: stored (levels enough for the chunk's range)
  uint32_t* columns;  // kv_heads x head_dim: one band's coordinates
};

size_t transform_scratch_bytes(const ChunkGeometry& g, uint32_t block_tokens) noexcept;
bool carve_transform_scratch(void* scratch, size_t bytes, const ChunkGeometry& g, uint32_t block_tokens,
                             TransformScratch* ts, EncodeScratch* sc) noexcept;

// (layer, plane, head)'s calibrated mean[D], variance[D] and axes[D][D] (contiguous).
const float* calibration_head(const Kvc1Calibration& cal, uint32_t layer, uint32_t plane, uint32_t head) noexcept;

// Widths (kv_heads x head_dim, 0..8) of (layer, plane) at mean_bits per coordinate: reverse
// water-filling on the calibrated variances with the Gaussian quantizer's error per width.
// `var` is kv_heads x head_dim doubles of scratch.
void allot_widths(const Kvc1Calibration& cal, uint32_t layer, uint32_t plane, double mean_bits, double* var,
                  uint8_t* w) noexcept;

// Writes the kCodecTransform plane record of (layer, plane) at out.pos and sets `spec` to its
// codec and width (the largest coordinate width).
Status write_transform_plane(const ChunkGeometry& g, const void* chunk, uint32_t layer, uint32_t plane, PlaneSpec& spec,
                             const EncodePlan& plan, TransformScratch& ts, EncodeScratch& sc, OutBuf& out) noexcept;

}  // namespace kdn::kernels::kvc1
