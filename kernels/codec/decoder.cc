// KVC1 CPU decoder: segment readers, the canonical-chunk sink, kvc1_decode and kvc1_inspect.
#include "decode_run.h"
#include "decode_transform.h"

#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kdn::kernels {
namespace kvc1 {

bool untransform_row16(const uint8_t* hi, const uint8_t* lo, const uint8_t* emax, uint32_t n, const ExponentField& f,
                       uint16_t* out) noexcept {
  uint32_t d = 0;
  bool bad = false;
#if defined(__SSE2__)
  // Eight elements at a time; every value fits 16 bits, and the exponent fields 8, so signed
  // 16-bit compares are exact.
  const __m128i zero = _mm_setzero_si128(), field = _mm_set1_epi16(static_cast<short>(f.mask));
  const __m128i low = _mm_set1_epi16(static_cast<short>((1u << f.shift) - 1)), one = _mm_set1_epi16(1);
  const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(f.shift));
  __m128i worse = zero;
  for (; d + 8 <= n; d += 8) {
    const __m128i rp = _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo + d)),
                                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hi + d)));
    const __m128i ref = _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(emax + d)), zero);
    const __m128i delta = _mm_srl_epi16(rp, shift);
    worse = _mm_or_si128(worse, _mm_cmpgt_epi16(delta, ref));
    const __m128i e = _mm_and_si128(_mm_sub_epi16(ref, delta), field);
    const __m128i r = _mm_or_si128(_mm_sll_epi16(e, shift), _mm_and_si128(rp, low));
    const __m128i u = _mm_or_si128(_mm_srli_epi16(r, 1), _mm_slli_epi16(_mm_and_si128(r, one), 15));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + d), u);
  }
  bad = _mm_movemask_epi8(worse) != 0;
#endif
  for (; d < n; ++d)
    out[d] = static_cast<uint16_t>(untransform_element((uint32_t{hi[d]} << 8) | lo[d], emax[d], f, &bad));
  return !bad;
}

bool SegmentReader::open(const uint8_t* blob, const Header& h, const Segment& sg) noexcept {
  blob_ = blob;
  sg_ = sg;
  head_dim_ = h.head_dim;
  done_ = 0;
  bitpos_ = 0;
  block_ = 0;
  if (sg.predictor != kPredictNone) {
    for (uint32_t d = 0; d < head_dim_; ++d) {
      select_[d] = channel_predicted(blob, sg, d) ? 0xffu : 0u;
      prev_[d] = 0;
    }
  }
  if (sg.coding == kCodingPacked) return true;
  uint16_t freq[rans::kMaxSymbols];
  for (uint32_t s = 0; s < sg.n_syms; ++s) freq[s] = ld16(blob + sg.table_off + 2 * s);
  return rans::build_decode_table(freq, sg.n_syms, sg.bits, &table_) && next_block();
}

bool SegmentReader::next_block() noexcept {
  Block bk;
  if (parse_block(blob_, sg_, block_, &bk) != kParseOk) return false;
  rans::start_block(&dec_, bk.desc + 8, blob_ + bk.words_off, bk.n_words, bk.n_symbols);
  ++block_;
  return true;
}

void SegmentReader::read_packed(uint8_t* out, uint32_t n) noexcept {
  const uint8_t* p = blob_ + sg_.offset + kSegmentHeaderBytes;
  const uint32_t b = sg_.bits;
  if (b == 8) {
    std::memcpy(out, p + bitpos_ / 8, n);
  } else if (b == 4 && bitpos_ % 8 == 0) {
    const uint8_t* src = p + bitpos_ / 8;
    for (uint32_t i = 0; i + 1 < n; i += 2) {
      out[i] = src[i / 2] & 0xfu;
      out[i + 1] = src[i / 2] >> 4;
    }
    if (n % 2) out[n - 1] = src[n / 2] & 0xfu;
  } else {
    const uint32_t mask = (1u << b) - 1;
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t pos = bitpos_ + uint64_t{i} * b;
      const uint32_t sh = pos % 8;
      uint32_t v = p[pos / 8];
      if (sh + b > 8) v |= uint32_t{p[pos / 8 + 1]} << 8;  // inside the stream: the symbol's own bits
      out[i] = static_cast<uint8_t>((v >> sh) & mask);
    }
  }
  bitpos_ += uint64_t{n} * b;
}

bool SegmentReader::read(uint8_t* out, uint32_t n) noexcept {
  if (n > sg_.n_symbols - done_) return false;
  done_ += n;
  if (sg_.coding == kCodingPacked) {
    read_packed(out, n);
    return true;
  }
  while (n > 0) {
    if (dec_.next == dec_.n_symbols && (!rans::block_finished_cleanly(dec_) || !next_block())) return false;
    const uint32_t left = dec_.n_symbols - dec_.next;
    const uint32_t k = n < left ? n : left;
    if (!rans::decode_symbols(dec_, table_, out, k)) return false;
    out += k;
    n -= k;
  }
  return true;
}

namespace {

// row[d] = (row[d] + (prev[d] & select[d])) & mask, 16 channels at a time (SSE2 is part of
// x86-64; -O2 does not vectorize byte loops of unknown length by itself).
void add_previous_row(uint8_t* row, const uint8_t* prev, const uint8_t* select, uint32_t n, uint8_t mask) {
  uint32_t d = 0;
#if defined(__SSE2__)
  const __m128i m = _mm_set1_epi8(static_cast<char>(mask));
  for (; d + 16 <= n; d += 16) {
    const __m128i p = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(prev + d)),
                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(select + d)));
    const __m128i r = _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d)), p);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(row + d), _mm_and_si128(r, m));
  }
#endif
  for (; d < n; ++d) row[d] = static_cast<uint8_t>((row[d] + (prev[d] & select[d])) & mask);
}

}  // namespace

void SegmentReader::undo_token_delta(uint8_t* rows, uint32_t n_rows) noexcept {
  const uint8_t mask = static_cast<uint8_t>((1u << sg_.bits) - 1);
  add_previous_row(rows, prev_, select_, head_dim_, mask);
  for (uint32_t r = 1; r < n_rows; ++r) {
    uint8_t* row = rows + size_t{r} * head_dim_;
    add_previous_row(row, row - head_dim_, select_, head_dim_, mask);
  }
  std::memcpy(prev_, rows + size_t{n_rows - 1} * head_dim_, head_dim_);
}

bool SegmentReader::read_rows(uint8_t* out, uint32_t rows) noexcept {
  if (!read(out, rows * head_dim_)) return false;
  if (sg_.predictor == kPredictTokenDelta && rows > 0) undo_token_delta(out, rows);
  return true;
}

bool SegmentReader::finish() noexcept {
  if (done_ != sg_.n_symbols) return false;
  return sg_.coding == kCodingPacked || (block_ == sg_.n_blocks && rans::block_finished_cleanly(dec_));
}

namespace {

// Rows go straight into the canonical chunk, in its dtype.
struct CanonicalSink {
  uint8_t* out;
  const ChunkGeometry& g;
  uint32_t layer, plane, head;

  void* row(uint32_t t) const {
    return out + chunk_offset(g, layer, plane, t, head, 0) * static_cast<int64_t>(dtype_size(g.dtype));
  }
  DType quant_type() const { return g.dtype; }
  void* quant_row(uint32_t t) const { return row(t); }
  void commit_quant(uint32_t) const {}
  void* bits_row(uint32_t t) const { return row(t); }
  void commit_bits(uint32_t) const {}
};

}  // namespace

void FirstError::record(const Status& s) noexcept {
  bool expected = false;
  // acq_rel: the winner's write of `status` is published by the join that ends the parallel
  // phase; the flag only picks the single writer.
  if (set.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) status = s;
}

Status open_for_decode(const uint8_t* blob, size_t len, const ChunkGeometry& expected, const kdn_key& fingerprint,
                       const DecodeOptions& opts, Header* h, LayerRange* layers) noexcept {
  if (!blob) return Status(Code::kInvalidArgument, "null blob");
  KDN_RETURN_IF_ERROR(check_codec_geometry(expected));
  KDN_RETURN_IF_ERROR(open_blob(blob, len, opts.verify_crc, h));
  KDN_RETURN_IF_ERROR(match_expected(*h, expected, fingerprint));
  layers->begin = opts.layers.begin;
  layers->end = opts.layers.end ? opts.layers.end : expected.layers;
  if (layers->begin >= layers->end || layers->end > expected.layers)
    return Status(Code::kInvalidArgument, "layer range out of bounds");
  return OkStatus();
}

Status validate_layers(const uint8_t* blob, const Header& h, const LayerRange& layers,
                       const DecodeOptions& opts) noexcept {
  FirstError err;
  run_tasks(layers.end - layers.begin, opts.cpu_threads, err, [&](uint32_t i) {
    Plane planes[2];
    return validate_layer(blob, h, layers.begin + i, opts.verify_crc, planes);
  });
  return err.get();
}

}  // namespace kvc1

const char* codec_mode_name(CodecMode mode) noexcept {
  switch (mode) {
    case CodecMode::kRaw:
      return "raw";
    case CodecMode::kLossless:
      return "lossless";
    case CodecMode::kInt8:
      return "int8";
    case CodecMode::kKivi4:
      return "kivi4";
    case CodecMode::kKivi2:
      return "kivi2";
    case CodecMode::kTransform:
      return "transform";
  }
  return "unknown";
}

uint8_t codec_mode_default_bits(CodecMode mode) noexcept {
  switch (mode) {
    case CodecMode::kInt8:
      return 8;
    case CodecMode::kKivi4:
      return 4;
    case CodecMode::kKivi2:
      return 2;
    default:
      return 0;
  }
}

ChunkGeometry kvc1_geometry(const ModelInfo& model) noexcept {
  ChunkGeometry g;
  g.layers = model.desc.num_layers;
  g.kv_heads = model.desc.num_kv_heads;
  g.head_dim = model.desc.head_dim;
  g.tokens = model.chunk_tokens;
  g.dtype = static_cast<DType>(model.desc.dtype);
  return g;
}

Status kvc1_inspect(const uint8_t* blob, size_t len, Kvc1Info* out) noexcept {
  if (!blob || !out) return Status(Code::kInvalidArgument, "null argument");
  kvc1::Header h;
  KDN_RETURN_IF_ERROR(kvc1::open_blob(blob, len, true, &h));
  out->version_major = h.version_major;
  out->version_minor = h.version_minor;
  out->total_bytes = h.total_bytes;
  out->geometry.layers = h.layers;
  out->geometry.kv_heads = h.kv_heads;
  out->geometry.head_dim = h.head_dim;
  out->geometry.tokens = h.tokens;
  out->geometry.dtype = static_cast<DType>(h.dtype);
  out->fingerprint = h.fingerprint;
  out->mode = static_cast<CodecMode>(h.mode);
  out->block_tokens = h.block_tokens;
  out->pos_base = h.pos_base;
  out->chunk_key = h.chunk_key;
  out->calibration_id = h.calibration_id;
  return OkStatus();
}

Status kvc1_decode(const uint8_t* blob, size_t len, const ChunkGeometry& expected, const kdn_key& fingerprint,
                   void* out, size_t out_bytes, const DecodeOptions& opts) noexcept {
  using namespace kvc1;
  kvc1::Header h;
  LayerRange layers;
  KDN_RETURN_IF_ERROR(open_for_decode(blob, len, expected, fingerprint, opts, &h, &layers));
  const uint64_t need = uint64_t{expected.layers} * 2 * expected.tokens * expected.kv_heads * expected.head_dim *
                        dtype_size(expected.dtype);
  if (!out || out_bytes < need) return Status(Code::kInvalidArgument, "output buffer smaller than the chunk");
  KDN_RETURN_IF_ERROR(match_calibration(h, fingerprint, opts));
  KDN_RETURN_IF_ERROR(validate_layers(blob, h, layers, opts));
  const uint32_t per_layer = 2 * h.kv_heads;
  FirstError err;
  run_tasks((layers.end - layers.begin) * per_layer, opts.cpu_threads, err, [&](uint32_t i) {
    const uint32_t layer = layers.begin + i / per_layer;
    const uint32_t plane = (i % per_layer) / h.kv_heads;
    const uint32_t head = i % h.kv_heads;
    Plane planes[2];
    if (uint32_t e = locate_planes(blob, h, layer, planes)) return parse_status(e);
    if (planes[plane].codec == kCodecTransform) {  // one task decodes the whole plane
      if (head != 0) return OkStatus();
      uint8_t* base =
          static_cast<uint8_t*>(out) + chunk_offset(expected, layer, plane, 0, 0, 0) * dtype_size(expected.dtype);
      return decode_transform_plane(blob, h, planes[plane], *opts.calibration, layer, plane, base);
    }
    CanonicalSink sink{static_cast<uint8_t*>(out), expected, layer, plane, head};
    return decode_head(blob, h, planes[plane], head, sink);
  });
  return err.get();
}

}  // namespace kdn::kernels
