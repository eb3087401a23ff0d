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

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t extend_sse42(uint32_t c, const uint8_t* p, size_t n) {
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
