// The overlapped load (a hit's KV copied beside the suffix prefill, layer by layer) on the real
// SmolLM2-135M: with a copy slowed down until the compute thread catches up with it at every
// layer, the hit still equals a full prefill bit for bit; a non-finite element the copy finds
// only after the prefill has started still ends in a full prefill with identical output; and
// with the overlap off the copy is done before the prefill.
#include "llama_test_util.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

namespace kdn::llama {
namespace {

using testing::kTestChunk;
using testing::open_engine;
using testing::open_store;
using testing::read_document;
using testing::same_bits;
using testing::test_engine_options;

constexpr uint32_t kChunks = 4;
constexpr uint32_t kContext = kChunks * kTestChunk;
constexpr uint32_t kPredict = 16;
constexpr uint32_t kSlowCopyUs = 10000;  // per cache tensor: 60 tensors, 0.6 s (the prefill: ~0.1 s)

class OverlappedLoadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::unique_ptr<Engine> writer = open_engine(overlap(LoadOverlap::kOff, 0));
    ASSERT_NE(writer, nullptr);
    Result<std::vector<int32_t>> p = writer->chat_prompt(read_document(), "Who may change this license?", kContext);
    ASSERT_TRUE(p.ok()) << p.status().what();
    prompt_ = new std::vector<int32_t>(std::move(p.value()));
    Result<Generation> ref = writer->generate(*prompt_, kPredict, nullptr);
    ASSERT_TRUE(ref.ok());
    ref_ = new Generation(std::move(ref.value()));
    node_ = new MemoryNode();
    auto store = open_store(*node_, *writer);
    Result<Generation> miss = writer->generate(*prompt_, 1, store.get());
    ASSERT_TRUE(miss.ok());
    ASSERT_EQ(miss->stats.chunks_stored, prompt_->size() / kTestChunk);
  }
  static void TearDownTestSuite() {
    delete prompt_;
    delete ref_;
    delete node_;
  }
  static EngineOptions overlap(LoadOverlap mode, uint32_t delay_us) {
    EngineOptions o = test_engine_options();
    o.load_overlap = mode;
    o.overlap_test_delay_us = delay_us;
    return o;
  }
  // A hit of the stored prompt on `e`, from a copy of the stored chunks (`damage` may change
  // them first), checked against the full prefill.
  Generation hit(Engine& e, const std::function<void(MemoryChunkCache&)>& damage = {}) {
    MemoryNode node = *node_;
    auto store = open_store(node, e);
    if (damage) damage(*store);
    Result<Generation> g = e.generate(*prompt_, kPredict, store.get());
    EXPECT_TRUE(g.ok()) << g.status().what();
    if (!g.ok()) return {};
    EXPECT_EQ(g->tokens, ref_->tokens);
    EXPECT_TRUE(same_bits(g->first_logits, ref_->first_logits));
    return std::move(g.value());
  }
  // Writes an fp16 infinity at byte `offset` of stored chunk `chunk` of the prompt.
  static std::function<void(MemoryChunkCache&)> poison(uint32_t chunk, uint64_t offset) {
    return [chunk, offset](MemoryChunkCache& store) {
      std::vector<uint8_t>* c = store.find(*prompt_, chunk);
      ASSERT_NE(c, nullptr);
      ASSERT_LE(offset + 2, c->size());
      const uint16_t inf = 0x7c00;
      std::memcpy(c->data() + offset, &inf, 2);
    };
  }

  static std::vector<int32_t>* prompt_;
  static Generation* ref_;
  static MemoryNode* node_;
};
std::vector<int32_t>* OverlappedLoadTest::prompt_ = nullptr;
Generation* OverlappedLoadTest::ref_ = nullptr;
MemoryNode* OverlappedLoadTest::node_ = nullptr;

TEST_F(OverlappedLoadTest, ASlowCopyRunsBesideThePrefillAndTheHitStaysExact) {
  // The same hit without overlap: load, then the whole suffix prefill.
  std::unique_ptr<Engine> serial = open_engine(overlap(LoadOverlap::kOff, 0));
  ASSERT_NE(serial, nullptr);
  const Generation off = hit(*serial);
  ASSERT_EQ(off.stats.tokens_reused, kContext);

  std::unique_ptr<Engine> e = open_engine(overlap(LoadOverlap::kOn, kSlowCopyUs));
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->overlaps_load());
  const Generation g = hit(*e);
  EXPECT_TRUE(g.stats.cache_status.ok()) << g.stats.cache_status.what();
  EXPECT_EQ(g.stats.tokens_reused, kContext);
  const uint32_t tensors = 2 * e->identity().geometry.n_layer;
  // The copy took at least its sleeps, far longer than the suffix prefill, so the prefill
  // had to wait for it...
  EXPECT_GE(g.stats.load_copy_s, tensors * kSlowCopyUs * 1e-6);
  EXPECT_GT(g.stats.load_wait_s, 0.0);
  EXPECT_LE(g.stats.load_wait_s, g.stats.ttft_s);
  // ...but computed beside it. One after the other, the copy and the suffix prefill would take
  // their sum; beside each other, about the longer of the two plus the layers after the last
  // copied one. At least half of the shorter one must be saved, whichever is longer: the copy
  // in an optimized build, the prefill under a sanitizer.
  const double prefill = off.stats.ttft_s;  // the serial hit: a fast copy, then the prefill
  const double shorter = std::min(g.stats.load_copy_s, prefill);
  EXPECT_LT(g.stats.ttft_s, g.stats.load_copy_s + prefill - 0.5 * shorter)
      << "ttft " << g.stats.ttft_s << " copy " << g.stats.load_copy_s << " serial ttft " << off.stats.ttft_s;
}

TEST_F(OverlappedLoadTest, AFastCopyHitsExactly) {
  std::unique_ptr<Engine> e = open_engine(overlap(LoadOverlap::kOn, 0));
  ASSERT_NE(e, nullptr);
  for (int i = 0; i < 3; ++i) {  // the worker thread is reused across requests
    const Generation g = hit(*e);
    EXPECT_EQ(g.stats.tokens_reused, kContext);
    EXPECT_GT(g.stats.load_copy_s, 0.0);
  }
}

TEST_F(OverlappedLoadTest, NonFiniteBytesFoundDuringThePrefillFallBackToAFullPrefill) {
  std::unique_ptr<Engine> e = open_engine(overlap(LoadOverlap::kOn, kSlowCopyUs));
  ASSERT_NE(e, nullptr);
  const KvGeometry& g = e->identity().geometry;
  // Layer 0's first K element (the copy's first tensor), and the last layer's last V element
  // of the last chunk (its last): the prefill has run layers on loaded bytes by then.
  for (const auto& [chunk, offset] :
       {std::pair<uint32_t, uint64_t>{0, 0}, std::pair<uint32_t, uint64_t>{kChunks - 1, g.chunk_bytes() - 2}}) {
    const Generation r = hit(*e, poison(chunk, offset));
    EXPECT_EQ(r.stats.cache_status.code(), Code::kCorrupt) << r.stats.cache_status.what();
    EXPECT_EQ(r.stats.tokens_reused, 0u);
    EXPECT_EQ(r.stats.tokens_computed, prompt_->size());
    EXPECT_EQ(r.stats.chunks_loaded, 0u);
  }
  // The engine is whole afterwards: the next clean hit is exact.
  EXPECT_EQ(hit(*e).stats.tokens_reused, kContext);
}

TEST_F(OverlappedLoadTest, OffCopiesBeforeThePrefill) {
  std::unique_ptr<Engine> e = open_engine(overlap(LoadOverlap::kOff, kSlowCopyUs));
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(e->overlaps_load());
  const Generation g = hit(*e);
  EXPECT_EQ(g.stats.tokens_reused, kContext);
  EXPECT_EQ(g.stats.load_copy_s, 0.0);
  EXPECT_EQ(g.stats.load_wait_s, 0.0);
}

TEST_F(OverlappedLoadTest, TransposedVIsNeverOverlapped) {
  EngineOptions o = overlap(LoadOverlap::kOn, 0);
  o.flash_attn = false;
  std::unique_ptr<Engine> e = open_engine(o);
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(e->overlaps_load());
}

}  // namespace
}  // namespace kdn::llama
