#include <kdn/llama/state_blob.h>

#include <kdn/common/model.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kdn::llama {
namespace {

// Most cells one blob may describe: 16M tokens is far beyond any context we run, and keeps
// every size computation below well inside 64 bits.
constexpr uint64_t kMaxCells = 1u << 24;
// Bytes of the per-layer headers: i32 type + u64 row bytes (K, V rows) or
// i32 type + u32 elem bytes + u32 n_embd (transposed V); both are 12.
constexpr uint64_t kLayerHeaderBytes = 12;
constexpr uint64_t kCellMetaBytes = 12;  // i32 pos, u32 n_seq_id, i32 seq_id

// Writes a blob as pieces: little-endian fields go into a buffer the caller sized exactly
// (consecutive fields join one piece), KV pieces point at bytes kept elsewhere.
class PieceWriter {
 public:
  PieceWriter(uint8_t* fields, std::vector<BlobPiece>& pieces) noexcept : p_(fields), pieces_(pieces) {}
  void u32(uint32_t v) noexcept { put(&v, 4); }
  void i32(int32_t v) noexcept { put(&v, 4); }
  void u64(uint64_t v) noexcept { put(&v, 8); }
  // The vector's capacity was reserved for every piece: push_back does not allocate.
  void kv(const uint8_t* data, uint64_t n) noexcept { pieces_.push_back({data, n, true}); }

 private:
  void put(const void* v, size_t n) noexcept {
    std::memcpy(p_, v, n);
    if (!pieces_.empty() && !pieces_.back().kv && pieces_.back().data + pieces_.back().size == p_)
      pieces_.back().size += n;
    else
      pieces_.push_back({p_, n, false});
    p_ += n;
  }
  uint8_t* p_;
  std::vector<BlobPiece>& pieces_;
};

// Reads fields from an untrusted blob; every read is bounds-checked and a failed read
// leaves the reader failed, so callers test ok() once after a group of reads.
class BlobReader {
 public:
  explicit BlobReader(std::span<const uint8_t> in) noexcept : in_(in) {}
  uint32_t u32() noexcept { return get<uint32_t>(); }
  int32_t i32() noexcept { return get<int32_t>(); }
  uint64_t u64() noexcept { return get<uint64_t>(); }
  const uint8_t* skip(uint64_t n) noexcept {
    if (!ok_ || n > in_.size() - pos_) {
      ok_ = false;
      return nullptr;
    }
    const uint8_t* at = in_.data() + pos_;
    pos_ += n;
    return at;
  }
  bool ok() const noexcept { return ok_; }
  bool at_end() const noexcept { return ok_ && pos_ == in_.size(); }

 private:
  template <class T>
  T get() noexcept {
    T v{};
    if (const uint8_t* at = skip(sizeof(T))) std::memcpy(&v, at, sizeof(T));
    return v;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Whether n elements of width sizeof(U) at `src` (unaligned is fine) are all finite, copying
// them to `dst` in the same pass when it is not null: an element is not finite when its
// exponent bits (exp_mask) are all set. Fixed-size blocks with no early exit, so the compiler
// vectorizes the loop even at -O2; each block is loaded once, checked in registers and stored.
template <class U>
bool finite_scalar(uint8_t* dst, const uint8_t* src, uint64_t n, U exp_mask) noexcept {
  constexpr uint64_t kBlock = 64;
  U bad = 0;
  uint64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    U v[kBlock];
    std::memcpy(v, src + i * sizeof(U), sizeof v);
    for (uint64_t j = 0; j < kBlock; ++j) bad |= static_cast<U>((v[j] & exp_mask) == exp_mask);
    if (dst) std::memcpy(dst + i * sizeof(U), v, sizeof v);
  }
  for (; i < n; ++i) {
    U v;
    std::memcpy(&v, src + i * sizeof(U), sizeof(U));
    bad |= static_cast<U>((v & exp_mask) == exp_mask);
    if (dst) std::memcpy(dst + i * sizeof(U), &v, sizeof(U));
  }
  return bad == 0;
}

// finite_scalar on `bytes` bytes of 16-bit (or, when `wide`, 32-bit) elements.
bool finite_scalar(uint8_t* dst, const uint8_t* src, uint64_t bytes, uint32_t exp_mask, bool wide) noexcept {
  if (wide) return finite_scalar<uint32_t>(dst, src, bytes / 4, exp_mask);
  return finite_scalar<uint16_t>(dst, src, bytes / 2, static_cast<uint16_t>(exp_mask));
}

uint32_t exp_mask_of(KvType type) noexcept {
  switch (type) {
    case KvType::kF16:
      return 0x7c00;
    case KvType::kBF16:
      return 0x7f80;
    case KvType::kF32:
      return 0x7f800000u;
  }
  return 0;
}

#if defined(__x86_64__)
// Bytes at the start of a copy to dst that come before its first `align`-byte boundary, if
// that is a whole number of elements (else `bytes`: the whole copy then takes the plain path).
uint64_t head_to_align(const uint8_t* dst, uint64_t bytes, uint64_t align, bool wide) noexcept {
  const uint64_t head = (align - (reinterpret_cast<uintptr_t>(dst) & (align - 1))) & (align - 1);
  return head % (wide ? 4 : 2) == 0 ? std::min(head, bytes) : bytes;
}

// The same check (and copy, when dst is not null) with SIMD, 128 bytes per step, at memory
// speed: an element is not finite when its magnitude bits (sign cleared) reach exp_mask, so
// the loop keeps running maxima of the magnitudes and compares once at the end. The copy
// uses streaming stores, which skip reading the destination lines first (the destination is
// an engine's KV cache or a store slot, not read again by this thread soon); the part
// before dst's first aligned address is copied by the scalar path.
__attribute__((target("avx512bw"))) bool finite_avx512(uint8_t* dst, const uint8_t* src, uint64_t bytes,
                                                       uint32_t exp_mask, bool wide) noexcept {
  const uint64_t head = dst ? head_to_align(dst, bytes, 64, wide) : 0;
  const bool head_ok = head == 0 || finite_scalar(dst, src, head, exp_mask, wide);
  const __m512i abs = wide ? _mm512_set1_epi32(0x7fffffff) : _mm512_set1_epi16(0x7fff);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0;
  uint64_t i = head;
  for (; i + 128 <= bytes; i += 128) {
    const __m512i v0 = _mm512_loadu_si512(src + i), v1 = _mm512_loadu_si512(src + i + 64);
    if (wide) {
      m0 = _mm512_mask_max_epu32(m0, 0xffff, m0, _mm512_and_si512(v0, abs));
      m1 = _mm512_mask_max_epu32(m1, 0xffff, m1, _mm512_and_si512(v1, abs));
    } else {
      m0 = _mm512_mask_max_epu16(m0, ~__mmask32{0}, m0, _mm512_and_si512(v0, abs));
      m1 = _mm512_mask_max_epu16(m1, ~__mmask32{0}, m1, _mm512_and_si512(v1, abs));
    }
    if (dst) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), v0);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 64), v1);
    }
  }
  if (dst) _mm_sfence();
  const bool ok = wide ? _mm512_cmpge_epu32_mask(_mm512_mask_max_epu32(m0, 0xffff, m0, m1),
                                                 _mm512_set1_epi32(static_cast<int>(exp_mask))) == 0
                       : _mm512_cmpge_epu16_mask(_mm512_mask_max_epu16(m0, ~__mmask32{0}, m0, m1),
                                                 _mm512_set1_epi16(static_cast<short>(exp_mask))) == 0;
  return finite_scalar(dst ? dst + i : nullptr, src + i, bytes - i, exp_mask, wide) && ok && head_ok;
}

__attribute__((target("avx2"))) bool finite_avx2(uint8_t* dst, const uint8_t* src, uint64_t bytes, uint32_t exp_mask,
                                                 bool wide) noexcept {
  const uint64_t head = dst ? head_to_align(dst, bytes, 32, wide) : 0;
  const bool head_ok = head == 0 || finite_scalar(dst, src, head, exp_mask, wide);
  const __m256i abs = wide ? _mm256_set1_epi32(0x7fffffff) : _mm256_set1_epi16(0x7fff);
  __m256i m[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  uint64_t i = head;
  for (; i + 128 <= bytes; i += 128) {
    for (int k = 0; k < 4; ++k) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32 * k));
      const __m256i a = _mm256_and_si256(v, abs);
      m[k] = wide ? _mm256_max_epu32(m[k], a) : _mm256_max_epu16(m[k], a);
      if (dst) _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32 * k), v);
    }
  }
  if (dst) _mm_sfence();
  // max >= exp_mask  <=>  max(max, exp_mask - 1) != exp_mask - 1
  const __m256i lim =
      wide ? _mm256_set1_epi32(static_cast<int>(exp_mask - 1)) : _mm256_set1_epi16(static_cast<short>(exp_mask - 1));
  __m256i x = m[0];
  for (int k = 1; k < 4; ++k) x = wide ? _mm256_max_epu32(x, m[k]) : _mm256_max_epu16(x, m[k]);
  x = wide ? _mm256_max_epu32(x, lim) : _mm256_max_epu16(x, lim);
  const bool ok = _mm256_movemask_epi8(_mm256_cmpeq_epi8(x, lim)) == -1;
  return finite_scalar(dst ? dst + i : nullptr, src + i, bytes - i, exp_mask, wide) && ok && head_ok;
}

enum class Simd { kNone, kAvx2, kAvx512 };

// The widest the CPU has, capped by KDN_SIMD=avx2|none (the tests run every path).
Simd detect_simd() noexcept {
  const char* cap = std::getenv("KDN_SIMD");
  const bool allow512 = cap == nullptr || std::strcmp(cap, "avx512") == 0;
  const bool allow2 = allow512 || std::strcmp(cap, "avx2") == 0;
  if (allow512 && __builtin_cpu_supports("avx512bw")) return Simd::kAvx512;
  if (allow2 && __builtin_cpu_supports("avx2")) return Simd::kAvx2;
  return Simd::kNone;
}

Simd simd_level() noexcept {
  static const Simd level = detect_simd();
  return level;
}

#endif

// Whether every element of `bytes` bytes of `type` at src is finite, copying them to dst in
// the same pass when dst is not null: with the widest SIMD this CPU has, else scalar.
bool check_finite(KvType type, uint8_t* dst, const uint8_t* src, uint64_t bytes) noexcept {
  const uint32_t mask = exp_mask_of(type);
  const bool wide = type == KvType::kF32;
#if defined(__x86_64__)
  switch (simd_level()) {
    case Simd::kAvx512:
      return finite_avx512(dst, src, bytes, mask, wide);
    case Simd::kAvx2:
      return finite_avx2(dst, src, bytes, mask, wide);
    case Simd::kNone:
      break;
  }
#endif
  return finite_scalar(dst, src, bytes, mask, wide);
}

bool all_finite(KvType type, const uint8_t* src, uint64_t bytes) noexcept {
  return check_finite(type, nullptr, src, bytes);
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols (element units).
// Tiled so both sides stay in cache.
template <class U>
void transpose(U* dst, uint64_t dst_stride, const U* src, uint64_t src_stride, uint64_t rows, uint64_t cols) noexcept {
  constexpr uint64_t kTile = 32;
  for (uint64_t r0 = 0; r0 < rows; r0 += kTile) {
    const uint64_t r1 = std::min(rows, r0 + kTile);
    for (uint64_t c0 = 0; c0 < cols; c0 += kTile) {
      const uint64_t c1 = std::min(cols, c0 + kTile);
      for (uint64_t c = c0; c < c1; ++c)
        for (uint64_t r = r0; r < r1; ++r) dst[c * dst_stride + r] = src[r * src_stride + c];
    }
  }
}

void transpose(uint32_t elem_bytes, void* dst, uint64_t dst_stride, const void* src, uint64_t src_stride, uint64_t rows,
               uint64_t cols) noexcept {
  if (elem_bytes == 4)
    transpose(static_cast<uint32_t*>(dst), dst_stride, static_cast<const uint32_t*>(src), src_stride, rows, cols);
  else
    transpose(static_cast<uint16_t*>(dst), dst_stride, static_cast<const uint16_t*>(src), src_stride, rows, cols);
}

// Transposes the V plane of `layer` of every chunk into dst, the layer's transposed V
// section: element j of cell i at j * n_cells + i.
void write_v_transposed(const KvGeometry& g, std::span<const std::span<const uint8_t>> chunks, uint32_t layer,
                        uint8_t* dst, uint64_t n_cells) noexcept {
  const uint64_t embd = uint64_t{g.n_kv_heads} * g.head_dim;
  const uint64_t v_off = (2 * uint64_t{layer} + 1) * g.plane_bytes();
  for (size_t c = 0; c < chunks.size(); ++c) {
    uint8_t* col0 = dst + c * g.chunk_tokens * g.elem_bytes();
    transpose(g.elem_bytes(), col0, n_cells, chunks[c].data() + v_off, embd, g.chunk_tokens, embd);
  }
}

}  // namespace

bool copy_finite(KvType type, uint8_t* dst, const uint8_t* src, uint64_t bytes) noexcept {
  if (check_finite(type, dst, src, bytes)) return true;
  // The copy went at full speed and took the bad values with it; put zeros in their place so
  // that no Inf or NaN is left where an engine computes (llama.cpp built with assertions
  // aborts on one, and attention turns one into NaN over the whole row).
  if (dst != nullptr) std::memset(dst, 0, bytes);
  return false;
}

Status validate_geometry(const KvGeometry& g) noexcept {
  if (g.type != KvType::kF16 && g.type != KvType::kBF16 && g.type != KvType::kF32)
    return Status(Code::kUnsupported, "KV element type must be f16, bf16 or f32");
  if (g.n_layer == 0 || g.n_layer > kMaxLayers) return Status(Code::kInvalidArgument, "bad n_layer");
  if (g.n_kv_heads == 0 || g.n_kv_heads > kMaxHeads) return Status(Code::kInvalidArgument, "bad n_kv_heads");
  if (g.head_dim == 0 || g.head_dim > kMaxHeadDim) return Status(Code::kInvalidArgument, "bad head_dim");
  if (g.n_stream == 0 || g.n_stream > 4096) return Status(Code::kInvalidArgument, "bad n_stream");
  if (g.chunk_tokens == 0 || g.chunk_tokens > kMaxChunkTokens)
    return Status(Code::kInvalidArgument, "bad chunk_tokens");
  if (g.chunk_bytes() > kMaxChunkBytes) return Status(Code::kInvalidArgument, "chunk too large");
  return OkStatus();
}

uint64_t seq_blob_bytes(const KvGeometry& g, uint64_t n_cells) noexcept {
  uint64_t bytes = 12 + 4 * uint64_t{g.n_stream};  // magic, seq_id, n_stream, cell counts
  if (n_cells == 0) return bytes;
  bytes += n_cells * kCellMetaBytes + 8;  // cell metadata, v_trans, n_layer
  bytes += 2 * uint64_t{g.n_layer} * (kLayerHeaderBytes + n_cells * g.row_bytes());
  return bytes;
}

Status check_chunk(const KvGeometry& g, std::span<const uint8_t> chunk) noexcept {
  if (chunk.size() != g.chunk_bytes()) return Status(Code::kCorrupt, "chunk has the wrong size");
  if (!all_finite(g.type, chunk.data(), chunk.size())) return Status(Code::kCorrupt, "chunk holds a non-finite value");
  return OkStatus();
}

namespace {

// Header, stream 0's cell count and its cell metadata: positions first_pos.., sequence 0.
void write_cells(PieceWriter& w, const KvGeometry& g, uint64_t n_cells, int32_t first_pos) noexcept {
  w.u32(kSeqStateMagic);
  w.i32(0);  // source seq_id: llama.cpp ignores it on load
  w.u32(g.n_stream);
  w.u32(static_cast<uint32_t>(n_cells));
  for (uint64_t i = 0; i < n_cells; ++i) {
    w.i32(first_pos + static_cast<int32_t>(i));
    w.u32(1);
    w.i32(0);
  }
  w.u32(g.v_trans ? 1 : 0);
  w.u32(g.n_layer);
}

// One layer's K (plane 0) or V (plane 1) section: its fields, then the plane of every chunk,
// or (transposed V) the layer's slice of `transposed`, filled here.
void write_plane(PieceWriter& w, const KvGeometry& g, std::span<const std::span<const uint8_t>> chunks, uint32_t layer,
                 int plane, uint8_t* transposed, uint64_t n_cells) noexcept {
  w.i32(static_cast<int32_t>(g.type));
  if (plane == 1 && g.v_trans) {
    w.u32(g.elem_bytes());
    w.u32(g.n_kv_heads * g.head_dim);
    uint8_t* dst = transposed + uint64_t{layer} * n_cells * g.row_bytes();
    write_v_transposed(g, chunks, layer, dst, n_cells);
    w.kv(dst, n_cells * g.row_bytes());
    return;
  }
  w.u64(g.row_bytes());
  const uint64_t off = (2 * uint64_t{layer} + plane) * g.plane_bytes();
  for (const auto& c : chunks) w.kv(c.data() + off, g.plane_bytes());
}

}  // namespace

Status SeqBlobPieces::reserve(const KvGeometry& g, uint64_t n_chunks) noexcept {
  KDN_RETURN_IF_ERROR(validate_geometry(g));
  const uint64_t n_cells = n_chunks * g.chunk_tokens;
  if (n_chunks == 0 || n_cells > kMaxCells) return Status(Code::kInvalidArgument, "bad chunk count");
  const uint64_t kv_bytes = 2 * uint64_t{g.n_layer} * n_cells * g.row_bytes();
  try {
    fields_.resize(seq_blob_bytes(g, n_cells) - kv_bytes);
    if (g.v_trans) transposed_.resize(kv_bytes / 2);
    // At most: one run of fields before each layer section and after the last, and a KV piece
    // per chunk in each section.
    pieces_.reserve(2 * uint64_t{g.n_layer} * (1 + n_chunks) + 2);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "no memory to describe the KV blob");
  }
  return OkStatus();
}

Status SeqBlobPieces::describe(const KvGeometry& g, std::span<const std::span<const uint8_t>> chunks,
                               int32_t first_pos) noexcept {
  pieces_.clear();
  size_ = 0;
  KDN_RETURN_IF_ERROR(reserve(g, chunks.size()));
  const uint64_t n_cells = uint64_t{chunks.size()} * g.chunk_tokens;
  if (first_pos < 0 || uint64_t(first_pos) + n_cells > uint64_t{INT32_MAX})
    return Status(Code::kInvalidArgument, "positions out of range");
  for (const auto& c : chunks)
    if (c.size() != g.chunk_bytes()) return Status(Code::kCorrupt, "chunk has the wrong size");

  PieceWriter w(fields_.data(), pieces_);
  write_cells(w, g, n_cells, first_pos);
  for (int plane = 0; plane < 2; ++plane)
    for (uint32_t l = 0; l < g.n_layer; ++l) write_plane(w, g, chunks, l, plane, transposed_.data(), n_cells);
  for (uint32_t s = 1; s < g.n_stream; ++s) w.u32(0);  // the other streams are empty
  size_ = seq_blob_bytes(g, n_cells);
  return OkStatus();
}

Status gather_pieces(KvType type, std::span<const BlobPiece> pieces, std::span<uint8_t> out) noexcept {
  uint64_t at = 0;
  bool finite = true;
  for (const BlobPiece& p : pieces) {
    if (p.size > out.size() - at) return Status(Code::kInvalidArgument, "pieces overrun the output");
    if (p.kv)
      finite &= copy_finite(type, out.data() + at, p.data, p.size);
    else
      std::memcpy(out.data() + at, p.data, p.size);
    at += p.size;
  }
  if (at != out.size()) return Status(Code::kInvalidArgument, "pieces do not fill the output");
  if (!finite) return Status(Code::kCorrupt, "chunk holds a non-finite value");
  return OkStatus();
}

Status build_seq_blob(const KvGeometry& g, std::span<const std::span<const uint8_t>> chunks, int32_t first_pos,
                      std::span<uint8_t> out) noexcept {
  SeqBlobPieces pieces;
  KDN_RETURN_IF_ERROR(pieces.describe(g, chunks, first_pos));
  if (out.size() != pieces.size()) return Status(Code::kInvalidArgument, "output is not exactly seq_blob_bytes long");
  return gather_pieces(g.type, pieces.pieces(), out);
}

namespace {

// Cell metadata of the one non-empty stream: one sequence per cell, consecutive positions.
Status parse_cells(BlobReader& r, uint32_t cells, SeqBlobView& v) noexcept {
  v.n_cells = cells;
  for (uint32_t i = 0; i < cells; ++i) {
    const int32_t pos = r.i32();
    const uint32_t n_seq = r.u32();
    const int32_t seq = r.i32();
    if (!r.ok()) return Status(Code::kCorrupt, "blob truncated in cell metadata");
    if (i == 0) v.first_pos = pos;
    if (n_seq != 1 || seq < 0) return Status(Code::kCorrupt, "cell is not of exactly one sequence");
    if (pos < 0 || int64_t{pos} != int64_t{v.first_pos} + i)
      return Status(Code::kCorrupt, "cell positions are not consecutive");
  }
  return OkStatus();
}

// One plane (K, or V) of every layer: header checked against g, then a pointer to its data.
Status parse_plane(BlobReader& r, const KvGeometry& g, bool transposed, uint32_t cells,
                   std::vector<const uint8_t*>& rows) noexcept {
  rows.reserve(g.n_layer);
  for (uint32_t l = 0; l < g.n_layer; ++l) {
    const int32_t type = r.i32();
    bool shape_ok;
    if (transposed) {
      const uint32_t elem = r.u32();
      const uint32_t embd = r.u32();
      shape_ok = elem == g.elem_bytes() && embd == g.n_kv_heads * g.head_dim;
    } else {
      shape_ok = r.u64() == g.row_bytes();
    }
    const uint8_t* data = r.skip(uint64_t{cells} * g.row_bytes());
    if (!r.ok()) return Status(Code::kCorrupt, "blob truncated in the KV rows");
    if (type != static_cast<int32_t>(g.type) || !shape_ok)
      return Status(Code::kModelMismatch, "KV element type or row size differs");
    rows.push_back(data);
  }
  return OkStatus();
}

Status parse_stream(BlobReader& r, const KvGeometry& g, uint32_t cells, SeqBlobView& v) noexcept {
  if (cells > kMaxCells) return Status(Code::kCorrupt, "blob cell count out of range");
  KDN_RETURN_IF_ERROR(parse_cells(r, cells, v));
  const uint32_t v_trans = r.u32();
  const uint32_t n_layer = r.u32();
  if (!r.ok()) return Status(Code::kCorrupt, "blob truncated before the layers");
  if (v_trans != (g.v_trans ? 1u : 0u)) return Status(Code::kModelMismatch, "V transposition differs");
  if (n_layer != g.n_layer) return Status(Code::kModelMismatch, "layer count differs");
  KDN_RETURN_IF_ERROR(parse_plane(r, g, false, cells, v.k_rows));
  return parse_plane(r, g, g.v_trans, cells, v.v_data);
}

}  // namespace

Result<SeqBlobView> parse_seq_blob(const KvGeometry& g, std::span<const uint8_t> blob) noexcept {
  KDN_RETURN_IF_ERROR(validate_geometry(g));
  BlobReader r(blob);
  const uint32_t magic = r.u32();
  (void)r.i32();  // source seq_id
  const uint32_t n_stream = r.u32();
  if (!r.ok() || magic != kSeqStateMagic) return Status(Code::kCorrupt, "not a sequence state blob");
  if (n_stream != g.n_stream) return Status(Code::kModelMismatch, "blob has another stream count");

  SeqBlobView v;
  bool found = false;
  for (uint32_t s = 0; s < n_stream; ++s) {
    const uint32_t cells = r.u32();
    if (!r.ok()) return Status(Code::kCorrupt, "blob truncated in the stream table");
    if (cells == 0) continue;
    if (found) return Status(Code::kCorrupt, "blob holds more than one non-empty stream");
    found = true;
    KDN_RETURN_IF_ERROR(parse_stream(r, g, cells, v));
  }
  if (!found) return Status(Code::kCorrupt, "blob holds no cells");
  if (!r.at_end()) return Status(Code::kCorrupt, "blob has trailing bytes");
  return v;
}

Status blob_chunk_to_canonical(const KvGeometry& g, const SeqBlobView& view, uint32_t c,
                               std::span<uint8_t> out) noexcept {
  if (out.size() != g.chunk_bytes()) return Status(Code::kInvalidArgument, "output is not one chunk");
  if (view.k_rows.size() != g.n_layer || view.v_data.size() != g.n_layer)
    return Status(Code::kInvalidArgument, "view does not match the geometry");
  const uint64_t first = uint64_t{c} * g.chunk_tokens;
  if (first + g.chunk_tokens > view.n_cells) return Status(Code::kInvalidArgument, "chunk beyond the blob");
  const uint64_t embd = uint64_t{g.n_kv_heads} * g.head_dim;
  bool finite = true;
  for (uint32_t l = 0; l < g.n_layer; ++l) {
    uint8_t* k_dst = out.data() + 2 * uint64_t{l} * g.plane_bytes();
    uint8_t* v_dst = k_dst + g.plane_bytes();
    finite &= copy_finite(g.type, k_dst, view.k_rows[l] + first * g.row_bytes(), g.plane_bytes());
    if (!g.v_trans) {
      finite &= copy_finite(g.type, v_dst, view.v_data[l] + first * g.row_bytes(), g.plane_bytes());
      continue;
    }
    // Element j of cell i sits at j * n_cells + i: a (embd x n_cells) matrix to transpose.
    const uint8_t* src = view.v_data[l] + first * g.elem_bytes();
    transpose(g.elem_bytes(), v_dst, embd, src, view.n_cells, embd, g.chunk_tokens);
    finite &= all_finite(g.type, v_dst, g.plane_bytes());
  }
  if (!finite) return Status(Code::kCorrupt, "engine KV holds a non-finite value");
  return OkStatus();
}

}  // namespace kdn::llama
