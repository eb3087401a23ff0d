// Shared helpers of the llama.cpp engine tests: the model, a real document, engines and
// stores.
#pragma once

#include <kdn/llama/chunk_cache.h>
#include <kdn/llama/engine.h>

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

namespace kdn::llama::testing {

inline std::string read_document() {
  std::ifstream in(KDN_LLAMA_TEST_DOC);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Tests use 128-token chunks so a short prompt (CI time) still spans several chunks, and one
// thread, because ctest runs tests side by side on two cores. (llama.cpp results may differ
// between thread counts, so every comparison here is between runs of one engine setup.)
constexpr uint32_t kTestChunk = 128;

inline EngineOptions test_engine_options(bool flash_attn = true, uint32_t n_ctx = 1024,
                                         const std::string& model = KDN_LLAMA_TEST_MODEL) {
  EngineOptions o;
  o.model_path = model;
  o.n_ctx = n_ctx;
  o.chunk_tokens = kTestChunk;
  o.n_threads = 1;
  o.flash_attn = flash_attn;
  return o;
}

inline std::unique_ptr<Engine> open_engine(const EngineOptions& o) {
  Result<std::unique_ptr<Engine>> e = Engine::open(o);
  EXPECT_TRUE(e.ok()) << e.status().what();
  if (!e.ok()) return nullptr;
  EXPECT_TRUE(e.value()->cache_support().ok()) << e.value()->cache_support().what();
  return std::move(e.value());
}

inline std::unique_ptr<Engine> open_engine(bool flash_attn = true, uint32_t n_ctx = 1024,
                                           const std::string& model = KDN_LLAMA_TEST_MODEL) {
  return open_engine(test_engine_options(flash_attn, n_ctx, model));
}

inline std::unique_ptr<MemoryChunkCache> open_store(MemoryNode& node, const Engine& e) {
  Result<std::unique_ptr<MemoryChunkCache>> s = MemoryChunkCache::open(node, e.identity().desc);
  EXPECT_TRUE(s.ok()) << s.status().what();
  return s.ok() ? std::move(s.value()) : nullptr;
}

// Bitwise equality of two logit vectors (memcmp, so -0.0 != 0.0 and NaN patterns count).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace kdn::llama::testing
