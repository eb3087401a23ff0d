#include "crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kdn::kernels::kvc1 {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

struct CrcTable {
  uint32_t t[8][256];
};

// Slicing-by-8 tables: t[0] is the byte table, t[k][b] advances t[k-1][b] by one zero byte.
constexpr CrcTable make_table() {
  CrcTable tab{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
    tab.t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) tab.t[k][b] = (tab.t[k - 1][b] >> 8) ^ tab.t[0][tab.t[k - 1][b] & 0xffu];
  return tab;
}

constexpr CrcTable kTable = make_table();

uint32_t extend_portable(uint32_t c, const uint8_t* p, size_t n) {
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= c;
    c = kTable.t[7][v & 0xff] ^ kTable.t[6][(v >> 8) & 0xff] ^ kTable.t[5][(v >> 16) & 0xff] ^
        kTable.t[4][(v >> 24) & 0xff] ^ kTable.t[3][(v >> 32) & 0xff] ^ kTable.t[2][(v >> 40) & 0xff] ^
        kTable.t[1][(v >> 48) & 0xff] ^ kTable.t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ kTable.t[0][(c ^ *p++) & 0xffu];
  return c;
}

// ---- combining CRCs: shifting a CRC register by n zero bytes is a multiplication by x^(8n)
// modulo the polynomial (reflected bit order: bit 31 is x^0).

// a * b modulo the polynomial.
constexpr uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, prod = 0;
  for (;;) {
    if (a & m) {
      prod ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return prod;
}

// x^(8n) modulo the polynomial.
constexpr uint32_t x8nmodp(uint64_t n) {
  uint32_t x2k = 1u << 30;                               // x^1
  for (int k = 0; k < 3; ++k) x2k = multmodp(x2k, x2k);  // x^8
  uint32_t p = 1u << 31;                                 // x^0
  for (; n; n >>= 1) {
    if (n & 1) p = multmodp(x2k, p);
    x2k = multmodp(x2k, x2k);
  }
  return p;
}

#if defined(__x86_64__)
// Three interleaved streams: the crc32 instruction has a latency of three cycles and a
// throughput of one, so one stream runs at a third of the unit's rate. Each block of
// 3 * kStream bytes is three independent CRCs, combined by shifting.
constexpr size_t kStream = 8192;
constexpr uint32_t kShiftStream = x8nmodp(kStream);

__attribute__((target("sse4.2"))) uint32_t extend_sse42(uint32_t c, const uint8_t* p, size_t n) {
  while (n >= 3 * kStream) {
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < kStream; i += 8) {
      uint64_t va, vb, vd;
      std::memcpy(&va, p + i, 8);
      std::memcpy(&vb, p + kStream + i, 8);
      std::memcpy(&vd, p + 2 * kStream + i, 8);
      a = _mm_crc32_u64(a, va);
      b = _mm_crc32_u64(b, vb);
      d = _mm_crc32_u64(d, vd);
    }
    c = multmodp(kShiftStream, multmodp(kShiftStream, uint32_t(a)) ^ uint32_t(b)) ^ uint32_t(d);
    p += 3 * kStream;
    n -= 3 * kStream;
  }
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c64);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

bool has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) noexcept {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (has_sse42()) return ~extend_sse42(c, p, n);
#endif
  return ~extend_portable(c, p, n);
}

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) noexcept {
  return ~extend_portable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t crc32c(const void* data, size_t n) noexcept { return crc32c_extend(0, data, n); }

}  // namespace kdn::kernels::kvc1
