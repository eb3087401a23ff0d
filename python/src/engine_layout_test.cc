#include "engine_layout.h"

#include "client.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace kdn::python {
namespace {

PagedLayout dense(uint64_t base) {
  PagedLayout l;
  l.dtype = KDN_DTYPE_BF16;
  l.elem_bytes = 2;
  l.num_blocks = 4;
  l.block_size = 8;
  l.kv_heads = 2;
  l.head_dim = 4;
  l.stride_dim = 1;
  l.stride_kv = 4;
  l.stride_offset = 8;
  l.stride_head = 64;
  l.stride_block = 128;
  l.layer_base = {base, base + 4 * 128 * 2};
  return l;
}

// Every byte any element reaches, by enumeration: the reference the extents are checked against.
std::pair<uint64_t, uint64_t> enumerate(const PagedLayout& l) {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (uint64_t base : l.layer_base)
    for (uint64_t b = 0; b < l.num_blocks; ++b)
      for (int64_t t = 0; t < l.block_size; ++t)
        for (uint32_t h = 0; h < l.kv_heads; ++h)
          for (uint32_t d = 0; d < l.head_dim; ++d)
            for (int p = 0; p < 2; ++p) {
              const int64_t e = int64_t(b) * l.stride_block + t * l.stride_offset + int64_t(h) * l.stride_head +
                                int64_t(d) * l.stride_dim + p * l.stride_kv;
              const uint64_t at = base + uint64_t(e * int64_t(l.elem_bytes));
              lo = std::min(lo, at);
              hi = std::max(hi, at + l.elem_bytes);
            }
  return {lo, hi};
}

TEST(PagedLayoutCheck, DenseLayoutFitsItsAllocationExactly) {
  const uint64_t base = 1 << 20;
  PagedLayout l = dense(base);
  const uint64_t bytes = 2 * 4 * 128 * 2;
  EXPECT_NO_THROW(check_layout_within(l, base, bytes));
  EXPECT_THROW(check_layout_within(l, base, bytes - 1), Error);
  EXPECT_THROW(check_layout_within(l, base + 2, bytes), Error);
  EXPECT_EQ(layout_bytes(l), (std::pair<uint64_t, uint64_t>{base, base + bytes}));
}

TEST(PagedLayoutCheck, ExtentsMatchEnumerationForRandomStrides) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> stride(-300, 300);
  for (int i = 0; i < 500; ++i) {
    PagedLayout l = dense(1ull << 30);
    l.stride_block = stride(rng), l.stride_offset = stride(rng), l.stride_head = stride(rng);
    l.stride_dim = stride(rng), l.stride_kv = stride(rng);
    l.layer_base = {(1ull << 30) + uint64_t(stride(rng) + 300) * 64, 1ull << 30};
    const auto [lo, hi] = enumerate(l);
    ASSERT_EQ(layout_bytes(l), std::make_pair(lo, hi));
    EXPECT_NO_THROW(check_layout_within(l, lo, hi - lo));
    EXPECT_THROW(check_layout_within(l, lo + 1, hi - lo - 1), Error);
    EXPECT_THROW(check_layout_within(l, lo, hi - lo - 1), Error);
  }
}

TEST(PagedLayoutCheck, RefusesEmptyAndOutOfRangeFields) {
  const PagedLayout good = dense(4096);
  PagedLayout l = good;
  l.layer_base.clear();
  EXPECT_THROW(validate_layout(l), Error);
  l = good;
  l.layer_base[1] = 0;
  EXPECT_THROW(validate_layout(l), Error);
  l = good;
  l.num_blocks = 0;
  EXPECT_THROW(validate_layout(l), Error);
  l = good;
  l.block_size = -1;
  EXPECT_THROW(validate_layout(l), Error);
  l = good;
  l.stride_block = int64_t{1} << 60;
  EXPECT_THROW(validate_layout(l), Error);
  l = good;
  l.elem_bytes = 0;
  EXPECT_THROW(validate_layout(l), Error);
  try {
    check_layout_within(good, 4096, 10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), KDN_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("layer 0"), std::string::npos);
  }
}

}  // namespace
}  // namespace kdn::python
