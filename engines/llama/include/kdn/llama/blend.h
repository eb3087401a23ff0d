// RAG prompts made of cached segments, blended (docs/blend.md).
//
// A RagPrompt is the chat template around system + documents + question, kept as token spans:
// the head (everything before the first document: BOS, the system prompt, the user turn's
// start), one span per document (tokenized alone, with the separator that follows it), and the
// tail (the question and the template's end). Its tokens are the concatenation, so a document's
// tokens are the same in every prompt, whatever comes before it.
//
// The head is the documents' base context: a document's KV is computed right after it, at
// positions head.size() ..., stored as a segment, and loaded into later prompts at whatever
// position the document lands, K re-rotated. Cross-attention between documents is then restored
// by recomputing a few tokens (the policy).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace kdn::llama {

enum class BlendPolicy : uint8_t {
  kNone,      // load every segment at its position (K re-rotated), recompute nothing: the control
  kHkvd,      // CacheBlend: recompute the tokens whose K deviates most at a check layer
  kBoundary,  // EPIC's LegoLink: recompute the first tokens of every segment after the first
  kAll,       // recompute every segment token (equals a full prefill; for tests)
};

// The name of a policy ("none", "hkvd", "boundary", "all") and back (false: unknown).
std::string_view blend_policy_name(BlendPolicy p) noexcept;
bool parse_blend_policy(std::string_view name, BlendPolicy* out) noexcept;

// What hkvd compares at the check layer: K rows, V rows, or both (their deviations summed).
enum class BlendDeviation : uint8_t { kK, kV, kKV };

std::string_view blend_deviation_name(BlendDeviation d) noexcept;
bool parse_blend_deviation(std::string_view name, BlendDeviation* out) noexcept;

struct BlendOptions {
  BlendPolicy policy = BlendPolicy::kHkvd;
  double recompute_ratio = 0.15;                  // hkvd: share of segment tokens recomputed
  uint32_t check_layer = 1;                       // hkvd: the layer whose deviation ranks the tokens
  BlendDeviation deviation = BlendDeviation::kK;  // hkvd: which rows the deviation compares
  uint32_t boundary_tokens = 16;  // boundary: tokens recomputed at the start of each segment after the first
};

struct RagPrompt {
  std::vector<int32_t> head;
  std::vector<std::vector<int32_t>> segments;
  std::vector<int32_t> tail;

  uint64_t size() const noexcept;
  std::vector<int32_t> tokens() const;
  // Position of segment i's first token in this prompt.
  uint64_t segment_pos(size_t i) const noexcept;
};

// What a blended prefill did (RequestStats::blend).
struct BlendStats {
  bool used = false;  // the prompt was blended (false: it fell back, or was not asked to)
  uint32_t segments = 0;
  uint32_t segments_reused = 0;    // loaded from the cache
  uint32_t segments_computed = 0;  // not cached whole: prefilled after the base context and stored
  uint64_t tokens_loaded = 0;      // segment tokens whose KV came from the cache
  uint64_t tokens_recomputed = 0;  // of those, recomputed by the policy
  uint64_t tokens_checked = 0;     // tokens run through the check layers (hkvd)
  uint32_t chunks_stored = 0;
  double lookup_s = 0;           // segment lookup
  double segment_prefill_s = 0;  // prefilling missing segments after the base context
  double segment_store_s = 0;    // storing them
  double place_s = 0;            // placing the prompt's cells (hkvd: the check pass)
  double retrieve_s = 0;         // segments -> KV cache (lease, re-rotate, scatter, check)
  double select_s = 0;           // deviation and top-k
  double recompute_s = 0;        // the head, the selected tokens and the question through every layer
};

}  // namespace kdn::llama
