// Byte copies with optional streaming (non-temporal) stores: the CPU launchers use them, and
// libkdn's kdn_copy_chunk exposes them to engines that copy whole chunks themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace kdn::kernels::detail {

// Copies n bytes. With `stream`, the 16-byte-aligned middle of dst is written with
// non-temporal stores (SSE2, every x86-64 has it); call streaming_fence() before another
// thread may read dst.
inline void copy_bytes(void* dst, const void* src, size_t n, bool stream) {
#if defined(__x86_64__)
  if (stream && n >= 256) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    for (; i + 16 <= n; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    }
    memcpy(d + i, s + i, n - i);
    return;
  }
#endif
  (void)stream;
  memcpy(dst, src, n);
}

// Orders earlier non-temporal stores before later stores (no-op elsewhere).
inline void streaming_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace kdn::kernels::detail
