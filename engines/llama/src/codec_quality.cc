#include <kdn/llama/codec_quality.h>

#include <kdn/common/median.h>
#include <kdn/common/model.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kdn::llama {
namespace {

// Teacher-forced predictions of one run over the scored tokens. The reference run keeps its
// log-probabilities so that later runs can be measured against them.
struct Scores {
  std::vector<int32_t> top1;
  double nll_sum = 0;  // -log p(actual next token), summed
  uint32_t nll_count = 0;
  double kl_sum = 0;             // sum over positions of KL(reference || this run)
  std::vector<float> log_probs;  // reference runs only: [position][vocab]
};

// log sum_j exp(logits[j]), computed around the largest logit.
double log_normalizer(std::span<const float> logits) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  return mx + std::log(sum);
}

// KL(p || q) from both distributions' log-probabilities.
double kl_divergence(std::span<const float> log_p, std::span<const float> log_q) {
  double kl = 0;
  for (size_t j = 0; j < log_p.size(); ++j)
    kl += std::exp(static_cast<double>(log_p[j])) * (static_cast<double>(log_p[j]) - log_q[j]);
  return kl;
}

// Scores `eval` on top of `chunks`. Without `reference` the run keeps its log-probabilities
// (it is the reference); with one, it sums its KL against it.
Status score(Engine& e, std::span<const std::span<const uint8_t>> chunks, std::span<const int32_t> eval,
             uint32_t first_pos, const Scores* reference, Scores& out) {
  e.reset();
  KDN_RETURN_IF_ERROR(e.load_chunks(chunks));
  const size_t vocab = e.n_vocab();
  out.top1.assign(eval.size(), -1);
  if (!reference) out.log_probs.resize(eval.size() * vocab);
  std::vector<float> scratch(reference ? vocab : 0);
  const LogitsSink sink = [&](uint32_t i, std::span<const float> logits) {
    out.top1[i] = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const double log_z = log_normalizer(logits);
    if (i + 1 < eval.size()) {
      out.nll_sum -= logits[static_cast<size_t>(eval[i + 1])] - log_z;
      ++out.nll_count;
    }
    const std::span<float> log_probs =
        reference ? std::span(scratch) : std::span(out.log_probs).subspan(i * vocab, vocab);
    for (size_t j = 0; j < vocab; ++j) log_probs[j] = static_cast<float>(logits[j] - log_z);
    if (reference) out.kl_sum += kl_divergence(std::span(reference->log_probs).subspan(i * vocab, vocab), log_probs);
  };
  return e.prefill(eval, first_pos, sink);
}

// Encodes and decodes every chunk, the chunks being one context in order (the first one starts
// the sequence, the last one ends the context); fills the size and tensor-error fields of
// `report`.
Status codec_round_trip(const Engine& e, std::span<const std::span<const uint8_t>> exact,
                        const kernels::CodecConfig& config, std::vector<std::vector<uint8_t>>& decoded,
                        CodecQualityReport& report) {
  Result<ModelInfo> info = ModelInfo::from_desc(e.identity().desc);
  if (!info.ok()) return info.status();
  const kernels::ChunkGeometry geo = kernels::kvc1_geometry(info.value());
  kernels::CodecConfig chunk_config = config;
  chunk_config.pos_base = 0;
  chunk_config.ends_context = true;  // sizes for the chunk that carries the most exact rows
  const size_t cap = kernels::kvc1_max_encoded_size(geo, chunk_config);
  const size_t scratch_bytes = kernels::kvc1_encode_scratch_bytes(geo, chunk_config);
  if (cap == 0) return Status(Code::kInvalidArgument, "codec config does not fit this model");
  std::vector<uint8_t> blob(cap), scratch(std::max<size_t>(scratch_bytes, 1));
  uint64_t raw_bytes = 0, encoded_bytes = 0;
  report.cosine_min = 1.0;
  for (size_t c = 0; c < exact.size(); ++c) {
    size_t written = 0;
    chunk_config.pos_base = static_cast<int64_t>(c) * geo.tokens;
    chunk_config.ends_context = c + 1 == exact.size();
    KDN_RETURN_IF_ERROR(kernels::kvc1_encode(geo, info->fingerprint, exact[c].data(), chunk_config, blob.data(), cap,
                                             &written, scratch.data(), scratch.size()));
    decoded[c].resize(exact[c].size());
    kernels::DecodeOptions opts;
    opts.calibration = config.calibration;  // the transform mode's; null otherwise
    KDN_RETURN_IF_ERROR(
        kernels::kvc1_decode(blob.data(), written, geo, info->fingerprint, decoded[c].data(), decoded[c].size(), opts));
    const kernels::CodecQuality q = kernels::kvc1_quality(geo, exact[c].data(), decoded[c].data(), written);
    report.rel_frobenius_error = std::max(report.rel_frobenius_error, q.rel_frobenius_error);
    report.cosine_min = std::min(report.cosine_min, q.cosine_min);
    raw_bytes += kernels::chunk_elements(geo) * 2;
    encoded_bytes += written;
  }
  report.ratio_vs_fp16 = static_cast<double>(raw_bytes) / static_cast<double>(encoded_bytes);
  return OkStatus();
}

// The one-ulp control: flips the lowest bit of a fixed pseudo-random half of the elements.
std::vector<std::vector<uint8_t>> flip_last_bits(std::span<const std::span<const uint8_t>> exact, uint32_t elem_bytes) {
  std::vector<std::vector<uint8_t>> out(exact.size());
  uint64_t state = 0x9E3779B97F4A7C15ull;  // xorshift64: the same pattern on every machine
  for (size_t c = 0; c < exact.size(); ++c) {
    out[c].assign(exact[c].begin(), exact[c].end());
    for (size_t i = 0; i + elem_bytes <= out[c].size(); i += elem_bytes) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      out[c][i] ^= static_cast<uint8_t>(state >> 63);  // little-endian: byte 0 holds the lowest bit
    }
  }
  return out;
}

double agreement(const Scores& a, const Scores& b) {
  uint32_t same = 0;
  for (size_t i = 0; i < a.top1.size(); ++i) same += a.top1[i] == b.top1[i];
  return static_cast<double>(same) / static_cast<double>(a.top1.size());
}

// The exact run's probability of its own token minus that of `run`'s, at each position where
// they differ (the reference keeps its log-probabilities).
std::vector<double> flip_margins(const Scores& reference, const Scores& run, size_t vocab) {
  std::vector<double> out;
  for (size_t i = 0; i < reference.top1.size(); ++i) {
    if (reference.top1[i] == run.top1[i]) continue;
    const float* lp = reference.log_probs.data() + i * vocab;
    out.push_back(std::exp(static_cast<double>(lp[reference.top1[i]])) -
                  std::exp(static_cast<double>(lp[run.top1[i]])));
  }
  return out;
}

// The exact run's p(top 1) - p(top 2) at every position (top1 is its argmax already; the
// runner-up is found among the log-probabilities, and only the two are exponentiated).
std::vector<double> top2_margins(const Scores& reference, size_t vocab) {
  std::vector<double> out;
  for (size_t i = 0; i < reference.top1.size(); ++i) {
    const float* lp = reference.log_probs.data() + i * vocab;
    const size_t first = static_cast<size_t>(reference.top1[i]);
    float second = -std::numeric_limits<float>::infinity();
    for (size_t j = 0; j < vocab; ++j)
      if (j != first) second = std::max(second, lp[j]);
    out.push_back(std::exp(static_cast<double>(lp[first])) - std::exp(static_cast<double>(second)));
  }
  return out;
}

double perplexity(const Scores& s) { return std::exp(s.nll_sum / s.nll_count); }

std::vector<std::span<const uint8_t>> spans_of(const std::vector<std::vector<uint8_t>>& v) {
  return {v.begin(), v.end()};
}

bool sizes_match(const KvGeometry& g, std::span<const std::span<const uint8_t>> chunks) {
  for (const auto& c : chunks)
    if (c.size() != g.chunk_bytes()) return false;
  return !chunks.empty();
}

// Prefills the first context_chunks chunks of `tokens` and extracts them.
Result<std::vector<std::vector<uint8_t>>> prefill_exact(Engine& e, std::span<const int32_t> tokens,
                                                        uint32_t context_chunks, uint32_t eval_tokens) {
  const KvGeometry& g = e.identity().geometry;
  const uint64_t context = uint64_t{context_chunks} * g.chunk_tokens;
  if (context_chunks == 0 || tokens.size() < context + eval_tokens)
    return Status(Code::kInvalidArgument, "not enough tokens for the context and the scored part");
  e.reset();
  KDN_RETURN_IF_ERROR(e.prefill(tokens.first(context), 0, {}));
  std::vector<std::vector<uint8_t>> exact(context_chunks, std::vector<uint8_t>(g.chunk_bytes()));
  std::vector<std::span<uint8_t>> out(exact.begin(), exact.end());
  KDN_RETURN_IF_ERROR(e.extract_chunks(0, out));
  return exact;
}

double mean_kl(const Scores& s) { return s.kl_sum / static_cast<double>(s.top1.size()); }

// The probe width of a calibration config, or 0 if it cannot be one.
uint32_t probe_bits_of(const kernels::CodecConfig& c) {
  const uint32_t def = kernels::codec_mode_default_bits(c.mode);
  const uint32_t k = c.k_bits ? c.k_bits : def, v = c.v_bits ? c.v_bits : def;
  if (def == 0 || k != v || c.layer_k_bits || c.layer_v_bits) return 0;
  return k;
}

// `exact` with layer `layer`'s plane `plane` (0 K, 1 V) replaced by `decoded`'s, chunk by chunk.
void splice_plane(std::span<const std::span<const uint8_t>> exact, const std::vector<std::vector<uint8_t>>& decoded,
                  const KvGeometry& g, uint32_t layer, uint32_t plane, std::vector<std::vector<uint8_t>>& out) {
  const size_t plane_bytes = g.plane_bytes();
  const size_t at = (size_t{layer} * 2 + plane) * plane_bytes;
  for (size_t c = 0; c < exact.size(); ++c) {
    out[c].assign(exact[c].begin(), exact[c].end());
    std::copy_n(decoded[c].begin() + static_cast<ptrdiff_t>(at), plane_bytes,
                out[c].begin() + static_cast<ptrdiff_t>(at));
  }
}

}  // namespace

Result<std::vector<CodecQualityReport>> measure_codec_quality(Engine& engine,
                                                              std::span<const std::span<const uint8_t>> exact,
                                                              std::span<const int32_t> eval,
                                                              std::span<const kernels::CodecConfig> configs) noexcept {
  const KvGeometry& g = engine.identity().geometry;
  if (!sizes_match(g, exact) || eval.size() < 2)
    return Status(Code::kInvalidArgument, "need whole exact chunks and at least 2 scored tokens");
  const uint32_t context = static_cast<uint32_t>(exact.size()) * g.chunk_tokens;
  Scores base, control;
  KDN_RETURN_IF_ERROR(score(engine, exact, eval, context, nullptr, base));
  const std::vector<std::vector<uint8_t>> flipped = flip_last_bits(exact, g.elem_bytes());
  KDN_RETURN_IF_ERROR(score(engine, spans_of(flipped), eval, context, &base, control));
  const double margin = median(top2_margins(base, engine.n_vocab()));
  std::vector<CodecQualityReport> reports;
  for (const kernels::CodecConfig& config : configs) {
    CodecQualityReport report;
    report.context_tokens = context;
    report.eval_tokens = static_cast<uint32_t>(eval.size());
    std::vector<std::vector<uint8_t>> decoded(exact.size());
    KDN_RETURN_IF_ERROR(codec_round_trip(engine, exact, config, decoded, report));
    Scores lossy;
    KDN_RETURN_IF_ERROR(score(engine, spans_of(decoded), eval, context, &base, lossy));
    report.top1_agreement = agreement(base, lossy);
    report.flip_margin_median = median(flip_margins(base, lossy, engine.n_vocab()));
    report.margin_median = margin;
    report.ppl_exact = perplexity(base);
    report.ppl_codec = perplexity(lossy);
    report.ppl_delta_pct = 100.0 * (report.ppl_codec - report.ppl_exact) / report.ppl_exact;
    report.kl = mean_kl(lossy);
    report.floor_top1_agreement = agreement(base, control);
    report.floor_ppl_delta_pct = 100.0 * (perplexity(control) - report.ppl_exact) / report.ppl_exact;
    report.floor_kl = mean_kl(control);
    reports.push_back(report);
  }
  engine.reset();
  return reports;
}

Result<CodecQualityReport> measure_codec_quality(Engine& engine, std::span<const std::span<const uint8_t>> exact,
                                                 std::span<const int32_t> eval,
                                                 const kernels::CodecConfig& config) noexcept {
  Result<std::vector<CodecQualityReport>> r = measure_codec_quality(engine, exact, eval, std::span(&config, 1));
  if (!r.ok()) return r.status();
  return r.value().front();
}

Result<CodecQualityReport> measure_codec_quality(Engine& engine, std::span<const int32_t> tokens,
                                                 uint32_t context_chunks, uint32_t eval_tokens,
                                                 const kernels::CodecConfig& config) noexcept {
  Result<std::vector<std::vector<uint8_t>>> exact = prefill_exact(engine, tokens, context_chunks, eval_tokens);
  if (!exact.ok()) return exact.status();
  const uint64_t context = uint64_t{context_chunks} * engine.identity().geometry.chunk_tokens;
  return measure_codec_quality(engine, spans_of(exact.value()), tokens.subspan(context, eval_tokens), config);
}

Result<CodecCalibration> calibrate_codec_bits(Engine& engine, std::span<const int32_t> tokens,
                                              const kernels::CodecConfig& probe,
                                              const CalibrationOptions& options) noexcept {
  const uint32_t probe_bits = probe_bits_of(probe);
  if (probe_bits == 0)
    return Status(Code::kInvalidArgument, "calibration probe: a quantized mode with one uniform width for K and V");
  if (options.eval_tokens < 2) return Status(Code::kInvalidArgument, "calibration: at least 2 scored tokens");
  const KvGeometry& g = engine.identity().geometry;
  CodecCalibration cal;
  cal.k_bits.resize(g.n_layer);
  cal.v_bits.resize(g.n_layer);
  // The allocator checks its bounds itself; asking it once with no sensitivities does that
  // before the runs instead of after them.
  const std::vector<double> unmeasured(g.n_layer, 0.0);
  KDN_RETURN_IF_ERROR(kernels::kvc1_allocate_bits(unmeasured, unmeasured, probe_bits, options.mean_bits,
                                                  options.min_bits, options.max_bits, cal.k_bits, cal.v_bits));
  Result<std::vector<std::vector<uint8_t>>> exact_r =
      prefill_exact(engine, tokens, options.context_chunks, options.eval_tokens);
  if (!exact_r.ok()) return exact_r.status();
  const std::vector<std::span<const uint8_t>> exact = spans_of(exact_r.value());
  const uint32_t context = options.context_chunks * g.chunk_tokens;
  const std::span<const int32_t> eval = tokens.subspan(context, options.eval_tokens);

  CodecQualityReport unused;
  std::vector<std::vector<uint8_t>> decoded(exact.size()), spliced(exact.size());
  KDN_RETURN_IF_ERROR(codec_round_trip(engine, exact, probe, decoded, unused));
  const uint32_t runs = 2 * g.n_layer + 1;
  Scores base;
  KDN_RETURN_IF_ERROR(score(engine, exact, eval, context, nullptr, base));
  if (options.progress) options.progress(1, runs);

  cal.probe_bits = probe_bits;
  cal.context_tokens = context;
  cal.eval_tokens = options.eval_tokens;
  cal.k_sensitivity.resize(g.n_layer);
  cal.v_sensitivity.resize(g.n_layer);
  for (uint32_t layer = 0; layer < g.n_layer; ++layer)
    for (uint32_t plane = 0; plane < 2; ++plane) {
      splice_plane(exact, decoded, g, layer, plane, spliced);
      Scores s;
      KDN_RETURN_IF_ERROR(score(engine, spans_of(spliced), eval, context, &base, s));
      // A KL below zero is rounding in the sum; it means "no measurable effect".
      (plane == 0 ? cal.k_sensitivity : cal.v_sensitivity)[layer] = std::max(0.0, mean_kl(s));
      if (options.progress) options.progress(2 + 2 * layer + plane, runs);
    }
  engine.reset();

  KDN_RETURN_IF_ERROR(kernels::kvc1_allocate_bits(cal.k_sensitivity, cal.v_sensitivity, probe_bits, options.mean_bits,
                                                  options.min_bits, options.max_bits, cal.k_bits, cal.v_bits));
  double bits = 0;
  for (uint32_t l = 0; l < g.n_layer; ++l) {
    bits += cal.k_bits[l] + cal.v_bits[l];
    cal.modelled_kl_uniform += cal.k_sensitivity[l] + cal.v_sensitivity[l];
    cal.modelled_kl_allocated += kernels::kvc1_modelled_cost(cal.k_sensitivity[l], probe_bits, cal.k_bits[l]) +
                                 kernels::kvc1_modelled_cost(cal.v_sensitivity[l], probe_bits, cal.v_bits[l]);
  }
  cal.mean_bits = bits / (2.0 * g.n_layer);
  return cal;
}

}  // namespace kdn::llama
