// kdn-bench codec-curve: the ratio / quality curve of the transform mode (docs/codec.md §10)
// beside kivi4 and kivi2, on SmolLM2-135M's f16 weights (llama.cpp), all in one run.
//
// A calibration is learnt from the document's last tokens (never scored), then for each prompt
// size the context's exact chunks are prefilled once and every codec config is scored on the
// same chunks with the quality harness (kdn/llama/codec_quality.h: teacher-forced top-1 against
// the exact KV, mean KL of the next-token distributions, perplexity, compression ratio).
// Reported per config: the ratio, pooled top-1 with its 95% Wilson interval over positions and
// a percentile-bootstrap interval over prompts, and the KL per prompt.
#include "documents.h"
#include "stats.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/codec_transform.h>
#include <kdn/llama/codec_quality.h>
#include <kdn/llama/engine.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Json = nlohmann::json;
using kdn::llama::Engine;
namespace kk = kdn::kernels;

struct CurveOptions {
  std::vector<uint32_t> sizes = {1024, 2048, 4096};
  uint32_t eval_tokens = 256;
  std::vector<double> bits = {1.0, 1.5, 2.0, 2.5, 3.0};
  uint32_t calib_chunks = 16;
  int32_t threads = 0;
  std::string question = "Summarize the terms above in one sentence.";
  bool json = false;
};

std::string license_texts() { return kdn::bench::read_documents(kdn::bench::default_documents()); }

// The exact canonical chunks of tokens[0, chunks * chunk_tokens), prefilled from position 0.
kdn::Result<std::vector<std::vector<uint8_t>>> exact_chunks(Engine& e, std::span<const int32_t> tokens,
                                                            uint32_t chunks) {
  const kdn::llama::KvGeometry& g = e.identity().geometry;
  e.reset();
  KDN_RETURN_IF_ERROR(e.prefill(tokens.first(size_t{chunks} * g.chunk_tokens), 0, {}));
  std::vector<std::vector<uint8_t>> out(chunks, std::vector<uint8_t>(g.chunk_bytes()));
  std::vector<std::span<uint8_t>> spans(out.begin(), out.end());
  KDN_RETURN_IF_ERROR(e.extract_chunks(0, spans));
  return out;
}

// The calibration object, from the document's last calib_chunks chunks.
kdn::Result<std::vector<uint8_t>> calibrate(Engine& e, const std::string& doc, const CurveOptions& o) {
  auto tokens = e.tokenize(doc, false, false);
  if (!tokens.ok()) return tokens.status();
  const uint32_t ct = e.identity().geometry.chunk_tokens;
  const size_t need = size_t{o.calib_chunks} * ct;
  if (tokens->size() < need + o.sizes.back() + o.eval_tokens)
    return kdn::Status(kdn::Code::kInvalidArgument, "document too short to calibrate apart from the scored part");
  auto chunks = exact_chunks(e, std::span(*tokens).last(need), o.calib_chunks);
  if (!chunks.ok()) return chunks.status();
  std::vector<kk::Kvc1CalibrationSample> samples;
  for (size_t i = 0; i < chunks->size(); ++i) samples.push_back({(*chunks)[i].data(), int64_t(i) * ct});
  auto info = kdn::ModelInfo::from_desc(e.identity().desc);
  if (!info.ok()) return info.status();
  const kk::ChunkGeometry g = kk::kvc1_geometry(info.value());
  std::vector<uint8_t> obj(kk::kvc1_calibration_bytes(g));
  size_t written = 0;
  KDN_RETURN_IF_ERROR(kk::kvc1_calibrate(g, info->fingerprint, samples, obj.data(), obj.size(), &written));
  return obj;
}

struct Row {
  std::string name;
  std::vector<kdn::llama::CodecQualityReport> per_prompt;
};

Json row_json(const Row& r) {
  uint64_t agree = 0, n = 0, raw = 0;
  double bytes = 0;
  std::vector<double> top1, kl;
  for (const auto& q : r.per_prompt) {
    agree += static_cast<uint64_t>(q.top1_agreement * q.eval_tokens + 0.5);
    n += q.eval_tokens;
    top1.push_back(q.top1_agreement);
    kl.push_back(q.kl);
    raw += q.context_tokens;
    bytes += q.context_tokens / q.ratio_vs_fp16;
  }
  const kdn::bench::Interval w = kdn::bench::proportion_interval(agree, n);
  const kdn::bench::Interval b = kdn::bench::bootstrap_mean_interval(top1);
  return Json{{"config", r.name},
              {"ratio_vs_fp16", static_cast<double>(raw) / bytes},
              {"top1_pooled", static_cast<double>(agree) / static_cast<double>(n)},
              {"agreeing_positions", agree},
              {"positions", n},
              {"top1_wilson95", {w.lo, w.hi}},
              {"top1_bootstrap95_over_prompts", {b.lo, b.hi}},
              {"top1_per_prompt", top1},
              {"kl_per_prompt", kl},
              {"rel_frobenius_error_worst", r.per_prompt.empty() ? 0.0 : r.per_prompt.back().rel_frobenius_error}};
}

int run(const CurveOptions& o) {
  auto f16 = kdn::llama::f16_weights_model(kdn::llama::default_model_path());
  if (!f16.ok()) return std::fprintf(stderr, "codec-curve: %s\n", f16.status().what()), 1;
  kdn::llama::EngineOptions eo;
  eo.model_path = f16.value();
  eo.n_threads = o.threads;
  eo.n_ctx = std::max(o.sizes.back(), o.calib_chunks * 256) + o.eval_tokens + 512;
  auto eng = Engine::open(eo);
  if (!eng.ok()) return std::fprintf(stderr, "codec-curve: engine: %s\n", eng.status().what()), 1;
  Engine& e = *eng.value();
  const std::string doc = license_texts();
  auto cal_bytes = calibrate(e, doc, o);
  if (!cal_bytes.ok()) return std::fprintf(stderr, "codec-curve: calibration: %s\n", cal_bytes.status().what()), 1;
  kk::Kvc1Calibration cal;
  if (!kk::kvc1_calibration_open(cal_bytes->data(), cal_bytes->size(), &cal).ok()) return 1;
  std::vector<kk::CodecConfig> configs;
  std::vector<Row> rows;
  for (kk::CodecMode m : {kk::CodecMode::kKivi4, kk::CodecMode::kKivi2}) {
    configs.emplace_back().mode = m;
    rows.push_back({kk::codec_mode_name(m), {}});
  }
  for (double b : o.bits) {
    kk::CodecConfig& c = configs.emplace_back();
    c.mode = kk::CodecMode::kTransform;
    c.calibration = &cal;
    c.transform_mean_bits = b;
    char name[48];
    std::snprintf(name, sizeof name, "transform %.2f bits", b);
    rows.push_back({name, {}});
  }
  for (uint32_t size : o.sizes) {
    auto prompt = e.chat_prompt(doc, o.question, size + o.eval_tokens);
    if (!prompt.ok()) return std::fprintf(stderr, "codec-curve: prompt: %s\n", prompt.status().what()), 1;
    auto exact = exact_chunks(e, *prompt, size / 256);
    if (!exact.ok()) return std::fprintf(stderr, "codec-curve: prefill: %s\n", exact.status().what()), 1;
    std::vector<std::span<const uint8_t>> spans(exact->begin(), exact->end());
    auto q = kdn::llama::measure_codec_quality(e, spans, std::span(*prompt).subspan(size, o.eval_tokens), configs);
    if (!q.ok()) return std::fprintf(stderr, "codec-curve: quality: %s\n", q.status().what()), 1;
    for (size_t i = 0; i < rows.size(); ++i) rows[i].per_prompt.push_back((*q)[i]);
    std::fprintf(stderr, "codec-curve: %u tokens scored\n", size);
  }
  Json out{{"model", "SmolLM2-135M f16"},
           {"calibration_rows", cal.samples},
           {"sizes", o.sizes},
           {"eval_tokens", o.eval_tokens},
           {"rows", Json::array()}};
  for (const Row& r : rows) out["rows"].push_back(row_json(r));
  if (o.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("%-22s %8s %8s %17s %17s\n", "config", "ratio", "top-1", "wilson 95%", "bootstrap 95%");
  for (const Json& r : out["rows"])
    std::printf("%-22s %8.2f %8.4f %8.3f-%-8.3f %8.3f-%-8.3f\n", r["config"].get<std::string>().c_str(),
                r["ratio_vs_fp16"].get<double>(), r["top1_pooled"].get<double>(), r["top1_wilson95"][0].get<double>(),
                r["top1_wilson95"][1].get<double>(), r["top1_bootstrap95_over_prompts"][0].get<double>(),
                r["top1_bootstrap95_over_prompts"][1].get<double>());
  return 0;
}

}  // namespace

int run_codec_curve_bench(int argc, char** argv) {
  CLI::App app("kdn-bench codec-curve: ratio and top-1 of the transform mode beside kivi4 and kivi2");
  CurveOptions o;
  app.add_flag("--json", o.json, "print JSON");
  app.add_option("--sizes", o.sizes, "prompt sizes in tokens (multiples of 256, ascending)")->delimiter(',');
  app.add_option("--eval-tokens", o.eval_tokens, "document tokens scored after each context");
  app.add_option("--bits", o.bits, "transform mean code widths to score")->delimiter(',');
  app.add_option("--calib-chunks", o.calib_chunks, "chunks of the document's tail to calibrate on");
  app.add_option("--threads", o.threads, "llama.cpp threads (0: every core)");
  CLI11_PARSE(app, argc, argv);
  std::sort(o.sizes.begin(), o.sizes.end());
  for (uint32_t s : o.sizes)
    if (s == 0 || s % 256 != 0) return std::fprintf(stderr, "codec-curve: sizes must be multiples of 256\n"), 2;
  return run(o);
}
