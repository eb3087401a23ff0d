// The node benchmark's workload: model layouts, a deterministic document corpus and a Zipf
// request stream. Everything here is a pure function of its seed, so every engine process
// (and every rerun) sees the same documents and keys.
#pragma once

#include <kdn/common/model_presets.h>
#include <kdn/kdn.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

namespace kdn::bench {

constexpr uint32_t kBenchChunkTokens = 256;
constexpr uint32_t kDocTokens = 8192;  // 32 chunks
constexpr uint32_t kVocabSize = 128256;

// A model preset with the benchmark's chunk and document sizes (fp16, 256-token chunks).
struct ModelLayout : ModelPreset {
  uint64_t chunk_bytes() const noexcept {
    return uint64_t{layers} * 2 * kBenchChunkTokens * kv_heads * head_dim * sizeof(uint16_t);
  }
  uint64_t doc_bytes() const noexcept { return chunk_bytes() * (kDocTokens / kBenchChunkTokens); }
};

// The presets: llama3-8b (32 MiB per chunk) and smollm2-135m (5.625 MiB per chunk).
const std::vector<ModelLayout>& bench_models();
std::optional<ModelLayout> find_model(std::string_view name);

// The descriptor an engine registers for `layout`.
kdn_model_desc model_desc(const ModelLayout& layout);

// Token ids of document `doc` (kDocTokens of them, in [0, kVocabSize)).
std::vector<int32_t> document_tokens(uint64_t seed, uint32_t doc);

// A request prompt: the document followed by a short question that never completes a chunk,
// as a RAG prompt is. Only the document's whole chunks are ever cached.
std::vector<int32_t> request_tokens(uint64_t seed, uint32_t doc, uint64_t request_id);

// Samples ranks 0..n-1 with P(k) proportional to (k + 1)^-s.
class ZipfSampler {
 public:
  ZipfSampler(uint32_t n, double s);
  uint32_t sample(std::mt19937_64& rng) const;
  double probability(uint32_t k) const;
  uint32_t size() const noexcept { return static_cast<uint32_t>(cdf_.size()); }

 private:
  std::vector<double> cdf_;
};

}  // namespace kdn::bench
