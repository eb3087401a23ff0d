#include "node_workload.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace kdn::bench {
namespace {

constexpr uint32_t kQuestionTokens = 96;  // < one chunk

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void append_tokens(std::vector<int32_t>& out, uint64_t state, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    out.push_back(static_cast<int32_t>(splitmix64(state) % kVocabSize));
  }
}

}  // namespace

const std::vector<ModelLayout>& bench_models() {
  static const std::vector<ModelLayout> models = [] {
    std::vector<ModelLayout> v;
    for (const ModelPreset& p : model_presets()) v.push_back(ModelLayout{p});
    return v;
  }();
  return models;
}

std::optional<ModelLayout> find_model(std::string_view name) {
  for (const ModelLayout& m : bench_models()) {
    if (m.name == name) return m;
  }
  return std::nullopt;
}

kdn_model_desc model_desc(const ModelLayout& layout) {
  kdn_model_desc d = preset_desc(layout, "kdn-bench/" + std::string(layout.name));
  d.chunk_tokens = kBenchChunkTokens;
  return d;
}

std::vector<int32_t> document_tokens(uint64_t seed, uint32_t doc) {
  std::vector<int32_t> tokens;
  tokens.reserve(kDocTokens + kQuestionTokens);
  append_tokens(tokens, seed * 0x100000001B3ull + doc, kDocTokens);
  return tokens;
}

std::vector<int32_t> request_tokens(uint64_t seed, uint32_t doc, uint64_t request_id) {
  std::vector<int32_t> tokens = document_tokens(seed, doc);
  append_tokens(tokens, ~seed ^ (request_id * 0xD6E8FEB86659FD93ull), kQuestionTokens);
  return tokens;
}

ZipfSampler::ZipfSampler(uint32_t n, double s) {
  cdf_.resize(std::max<uint32_t>(n, 1));
  double sum = 0;
  for (size_t k = 0; k < cdf_.size(); ++k) {
    sum += std::pow(static_cast<double>(k + 1), -s);
    cdf_[k] = sum;
  }
  for (double& c : cdf_) c /= sum;
  cdf_.back() = 1.0;
}

uint32_t ZipfSampler::sample(std::mt19937_64& rng) const {
  double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
  return static_cast<uint32_t>(std::min<size_t>(it - cdf_.begin(), cdf_.size() - 1));
}

double ZipfSampler::probability(uint32_t k) const {
  if (k >= cdf_.size()) return 0;
  return k == 0 ? cdf_[0] : cdf_[k] - cdf_[k - 1];
}

}  // namespace kdn::bench
