// Blending on the real SmolLM2-135M (in-process store): segments stored on first use and loaded
// at other positions, K re-rotated; layer 0 of a moved segment equals the KV computed there
// directly; recomputing every token equals a full prefill; each policy recomputes what it says;
// a corrupted or missing segment falls back; bad input is refused with a clear error.
#include "llama_test_util.h"

#include <kdn/llama/state_blob.h>

#include <ggml.h>
#include <llama.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace kdn::llama {
namespace {

using testing::open_engine;
using testing::open_store;
using testing::read_document;

constexpr uint32_t kPredict = 16;

// Three passages of the test document, about 150-260 tokens each (none a whole number of
// 128-token chunks, so every segment ends in a partial chunk).
std::vector<std::string> passages() {
  const std::string doc = read_document();
  std::vector<std::string> out;
  size_t at = doc.size() / 5;
  for (size_t len : {700u, 1000u, 850u}) {
    out.push_back(doc.substr(at, len));
    at += len + 400;
  }
  return out;
}

// Flash attention on (V rows) unless a test is parametrized over it (V transposed too).
class Blend : public ::testing::Test {
 protected:
  virtual bool flash_attn() const { return true; }
  void SetUp() override {
    engine_ = open_engine(flash_attn(), 2048);
    ASSERT_NE(engine_, nullptr);
    store_ = open_store(node_, *engine_);
    ASSERT_NE(store_, nullptr);
    docs_ = passages();
  }
  RagPrompt prompt(std::vector<size_t> order, const char* question = "Which rights does the text grant?") {
    std::vector<std::string> d;
    for (size_t i : order) d.push_back(docs_[i]);
    Result<RagPrompt> p = engine_->rag_prompt(d, question);
    EXPECT_TRUE(p.ok()) << p.status().what();
    return p.ok() ? std::move(p.value()) : RagPrompt{};
  }
  Generation full(const RagPrompt& p) {
    Result<Generation> g = engine_->generate(p.tokens(), kPredict, nullptr);
    EXPECT_TRUE(g.ok()) << g.status().what();
    return g.ok() ? std::move(g.value()) : Generation{};
  }
  Generation blend(const RagPrompt& p, BlendPolicy policy, double ratio = 0.15,
                   BlendDeviation deviation = BlendDeviation::kK) {
    BlendOptions o;
    o.policy = policy;
    o.recompute_ratio = ratio;
    o.deviation = deviation;
    Result<Generation> g = engine_->generate_blend(p, kPredict, store_.get(), o);
    EXPECT_TRUE(g.ok()) << g.status().what();
    return g.ok() ? std::move(g.value()) : Generation{};
  }
  // Layer-0 K rows of positions [first, first + n) of the current sequence, as f32.
  std::vector<float> layer0_k(uint32_t first, uint32_t n) {
    const KvGeometry& g = engine_->identity().geometry;
    llama_context* ctx = engine_->context();
    std::vector<uint8_t> blob(llama_state_seq_get_size(ctx, 0));
    EXPECT_EQ(llama_state_seq_get_data(ctx, blob.data(), blob.size(), 0), blob.size());
    Result<SeqBlobView> v = parse_seq_blob(g, blob);
    EXPECT_TRUE(v.ok()) << v.status().what();
    std::vector<float> out;
    if (!v.ok()) return out;
    const uint32_t width = g.n_kv_heads * g.head_dim;
    const auto* k = reinterpret_cast<const uint16_t*>(v->k_rows[0]);
    for (uint32_t t = first; t < first + n; ++t)
      for (uint32_t c = 0; c < width; ++c) out.push_back(ggml_fp16_to_fp32(k[uint64_t(t - v->first_pos) * width + c]));
    return out;
  }

  MemoryNode node_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<MemoryChunkCache> store_;
  std::vector<std::string> docs_;
};

class BlendBothV : public Blend, public ::testing::WithParamInterface<bool> {
 protected:
  bool flash_attn() const override { return GetParam(); }
};

TEST_F(Blend, SegmentsAreStoredOnFirstUseAndReusedInAnyOrder) {
  const RagPrompt a = prompt({0, 1, 2});
  for (const auto& s : a.segments) EXPECT_NE(s.size() % testing::kTestChunk, 0u) << "a partial last chunk";
  const Generation first = blend(a, BlendPolicy::kHkvd);
  ASSERT_TRUE(first.stats.blend.used) << first.stats.cache_status.what();
  EXPECT_EQ(first.stats.blend.segments_computed, 3u);
  EXPECT_EQ(first.stats.blend.segments_reused, 0u);
  EXPECT_GT(first.stats.blend.chunks_stored, 3u);
  const RagPrompt b = prompt({2, 0, 1});
  const Generation again = blend(b, BlendPolicy::kHkvd);
  ASSERT_TRUE(again.stats.blend.used) << again.stats.cache_status.what();
  EXPECT_EQ(again.stats.blend.segments_computed, 0u);
  EXPECT_EQ(again.stats.blend.segments_reused, 3u);
  EXPECT_EQ(again.stats.blend.chunks_stored, 0u);
  EXPECT_EQ(again.stats.blend.tokens_loaded, b.size() - b.head.size() - b.tail.size());
  EXPECT_EQ(again.stats.tokens_reused + again.stats.tokens_computed, b.size());
}

TEST_P(BlendBothV, RecomputingEveryTokenEqualsAFullPrefill) {
  const RagPrompt p = prompt({1, 2, 0});
  const Generation ref = full(p);
  const Generation cold = blend(p, BlendPolicy::kAll);  // stores the segments
  ASSERT_TRUE(cold.stats.blend.used) << cold.stats.cache_status.what();
  const Generation warm = blend(p, BlendPolicy::kAll);  // loads them, then recomputes them all
  ASSERT_TRUE(warm.stats.blend.used) << warm.stats.cache_status.what();
  EXPECT_EQ(warm.stats.blend.segments_reused, 3u);
  EXPECT_EQ(warm.tokens, ref.tokens);
  EXPECT_EQ(cold.tokens, ref.tokens);
  EXPECT_TRUE(testing::same_bits(warm.first_logits, ref.first_logits)) << "batches and cells as a prefill's";
}

TEST_P(BlendBothV, AMovedSegmentsFirstLayerEqualsItsKvComputedThere) {
  const RagPrompt stored = prompt({0, 1});
  ASSERT_TRUE(blend(stored, BlendPolicy::kNone).stats.blend.used);
  // Segment 0 moves from right after the head to after segment 2 (another delta per segment).
  const RagPrompt moved = prompt({2, 0, 1});
  RequestStats stats;
  BlendOptions none;
  none.policy = BlendPolicy::kNone;
  ASSERT_TRUE(engine_->prefill_blend(moved, *store_, none, stats).ok());
  const uint32_t at = static_cast<uint32_t>(moved.segment_pos(1)), n = static_cast<uint32_t>(moved.segments[1].size());
  ASSERT_NE(at, stored.head.size());
  const std::vector<float> loaded = layer0_k(at, n);
  engine_->reset();
  ASSERT_TRUE(engine_->prefill(moved.tokens(), 0, {}).ok());
  const std::vector<float> direct = layer0_k(at, n);
  ASSERT_EQ(loaded.size(), direct.size());
  // Layer 0 sees no other token: only the rotation differs. A rotation mixes the two channels
  // of a pair (adjacent in llama.cpp's K order), so errors scale with the pair's magnitude m.
  // The tolerance adds the kernels' stated 1 ulp (docs/kernels.md: f16 output within one ulp
  // of the fp64 rotation of its input), the stored K's own f16 rounding carried through the
  // rotation (half an ulp of each channel: at most 1 ulp of m) and the directly computed K's
  // rounding (half an ulp): 2.5 f16 ulps of m.
  double worst = 0;
  for (size_t i = 0; i < loaded.size(); ++i) {
    const float mag = std::max({std::fabs(direct[i]), std::fabs(direct[i ^ 1]), 6.1e-5f});
    const double ulp = std::ldexp(1.0, std::ilogb(mag) - 10);
    worst = std::max(worst, std::fabs(double(loaded[i]) - direct[i]) / ulp);
  }
  EXPECT_LE(worst, 2.5) << "worst difference in f16 ulps of the pair's magnitude";
  std::printf("layer-0 K of a segment moved by %lld positions: worst difference %.2f f16 ulps of its pair\n",
              static_cast<long long>(at) - static_cast<long long>(stored.head.size()), worst);
  // At its own base position the loaded KV is the computed one, bit for bit.
  ASSERT_TRUE(engine_->prefill_blend(stored, *store_, none, stats).ok());
  const uint32_t b = static_cast<uint32_t>(stored.head.size()), n0 = static_cast<uint32_t>(stored.segments[0].size());
  const std::vector<float> same = layer0_k(b, n0);
  engine_->reset();
  ASSERT_TRUE(engine_->prefill(stored.tokens(), 0, {}).ok());
  EXPECT_EQ(same, layer0_k(b, n0));
}

// At the check layer the first document's fresh K and V equal the ones it was stored with (it
// sits where it was computed, after the same head), so whichever rows hkvd compares, in either
// V layout, it never picks that document's tokens while later documents deviate.
TEST_P(BlendBothV, HkvdNeverPicksTheDocumentThatSitsWhereItWasComputed) {
  const RagPrompt stored = prompt({0, 1, 2});
  ASSERT_TRUE(blend(stored, BlendPolicy::kNone).stats.blend.used);  // stores every document
  const RagPrompt p = prompt({2, 0, 1});
  const uint32_t first_end = static_cast<uint32_t>(p.head.size() + p.segments[0].size());
  for (BlendDeviation d : {BlendDeviation::kK, BlendDeviation::kV, BlendDeviation::kKV}) {
    const Generation g = blend(p, BlendPolicy::kHkvd, 0.15, d);
    ASSERT_TRUE(g.stats.blend.used) << blend_deviation_name(d) << ": " << g.stats.cache_status.what();
    const std::vector<uint32_t>& sel = engine_->last_blend_selection();
    ASSERT_EQ(sel.size(), g.stats.blend.tokens_recomputed);
    ASSERT_FALSE(sel.empty());
    EXPECT_GE(*std::min_element(sel.begin(), sel.end()), first_end) << blend_deviation_name(d);
    EXPECT_LT(*std::max_element(sel.begin(), sel.end()), p.size() - p.tail.size()) << blend_deviation_name(d);
  }
}

TEST_F(Blend, PoliciesRecomputeWhatTheySay) {
  const RagPrompt p = prompt({0, 1, 2});
  ASSERT_TRUE(blend(p, BlendPolicy::kNone).stats.blend.used);  // stores
  const uint64_t seg_tokens = p.size() - p.head.size() - p.tail.size();
  const Generation none = blend(p, BlendPolicy::kNone);
  EXPECT_EQ(none.stats.blend.tokens_recomputed, 0u);
  EXPECT_EQ(none.stats.tokens_reused, seg_tokens);
  const Generation boundary = blend(p, BlendPolicy::kBoundary);
  EXPECT_EQ(boundary.stats.blend.tokens_recomputed, 2u * 16u);
  const Generation hkvd = blend(p, BlendPolicy::kHkvd, 0.15);
  EXPECT_EQ(hkvd.stats.blend.tokens_recomputed, uint64_t(seg_tokens * 0.15));
  EXPECT_EQ(hkvd.stats.blend.tokens_checked, p.size() - p.tail.size());
  EXPECT_GT(engine_->partial_decodes(), 0u) << "the check pass stopped after the check layer";
  // The V and K+V deviations rank the same tokens' worth; what they pick may differ.
  const Generation by_v = blend(p, BlendPolicy::kHkvd, 0.15, BlendDeviation::kV);
  const Generation by_kv = blend(p, BlendPolicy::kHkvd, 0.15, BlendDeviation::kKV);
  EXPECT_EQ(by_v.stats.blend.tokens_recomputed, hkvd.stats.blend.tokens_recomputed);
  EXPECT_EQ(by_kv.stats.blend.tokens_recomputed, hkvd.stats.blend.tokens_recomputed);
  EXPECT_GT(hkvd.stats.blend.select_s, 0.0) << "the deviation and top-k are timed";
  for (const Generation* g : {&none, &boundary, &hkvd, &by_v, &by_kv}) {
    EXPECT_TRUE(g->stats.blend.used) << g->stats.cache_status.what();
    const BlendStats& b = g->stats.blend;
    const double phases =
        b.lookup_s + b.segment_prefill_s + b.segment_store_s + b.place_s + b.retrieve_s + b.select_s + b.recompute_s;
    EXPECT_LE(phases, g->stats.ttft_s) << "the phases are parts of the TTFT";
    EXPECT_GT(phases, 0.5 * g->stats.ttft_s) << "the phases account for most of the TTFT";
    EXPECT_EQ(g->tokens.size(), size_t(kPredict));
  }
}

TEST_F(Blend, CorruptedOrMissingSegmentsFallBackToAFullPrefill) {
  const RagPrompt p = prompt({0, 1, 2});
  const Generation ref = full(p);
  ASSERT_TRUE(blend(p, BlendPolicy::kHkvd).stats.blend.used);
  // A NaN in segment 1's last (partial) chunk.
  const kdn_key base = context_key(store_->model(), p.head);
  const SegmentRef seg{p.segments[1], base, int64_t(p.head.size())};
  std::vector<uint8_t>* chunk = store_->find_segment(seg, 1);
  ASSERT_NE(chunk, nullptr);
  const std::vector<uint8_t> good = *chunk;
  const uint16_t nan = 0x7e00;
  std::memcpy(chunk->data() + chunk->size() / 2, &nan, sizeof nan);
  const Generation corrupt = blend(p, BlendPolicy::kHkvd);
  EXPECT_FALSE(corrupt.stats.blend.used);
  EXPECT_EQ(corrupt.stats.cache_status.code(), Code::kCorrupt) << corrupt.stats.cache_status.what();
  EXPECT_EQ(corrupt.tokens, ref.tokens);
  EXPECT_EQ(corrupt.first_logits, ref.first_logits);
  // No store at all: a full prefill too.
  const Generation none = [&] {
    BlendOptions o;
    Result<Generation> g = engine_->generate_blend(p, kPredict, nullptr, o);
    EXPECT_TRUE(g.ok());
    return g.ok() ? std::move(g.value()) : Generation{};
  }();
  EXPECT_FALSE(none.stats.blend.used);
  EXPECT_EQ(none.tokens, ref.tokens);
  // A store that keeps no segments (kUnsupported) and a segment that vanished after the lookup
  // are the same story; the repaired chunk blends again.
  *chunk = good;
  EXPECT_TRUE(blend(p, BlendPolicy::kHkvd).stats.blend.used);
}

TEST_F(Blend, BadInputGetsAClearError) {
  BlendDeviation d = BlendDeviation::kK;
  for (BlendDeviation each : {BlendDeviation::kK, BlendDeviation::kV, BlendDeviation::kKV}) {
    EXPECT_TRUE(parse_blend_deviation(blend_deviation_name(each), &d));
    EXPECT_EQ(d, each);
  }
  EXPECT_FALSE(parse_blend_deviation("q", &d));
  EXPECT_EQ(d, BlendDeviation::kKV) << "a refused name leaves the value alone";
  RagPrompt p = prompt({0, 1, 2});
  RequestStats stats;
  BlendOptions o;
  o.check_layer = 30;
  EXPECT_EQ(engine_->prefill_blend(p, *store_, o, stats).code(), Code::kInvalidArgument) << "check layer";
  o = BlendOptions{};
  o.recompute_ratio = 1.5;
  EXPECT_EQ(engine_->prefill_blend(p, *store_, o, stats).code(), Code::kInvalidArgument) << "ratio";
  o = BlendOptions{};
  RagPrompt empty = p;
  empty.segments[1].clear();
  EXPECT_EQ(engine_->prefill_blend(empty, *store_, o, stats).code(), Code::kInvalidArgument) << "empty segment";
  // A segment longer than the context: refused, and generate_blend does not fall back to a
  // prefill that cannot fit either.
  RagPrompt big = p;
  for (int i = 0; i < 3; ++i) big.segments[0].insert(big.segments[0].end(), p.segments[0].begin(), p.segments[0].end());
  big.segments.push_back(std::vector<int32_t>(1200, 42));
  EXPECT_EQ(engine_->prefill_blend(big, *store_, o, stats).code(), Code::kInvalidArgument);
  EXPECT_EQ(engine_->generate_blend(big, kPredict, store_.get(), o).status().code(), Code::kInvalidArgument);
  // Target positions past what the kernels rotate, through the seam.
  const kdn_key base = context_key(store_->model(), p.head);
  const SegmentRef seg{p.segments[0], base, int64_t(p.head.size())};
  std::vector<uint64_t> loaded(1);
  const int64_t far[] = {kMaxPosition};
  kdn_engine_layout dst{};
  EXPECT_EQ(store_->retrieve_segments({&seg, 1}, far, dst, loaded).code(), Code::kInvalidArgument);
  const int64_t negative[] = {-1};
  EXPECT_EQ(store_->retrieve_segments({&seg, 1}, negative, dst, loaded).code(), Code::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(FlashAttn, BlendBothV, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "VRows" : "VTransposed"; });

}  // namespace
}  // namespace kdn::llama
