#include <kdn/common/model.h>
#include <kdn/common/model_presets.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace kdn {
namespace {

// GPT-J pairing on purpose: the golden key below pins this exact descriptor.
kdn_model_desc smol() {
  kdn_model_desc d = preset_desc(*find_model_preset("smollm2-135m"), "");
  d.rope_style = KDN_ROPE_GPTJ;
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
  d = smol();
  d.num_layers = 0;
  EXPECT_FALSE(ModelInfo::from_desc(d).ok());
  d = smol();
  d.dtype = 99;
  EXPECT_FALSE(ModelInfo::from_desc(d).ok());
  d = smol();
  d.rotary_dim = 65;
  EXPECT_FALSE(ModelInfo::from_desc(d).ok());
  d = smol();
  d.num_layers = 1024;
  d.num_kv_heads = 1024;
  d.head_dim = 4096;
  EXPECT_FALSE(ModelInfo::from_desc(d).ok());  // chunk would exceed 4 GiB
  d = smol();
  d.tp_size = 2;
  d.tp_rank = 2;
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

TEST(ModelPresets, EveryPresetIsAValidModel) {
  ASSERT_FALSE(model_presets().empty());
  for (const ModelPreset& p : model_presets()) {
    EXPECT_EQ(find_model_preset(p.name), &p);
    auto m = ModelInfo::from_desc(preset_desc(p, p.name));
    ASSERT_TRUE(m.ok()) << p.name << ": " << m.status().what();
    EXPECT_EQ(m->desc.num_layers, p.layers);
    EXPECT_EQ(m->desc.rope_scaling, p.rope_scaling);
    EXPECT_STREQ(m->desc.name, std::string(p.name).c_str());
  }
  EXPECT_EQ(find_model_preset("gpt-5"), nullptr);
  EXPECT_EQ(find_model_preset("llama3-8b")->head_dim, 128u);
}

TEST(ModelPresets, LongNamesAreTruncatedNotOverrun) {
  const std::string long_name(200, 'x');
  const kdn_model_desc d = preset_desc(*find_model_preset("smollm2-135m"), long_name);
  EXPECT_EQ(std::strlen(d.name), sizeof d.name - 1);
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

// ---- segment keys ----------------------------------------------------------------------------

std::vector<int32_t> seq_tokens(size_t n, int32_t salt) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 31 + salt) % 49152);
  return t;
}

std::vector<kdn_key> seg_keys(const ModelInfo& m, const kdn_key& base, int64_t pos, const std::vector<int32_t>& t) {
  std::vector<kdn_key> k(segment_chunks(m, t.size()));
  EXPECT_EQ(segment_keys(m, base, pos, t, k), k.size());
  return k;
}

TEST(SegmentKeys, WholeChunksPlusAPartialLast) {
  auto m = ModelInfo::from_desc(smol());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(segment_chunks(*m, 0), 0u);
  EXPECT_EQ(segment_chunks(*m, 1), 1u);
  EXPECT_EQ(segment_chunks(*m, 256), 1u);
  EXPECT_EQ(segment_chunks(*m, 257), 2u);
  const kdn_key base = context_key(*m, seq_tokens(30, 1));
  const auto doc = seq_tokens(600, 2);
  const auto k = seg_keys(*m, base, 30, doc);
  ASSERT_EQ(k.size(), 3u);
  // Deterministic, and independent of any later use: the same inputs give the same keys.
  EXPECT_EQ(seg_keys(*m, base, 30, doc), k);
  // A shorter segment with the same start shares its whole chunks, not its partial last one.
  const std::vector<int32_t> head(doc.begin(), doc.begin() + 300);
  const auto kh = seg_keys(*m, base, 30, head);
  ASSERT_EQ(kh.size(), 2u);
  EXPECT_EQ(kh[0], k[0]);
  EXPECT_FALSE(kh[1] == k[1]);
  // A partial chunk never takes a whole chunk's key: 512 tokens vs the same 512 + 88.
  const std::vector<int32_t> two(doc.begin(), doc.begin() + 512);
  const auto k2 = seg_keys(*m, base, 30, two);
  EXPECT_EQ(k2[1], k[1]);
  EXPECT_FALSE(k[2] == k2[1]);
  // A cap on the output writes a prefix of the keys.
  std::vector<kdn_key> one(1);
  EXPECT_EQ(segment_keys(*m, base, 30, doc, one), 1u);
  EXPECT_EQ(one[0], k[0]);
}

TEST(SegmentKeys, DependOnModelBaseAndBasePositionOnly) {
  auto a = ModelInfo::from_desc(smol());
  kdn_model_desc d = smol();
  d.engine_salt[3] = 9;
  auto b = ModelInfo::from_desc(d);
  ASSERT_TRUE(a.ok() && b.ok());
  const auto sys = seq_tokens(30, 1);
  const auto doc = seq_tokens(300, 2);
  const kdn_key base = context_key(*a, sys);
  const auto k = seg_keys(*a, base, 30, doc);
  // Another model: every key differs (collision-safe across models), context keys too.
  EXPECT_FALSE(context_key(*b, sys) == base);
  const auto kb = seg_keys(*b, context_key(*b, sys), 30, doc);
  for (size_t i = 0; i < k.size(); ++i) EXPECT_FALSE(kb[i] == k[i]);
  const auto kb_same_base = seg_keys(*b, base, 30, doc);
  for (size_t i = 0; i < k.size(); ++i) EXPECT_FALSE(kb_same_base[i] == k[i]);
  // Another base context, another base position, no base.
  EXPECT_FALSE(seg_keys(*a, context_key(*a, seq_tokens(30, 5)), 30, doc)[0] == k[0]);
  EXPECT_FALSE(seg_keys(*a, base, 31, doc)[0] == k[0]);
  EXPECT_FALSE(seg_keys(*a, kdn_key{0, 0}, 30, doc)[0] == k[0]);
  // The context key covers the context's length: a context is not confused with its prefix.
  EXPECT_FALSE(context_key(*a, std::span(sys).first(29)) == base);
  // Segment keys live in their own hash space: never a prefix key of the same tokens.
  std::vector<int32_t> whole = seq_tokens(512, 7);
  std::vector<kdn_key> pk(2);
  ASSERT_EQ(prefix_keys(*a, whole, pk), 2u);
  const auto sk = seg_keys(*a, kdn_key{0, 0}, 0, whole);
  EXPECT_FALSE(sk[0] == pk[0]);
  EXPECT_FALSE(sk[1] == pk[1]);
}

// Frozen value, as for prefix keys: a change invalidates every stored segment.
TEST(SegmentKeys, GoldenValue) {
  auto m = ModelInfo::from_desc(smol());
  ASSERT_TRUE(m.ok());
  std::vector<int32_t> sys(30), doc(300);
  for (int i = 0; i < 30; ++i) sys[i] = i;
  for (int i = 0; i < 300; ++i) doc[i] = 1000 + i;
  const auto k = seg_keys(*m, context_key(*m, sys), 30, doc);
  ASSERT_EQ(k.size(), 2u);
  EXPECT_EQ(k[1].lo, 0x4000c8e3467672e8ull);
  EXPECT_EQ(k[1].hi, 0x22a545baf3f9ad9full);
}

}  // namespace
}  // namespace kdn
