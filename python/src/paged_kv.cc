#include "paged_kv.h"

#include <kdn/kdn.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <string_view>
#include <thread>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kdn::python {

// ---- a small fork-join pool -------------------------------------------------------------
// run(n, fn) calls fn(i) for every i < n on the workers and the caller, and returns when all
// are done. Items are claimed from one counter, so a slow item does not hold up the others.
class PagedKV::Pool {
 public:
  explicit Pool(uint32_t workers) {
    for (uint32_t i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void run(uint64_t n, const std::function<void(uint64_t)>& fn) {
    if (threads_.empty() || n < 2) {
      for (uint64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      next_.store(0, std::memory_order_relaxed);
      active_ = static_cast<uint32_t>(threads_.size());
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return active_ == 0; });
    fn_ = nullptr;
  }

 private:
  void drain() {
    // Relaxed suffices: each index is claimed once, and the mutex hand-off around run()
    // orders the work against the caller.
    for (uint64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;) (*fn_)(i);
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(uint64_t)>* fn_ = nullptr;
  uint64_t n_ = 0;
  std::atomic<uint64_t> next_{0};
  uint32_t active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

namespace {

// Exponent bits of a dtype: an element with all of them set is Inf or NaN.
uint32_t exponent_mask(uint32_t dtype) {
  switch (dtype) {
    case KDN_DTYPE_BF16:
      return 0x7F80u;
    case KDN_DTYPE_F16:
      return 0x7C00u;
    case KDN_DTYPE_F32:
      return 0x7F800000u;
    default:
      return 0;
  }
}

template <class T>
bool finite(T v, T mask) {
  return static_cast<T>(v & mask) != mask;
}

// ---- generic element loops (any layout, any supported size) -------------------------------
template <class T>
bool scatter_plane_generic(const T* src, int64_t src_row, T* region, BlockLayout layout, uint32_t plane, uint32_t B,
                           uint32_t D, T mask) {
  bool ok = true;
  for (uint32_t t = 0; t < B; ++t)
    for (uint32_t d = 0; d < D; ++d) {
      const T v = src[t * src_row + d];
      ok &= finite(v, mask);
      region[block_element(layout, plane, t, d, B, D)] = v;
    }
  return ok;
}

template <class T>
void gather_plane_generic(const T* region, T* dst, int64_t dst_row, BlockLayout layout, uint32_t plane, uint32_t B,
                          uint32_t D) {
  for (uint32_t t = 0; t < B; ++t)
    for (uint32_t d = 0; d < D; ++d) dst[t * dst_row + d] = region[block_element(layout, plane, t, d, B, D)];
}

// ---- kColumnsRows fast forms ---------------------------------------------------------------
// V rows: a token's D channels are contiguous on both sides.
template <class T>
bool copy_row_checked(T* dst, const T* src, uint32_t n, T mask) {
  T bad = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const T v = src[i];
    bad |= static_cast<T>((v & mask) == mask);
    dst[i] = v;
  }
  return bad == 0;
}

#if defined(__SSE2__)
// 8x8 transpose of 16-bit elements: rows r[0..7] in, columns out (in place).
inline void transpose8x8_epi16(__m128i r[8]) {
  const __m128i a0 = _mm_unpacklo_epi16(r[0], r[1]), a1 = _mm_unpackhi_epi16(r[0], r[1]);
  const __m128i a2 = _mm_unpacklo_epi16(r[2], r[3]), a3 = _mm_unpackhi_epi16(r[2], r[3]);
  const __m128i a4 = _mm_unpacklo_epi16(r[4], r[5]), a5 = _mm_unpackhi_epi16(r[4], r[5]);
  const __m128i a6 = _mm_unpacklo_epi16(r[6], r[7]), a7 = _mm_unpackhi_epi16(r[6], r[7]);
  const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
  const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
  const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
  const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
  r[0] = _mm_unpacklo_epi64(b0, b4);
  r[1] = _mm_unpackhi_epi64(b0, b4);
  r[2] = _mm_unpacklo_epi64(b1, b5);
  r[3] = _mm_unpackhi_epi64(b1, b5);
  r[4] = _mm_unpacklo_epi64(b2, b6);
  r[5] = _mm_unpackhi_epi64(b2, b6);
  r[6] = _mm_unpacklo_epi64(b3, b7);
  r[7] = _mm_unpackhi_epi64(b3, b7);
}

// K of kColumnsRows for 16-bit types: token-major rows in, channel-major [D][B] out.
bool scatter_k_columns16(const uint16_t* src, int64_t src_row, uint16_t* region, uint32_t B, uint32_t D,
                         uint16_t mask) {
  const __m128i m = _mm_set1_epi16(static_cast<short>(mask));
  __m128i bad = _mm_setzero_si128();
  for (uint32_t t0 = 0; t0 < B; t0 += 8)
    for (uint32_t d0 = 0; d0 < D; d0 += 8) {
      __m128i r[8];
      for (int i = 0; i < 8; ++i) {
        r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (t0 + i) * src_row + d0));
        bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(r[i], m), m));
      }
      transpose8x8_epi16(r);
      for (int j = 0; j < 8; ++j) _mm_storeu_si128(reinterpret_cast<__m128i*>(region + size_t(d0 + j) * B + t0), r[j]);
    }
  return _mm_movemask_epi8(bad) == 0;
}

void gather_k_columns16(const uint16_t* region, uint16_t* dst, int64_t dst_row, uint32_t B, uint32_t D) {
  for (uint32_t d0 = 0; d0 < D; d0 += 8)
    for (uint32_t t0 = 0; t0 < B; t0 += 8) {
      __m128i r[8];
      for (int j = 0; j < 8; ++j)
        r[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(region + size_t(d0 + j) * B + t0));
      transpose8x8_epi16(r);
      for (int i = 0; i < 8; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (t0 + i) * dst_row + d0), r[i]);
    }
}

bool copy_row_checked16(uint16_t* dst, const uint16_t* src, uint32_t n, uint16_t mask) {
  if (n % 8 != 0) return copy_row_checked(dst, src, n, mask);
  const __m128i m = _mm_set1_epi16(static_cast<short>(mask));
  __m128i bad = _mm_setzero_si128();
  for (uint32_t i = 0; i < n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(v, m), m));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), v);
  }
  return _mm_movemask_epi8(bad) == 0;
}
#endif

bool fast_columns16(const PagedGeometry& g) {
#if defined(__SSE2__)
  return g.layout == BlockLayout::kColumnsRows && g.elem_bytes == 2 && g.block_tokens % 8 == 0 && g.head_dim % 8 == 0;
#else
  (void)g;
  return false;
#endif
}

}  // namespace

bool block_layout_from_isa(const char* isa, BlockLayout* out) noexcept {
  if (isa == nullptr || out == nullptr) return false;
  const std::string_view s(isa);
  if (s == "vec" || s == "vec16") {
    *out = BlockLayout::kColumnsRows;
    return true;
  }
  if (s == "amx") {
    *out = BlockLayout::kAmx;
    return true;
  }
  return false;
}

uint64_t block_element(BlockLayout layout, uint32_t plane, uint32_t t, uint32_t d, uint32_t B, uint32_t D) noexcept {
  const uint64_t plane_base = plane == 0 ? 0 : uint64_t{B} * D;
  if (layout == BlockLayout::kColumnsRows) {
    return plane == 0 ? uint64_t{d} * B + t : plane_base + uint64_t{t} * D + d;
  }
  // kAmx: K words of two channels, 16 tokens a group; V pairs of tokens, 16 channels a group.
  if (plane == 0) return uint64_t{t / 16} * 16 * D + uint64_t{d / 2} * 32 + (t % 16) * 2 + d % 2;
  return plane_base + uint64_t{d / 16} * 16 * B + uint64_t{t / 2} * 32 + (d % 16) * 2 + t % 2;
}

PagedKV::PagedKV(const PagedGeometry& g, std::vector<uint8_t*> layers) noexcept : g_(g), layers_(std::move(layers)) {}

PagedKV::~PagedKV() = default;

Result<std::unique_ptr<PagedKV>> PagedKV::create(const PagedGeometry& g, std::vector<uint8_t*> layers,
                                                 uint32_t threads) noexcept {
  const uint64_t region = 2ull * g.block_tokens * g.head_dim;
  if (g.layers == 0 || g.layers > 1024 || g.kv_heads == 0 || g.kv_heads > 1024 || g.head_dim == 0 ||
      g.head_dim > 4096 || g.block_tokens == 0 || g.chunk_tokens == 0 || g.chunk_tokens % g.block_tokens != 0 ||
      g.num_blocks == 0 || exponent_mask(g.dtype) == 0)
    return Status(Code::kInvalidArgument, "paged KV geometry out of range");
  if (g.elem_bytes != (g.dtype == KDN_DTYPE_F32 ? 4u : 2u))
    return Status(Code::kInvalidArgument, "element size does not match the dtype");
  if (g.layout == BlockLayout::kAmx && (g.elem_bytes != 2 || g.block_tokens % 32 != 0 || g.head_dim % 16 != 0))
    return Status(Code::kUnsupported, "the AMX block layout needs 2-byte elements, 32-token blocks, 16-channel heads");
  if (g.stride_head < int64_t(region) || g.stride_block < int64_t(g.kv_heads) * g.stride_head)
    return Status(Code::kInvalidArgument, "block or head stride smaller than a region");
  if (layers.size() != g.layers || std::count(layers.begin(), layers.end(), nullptr) != 0)
    return Status(Code::kInvalidArgument, "one non-null base per layer is needed");
  try {
    std::unique_ptr<PagedKV> p(new PagedKV(g, std::move(layers)));
    p->pool_ = std::make_unique<Pool>(std::min<uint32_t>(threads, 64));
    return p;
  } catch (const std::exception&) {
    return Status(Code::kNoMemory, "cannot start the copy workers");
  }
}

uint64_t PagedKV::chunk_bytes() const noexcept {
  return uint64_t{g_.layers} * 2 * g_.chunk_tokens * g_.kv_heads * g_.head_dim * g_.elem_bytes;
}

Status PagedKV::check_blocks(std::span<const int64_t> blocks) const noexcept {
  if (blocks.size() != blocks_per_chunk()) return Status(Code::kInvalidArgument, "one block id per chunk block");
  for (int64_t b : blocks)
    if (b >= int64_t(g_.num_blocks)) return Status(Code::kInvalidArgument, "block id beyond the cache");
  return OkStatus();
}

uint8_t* PagedKV::region(uint32_t layer, int64_t block, uint32_t head) const noexcept {
  return layers_[layer] + (block * g_.stride_block + int64_t{head} * g_.stride_head) * g_.elem_bytes;
}

// One (chunk, layer): every block and head, K and V. Returns false if an element was not finite.
bool PagedKV::scatter_item(const ChunkCopy& c, uint32_t layer) const noexcept {
  const uint32_t B = g_.block_tokens, D = g_.head_dim, H = g_.kv_heads, T = g_.chunk_tokens;
  const int64_t row = int64_t{H} * D;  // canonical elements between tokens
  const size_t es = g_.elem_bytes;
  bool ok = true;
  for (uint32_t bi = 0; bi < c.blocks.size(); ++bi) {
    if (c.blocks[bi] < 0) continue;
    for (uint32_t plane = 0; plane < 2; ++plane) {
      const uint8_t* src = c.chunk + ((uint64_t{layer} * 2 + plane) * T + uint64_t{bi} * B) * row * es;
      for (uint32_t h = 0; h < H; ++h) {
        uint8_t* dst = region(layer, c.blocks[bi], h);
        const uint8_t* s = src + size_t{h} * D * es;
        if (es == 2) {
          auto* d16 = reinterpret_cast<uint16_t*>(dst);
          auto* s16 = reinterpret_cast<const uint16_t*>(s);
          const auto mask = static_cast<uint16_t>(exponent_mask(g_.dtype));
#if defined(__SSE2__)
          if (fast_columns16(g_)) {
            if (plane == 0) {
              ok &= scatter_k_columns16(s16, row, d16, B, D, mask);
            } else {
              for (uint32_t t = 0; t < B; ++t)
                ok &= copy_row_checked16(d16 + size_t{B} * D + size_t{t} * D, s16 + t * row, D, mask);
            }
            continue;
          }
#endif
          ok &= scatter_plane_generic(s16, row, d16, g_.layout, plane, B, D, mask);
        } else {
          ok &= scatter_plane_generic(reinterpret_cast<const uint32_t*>(s), row, reinterpret_cast<uint32_t*>(dst),
                                      g_.layout, plane, B, D, exponent_mask(g_.dtype));
        }
      }
    }
  }
  return ok;
}

void PagedKV::zero_item(const ChunkCopy& c, uint32_t layer) const noexcept {
  const size_t bytes = 2ull * g_.block_tokens * g_.head_dim * g_.elem_bytes;
  for (int64_t b : c.blocks) {
    if (b < 0) continue;
    for (uint32_t h = 0; h < g_.kv_heads; ++h) std::memset(region(layer, b, h), 0, bytes);
  }
}

void PagedKV::gather_item(std::span<const int64_t> blocks, uint8_t* out, uint32_t layer) const noexcept {
  const uint32_t B = g_.block_tokens, D = g_.head_dim, H = g_.kv_heads, T = g_.chunk_tokens;
  const int64_t row = int64_t{H} * D;
  const size_t es = g_.elem_bytes;
  for (uint32_t bi = 0; bi < blocks.size(); ++bi) {
    for (uint32_t plane = 0; plane < 2; ++plane) {
      uint8_t* dst = out + ((uint64_t{layer} * 2 + plane) * T + uint64_t{bi} * B) * row * es;
      for (uint32_t h = 0; h < H; ++h) {
        const uint8_t* src = region(layer, blocks[bi], h);
        uint8_t* d = dst + size_t{h} * D * es;
        if (es == 2) {
          auto* d16 = reinterpret_cast<uint16_t*>(d);
          auto* s16 = reinterpret_cast<const uint16_t*>(src);
#if defined(__SSE2__)
          if (fast_columns16(g_)) {
            if (plane == 0) {
              gather_k_columns16(s16, d16, row, B, D);
            } else {
              for (uint32_t t = 0; t < B; ++t)
                std::memcpy(d16 + t * row, s16 + size_t{B} * D + size_t{t} * D, size_t{D} * 2);
            }
            continue;
          }
#endif
          gather_plane_generic(s16, d16, row, g_.layout, plane, B, D);
        } else {
          gather_plane_generic(reinterpret_cast<const uint32_t*>(src), reinterpret_cast<uint32_t*>(d), row, g_.layout,
                               plane, B, D);
        }
      }
    }
  }
}

Status PagedKV::scatter(std::span<const ChunkCopy> chunks, std::span<uint8_t> ok) noexcept {
  if (ok.size() != chunks.size()) return Status(Code::kInvalidArgument, "one result per chunk");
  for (const ChunkCopy& c : chunks) {
    if (c.chunk == nullptr) return Status(Code::kInvalidArgument, "null chunk");
    KDN_RETURN_IF_ERROR(check_blocks(c.blocks));
  }
  std::vector<std::atomic<uint8_t>> bad(chunks.size());
  try {
    const uint64_t items = uint64_t{chunks.size()} * g_.layers;
    pool_->run(items, [&](uint64_t i) {
      const size_t c = i / g_.layers;
      // Relaxed: the pool's join orders these stores before the reads below.
      if (!scatter_item(chunks[c], uint32_t(i % g_.layers))) bad[c].store(1, std::memory_order_relaxed);
    });
    pool_->run(items, [&](uint64_t i) {
      const size_t c = i / g_.layers;
      if (bad[c].load(std::memory_order_relaxed)) zero_item(chunks[c], uint32_t(i % g_.layers));
    });
  } catch (const std::exception&) {
    return Status(Code::kNoMemory, "copy dispatch failed");
  }
  for (size_t c = 0; c < chunks.size(); ++c) ok[c] = bad[c].load(std::memory_order_relaxed) ? 0 : 1;
  return OkStatus();
}

Status PagedKV::gather(std::span<const std::span<const int64_t>> blocks, std::span<uint8_t* const> out) noexcept {
  if (blocks.size() != out.size()) return Status(Code::kInvalidArgument, "one output per chunk");
  for (size_t c = 0; c < blocks.size(); ++c) {
    if (out[c] == nullptr) return Status(Code::kInvalidArgument, "null output chunk");
    KDN_RETURN_IF_ERROR(check_blocks(blocks[c]));
    for (int64_t b : blocks[c])
      if (b < 0) return Status(Code::kInvalidArgument, "a stored chunk needs every one of its blocks");
  }
  try {
    pool_->run(uint64_t{blocks.size()} * g_.layers, [&](uint64_t i) {
      const size_t c = i / g_.layers;
      gather_item(blocks[c], out[c], uint32_t(i % g_.layers));
    });
  } catch (const std::exception&) {
    return Status(Code::kNoMemory, "copy dispatch failed");
  }
  return OkStatus();
}

}  // namespace kdn::python
