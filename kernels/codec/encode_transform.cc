// KVC1 encoder: transform-coded planes (kCodecTransform, docs/codec.md §10). Each (token, head)
// row is moved onto the calibrated axes of its head, every coordinate gets a width by its
// calibrated variance (reverse water-filling), a uniform step fitted to the chunk's own spread
// of it, and the codes of each width go to one band segment coded like any other segment.
#include "encode_transform.h"

#include "quant.h"
#include "transform_format.h"

#include <kdn/kernels/codec_transform.h>
#include <kdn/kernels/dtype.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kdn::kernels::kvc1 {
namespace {

Status no_space() { return Status(Code::kNoSpace, "KVC1 output buffer too small"); }

size_t align64(size_t v) { return (v + 63) & ~size_t{63}; }

// Mean squared error of Max's uniform quantizer on a unit-variance Gaussian at b bits, and the
// drop one more bit buys (decreasing in b, so water-filling on it is the greedy optimum).
constexpr double kGaussianMse[9] = {1.0, 0.3634, 0.1188, 0.03744, 0.01154, 0.00349, 0.001035, 0.000303, 0.000087};

uint32_t bits_at(double variance, double level) {
  uint32_t b = 0;
  while (b < 8 && variance * (kGaussianMse[b] - kGaussianMse[b + 1]) > level) ++b;
  return b;
}

uint64_t widths_at(const double* var, uint32_t n, double level, uint8_t* w) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; ++i) total += w[i] = static_cast<uint8_t>(bits_at(var[i], level));
  return total;
}

Header plane_header(const ChunkGeometry& g) { return geometry_header(g); }

// The coordinates of one plane: y = U (x - mean) for every coded, non-exact row; false if a
// row holds NaN or Inf.
bool transform_rows(const Source& src, const Plane& pl, const Kvc1Calibration& cal, TransformScratch& ts) {
  const ChunkGeometry& g = src.g;
  const uint32_t d = g.head_dim;
  for (uint32_t h = 0; h < g.kv_heads; ++h) {
    const float* head = calibration_head(cal, src.layer, src.plane, h);
    const float* basis = head + 2 * d;
    for (uint32_t k = 0; k < d; ++k)  // the transpose, so the products below run over j
      for (uint32_t j = 0; j < d; ++j) ts.basis_t[size_t{k} * d + j] = basis[size_t{j} * d + k];
    for (uint32_t t = pl.exact_tokens; t < coded_tokens(plane_header(g), pl); ++t) {
      if (!src.row_f32(t, h, ts.row)) return false;
      float* y = ts.coords + (size_t{t} * g.kv_heads + h) * d;
      std::fill(y, y + d, 0.0f);
      for (uint32_t k = 0; k < d; ++k) {
        const float c = ts.row[k] - head[k];
        const float* ut = ts.basis_t + size_t{k} * d;
        for (uint32_t j = 0; j < d; ++j) y[j] = y[j] + ut[j] * c;
      }
    }
  }
  return true;
}

// Mean and standard deviation of each coordinate over the coded, non-exact rows.
void coordinate_moments(const ChunkGeometry& g, const Plane& pl, TransformScratch& ts) {
  const size_t n = size_t{g.kv_heads} * g.head_dim;
  const uint32_t t0 = pl.exact_tokens, t1 = g.tokens - pl.exact_tail_tokens;
  for (size_t i = 0; i < n; ++i) {
    if (t1 <= t0) {  // every row exact: the coordinates are never used
      ts.mean[i] = ts.stdev[i] = 0;
      ts.lo[i] = ts.hi[i] = 0;
      continue;
    }
    double s = 0, s2 = 0;
    float lo = INFINITY, hi = -INFINITY;
    for (uint32_t t = t0; t < t1; ++t) {
      const float y = ts.coords[size_t{t} * n + i];
      s += y;
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
    ts.lo[i] = lo;
    ts.hi[i] = hi;
    const double mean = s / (t1 - t0);
    for (uint32_t t = t0; t < t1; ++t) {
      const double e = ts.coords[size_t{t} * n + i] - mean;
      s2 += e * e;
    }
    ts.mean[i] = mean;
    ts.stdev[i] = std::sqrt(s2 / (t1 - t0));
  }
}

uint32_t to_scale(float v, uint8_t sd, float* stored) {
  if (sd == kScaleF32) {
    *stored = v;
    return bits_as<uint32_t>(v);
  }
  const uint16_t h = f32_to_f16(v);
  *stored = f16_to_f32(h);
  return h;
}

void store_value(uint8_t* p, uint64_t i, uint8_t sd, uint32_t bits) {
  if (sd == kScaleF16) {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(p + 2 * i, &h, 2);
  } else {
    std::memcpy(p + 4 * i, &bits, 4);
  }
}

// Levels from Z to hi at step S, as a width (at most 9: more than the format holds).
uint32_t width_for(float lo_z, float hi, float s) {
  const double levels = std::floor((static_cast<double>(hi) - lo_z) / s + 0.5) + 1;
  uint32_t w = 1;
  while (w < 9 && levels > static_cast<double>(1u << w)) ++w;
  return w;
}

// S and Z of coordinate i with resolution width w > 0, and the width stored: the step is
// Max's for w at the chunk's stdev, the levels start at the chunk's minimum and go up to its
// maximum, so nothing is clamped (rare extremes of K set the largest attention scores) and the
// extra levels cost the entropy coder little; above 8 bits the step widens to fit 256 levels.
bool coordinate_scale(size_t i, uint32_t w, uint8_t sd, TransformScratch& ts, uint32_t* s_bits, uint32_t* z_bits) {
  GroupScale gs;
  if (!group_scale_body(ts.lo[i], ts.lo[i], 8, sd, &gs)) return false;  // Z: the minimum rounded down
  float sv = 0;
  *s_bits = to_scale(static_cast<float>(gaussian_step(w) * ts.stdev[i]), sd, &sv);
  *z_bits = gs.z_bits;
  uint32_t coded = sv > 0 ? width_for(gs.z, ts.hi[i], sv) : 1;
  if (coded > 8) {
    if (!group_scale_body(ts.lo[i], ts.hi[i], 8, sd, &gs)) return false;
    *s_bits = gs.s_bits;
    sv = gs.s;
    coded = 8;
  }
  ts.scale[i] = sv;
  ts.zero[i] = gs.z;
  ts.coded[i] = static_cast<uint8_t>(coded);
  return std::isfinite(sv);
}

// S and Z of every coordinate into params (S at `s`, Z after the n S values) and the stored
// widths into ts.coded; false if a value does not fit the scale dtype. A coordinate of width
// 0 decodes as its chunk mean (S = 0, Z = mean).
bool write_scales(const uint8_t* w, size_t n, uint8_t sd, TransformScratch& ts, uint8_t* s) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t sb = 0, zb = 0;
    if (w[i] == 0) {
      float zv = 0;
      zb = to_scale(static_cast<float>(ts.mean[i]), sd, &zv);
      if (!std::isfinite(zv)) return false;
      ts.scale[i] = 0;
      ts.zero[i] = zv;
      ts.coded[i] = 0;
    } else if (!coordinate_scale(i, w[i], sd, ts, &sb, &zb)) {
      return false;
    }
    store_value(s, i, sd, sb);
    store_value(s, n + i, sd, zb);
  }
  return true;
}

// Exact rows E[row][h][d] in the chunk dtype (leading, then trailing); false on NaN or Inf.
bool write_exact(const Source& src, const Plane& pl, float* row, uint8_t* at) {
  const ChunkGeometry& g = src.g;
  const size_t bytes = size_t{g.head_dim} * dtype_size(g.dtype);
  for (uint32_t t = 0; t < g.tokens; ++t) {
    if (!is_exact_token(pl, g.tokens, t)) continue;
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      if (!src.row_f32(t, h, row)) return false;
      std::memcpy(at, static_cast<const uint8_t*>(src.chunk) + src.index(t, h, 0) * dtype_size(g.dtype), bytes);
      at += bytes;
    }
  }
  return true;
}

Status write_params(const Source& src, Plane& pl, const EncodePlan& plan, TransformScratch& ts, OutBuf& out) {
  const Header hdr = plane_header(src.g);
  const size_t n = size_t{src.g.kv_heads} * src.g.head_dim;
  const size_t at = out.pos;
  for (uint8_t sd : {kScaleF16, kScaleF32}) {
    if (sd == kScaleF16 && plan.f32_scales) continue;
    pl.scale_dtype = sd;
    const uint64_t bytes = tc_params_bytes(hdr, pl);
    if (!out.reserve(bytes)) return no_space();
    std::memset(out.data + at, 0, bytes);
    if (!write_scales(ts.widths, n, sd, ts, out.data + at + tc_scale_offset(hdr))) continue;
    std::memcpy(out.data + at, ts.coded, n);
    if (exact_rows(pl) && !write_exact(src, pl, ts.row, out.data + at + tc_exact_offset(hdr, pl)))
      return Status(Code::kInvalidArgument, "NaN or Inf in a chunk to quantize");
    pl.params_bytes = static_cast<uint32_t>(bytes);
    out.pos = at + bytes;
    return OkStatus();
  }
  return Status(Code::kInvalidArgument, "chunk values span more than fp32 scales can hold");
}

// The codes of band `width` (its columns in head-major order) into sc.symbols, one row per
// coded token; exact leading rows get zero placeholders.
uint32_t band_symbols(const ChunkGeometry& g, const Plane& pl, uint32_t width, TransformScratch& ts,
                      EncodeScratch& sc) {
  const size_t n = size_t{g.kv_heads} * g.head_dim;
  uint32_t cols = 0;
  for (size_t i = 0; i < n; ++i)
    if (ts.coded[i] == width) ts.columns[cols++] = static_cast<uint32_t>(i);
  const uint32_t qmax = (1u << width) - 1;
  for (uint32_t t = 0; t < coded_tokens(plane_header(g), pl); ++t) {
    uint8_t* row = sc.symbols + size_t{t} * cols;
    if (t < pl.exact_tokens) {
      std::memset(row, 0, cols);
      continue;
    }
    const float* y = ts.coords + size_t{t} * n;
    for (uint32_t c = 0; c < cols; ++c) {
      const uint32_t i = ts.columns[c];
      row[c] = static_cast<uint8_t>(quantize_value(y[i], ts.scale[i], ts.zero[i], qmax));
    }
  }
  return cols;
}

Status write_bands(const ChunkGeometry& g, const Plane& pl, const EncodePlan& plan, TransformScratch& ts,
                   EncodeScratch& sc, OutBuf& out, uint32_t* n_segments) {
  const uint32_t present = widths_present(ts.coded, uint64_t{g.kv_heads} * g.head_dim);
  const uint32_t n_seg = static_cast<uint32_t>(__builtin_popcount(present));
  const size_t payload = out.pos;
  if (!out.zeros(size_t{n_seg} * kSegmentDirEntryBytes)) return no_space();
  for (uint32_t s = 0; s < n_seg; ++s) {
    if (!out.pad16()) return no_space();
    const size_t seg = out.pos;
    const uint32_t width = band_width(present, s);
    const uint32_t cols = band_symbols(g, pl, width, ts, sc);
    KDN_RETURN_IF_ERROR(write_segment(coded_tokens(plane_header(g), pl), cols, width, plan, sc, out));
    out.st32(payload + 8 * size_t{s}, static_cast<uint32_t>(seg - payload));
    out.st32(payload + 8 * size_t{s} + 4, static_cast<uint32_t>(out.pos - seg));
  }
  *n_segments = n_seg;
  return OkStatus();
}

}  // namespace

void allot_widths(const Kvc1Calibration& cal, uint32_t layer, uint32_t plane, double mean_bits, double* var,
                  uint8_t* w) noexcept {
  const uint32_t d = cal.head_dim, n = cal.kv_heads * d;
  for (uint32_t h = 0; h < cal.kv_heads; ++h) {
    const float* v = calibration_head(cal, layer, plane, h) + d;
    for (uint32_t j = 0; j < d; ++j) var[h * d + j] = v[j];
  }
  const uint64_t budget = static_cast<uint64_t>(std::llround(std::min(mean_bits, 8.0) * n));
  // Bisection on the water level: the lowest level whose widths fit the budget.
  double lo = 0, hi = 0;
  for (uint32_t i = 0; i < n; ++i) hi = std::max(hi, var[i]);
  for (int it = 0; it < 100 && hi > 0; ++it) {
    const double mid = 0.5 * (lo + hi);
    (widths_at(var, n, mid, w) > budget ? lo : hi) = mid;
  }
  if (widths_at(var, n, hi, w) == 0) w[0] = 1;  // at least one coded coordinate
}

size_t transform_scratch_bytes(const ChunkGeometry& g, uint32_t block_tokens) noexcept {
  ChunkGeometry band = g;
  band.head_dim = g.kv_heads * g.head_dim;
  const size_t n = band.head_dim, d = g.head_dim;
  return 64 + align64(4 * size_t{g.tokens} * n) + align64(4 * d * d) + align64(4 * d) + 4 * align64(8 * n) +
         2 * align64(4 * n) + 2 * align64(n) + align64(4 * n) + encode_scratch_bytes(band, block_tokens);
}

bool carve_transform_scratch(void* scratch, size_t bytes, const ChunkGeometry& g, uint32_t block_tokens,
                             TransformScratch* ts, EncodeScratch* sc) noexcept {
  if (!scratch || bytes < transform_scratch_bytes(g, block_tokens)) return false;
  auto* p = reinterpret_cast<uint8_t*>(align64(reinterpret_cast<uintptr_t>(scratch)));
  auto take = [&p](size_t k) {
    uint8_t* at = p;
    p += align64(k);
    return at;
  };
  const size_t n = size_t{g.kv_heads} * g.head_dim, d = g.head_dim;
  ts->coords = reinterpret_cast<float*>(take(4 * size_t{g.tokens} * n));
  ts->basis_t = reinterpret_cast<float*>(take(4 * d * d));
  ts->row = reinterpret_cast<float*>(take(4 * d));
  ts->mean = reinterpret_cast<double*>(take(8 * n));
  ts->stdev = reinterpret_cast<double*>(take(8 * n));
  ts->scale = reinterpret_cast<float*>(take(8 * n));
  ts->zero = reinterpret_cast<float*>(take(8 * n));
  ts->lo = reinterpret_cast<float*>(take(4 * n));
  ts->hi = reinterpret_cast<float*>(take(4 * n));
  ts->widths = take(n);
  ts->coded = take(n);
  ts->columns = reinterpret_cast<uint32_t*>(take(4 * n));
  ChunkGeometry band = g;
  band.head_dim = static_cast<uint32_t>(n);
  const size_t used = static_cast<size_t>(p - static_cast<uint8_t*>(scratch));
  return carve_scratch(p, bytes - used, band, block_tokens, sc);
}

Status write_transform_plane(const ChunkGeometry& g, const void* chunk, uint32_t layer, uint32_t plane, PlaneSpec& spec,
                             const EncodePlan& plan, TransformScratch& ts, EncodeScratch& sc, OutBuf& out) noexcept {
  const Kvc1Calibration& cal = *plan.calibration;
  const uint64_t n = uint64_t{g.kv_heads} * g.head_dim;
  allot_widths(cal, layer, plane, plan.transform_bits, ts.mean, ts.widths);  // mean: scratch for the variances
  spec = PlaneSpec{kCodecTransform, 8, 0, kTransformNone, plan.exact_tokens, plan.exact_tail_tokens};
  Plane pl = spec_plane(spec, 0);
  const Source src{chunk, g, layer, plane};
  if (!transform_rows(src, pl, cal, ts)) return Status(Code::kInvalidArgument, "NaN or Inf in a chunk to quantize");
  coordinate_moments(g, pl, ts);
  const size_t at = out.pos;
  if (!out.zeros(kPlaneHeaderBytes)) return no_space();
  KDN_RETURN_IF_ERROR(write_params(src, pl, plan, ts, out));
  uint8_t bits = 0;
  for (uint64_t i = 0; i < n; ++i) bits = std::max(bits, ts.coded[i]);
  spec.bits = bits;
  if (!out.pad16()) return no_space();
  const size_t payload = out.pos;
  uint32_t n_seg = 0;
  KDN_RETURN_IF_ERROR(write_bands(g, pl, plan, ts, sc, out, &n_seg));
  out.data[at] = kCodecTransform;
  out.data[at + 1] = bits;
  out.data[at + 2] = pl.scale_dtype;
  out.st32(at + 8, n_seg);
  out.st32(at + 12, pl.params_bytes);
  out.st32(at + 16, static_cast<uint32_t>(out.pos - payload));
  out.st32(at + 20, pl.exact_tokens);
  out.st32(at + 24, pl.exact_tail_tokens);
  return out.pad16() ? OkStatus() : no_space();
}

}  // namespace kdn::kernels::kvc1
