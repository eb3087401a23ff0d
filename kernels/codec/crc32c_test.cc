#include "crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace kdn::kernels::kvc1 {
namespace {

TEST(Crc32c, StandardCheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_extend_portable(0, s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(s, 0), 0u);
}

TEST(Crc32c, HardwareAndPortablePathsAgreeAndExtend) {
  std::mt19937_64 rng(3);
  std::vector<uint8_t> data(4099);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{4099}}) {
    const uint32_t c = crc32c(data.data(), n);
    EXPECT_EQ(c, crc32c_extend_portable(0, data.data(), n)) << n;
    for (size_t cut : {size_t{0}, n / 3, n}) {
      EXPECT_EQ(crc32c_extend(crc32c(data.data(), cut), data.data() + cut, n - cut), c) << n << " " << cut;
    }
  }
}

// Buffers long enough for the interleaved path (three streams of 8 KiB, combined by shifting).
TEST(Crc32c, InterleavedStreamsAgreeWithThePortablePath) {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> data(200001);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{24575}, size_t{24576}, size_t{24577}, size_t{49152}, size_t{100003}, size_t{200001}}) {
    const uint32_t c = crc32c(data.data(), n);
    EXPECT_EQ(c, crc32c_extend_portable(0, data.data(), n)) << n;
    EXPECT_EQ(crc32c_extend(crc32c(data.data(), 5), data.data() + 5, n - 5), c) << n;
  }
}

TEST(Crc32c, DetectsEverySingleBitFlip) {
  std::vector<uint8_t> data(257, 0x5a);
  const uint32_t c = crc32c(data.data(), data.size());
  for (size_t i = 0; i < data.size() * 8; ++i) {
    data[i / 8] ^= static_cast<uint8_t>(1u << (i % 8));
    EXPECT_NE(crc32c(data.data(), data.size()), c);
    data[i / 8] ^= static_cast<uint8_t>(1u << (i % 8));
  }
}

}  // namespace
}  // namespace kdn::kernels::kvc1
