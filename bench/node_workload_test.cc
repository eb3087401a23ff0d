#include "node_workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kdn::bench {
namespace {

TEST(ModelLayoutTest, ChunkSizesMatchTheModels) {
  // llama3-8b: 32 layers x K,V x 256 tokens x 8 heads x 128 dims x 2 bytes.
  EXPECT_EQ(find_model("llama3-8b")->chunk_bytes(), 32ull << 20);
  // smollm2-135m: 30 x 2 x 256 x 3 x 64 x 2 = 5.625 MiB.
  EXPECT_EQ(find_model("smollm2-135m")->chunk_bytes(), 5898240u);
  EXPECT_EQ(find_model("llama3-8b")->doc_bytes(), 1ull << 30);
  EXPECT_FALSE(find_model("gpt-5"));
}

TEST(ModelLayoutTest, DescriptorCarriesTheGeometry) {
  kdn_model_desc d = model_desc(*find_model("smollm2-135m"));
  EXPECT_EQ(d.struct_size, sizeof d);
  EXPECT_EQ(d.num_layers, 30u);
  EXPECT_EQ(d.num_kv_heads, 3u);
  EXPECT_EQ(d.head_dim, 64u);
  EXPECT_EQ(d.dtype, uint32_t{KDN_DTYPE_F16});
  EXPECT_EQ(d.chunk_tokens, kBenchChunkTokens);
  EXPECT_STREQ(d.name, "kdn-bench/smollm2-135m");
}

TEST(CorpusTest, DocumentsAreDeterministicAndDistinct) {
  std::vector<int32_t> a = document_tokens(1, 0);
  EXPECT_EQ(a.size(), kDocTokens);
  EXPECT_EQ(a, document_tokens(1, 0));
  EXPECT_NE(a, document_tokens(1, 1));
  EXPECT_NE(a, document_tokens(2, 0));
  for (int32_t t : a) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, static_cast<int32_t>(kVocabSize));
  }
}

TEST(CorpusTest, RequestsAreTheDocumentPlusAPartialChunk) {
  std::vector<int32_t> doc = document_tokens(5, 3);
  std::vector<int32_t> r1 = request_tokens(5, 3, 1), r2 = request_tokens(5, 3, 2);
  ASSERT_GT(r1.size(), doc.size());
  EXPECT_LT(r1.size() - doc.size(), kBenchChunkTokens);  // never a whole extra chunk
  EXPECT_TRUE(std::equal(doc.begin(), doc.end(), r1.begin()));
  EXPECT_TRUE(std::equal(doc.begin(), doc.end(), r2.begin()));
  EXPECT_NE(r1, r2);
}

TEST(ZipfTest, ProbabilitiesDecreaseAndSumToOne) {
  ZipfSampler z(50, 1.1);
  double total = 0;
  for (uint32_t k = 0; k < z.size(); ++k) {
    total += z.probability(k);
    if (k > 0) {
      EXPECT_LT(z.probability(k), z.probability(k - 1));
    }
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
  EXPECT_NEAR(z.probability(0) / z.probability(1), std::pow(2.0, 1.1), 1e-9);
  EXPECT_EQ(z.probability(50), 0.0);
}

TEST(ZipfTest, SamplesFollowTheDistribution) {
  ZipfSampler z(20, 1.1);
  std::mt19937_64 rng(123);
  constexpr int kDraws = 200000;
  std::vector<int> counts(20, 0);
  for (int i = 0; i < kDraws; ++i) {
    uint32_t k = z.sample(rng);
    ASSERT_LT(k, 20u);
    ++counts[k];
  }
  for (uint32_t k = 0; k < 20; ++k) {
    double expected = z.probability(k) * kDraws;
    // 5 standard deviations of a binomial count.
    EXPECT_NEAR(counts[k], expected, 5 * std::sqrt(expected) + 1) << "rank " << k;
  }
}

TEST(ZipfTest, ZeroExponentIsUniformAndOneDocumentWorks) {
  ZipfSampler uniform(4, 0.0);
  for (uint32_t k = 0; k < 4; ++k) EXPECT_NEAR(uniform.probability(k), 0.25, 1e-12);
  ZipfSampler single(1, 1.1);
  std::mt19937_64 rng(1);
  EXPECT_EQ(single.sample(rng), 0u);
}

}  // namespace
}  // namespace kdn::bench
