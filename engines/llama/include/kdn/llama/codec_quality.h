// What a lossy KV codec costs in model quality, measured on a real document.
//
// The document's first context chunks are prefilled once and extracted as canonical chunks.
// Then the next eval_tokens tokens are scored twice with teacher forcing: once on top of the
// exact chunks, once on top of the same chunks after a KVC1 encode -> decode round trip.
// Only the cached prefix goes through the codec, as in real reuse; the scored tokens' own KV
// is computed fresh. Reported: how often both runs predict the same next token (top-1
// agreement), the perplexity of the document's actual next tokens under each, and the
// codec's compression ratio and tensor error.
//
// A third run is the control that says how much agreement any lossy KV can keep: the exact
// chunks with the lowest bit of a fixed pseudo-random half of the elements flipped, a change
// of at most one unit in the last place. Engines that quantize activations (llama.cpp
// multiplies quantized weights by 8-bit activations) turn even that into flipped near-ties,
// so floor_top1_agreement is the ceiling a codec's top1_agreement can be read against.
//
// Runs on the caller's engine (it resets its KV cache); not thread-safe, like the engine.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kernels/codec.h>
#include <kdn/llama/engine.h>

#include <cstdint>
#include <span>

namespace kdn::llama {

struct CodecQualityReport {
  uint32_t context_tokens = 0;     // tokens whose KV went through the codec
  uint32_t eval_tokens = 0;        // positions scored after them
  double top1_agreement = 0;       // fraction of positions where both runs pick the same token
  double ppl_exact = 0;            // perplexity of the document's next tokens, exact KV
  double ppl_codec = 0;            // the same with the codec's KV
  double ppl_delta_pct = 0;        // 100 * (ppl_codec - ppl_exact) / ppl_exact
  double ratio_vs_fp16 = 0;        // canonical fp16 bytes / encoded bytes, all chunks
  double rel_frobenius_error = 0;  // worst chunk
  double cosine_min = 0;           // worst (layer, plane) over all chunks
  double floor_top1_agreement = 0; // the one-ulp control's agreement with the exact run
  double floor_ppl_delta_pct = 0;  // and its perplexity delta
};

// `tokens` must hold context_chunks * chunk_tokens + eval_tokens tokens (eval_tokens >= 2);
// the context is prefilled here to get its exact chunks.
Result<CodecQualityReport> measure_codec_quality(Engine& engine, std::span<const int32_t> tokens,
                                                 uint32_t context_chunks, uint32_t eval_tokens,
                                                 const kernels::CodecConfig& config) noexcept;

// The same with the context's exact canonical chunks given (e.g. leased from kdnd): `eval`
// are the tokens that follow them (at least 2).
Result<CodecQualityReport> measure_codec_quality(Engine& engine,
                                                 std::span<const std::span<const uint8_t>> exact,
                                                 std::span<const int32_t> eval,
                                                 const kernels::CodecConfig& config) noexcept;

}  // namespace kdn::llama
