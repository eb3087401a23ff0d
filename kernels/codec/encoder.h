// Encoder internals shared by encoder.cc (framing) and encode_planes.cc (plane writers).
#pragma once

#include "format.h"

#include <kdn/kernels/layout.h>

#include <kdn/common/status.h>
#include <kdn/kernels/codec.h>

#include <cstddef>
#include <cstdint>

namespace kdn::kernels::kvc1 {

// Codec limits on a geometry (kdn/common/model.h's model limits, the dtypes the codec handles
// and a chunk of at most 4 GiB so every plane size fits 32 bits).
Status check_codec_geometry(const ChunkGeometry& g) noexcept;

// A CodecConfig with defaults filled in and every field checked against the geometry.
struct EncodePlan {
  CodecMode mode;
  uint32_t block_tokens;  // effective: min(configured, tokens)
  uint32_t k_group, v_group;
  uint8_t k_bits, v_bits;
  uint32_t exact_tokens;       // quantized planes: leading tokens stored exactly (sink tokens)
  uint32_t exact_tail_tokens;  // and trailing ones (recent tokens of a chunk that ends its context)
  const uint8_t* layer_bits[2];
  bool entropy, token_delta, f32_scales, rotate;
  const Kvc1Calibration* calibration;  // transform mode
  double transform_bits;               // transform mode: mean code width per coordinate
};
Status make_encode_plan(const ChunkGeometry& g, const CodecConfig& cfg, EncodePlan* out) noexcept;

// What one plane of one layer is encoded with.
struct PlaneSpec {
  uint8_t codec, bits;
  uint32_t group;
  uint8_t transform = kTransformNone;
  uint32_t exact_tokens = 0;
  uint32_t exact_tail_tokens = 0;
};
PlaneSpec plane_spec(const EncodePlan& plan, const ChunkGeometry& g, uint32_t layer, uint32_t plane) noexcept;

// Largest encoded size of a plane record (header, parameters as f32, packed payload).
uint64_t plane_max_bytes(const ChunkGeometry& g, const PlaneSpec& spec) noexcept;

// The chunk header fields a plane's encoding reads (tokens, heads, head_dim, dtype), and the
// plane record of `spec` with its scales in `scale_dtype`.
Header geometry_header(const ChunkGeometry& g) noexcept;
Plane spec_plane(const PlaneSpec& spec, uint8_t scale_dtype) noexcept;

// Bounded output cursor: every write checks the capacity.
struct OutBuf {
  uint8_t* data;
  size_t cap;
  size_t pos;

  bool reserve(uint64_t n) const { return n <= cap && pos <= cap - n; }
  bool put(const void* src, size_t n);
  bool zeros(size_t n);
  bool pad16() { return zeros(static_cast<size_t>(align16(pos) - pos)); }
  void st16(size_t at, uint16_t v);
  void st32(size_t at, uint32_t v);
  void st64(size_t at, uint64_t v);
};

// Scratch carved out of the caller's buffer.
struct EncodeScratch {
  uint8_t* symbols;    // tokens * head_dim codes
  uint8_t* residuals;  // tokens * head_dim codes after the token-delta predictor
  uint16_t* stack;     // block_tokens * head_dim rANS words
  uint32_t stack_words;
  float* lo;             // head_dim: group minima, then a row's scales
  float* hi;             // head_dim: group maxima, then a row's zero points
  float* row;            // head_dim: one source row as f32
  uint64_t* cost_plain;  // head_dim: per-channel code lengths (predictor choice)
  uint64_t* cost_delta;  // head_dim
  uint32_t* hist_plain;  // head_dim * 256: per-channel code histograms (predictor choice)
  uint32_t* hist_delta;  // head_dim * 256: the same of the token deltas
};

// One plane of the source chunk.
struct Source {
  const void* chunk;
  const ChunkGeometry& g;
  uint32_t layer, plane;

  int64_t index(uint32_t t, uint32_t h, uint32_t d) const { return chunk_offset(g, layer, plane, t, h, d); }
  uint32_t bits(uint32_t t, uint32_t h, uint32_t d) const;
  // Row (t, h) as f32.
  void load_row(uint32_t t, uint32_t h, float* out) const;
  // Row (t, h) as f32; false if it holds a NaN or an infinity.
  bool row_f32(uint32_t t, uint32_t h, float* out) const;
};

// Quantizer parameters of a uint plane at out.pos: S and Z per group, f16 unless the plan asks
// for f32 or a value does not fit. Sets pl.scale_dtype and pl.params_bytes.
Status write_quant_params(const Source& src, const Header& hdr, Plane& pl, const EncodePlan& plan, EncodeScratch& sc,
                          OutBuf& out) noexcept;
// Codes of head `head` (token-major) into sc.symbols, quantized with the STORED parameters.
void quantize_head(const Source& src, const Header& hdr, const Plane& pl, const uint8_t* params, uint32_t head,
                   EncodeScratch& sc) noexcept;
// Lossless: the largest exponent of every (head, channel), u8 [head][d].
void write_exponent_refs(const Source& src, uint8_t* params) noexcept;
// Lossless: byte plane k (0 = most significant) of head `head` into sym.
void byte_plane_symbols(const Source& src, const uint8_t* emax, uint32_t head, uint32_t k, uint8_t* sym) noexcept;
size_t encode_scratch_bytes(const ChunkGeometry& g, uint32_t block_tokens) noexcept;
bool carve_scratch(void* scratch, size_t bytes, const ChunkGeometry& g, uint32_t block_tokens,
                   EncodeScratch* out) noexcept;

// Writes the plane record of (layer, plane) at out.pos (16-aligned) and pads it to 16. A
// lossless plane that would not be smaller than raw is written raw; `spec` then says so.
Status write_plane(const ChunkGeometry& g, const void* chunk, uint32_t layer, uint32_t plane, PlaneSpec& spec,
                   const EncodePlan& plan, EncodeScratch& scratch, OutBuf& out) noexcept;

// Encodes the codes of one segment (scratch.symbols: tokens rows of head_dim codes, each
// < 2^bits) at out.pos: rANS in blocks of block_tokens rows, with the token-delta predictor
// on the channels where it lowers the code variance, when that is smaller than packing and
// `entropy` allows; packed otherwise.
Status write_segment(uint32_t tokens, uint32_t head_dim, uint32_t bits, const EncodePlan& plan, EncodeScratch& scratch,
                     OutBuf& out) noexcept;

// Channels (bit d of mask[d / 8]) to code as token deltas: each channel takes the option with
// the smaller ideal code length under the table the segment will share (refined twice from a
// first guess), and the predictor is dropped unless the mix beats coding every channel plain. False if no channel is
// predicted (or head_dim < 32, where the predictor is not allowed). Either way `histogram` (2^bits entries) receives
// the counts of the symbols the segment will code: the residuals when true, the codes when false.
bool choose_predicted_channels(const uint8_t* codes, uint32_t tokens, uint32_t head_dim, uint32_t bits,
                               EncodeScratch& sc, uint8_t* mask, uint32_t* histogram) noexcept;

// histogram[s] = #{i < n : sym[i] == s} for s < n_syms (every sym[i] < n_syms).
void count_symbols(const uint8_t* sym, uint32_t n, uint32_t n_syms, uint32_t* histogram) noexcept;

// out = the codes with the channels of `mask` replaced by their token deltas (mod 2^bits).
void apply_token_delta(const uint8_t* codes, uint32_t tokens, uint32_t head_dim, uint8_t code_mask, const uint8_t* mask,
                       uint8_t* out) noexcept;

}  // namespace kdn::kernels::kvc1
