// Validation of kCodecTransform planes (docs/codec.md §10): everything decode_transform.cc
// relies on, before any symbol is decoded.
#include "quant.h"
#include "transform_format.h"
#include "validate.h"

#include <kdn/common/model.h>

#include <cmath>

namespace kdn::kernels::kvc1 {
namespace {

Status corrupt(const char* what) { return Status(Code::kCorrupt, what); }

Status check_header_fields(const Header& h, const Plane& pl) {
  if (h.version_minor < kVersionMinorCalibrated || !(h.calibration_id.lo || h.calibration_id.hi))
    return corrupt("KVC1 transform plane in a blob that names no calibration");
  if (h.dtype == KDN_DTYPE_FP8_E4M3 || pl.bits == 0 || pl.bits > 8 || pl.group != 0 || pl.transform != 0)
    return corrupt("KVC1 transform plane header invalid");
  if (pl.scale_dtype != kScaleF16 && pl.scale_dtype != kScaleF32) return corrupt("KVC1 unknown scale dtype");
  if (uint64_t{h.kv_heads} * h.head_dim > kMaxHeadDim) return corrupt("KVC1 transform plane wider than 4096");
  if (exact_rows(pl) > h.tokens || pl.exact_tail_tokens >= h.tokens) return corrupt("KVC1 exact rows out of range");
  if (pl.params_bytes != tc_params_bytes(h, pl)) return corrupt("KVC1 transform parameters size");
  return OkStatus();
}

// Widths within the plane's, the largest equal to it, one segment per width present, zero
// padding, finite scales (zero for width 0) and zero points, finite exact rows.
Status check_params(const uint8_t* blob, const Header& h, const Plane& pl) {
  const uint8_t* p = blob + pl.params_off;
  const uint64_t n = uint64_t{h.kv_heads} * h.head_dim;
  uint8_t widest = 0;
  for (uint64_t i = 0; i < n; ++i) widest = p[i] > widest ? p[i] : widest;
  if (widest != pl.bits) return corrupt("KVC1 transform widths disagree with the plane's");
  const uint32_t present = widths_present(p, n);
  if (static_cast<uint32_t>(__builtin_popcount(present)) != pl.n_segments)
    return corrupt("KVC1 transform plane has the wrong segment count");
  for (uint64_t i = n; i < tc_scale_offset(h); ++i)
    if (p[i] != 0) return corrupt("KVC1 padding after the widths is not zero");
  const uint8_t* s = p + tc_scale_offset(h);
  for (uint64_t i = 0; i < n; ++i) {
    const float sv = load_scale(s, i, pl.scale_dtype), zv = load_scale(s, n + i, pl.scale_dtype);
    if (!std::isfinite(sv) || !(sv >= 0.0f) || !std::isfinite(zv) || (p[i] == 0 && sv != 0.0f))
      return corrupt("KVC1 transform scale is not finite and non-negative, or set for an uncoded coordinate");
  }
  if (exact_rows(pl) == 0) return OkStatus();
  for (uint64_t i = tc_scale_offset(h) + 2 * n * scale_bytes(pl.scale_dtype); i < tc_exact_offset(h, pl); ++i)
    if (p[i] != 0) return corrupt("KVC1 padding before the exact rows is not zero");
  return validate_exact_values(p + tc_exact_offset(h, pl), exact_rows(pl) * n, h.dtype);
}

Status check_bands(const uint8_t* blob, const Header& h, const Plane& pl) {
  KDN_RETURN_IF_ERROR(validate_segment_placement(blob, pl));
  const uint8_t* w = blob + pl.params_off;
  const uint64_t n = uint64_t{h.kv_heads} * h.head_dim;
  const uint32_t present = widths_present(w, n);
  for (uint32_t s = 0; s < pl.n_segments; ++s) {
    const uint32_t width = band_width(present, s), cols = band_columns(w, n, width);
    const Header band = band_header(h, cols);
    Segment sg;
    if (uint32_t e = parse_segment(blob, band, pl, s, &sg)) return parse_status(e);
    if (sg.bits != width) return corrupt("KVC1 band segment width disagrees with its coordinates");
    if (sg.predictor != kPredictNone && cols % 8 != 0 && (blob[sg.mask_off + cols / 8] >> (cols % 8)) != 0)
      return corrupt("KVC1 predictor mask flags columns beyond the band");
    if (sg.coding == kCodingRans) KDN_RETURN_IF_ERROR(validate_rans_segment(blob, sg));
  }
  return OkStatus();
}

}  // namespace

Status check_transform_plane(const uint8_t* blob, const Header& h, const Plane& pl) noexcept {
  KDN_RETURN_IF_ERROR(check_header_fields(h, pl));
  KDN_RETURN_IF_ERROR(check_params(blob, h, pl));
  return check_bands(blob, h, pl);
}

}  // namespace kdn::kernels::kvc1
