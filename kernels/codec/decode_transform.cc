// CPU decoding of transform-coded planes (docs/codec.md §10). A plane's band segments hold
// columns of every head, so one task decodes the whole plane: first every band's codes are
// parked in the first bytes of their row's output slot (a row's codes fit its own output, so no
// row's output can overwrite another's codes), then each row is dequantized, moved back from
// the calibrated axes and rounded once into the output dtype over its codes.
#include "decode_transform.h"

#include "decode_head.h"
#include "encode_transform.h"
#include "transform_body.h"
#include "transform_format.h"

#include <kdn/kernels/codec_transform.h>

#include <cstring>

namespace kdn::kernels::kvc1 {
namespace {

struct PlaneOut {
  uint8_t* base;     // the plane's first row in the canonical chunk
  size_t row_bytes;  // head_dim * element bytes
  uint32_t heads;

  uint8_t* slot(uint32_t t, uint32_t h) const { return base + (size_t{t} * heads + h) * row_bytes; }
};

// Reads band segment s and parks its codes in their rows' slots.
bool park_band(const uint8_t* blob, const Header& h, const Plane& pl, uint32_t s, const uint8_t* widths,
               const PlaneOut& out) {
  const uint64_t n = uint64_t{h.kv_heads} * h.head_dim;
  const uint32_t width = band_width(widths_present(widths, n), s);
  uint16_t columns[kMaxHeadDim];
  const uint32_t cols = band_column_list(widths, n, width, columns);
  const Header band = band_header(h, cols);
  Segment sg;
  SegmentReader reader;
  if (parse_segment(blob, band, pl, s, &sg) != kParseOk || !reader.open(blob, band, sg)) return false;
  alignas(32) uint8_t tile[kTileSymbols + 32];
  const uint32_t tt = tile_tokens(cols), coded = coded_tokens(h, pl);
  for (uint32_t t0 = 0; t0 < coded; t0 += tt) {
    const uint32_t rows = coded - t0 < tt ? coded - t0 : tt;
    if (!reader.read_rows(tile, rows)) return false;
    for (uint32_t r = 0; r < rows; ++r) {
      const uint8_t* q = tile + size_t{r} * cols;
      for (uint32_t c = 0; c < cols; ++c) out.slot(t0 + r, columns[c] / h.head_dim)[columns[c] % h.head_dim] = q[c];
    }
  }
  return reader.finish();
}

// Row (t, head) from its parked codes: y^ = fmaf(q, S, Z) per coordinate (q = 0 where the
// width is 0), x = mean + sum_j y^_j axis_j in f32, one rounding into the output dtype.
void rebuild_row(const Header& h, const Plane& pl, const uint8_t* params, const float* cal_head, uint32_t head,
                 DType dtype, uint8_t* slot) {
  const uint32_t d = h.head_dim;
  alignas(32) float y[kMaxHeadDim], x[kMaxHeadDim];
  for (uint32_t j = 0; j < d; ++j) y[j] = tc_coordinate(params, h, pl, head, j, slot[j]);
  std::memcpy(x, cal_head, 4 * size_t{d});
  const float* axes = cal_head + 2 * d;
  for (uint32_t j = 0; j < d; ++j) {  // j outer, so the inner loop vectorizes; each x[k] sums j in order
    const float* a = axes + size_t{j} * d;
    for (uint32_t k = 0; k < d; ++k) x[k] = tc_accumulate(x[k], a[k], y[j]);
  }
  store_row_f32(x, d, dtype, 1.0f, slot);
}

}  // namespace

Status decode_transform_plane(const uint8_t* blob, const Header& h, const Plane& pl, const Kvc1Calibration& cal,
                              uint32_t layer, uint32_t plane, uint8_t* plane_out) noexcept {
  const PlaneOut out{plane_out, size_t{h.head_dim} * dtype_bytes_of(h.dtype), h.kv_heads};
  const uint8_t* params = blob + pl.params_off;
  for (uint32_t s = 0; s < pl.n_segments; ++s)
    if (!park_band(blob, h, pl, s, params, out)) return stream_corrupt();
  const uint8_t* exact = params + tc_exact_offset(h, pl);
  for (uint32_t t = 0; t < h.tokens; ++t)
    for (uint32_t head = 0; head < h.kv_heads; ++head) {
      uint8_t* slot = out.slot(t, head);
      if (is_exact_token(pl, h.tokens, t)) {
        std::memcpy(slot, exact + (size_t{exact_row_of(pl, h.tokens, t)} * h.kv_heads + head) * out.row_bytes,
                    out.row_bytes);
        continue;
      }
      rebuild_row(h, pl, params, calibration_head(cal, layer, plane, head), head, static_cast<DType>(h.dtype), slot);
    }
  return OkStatus();
}

Status match_calibration(const Header& h, const kdn_key& fingerprint, const DecodeOptions& opts) noexcept {
  if (!(h.calibration_id.lo || h.calibration_id.hi)) return OkStatus();
  const Kvc1Calibration* c = opts.calibration;
  if (!c || !c->data) return Status(Code::kNotFound, "KVC1 blob needs the calibration object it was coded with");
  if (opts.verify_crc && !(c->id == h.calibration_id))
    return Status(Code::kNotFound, "KVC1 blob was coded with another calibration object");
  if (c->layers != h.layers || c->kv_heads != h.kv_heads || c->head_dim != h.head_dim ||
      !(c->fingerprint == fingerprint))
    return Status(Code::kModelMismatch, "KVC1 calibration is for another model or geometry");
  return OkStatus();
}

}  // namespace kdn::kernels::kvc1
