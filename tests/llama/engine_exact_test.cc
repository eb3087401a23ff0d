// Exactness of KV reuse inside one process, on the real SmolLM2-135M: canonical chunks
// extracted from llama.cpp rebuild its own state blob byte for byte, and a prompt whose
// first k chunks come from the store (k = 1 .. all) yields bit-identical logits and the same
// 32 greedy tokens as a full prefill, with flash attention on (V rows) and off (V transposed).
#include "llama_test_util.h"

#include <llama.h>

#include <cstring>

namespace kdn::llama {
namespace {

using testing::kTestChunk;
using testing::open_engine;
using testing::open_store;
using testing::read_document;
using testing::same_bits;

constexpr uint32_t kChunks = 4;
constexpr uint32_t kContext = kChunks * kTestChunk;  // the document part of the prompt
constexpr uint32_t kPredict = 32;

class EngineExact : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    engine_ = open_engine(GetParam());
    ASSERT_NE(engine_, nullptr);
    doc_ = read_document();
    prompt_ = make_prompt("What does this document say about warranty?");
    ASSERT_GT(prompt_.size(), kContext);
  }
  std::vector<int32_t> make_prompt(const char* question) {
    Result<std::vector<int32_t>> p = engine_->chat_prompt(doc_, question, kContext);
    EXPECT_TRUE(p.ok()) << p.status().what();
    return p.ok() ? std::move(p.value()) : std::vector<int32_t>();
  }
  std::unique_ptr<Engine> engine_;
  std::string doc_;
  std::vector<int32_t> prompt_;
};

TEST_P(EngineExact, CanonicalChunksRebuildLlamaCppsOwnBlob) {
  const KvGeometry& g = engine_->identity().geometry;
  engine_->reset();
  ASSERT_TRUE(engine_->prefill(std::span(prompt_).first(kContext), 0, {}).ok());
  llama_context* ctx = engine_->context();
  std::vector<uint8_t> reference(llama_state_seq_get_size(ctx, 0));
  ASSERT_EQ(reference.size(), seq_blob_bytes(g, kContext));
  ASSERT_EQ(llama_state_seq_get_data(ctx, reference.data(), reference.size(), 0), reference.size());

  std::vector<std::vector<uint8_t>> chunks(kChunks, std::vector<uint8_t>(g.chunk_bytes()));
  std::vector<std::span<uint8_t>> out(chunks.begin(), chunks.end());
  ASSERT_TRUE(engine_->extract_chunks(0, out).ok());
  std::vector<std::span<const uint8_t>> in(chunks.begin(), chunks.end());
  std::vector<uint8_t> rebuilt(reference.size());
  ASSERT_TRUE(build_seq_blob(g, in, 0, rebuilt).ok());
  EXPECT_TRUE(rebuilt == reference) << "crafted blob differs from llama_state_seq_get_data";

  // Loading the chunks into a fresh cache puts every cell back in place: llama.cpp then
  // writes the same blob for the sequence.
  engine_->reset();
  ASSERT_TRUE(engine_->load_chunks(in).ok());
  std::vector<uint8_t> reloaded(reference.size());
  ASSERT_EQ(llama_state_seq_get_size(ctx, 0), reference.size());
  ASSERT_EQ(llama_state_seq_get_data(ctx, reloaded.data(), reloaded.size(), 0), reloaded.size());
  EXPECT_TRUE(reloaded == reference) << "loaded cells differ from the prefilled ones";
  engine_->reset();
  ASSERT_TRUE(engine_->prefill(std::span(prompt_).first(kContext), 0, {}).ok());

  // A middle chunk extracts to the same bytes as that chunk of the whole.
  std::vector<uint8_t> mid(g.chunk_bytes());
  std::vector<std::span<uint8_t>> one{mid};
  ASSERT_TRUE(engine_->extract_chunks(2, one).ok());
  EXPECT_TRUE(mid == chunks[2]);
  // Extraction leaves the sequence as it was and the scratch sequence empty.
  EXPECT_EQ(engine_->sequence_length(), kContext);
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(ctx), 1), -1);
  // Beyond the prefilled tokens there is nothing to extract.
  EXPECT_FALSE(engine_->extract_chunks(kChunks, one).ok());
}

TEST_P(EngineExact, EveryHitLengthMatchesAFullPrefillBitForBit) {
  Result<Generation> ref = engine_->generate(prompt_, kPredict, nullptr);
  ASSERT_TRUE(ref.ok()) << ref.status().what();
  ASSERT_EQ(ref->tokens.size(), kPredict) << "the answer ended early; pick another question";

  // A miss through the store computes everything, stores every whole chunk, and storing
  // (which copies ranges through a scratch sequence) does not disturb generation.
  MemoryNode full;
  auto writer = open_store(full, *engine_);
  Result<Generation> miss = engine_->generate(prompt_, kPredict, writer.get());
  ASSERT_TRUE(miss.ok());
  EXPECT_TRUE(miss->stats.cache_status.ok()) << miss->stats.cache_status.what();
  EXPECT_EQ(miss->stats.tokens_reused, 0u);
  EXPECT_EQ(miss->stats.chunks_stored, prompt_.size() / kTestChunk);
  EXPECT_EQ(miss->tokens, ref->tokens);
  EXPECT_TRUE(same_bits(miss->first_logits, ref->first_logits));

  // A second engine (its own context) loads the first k chunks and computes the rest.
  std::unique_ptr<Engine> reader = open_engine(GetParam());
  ASSERT_NE(reader, nullptr);
  for (uint32_t k = 1; k <= kChunks; ++k) {
    MemoryNode partial;
    auto store = open_store(partial, *reader);
    std::vector<kdn_key> keys(k);
    ASSERT_EQ(prefix_keys(store->model(), prompt_, keys), k);
    for (uint32_t i = 0; i < k; ++i) partial.chunks.emplace(keys[i], *writer->find(prompt_, i));

    Result<Generation> hit = reader->generate(prompt_, kPredict, store.get());
    ASSERT_TRUE(hit.ok());
    EXPECT_TRUE(hit->stats.cache_status.ok()) << hit->stats.cache_status.what();
    EXPECT_EQ(hit->stats.tokens_reused, k * kTestChunk) << "k=" << k;
    EXPECT_EQ(hit->stats.tokens_computed, prompt_.size() - k * kTestChunk);
    EXPECT_EQ(hit->tokens, ref->tokens) << "k=" << k;
    EXPECT_TRUE(same_bits(hit->first_logits, ref->first_logits)) << "k=" << k;
  }

  // Another question about the same document reuses the document's chunks.
  const std::vector<int32_t> other = make_prompt("Who may copy it?");
  Result<Generation> other_ref = reader->generate(other, kPredict, nullptr);
  auto store = open_store(full, *reader);
  Result<Generation> other_hit = reader->generate(other, kPredict, store.get());
  ASSERT_TRUE(other_ref.ok() && other_hit.ok());
  EXPECT_EQ(other_hit->stats.tokens_reused, kContext);
  EXPECT_EQ(other_hit->tokens, other_ref->tokens);
  EXPECT_TRUE(same_bits(other_hit->first_logits, other_ref->first_logits));
}

TEST_P(EngineExact, AFullyCachedPromptStillComputesItsLastChunk) {
  // A prompt of exactly 4 chunks: at most 3 load, the 4th is computed for its logits, in the
  // same batch a miss would use.
  const std::vector<int32_t> exact(prompt_.begin(), prompt_.begin() + kContext);
  MemoryNode node;
  auto store = open_store(node, *engine_);
  Result<Generation> miss = engine_->generate(exact, 4, store.get());
  Result<Generation> hit = engine_->generate(exact, 4, store.get());
  ASSERT_TRUE(miss.ok() && hit.ok());
  EXPECT_EQ(miss->stats.chunks_stored, kChunks);
  EXPECT_EQ(hit->stats.tokens_reused, kContext - kTestChunk);
  EXPECT_EQ(hit->stats.tokens_computed, kTestChunk);
  EXPECT_EQ(hit->tokens, miss->tokens);
  EXPECT_TRUE(same_bits(hit->first_logits, miss->first_logits));
}

INSTANTIATE_TEST_SUITE_P(FlashAttention, EngineExact, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "VRows" : "VTransposed"; });

}  // namespace
}  // namespace kdn::llama
