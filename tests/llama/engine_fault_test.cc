// Faults on the KV path never change the output: a corrupted or truncated chunk, a
// fingerprint mismatch, a failing store (kdnd gone) and a blob llama.cpp refuses all end in a
// full prefill whose tokens and logits equal a run without cache.
#include "llama_test_util.h"

#include <llama.h>

#include <cstring>
#include <random>

namespace kdn::llama {
namespace {

using testing::kTestChunk;
using testing::open_engine;
using testing::open_store;
using testing::read_document;
using testing::same_bits;

constexpr uint32_t kContext = 4 * kTestChunk;
constexpr uint32_t kPredict = 32;

// A store whose every call fails, as libkdn's do once kdnd is gone.
class UnavailableStore final : public ChunkCache {
 public:
  Result<std::unique_ptr<ChunkLease>> retrieve(std::span<const int32_t>, uint32_t) noexcept override {
    ++calls;
    return Status(Code::kUnavailable, "kdnd is not running");
  }
  Result<std::unique_ptr<ChunkReservation>> reserve(std::span<const int32_t>, uint32_t, uint32_t) noexcept override {
    ++calls;
    return Status(Code::kUnavailable, "kdnd is not running");
  }
  int calls = 0;
};

class EngineFault : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine_ = open_engine(true).release();
    ASSERT_NE(engine_, nullptr);
    Result<std::vector<int32_t>> p = engine_->chat_prompt(read_document(), "Summarize the preamble.", kContext);
    ASSERT_TRUE(p.ok());
    prompt_ = new std::vector<int32_t>(std::move(p.value()));
    Result<Generation> ref = engine_->generate(*prompt_, kPredict, nullptr);
    ASSERT_TRUE(ref.ok());
    ref_ = new Generation(std::move(ref.value()));
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete prompt_;
    delete ref_;
  }
  void SetUp() override {
    ASSERT_NE(ref_, nullptr);
    store_ = open_store(node_, *engine_);
    Result<Generation> miss = engine_->generate(*prompt_, 1, store_.get());
    ASSERT_TRUE(miss.ok());
    ASSERT_EQ(miss->stats.chunks_stored, prompt_->size() / kTestChunk);
  }
  // Runs the prompt through the store and checks it fell back to a full, identical prefill.
  void expect_fallback(ChunkCache* store, Code expected) {
    Result<Generation> g = engine_->generate(*prompt_, kPredict, store);
    ASSERT_TRUE(g.ok()) << g.status().what();
    EXPECT_EQ(g->stats.tokens_reused, 0u);
    EXPECT_EQ(g->stats.tokens_computed, prompt_->size());
    EXPECT_EQ(g->stats.cache_status.code(), expected) << g->stats.cache_status.what();
    EXPECT_EQ(g->tokens, ref_->tokens);
    EXPECT_TRUE(same_bits(g->first_logits, ref_->first_logits));
  }

  static Engine* engine_;
  static std::vector<int32_t>* prompt_;
  static Generation* ref_;
  MemoryNode node_;
  std::unique_ptr<MemoryChunkCache> store_;
};
Engine* EngineFault::engine_ = nullptr;
std::vector<int32_t>* EngineFault::prompt_ = nullptr;
Generation* EngineFault::ref_ = nullptr;

TEST_F(EngineFault, TheUndamagedStoreHits) {
  Result<Generation> g = engine_->generate(*prompt_, kPredict, store_.get());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->stats.tokens_reused, kContext);
  EXPECT_EQ(g->tokens, ref_->tokens);
}

TEST_F(EngineFault, CorruptedChunkFallsBackToPrefill) {
  std::vector<uint8_t>* c = store_->find(*prompt_, 2);
  ASSERT_NE(c, nullptr);
  std::mt19937 rng(7);  // 4 KiB of random bytes: about 64 of its 2048 halves are NaN or Inf
  for (size_t i = 100000; i < 100000 + 4096; ++i) (*c)[i] = static_cast<uint8_t>(rng());
  expect_fallback(store_.get(), Code::kCorrupt);
  // One non-finite element anywhere is enough (here the last V element of the last layer).
  std::vector<uint8_t>* c0 = store_->find(*prompt_, 0);
  std::memset(c->data() + 100000, 0, 4096);
  const uint16_t inf = 0x7c00;
  std::memcpy(c0->data() + c0->size() - 2, &inf, 2);
  expect_fallback(store_.get(), Code::kCorrupt);
}

TEST_F(EngineFault, TruncatedChunkFallsBackToPrefill) {
  std::vector<uint8_t>* c = store_->find(*prompt_, 1);
  ASSERT_NE(c, nullptr);
  c->resize(c->size() / 2);
  expect_fallback(store_.get(), Code::kCorrupt);
  c->clear();
  expect_fallback(store_.get(), Code::kCorrupt);
}

TEST_F(EngineFault, FingerprintMismatchIsAMiss) {
  // The same model without flash attention keeps V transposed: another fingerprint.
  std::unique_ptr<Engine> other = open_engine(false);
  ASSERT_NE(other, nullptr);
  kdn_key a, b;
  ASSERT_TRUE(ModelInfo::from_desc(engine_->identity().desc).ok());
  a = ModelInfo::from_desc(engine_->identity().desc)->fingerprint;
  b = ModelInfo::from_desc(other->identity().desc)->fingerprint;
  EXPECT_FALSE(a == b);
  // Its store on the same node sees none of this engine's chunks, and the reverse.
  auto other_store = open_store(node_, *other);
  Result<std::unique_ptr<ChunkLease>> lease = other_store->retrieve(*prompt_, 0);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ((*lease)->chunks(), 0u);
  node_.chunks.clear();
  ASSERT_TRUE(other->generate(*prompt_, 1, other_store.get()).ok());
  ASSERT_FALSE(node_.chunks.empty());
  expect_fallback(store_.get(), Code::kOk);
}

TEST_F(EngineFault, UnavailableStoreFallsBackToPrefill) {
  UnavailableStore down;
  expect_fallback(&down, Code::kUnavailable);
  EXPECT_EQ(down.calls, 2);  // the lookup, and the store of the computed chunks
}

TEST_F(EngineFault, RefusedBlobLeavesAnEmptySequence) {
  // A blob llama.cpp cannot read must not leave half-restored cells behind.
  const KvGeometry& g = engine_->identity().geometry;
  std::vector<std::span<const uint8_t>> chunks;
  for (uint32_t i = 0; i < 4; ++i) chunks.emplace_back(*store_->find(*prompt_, i));
  std::vector<uint8_t> blob(seq_blob_bytes(g, kContext));
  ASSERT_TRUE(build_seq_blob(g, chunks, 0, blob).ok());
  engine_->reset();
  llama_context* ctx = engine_->context();
  EXPECT_EQ(llama_state_seq_set_data(ctx, blob.data(), blob.size() - 1000, 0), 0u);
  EXPECT_EQ(engine_->sequence_length(), 0u);
  EXPECT_EQ(llama_memory_seq_pos_min(llama_get_memory(ctx), 0), -1);
  // Loading into a non-empty sequence is refused before llama.cpp sees anything.
  ASSERT_TRUE(engine_->load_chunks(chunks).ok());
  EXPECT_EQ(engine_->sequence_length(), kContext);
  EXPECT_EQ(engine_->load_chunks(chunks).code(), Code::kInvalidArgument);
  // And the engine still answers exactly afterwards.
  Result<Generation> g2 = engine_->generate(*prompt_, kPredict, nullptr);
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(g2->tokens, ref_->tokens);
}

}  // namespace
}  // namespace kdn::llama
