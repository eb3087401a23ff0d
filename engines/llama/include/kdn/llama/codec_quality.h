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
// Beside top-1 agreement, the mean KL divergence KL(exact || codec) of the next-token
// distributions over the scored positions: a continuous measure that a near tie does not
// turn into all or nothing, which the calibration below is built on.
//
// Runs on the caller's engine (it resets its KV cache); not thread-safe, like the engine.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kernels/codec.h>
#include <kdn/llama/engine.h>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

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
  double kl = 0;                   // mean KL(exact || codec) of next-token distributions, nats
  // Where the runs disagree, how clear the exact run's choice was: the median over those
  // positions of p_exact(exact's token) - p_exact(codec's token); 0 when they never disagree.
  // margin_median is the exact run's p(top 1) - p(top 2) over every scored position, for scale.
  double flip_margin_median = 0;
  double margin_median = 0;
  double floor_top1_agreement = 0;  // the one-ulp control's agreement with the exact run
  double floor_ppl_delta_pct = 0;   // and its perplexity delta
  double floor_kl = 0;              // and its mean KL
};

// `tokens` must hold context_chunks * chunk_tokens + eval_tokens tokens (eval_tokens >= 2);
// the context is prefilled here to get its exact chunks.
Result<CodecQualityReport> measure_codec_quality(Engine& engine, std::span<const int32_t> tokens,
                                                 uint32_t context_chunks, uint32_t eval_tokens,
                                                 const kernels::CodecConfig& config) noexcept;

// The same with the context's exact canonical chunks given (e.g. leased from kdnd): `eval`
// are the tokens that follow them (at least 2).
Result<CodecQualityReport> measure_codec_quality(Engine& engine, std::span<const std::span<const uint8_t>> exact,
                                                 std::span<const int32_t> eval,
                                                 const kernels::CodecConfig& config) noexcept;

// Several configs on the same chunks: the exact and control runs are shared, one report per
// config in order.
Result<std::vector<CodecQualityReport>> measure_codec_quality(Engine& engine,
                                                              std::span<const std::span<const uint8_t>> exact,
                                                              std::span<const int32_t> eval,
                                                              std::span<const kernels::CodecConfig> configs) noexcept;

// Calibration of per-layer bit widths for a quantized mode (KVQuant-style sensitivity, measured
// through the real engine). The context is prefilled and round-tripped through the codec at
// the probe config's uniform width; then, for each layer and plane in turn, only that
// plane's KV is taken from the codec's copy (the rest exact) and the scored positions' mean KL
// against the exact run is that plane's sensitivity. kvc1_allocate_bits turns the
// sensitivities into widths averaging mean_bits. 2 * layers + 1 scoring runs.
//
// Measure on an engine that computes in floating point (f16_weights_model): llama.cpp's 8-bit
// activations for quantized weights turn any change of the KV, however small, into about the
// same KL (the one-ulp control's), which hides the differences between layers.
struct CalibrationOptions {
  uint32_t context_chunks = 4;  // chunks through the codec
  uint32_t eval_tokens = 256;   // positions scored after them
  double mean_bits = 4.0;       // the widths' mean over every layer's K and V
  uint32_t min_bits = 2;
  uint32_t max_bits = 8;
  // Called after each scoring run with (runs done, runs in all); may be empty.
  std::function<void(uint32_t done, uint32_t total)> progress;
};

struct CodecCalibration {
  uint32_t probe_bits = 0;              // the uniform width the sensitivities were measured at
  std::vector<double> k_sensitivity;    // per layer: mean KL with only that layer's K quantized
  std::vector<double> v_sensitivity;    // the same for V
  std::vector<uint8_t> k_bits, v_bits;  // the allocation (CodecConfig::layer_k_bits/layer_v_bits)
  double mean_bits = 0;                 // of the allocation
  double modelled_kl_uniform = 0;       // sum of sensitivities (every plane at probe_bits)
  double modelled_kl_allocated = 0;     // the allocation's modelled sum
  uint32_t context_tokens = 0;
  uint32_t eval_tokens = 0;
};

// `tokens` must hold context_chunks * chunk_tokens + eval_tokens tokens; `probe` is a kivi or
// int8 config with uniform widths (no per-layer arrays) and the same width for K and V.
Result<CodecCalibration> calibrate_codec_bits(Engine& engine, std::span<const int32_t> tokens,
                                              const kernels::CodecConfig& probe,
                                              const CalibrationOptions& options) noexcept;

}  // namespace kdn::llama
