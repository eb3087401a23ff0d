// CPU row specializations. Every function computes exactly what the element bodies compute for
// the same row; only the instruction selection differs (memcpy, F16C, vectorizable loops).
#include <kdn/common/model.h>
#include <kdn/kernels/copy.h>
#include <kdn/kernels/cpu_rows.h>

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kdn::kernels {
namespace {

#if defined(__x86_64__)
bool detect_f16c() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool f16c = c & (1u << 29), avx = c & (1u << 28), osxsave = c & (1u << 27);
  if (!(f16c && avx && osxsave)) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 6u) == 6u;  // the OS saves XMM and YMM state
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const uint16_t* s, float* d, uint32_t n) {
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = f16_to_f32(s[i]);
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* s, uint16_t* d, uint32_t n) {
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  for (; i < n; ++i) d[i] = f32_to_f16(s[i]);
}
#else
bool detect_f16c() { return false; }
void f16_to_f32_f16c(const uint16_t*, float*, uint32_t) {}
void f32_to_f16_f16c(const float*, uint16_t*, uint32_t) {}
#endif

const bool g_has_f16c = detect_f16c();

void f16_row_to_f32(const uint16_t* s, float* d, uint32_t n) {
  if (g_has_f16c) return f16_to_f32_f16c(s, d, n);
  for (uint32_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
}

void f32_row_to_f16(const float* s, uint16_t* d, uint32_t n) {
  if (g_has_f16c) return f32_to_f16_f16c(s, d, n);
  for (uint32_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
}

void bf16_row_to_f32(const uint16_t* s, float* d, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
}

void f32_row_to_bf16(const float* s, uint16_t* d, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}

// llama.cpp order from canonical order: out[2i + c] = in[c * D/2 + i].
void interleave_halves(const float* in, uint32_t n, float* out) {
  const uint32_t half = n / 2;
  for (uint32_t i = 0; i < half; ++i) {
    out[2 * i] = in[i];
    out[2 * i + 1] = in[half + i];
  }
}

// Canonical order from llama.cpp order: out[c * D/2 + i] = in[2i + c].
void deinterleave_halves(const float* in, uint32_t n, float* out) {
  const uint32_t half = n / 2;
  for (uint32_t i = 0; i < half; ++i) {
    out[i] = in[2 * i];
    out[half + i] = in[2 * i + 1];
  }
}

bool permuted(const EngineView& v, uint32_t plane) { return plane == 0 && (v.flags & kPermuteK); }

}  // namespace

bool cpu_has_f16c() noexcept { return g_has_f16c; }

void load_row_f32(const void* src, DType st, float scale, uint32_t n, float* out) noexcept {
  switch (st) {
    case DType::kF16:
      return f16_row_to_f32(static_cast<const uint16_t*>(src), out, n);
    case DType::kBF16:
      return bf16_row_to_f32(static_cast<const uint16_t*>(src), out, n);
    case DType::kF32:
      memcpy(out, src, size_t{n} * 4);
      return;
    case DType::kFP8E4M3:
      for (uint32_t i = 0; i < n; ++i) out[i] = load_f32(src, i, st, scale);
      return;
  }
}

void store_row_f32(const float* in, uint32_t n, DType dt, float scale, void* dst) noexcept {
  switch (dt) {
    case DType::kF16:
      return f32_row_to_f16(in, static_cast<uint16_t*>(dst), n);
    case DType::kBF16:
      return f32_row_to_bf16(in, static_cast<uint16_t*>(dst), n);
    case DType::kF32:
      memcpy(dst, in, size_t{n} * 4);
      return;
    case DType::kFP8E4M3:
      for (uint32_t i = 0; i < n; ++i) store_f32(dst, i, dt, in[i], scale);
      return;
  }
}

void rope_row_f32_cpu(const RopeTable& t, uint32_t token, float* row) noexcept {
  const uint32_t half = t.rotary_dim / 2;
  const float* cs = rope_row_of(t, token);
  const float* sn = cs + half;
  if (t.style == RopeStyle::kNeox) {
    float* xs = row;
    float* ys = row + half;
    for (uint32_t i = 0; i < half; ++i) {
      const float x = xs[i], y = ys[i];
      xs[i] = x * cs[i] - y * sn[i];
      ys[i] = y * cs[i] + x * sn[i];
    }
    return;
  }
  for (uint32_t i = 0; i < half; ++i) {
    const float x = row[2 * i], y = row[2 * i + 1];
    row[2 * i] = x * cs[i] - y * sn[i];
    row[2 * i + 1] = y * cs[i] + x * sn[i];
  }
}

void store_engine_row_f32(const EngineView& v, uint32_t plane, uint32_t layer, int64_t slot, uint32_t head,
                          const float* row) noexcept {
  const uint32_t n = v.head_dim;
  void* base = engine_layer_base(v, plane, layer);
  const int64_t off = engine_row_offset(v, plane, slot, head);
  const int64_t sd = v.stride_dim[plane];
  float tmp[kMaxHeadDim];
  const float* src = row;
  if (permuted(v, plane)) {
    interleave_halves(row, n, tmp);
    src = tmp;
  }
  if (sd == 1) {
    char* dst = static_cast<char*>(base) + off * static_cast<int64_t>(dtype_size(v.dtype));
    return store_row_f32(src, n, v.dtype, v.scale[plane], dst);
  }
  for (uint32_t e = 0; e < n; ++e) store_f32(base, off + e * sd, v.dtype, src[e], v.scale[plane]);
}

void load_engine_row_f32(const EngineView& v, uint32_t plane, uint32_t layer, int64_t slot, uint32_t head,
                         float* row) noexcept {
  const uint32_t n = v.head_dim;
  const void* base = engine_layer_base(v, plane, layer);
  const int64_t off = engine_row_offset(v, plane, slot, head);
  const int64_t sd = v.stride_dim[plane];
  float tmp[kMaxHeadDim];
  float* dst = permuted(v, plane) ? tmp : row;
  if (sd == 1) {
    const char* src = static_cast<const char*>(base) + off * static_cast<int64_t>(dtype_size(v.dtype));
    load_row_f32(src, v.dtype, v.scale[plane], n, dst);
  } else {
    for (uint32_t e = 0; e < n; ++e) dst[e] = load_f32(base, off + e * sd, v.dtype, v.scale[plane]);
  }
  if (dst == tmp) deinterleave_halves(tmp, n, row);
}

}  // namespace kdn::kernels
