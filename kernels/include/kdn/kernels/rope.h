// RoPE re-positioning of cached K: rotate by delta = new position - old position.
//
// For rotary dim R and pair i in [0, R/2), with inv_freq[i] from the model's RoPE settings:
//     phi = delta * inv_freq[i]
//     x'  = x * cos(phi) - y * sin(phi),   y' = y * cos(phi) + x * sin(phi)
// NeoX pairs channel i with i + R/2; GPT-J pairs 2i with 2i + 1; channels >= R pass through.
// Pairs are named in the CANONICAL (chunk) channel order; a llama.cpp engine view's K permutation
// is applied after rotation, on store. V is never rotated.
//
// Why a delta and not "un-rotate old, rotate new": R(p1) = R(p1 - p0) R(p0) for unit rotations,
// so one rotation by delta is exact for every scaling, including YaRN, whose engine-side cos/sin
// carry mscale (un-rotating with scaled tables multiplies K by mscale^2).
//
// Precision. cos/sin are computed on the host in fp64 from (double)delta * (double)inv_freq[i]
// and rounded once to fp32 into a RopeTable; rotation runs in fp32 (each op rounded once) and the
// result is rounded once to the destination dtype. Because the table is built on the host, the CPU
// and CUDA launchers produce bit-identical results.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kdn.h>
#include <kdn/kernels/hd.h>

#include <cstddef>
#include <cstdint>

namespace kdn::kernels {

enum class RopeStyle : uint32_t {
  kNeox = 1,  // KDN_ROPE_NEOX
  kGptj = 2,  // KDN_ROPE_GPTJ
};

enum class RopeScaling : uint32_t {
  kNone = 0,    // KDN_ROPE_SCALING_NONE
  kLinear = 1,  // params: [factor]
  kLlama3 = 2,  // params: [factor, low_freq_factor, high_freq_factor, original_max_position]
  kYarn = 3,    // params: [factor, original_max_position, beta_fast (0: 32), beta_slow (0: 1)]
};

// The RoPE part of a model descriptor (kdn_model_desc: rope_theta, rotary_dim, rope_scaling,
// rope_scaling_params keep the same meaning).
struct RopeConfig {
  RopeStyle style = RopeStyle::kNeox;
  uint32_t head_dim = 0;
  uint32_t rotary_dim = 0;  // 0: head_dim; must be even and <= head_dim
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  float scaling_params[4] = {0, 0, 0, 0};
};

Status validate_rope(const RopeConfig& cfg) noexcept;

// The RoPE settings of a model descriptor, validated (kUnsupported for KDN_ROPE_NONE).
Status rope_config_from_desc(const kdn_model_desc& desc, RopeConfig* out) noexcept;
uint32_t rotary_dim_of(const RopeConfig& cfg) noexcept;  // rotary_dim or head_dim

// Fills inv_freq[0, R/2) exactly as the engines define it (vLLM's rotary_embedding formulas),
// evaluated in fp64 and rounded once to fp32:
//   none/linear: 1 / theta^(2i/R), linear additionally divides by factor (positions / factor);
//   llama3: wavelength-banded division by factor with smooth interpolation between the bands;
//   yarn: ramp-blended interpolation/extrapolation between beta_fast and beta_slow rotations.
// YaRN's mscale scales cos/sin inside the engine; delta rotation does not use it (see above).
Status compute_inv_freq(const RopeConfig& cfg, float* inv_freq, size_t n) noexcept;

// YaRN's attention scale (0.1 ln(factor) + 1 for factor > 1, else 1), for reference and tests.
double yarn_mscale(double factor) noexcept;

// cos/sin of delta * inv_freq[i] for one or more deltas. Row r holds rotary_dim floats: the R/2
// cosines, then the R/2 sines (split, so row loops vectorize). Caller-owned; build it with
// build_rope_table. For CUDA ops `cos_sin` must be device-readable (build on the host, then copy).
struct RopeTable {
  RopeStyle style = RopeStyle::kNeox;
  uint32_t rotary_dim = 0;
  const float* cos_sin = nullptr;  // [rows][cos R/2 | sin R/2]
  uint32_t per_token = 0;          // 0: row 0 for every token; 1: row t for chunk token t
};

// Floats the table needs: rows * rotary_dim (cos and sin for rotary_dim / 2 pairs per row).
size_t rope_table_floats(uint32_t rows, uint32_t rotary_dim) noexcept;

// Writes row r = cos, sin of deltas[r] * inv_freq[i] for r < n_deltas. |delta| <= 2^40.
Status build_rope_table(const float* inv_freq, uint32_t rotary_dim, const int64_t* deltas, uint32_t n_deltas,
                        float* out, size_t out_floats) noexcept;

// ---- per-element bodies -----------------------------------------------------------------------

// Channels (a, b) of rotary pair i in canonical order.
KDN_HD_INLINE void rope_pair_channels(RopeStyle style, uint32_t rotary_dim, uint32_t i, uint32_t* a, uint32_t* b) {
  if (style == RopeStyle::kNeox) {
    *a = i;
    *b = i + rotary_dim / 2;
  } else {
    *a = 2 * i;
    *b = 2 * i + 1;
  }
}

// The table row (cosines, then sines) for chunk token t.
KDN_HD_INLINE const float* rope_row_of(const RopeTable& rt, uint32_t token) {
  const uint64_t row = rt.per_token ? token : 0;
  return rt.cos_sin + row * rt.rotary_dim;
}

// Rotates (x, y) by the angle whose cosine and sine are c and s; fp32, each op rounded once.
KDN_HD_INLINE void rope_rotate(float x, float y, float c, float s, float* xo, float* yo) {
  *xo = fsub_rn(fmul_rn(x, c), fmul_rn(y, s));
  *yo = fadd_rn(fmul_rn(y, c), fmul_rn(x, s));
}

// Rotates a row of head_dim f32 values (canonical order) in place for chunk token t.
KDN_HD_INLINE void rope_row_f32(const RopeTable& rt, uint32_t token, float* row) {
  const uint32_t half = rt.rotary_dim / 2;
  const float* cs = rope_row_of(rt, token);
  for (uint32_t i = 0; i < half; ++i) {
    uint32_t a, b;
    rope_pair_channels(rt.style, rt.rotary_dim, i, &a, &b);
    rope_rotate(row[a], row[b], cs[i], cs[half + i], &row[a], &row[b]);
  }
}

}  // namespace kdn::kernels
