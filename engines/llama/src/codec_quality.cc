#include <kdn/llama/codec_quality.h>

#include <kdn/common/model.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace kdn::llama {
namespace {

// Teacher-forced predictions of one run over the scored tokens.
struct Scores {
  std::vector<int32_t> top1;
  double nll_sum = 0;  // -log p(actual next token), summed
  uint32_t nll_count = 0;
};

double log_prob(std::span<const float> logits, int32_t target) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  return (static_cast<double>(logits[static_cast<size_t>(target)]) - mx) - std::log(sum);
}

Status score(Engine& e, std::span<const std::span<const uint8_t>> chunks, std::span<const int32_t> eval,
             uint32_t first_pos, Scores& out) {
  e.reset();
  KDN_RETURN_IF_ERROR(e.load_chunks(chunks));
  out.top1.assign(eval.size(), -1);
  const LogitsSink sink = [&](uint32_t i, std::span<const float> logits) {
    out.top1[i] = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (i + 1 < eval.size()) {
      out.nll_sum -= log_prob(logits, eval[i + 1]);
      ++out.nll_count;
    }
  };
  return e.prefill(eval, first_pos, sink);
}

// Encodes and decodes every chunk; fills the size and tensor-error fields of `report`.
Status codec_round_trip(const Engine& e, std::span<const std::span<const uint8_t>> exact,
                        const kernels::CodecConfig& config, std::vector<std::vector<uint8_t>>& decoded,
                        CodecQualityReport& report) {
  Result<ModelInfo> info = ModelInfo::from_desc(e.identity().desc);
  if (!info.ok()) return info.status();
  const kernels::ChunkGeometry geo = kernels::kvc1_geometry(info.value());
  const size_t cap = kernels::kvc1_max_encoded_size(geo, config);
  const size_t scratch_bytes = kernels::kvc1_encode_scratch_bytes(geo, config);
  if (cap == 0) return Status(Code::kInvalidArgument, "codec config does not fit this model");
  std::vector<uint8_t> blob(cap), scratch(std::max<size_t>(scratch_bytes, 1));
  uint64_t raw_bytes = 0, encoded_bytes = 0;
  report.cosine_min = 1.0;
  kernels::CodecConfig chunk_config = config;
  for (size_t c = 0; c < exact.size(); ++c) {
    size_t written = 0;
    chunk_config.pos_base = static_cast<int64_t>(c) * geo.tokens;  // the chunks are the context in order
    KDN_RETURN_IF_ERROR(kernels::kvc1_encode(geo, info->fingerprint, exact[c].data(), chunk_config, blob.data(), cap,
                                             &written, scratch.data(), scratch.size()));
    decoded[c].resize(exact[c].size());
    KDN_RETURN_IF_ERROR(kernels::kvc1_decode(blob.data(), written, geo, info->fingerprint, decoded[c].data(),
                                             decoded[c].size()));
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
std::vector<std::vector<uint8_t>> flip_last_bits(std::span<const std::span<const uint8_t>> exact,
                                                 uint32_t elem_bytes) {
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

double perplexity(const Scores& s) { return std::exp(s.nll_sum / s.nll_count); }

std::vector<std::span<const uint8_t>> spans_of(const std::vector<std::vector<uint8_t>>& v) {
  return {v.begin(), v.end()};
}

bool sizes_match(const KvGeometry& g, std::span<const std::span<const uint8_t>> chunks) {
  for (const auto& c : chunks)
    if (c.size() != g.chunk_bytes()) return false;
  return !chunks.empty();
}

}  // namespace

Result<CodecQualityReport> measure_codec_quality(Engine& engine,
                                                 std::span<const std::span<const uint8_t>> exact,
                                                 std::span<const int32_t> eval,
                                                 const kernels::CodecConfig& config) noexcept {
  const KvGeometry& g = engine.identity().geometry;
  if (!sizes_match(g, exact) || eval.size() < 2)
    return Status(Code::kInvalidArgument, "need whole exact chunks and at least 2 scored tokens");
  CodecQualityReport report;
  const uint32_t context = static_cast<uint32_t>(exact.size()) * g.chunk_tokens;
  report.context_tokens = context;
  report.eval_tokens = static_cast<uint32_t>(eval.size());
  std::vector<std::vector<uint8_t>> decoded(exact.size());
  KDN_RETURN_IF_ERROR(codec_round_trip(engine, exact, config, decoded, report));

  Scores base, lossy, control;
  KDN_RETURN_IF_ERROR(score(engine, exact, eval, context, base));
  KDN_RETURN_IF_ERROR(score(engine, spans_of(decoded), eval, context, lossy));
  const std::vector<std::vector<uint8_t>> flipped = flip_last_bits(exact, g.elem_bytes());
  KDN_RETURN_IF_ERROR(score(engine, spans_of(flipped), eval, context, control));
  report.top1_agreement = agreement(base, lossy);
  report.ppl_exact = perplexity(base);
  report.ppl_codec = perplexity(lossy);
  report.ppl_delta_pct = 100.0 * (report.ppl_codec - report.ppl_exact) / report.ppl_exact;
  report.floor_top1_agreement = agreement(base, control);
  report.floor_ppl_delta_pct = 100.0 * (perplexity(control) - report.ppl_exact) / report.ppl_exact;
  engine.reset();
  return report;
}

Result<CodecQualityReport> measure_codec_quality(Engine& engine, std::span<const int32_t> tokens,
                                                 uint32_t context_chunks, uint32_t eval_tokens,
                                                 const kernels::CodecConfig& config) noexcept {
  const KvGeometry& g = engine.identity().geometry;
  const uint64_t context = uint64_t{context_chunks} * g.chunk_tokens;
  if (context_chunks == 0 || tokens.size() < context + eval_tokens)
    return Status(Code::kInvalidArgument, "not enough tokens for the context and the scored part");
  engine.reset();
  KDN_RETURN_IF_ERROR(engine.prefill(tokens.first(context), 0, {}));
  std::vector<std::vector<uint8_t>> exact(context_chunks, std::vector<uint8_t>(g.chunk_bytes()));
  std::vector<std::span<uint8_t>> out(exact.begin(), exact.end());
  KDN_RETURN_IF_ERROR(engine.extract_chunks(0, out));
  return measure_codec_quality(engine, spans_of(exact), tokens.subspan(context, eval_tokens), config);
}

}  // namespace kdn::llama
