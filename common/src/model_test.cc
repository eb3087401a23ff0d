#include <kdn/common/model.h>

#include <gtest/gtest.h>

#include <vector>

namespace kdn {
namespace {

kdn_model_desc smol() {
  kdn_model_desc d{};
  d.struct_size = sizeof d;
  d.num_layers = 30;
  d.num_kv_heads = 3;
  d.head_dim = 64;
  d.dtype = KDN_DTYPE_F16;
  d.rope_style = KDN_ROPE_GPTJ;
  d.rope_theta = 100000.0;
  return d;
}

TEST(ModelInfo, ChunkGeometryAndDefaults) {
  auto m = ModelInfo::from_desc(smol());
  ASSERT_TRUE(m.ok()) << m.status().what();
  EXPECT_EQ(m->chunk_tokens, 256u);
  EXPECT_EQ(m->desc.rotary_dim, 64u);
  EXPECT_EQ(m->chunk_bytes, 30ull * 2 * 256 * 3 * 64 * 2);  // 5.625 MiB
}

TEST(ModelInfo, RejectsHostileDescriptors) {
  kdn_model_desc d = smol();
  d.struct_size = 7;
  EXPECT_EQ(ModelInfo::from_desc(d).status().code(), Code::kVersion);
  d = smol(); d.num_layers = 0;
  EXPECT_FALSE(ModelInfo::from_desc(d).ok());
  d = smol(); d.dtype = 99;
  EXPECT_FALSE(ModelInfo::from_desc(d).ok());
  d = smol(); d.rotary_dim = 65;
  EXPECT_FALSE(ModelInfo::from_desc(d).ok());
  d = smol(); d.num_layers = 1024; d.num_kv_heads = 1024; d.head_dim = 4096;
  EXPECT_FALSE(ModelInfo::from_desc(d).ok());  // chunk would exceed 4 GiB
  d = smol(); d.tp_size = 2; d.tp_rank = 2;
  EXPECT_FALSE(ModelInfo::from_desc(d).ok());
}

TEST(ModelInfo, FingerprintSeparatesModels) {
  auto a = ModelInfo::from_desc(smol());
  kdn_model_desc d = smol();
  d.engine_salt[0] = 1;
  auto b = ModelInfo::from_desc(d);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(a->fingerprint == b->fingerprint);
  auto a2 = ModelInfo::from_desc(smol());
  EXPECT_TRUE(a->fingerprint == a2->fingerprint);
}

TEST(PrefixKeys, ChainAndDeterminism) {
  auto m = ModelInfo::from_desc(smol());
  ASSERT_TRUE(m.ok());
  std::vector<int32_t> tok(256 * 3 + 17);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>(i * 7 % 49152);
  std::vector<kdn_key> k(8);
  ASSERT_EQ(prefix_keys(*m, tok, k), 3u);  // partial trailing chunk is never keyed
  // Same first chunk, different second chunk: key 0 equal, keys 1+ differ.
  auto tok2 = tok;
  tok2[300] += 1;
  std::vector<kdn_key> k2(8);
  ASSERT_EQ(prefix_keys(*m, tok2, k2), 3u);
  EXPECT_TRUE(k[0] == k2[0]);
  EXPECT_FALSE(k[1] == k2[1]);
  EXPECT_FALSE(k[2] == k2[2]);  // the chain carries the difference forward
  // A chunk's key depends on its prefix, not only its own tokens.
  std::vector<int32_t> shifted(tok.begin() + 256, tok.end());
  std::vector<kdn_key> k3(8);
  ASSERT_EQ(prefix_keys(*m, shifted, k3), 2u);
  EXPECT_FALSE(k3[0] == k[1]);
  std::vector<kdn_key> again(8);
  prefix_keys(*m, tok, again);
  EXPECT_TRUE(again[2] == k[2]);
}

// Frozen value: keys must not depend on the process, the build or the hash library's
// seeding. Changing the key scheme invalidates every disk tier: bump the canonical version.
TEST(PrefixKeys, GoldenValue) {
  auto m = ModelInfo::from_desc(smol());
  ASSERT_TRUE(m.ok());
  std::vector<int32_t> tok(512);
  for (int i = 0; i < 512; ++i) tok[i] = i;
  std::vector<kdn_key> k(2);
  ASSERT_EQ(prefix_keys(*m, tok, k), 2u);
  EXPECT_EQ(k[1].lo, 0xb88c41e74df397aaull);
  EXPECT_EQ(k[1].hi, 0xf931e52c5227d0f4ull);
}

}  // namespace
}  // namespace kdn
