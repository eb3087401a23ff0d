// kdn-bench blend: non-prefix KV reuse on a RAG workload (docs/blend.md), SmolLM2-135M on
// llama.cpp, against a full prefill and today's prefix caching, measured in one run.
//
// For each size class (about 2K, 4K and 8K tokens) the workload (rag_workload.h) draws prompts
// of several passages in random order. Each prompt, in one engine, back to back:
//   full     the whole prompt prefilled from an empty cache: ttft_full_prefill_s, and the
//            reference: its greedy answer of --answer-tokens tokens (not stopped at the end of
//            the turn, so every prompt scores the same number of positions) with the next-token
//            distribution at every answer position;
//   prefix   the prompt with kdnd's prefix cache (today's kdn: the longest cached prefix of
//            whole chunks is loaded, the rest prefilled, its chunks stored): ttft_prefix_cache_s;
//   policies each blend policy (hkvd, boundary, none) with its own kdnd namespace, so each sees
//            the workload from an empty cache: a passage's first use prefills and stores it,
//            later prompts load it wherever it lands. ttft_blend_s (per prompt with phases_s, where
//            the blended prefill spent it), then the quality: the
//            blended cache is scored teacher-forced along the reference answer (one decode per
//            position, as the reference), top-1 agreement and KL(full || blend) per position.
//   control  the reference's own KV of the documents with one ulp flipped in half of its
//            elements, the question prefilled on top, scored the same way: the floor_* figures
//            say how much top-1 agreement any change of the documents' KV leaves on these weights.
// Quality metrics (fixed before any tuning; docs/blend.md): per prompt, the share of answer
// positions whose top-1 token equals the reference's, and the mean KL; over prompts, their
// means with 95% percentile-bootstrap intervals (prompts resampled, positions of a prompt are
// not independent), and the share of prompts whose greedy answer is identical (top-1 agrees at
// every position up to the reference answer's first end-of-turn token, inclusive) with a
// Wilson interval. Every ratio divides figures of this run.
#include "commands.h"
#include "kdnd_process.h"
#include "process.h"
#include "rag_workload.h"
#include "report.h"
#include "stats.h"

#include <kdn/common/clock.h>
#include <kdn/llama/engine.h>
#include <kdn/llama/kdn_chunk_cache.h>

#include <llama.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <vector>

namespace {

using kdn::bench::Report;
using kdn::llama::BlendPolicy;
using kdn::llama::Engine;
using Json = Report::Json;

struct Options {
  std::string model = kdn::llama::default_model_path();
  std::string kdnd = kdn::bench::default_kdnd_path();
  std::vector<uint32_t> sizes = {2048, 4096, 8192};
  std::vector<uint32_t> prompts;  // per size; empty: the class's count
  std::vector<uint32_t> pool;     // passages per size; empty: the class's pool
  std::vector<std::string> policies = {"hkvd", "boundary", "none"};
  kdn::llama::BlendOptions blend;
  uint32_t answer_tokens = 48;
  int32_t threads = 1;
  uint64_t seed = 1;
  bool prefix = true;
  bool f16_weights = false;
  bool json = false;
};

double seconds(uint64_t t0, uint64_t t1) { return double(t1 - t0) * 1e-9; }

int32_t argmax(std::span<const float> l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

// log-softmax of logits, in double.
std::vector<double> log_softmax(std::span<const float> l) {
  const double m = *std::max_element(l.begin(), l.end());
  double s = 0;
  for (float x : l) s += std::exp(double(x) - m);
  const double lse = m + std::log(s);
  std::vector<double> out(l.size());
  for (size_t i = 0; i < l.size(); ++i) out[i] = double(l[i]) - lse;
  return out;
}

// KL(p || q) of two next-token distributions given as log-probabilities.
double kl(const std::vector<double>& lp, const std::vector<double>& lq) {
  double d = 0;
  for (size_t i = 0; i < lp.size(); ++i) d += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(0.0, d);
}

// The reference of one prompt: its full prefill, its greedy answer and distributions.
struct Reference {
  double ttft_s = 0;
  std::vector<int32_t> answer;
  std::vector<std::vector<double>> log_probs;  // per answer position
  size_t answer_end = 0;                       // positions up to the first end-of-turn, inclusive
};

struct Scored {
  double ttft_s = 0;
  bool blended = false;
  std::string fallback;  // why it fell back
  uint64_t served = 0;   // prompt tokens whose KV came from the cache, not recomputed
  uint64_t recomputed = 0, loaded = 0;
  uint32_t segments_computed = 0;
  kdn::llama::BlendStats phases;  // where a blended prefill's time went
  uint32_t agree = 0, positions = 0;
  double kl_mean = 0;
  bool identical = false;
};

kdn::Result<Reference> reference(Engine& e, const std::vector<int32_t>& tokens, uint32_t n) {
  Reference r;
  e.reset();
  const uint64_t t0 = kdn::now_ns();
  KDN_RETURN_IF_ERROR(e.prefill(tokens, 0, {}));
  int32_t tok = argmax(e.last_logits());
  r.ttft_s = seconds(t0, kdn::now_ns());
  const llama_vocab* vocab = llama_model_get_vocab(llama_get_model(e.context()));
  for (uint32_t j = 0; j < n; ++j) {
    std::span<const float> l = e.last_logits();
    tok = argmax(l);
    r.answer.push_back(tok);
    r.log_probs.push_back(log_softmax(l));
    if (r.answer_end == 0 && llama_vocab_is_eog(vocab, tok)) r.answer_end = j + 1;
    if (j + 1 < n) KDN_RETURN_IF_ERROR(e.decode_one(tok, uint32_t(tokens.size() + j)));
  }
  if (r.answer_end == 0) r.answer_end = n;
  return r;
}

// Teacher-forced along the reference: the engine stands after the prompt.
kdn::Status score(Engine& e, const Reference& ref, size_t prompt_tokens, Scored& s) {
  double kl_sum = 0;
  bool identical = true;
  for (size_t j = 0; j < ref.answer.size(); ++j) {
    std::span<const float> l = e.last_logits();
    const bool agree = argmax(l) == ref.answer[j];
    s.agree += agree;
    if (j < ref.answer_end) identical &= agree;
    kl_sum += kl(ref.log_probs[j], log_softmax(l));
    if (j + 1 < ref.answer.size()) KDN_RETURN_IF_ERROR(e.decode_one(ref.answer[j], uint32_t(prompt_tokens + j)));
  }
  s.positions = uint32_t(ref.answer.size());
  s.kl_mean = kl_sum / double(ref.answer.size());
  s.identical = identical;
  return kdn::OkStatus();
}

kdn::Result<Scored> run_policy(Engine& e, kdn::llama::ChunkCache& cache, const kdn::llama::RagPrompt& p,
                               const std::vector<int32_t>& tokens, const kdn::llama::BlendOptions& bo,
                               const Reference& ref) {
  Scored s;
  kdn::llama::RequestStats stats;
  e.reset();
  const uint64_t t0 = kdn::now_ns();
  const kdn::Status st = e.prefill_blend(p, cache, bo, stats);
  if (!st.ok()) {  // the engine's fallback: the whole prompt
    s.fallback = st.what();
    KDN_RETURN_IF_ERROR(e.prefill(tokens, 0, {}));
  }
  (void)argmax(e.last_logits());
  s.ttft_s = seconds(t0, kdn::now_ns());
  s.blended = st.ok();
  if (s.blended) {
    s.loaded = stats.blend.tokens_loaded;
    s.recomputed = stats.blend.tokens_recomputed;
    s.served = s.loaded - s.recomputed;
    s.segments_computed = stats.blend.segments_computed;
    s.phases = stats.blend;
  }
  KDN_RETURN_IF_ERROR(score(e, ref, tokens.size(), s));
  return s;
}

// The control: the exact KV of the documents (the reference's own cells) with one ulp flipped in
// half of their elements, the question prefilled on top, scored like a policy. What any change
// of the documents' KV costs on these weights: the floor a policy's agreement is read against.
kdn::Result<Scored> run_control(Engine& e, const kdn::llama::RagPrompt& p, const std::vector<int32_t>& tokens,
                                const Reference& ref) {
  const uint32_t b = uint32_t(p.head.size()), end = uint32_t(p.size() - p.tail.size());
  llama_memory_seq_rm(llama_get_memory(e.context()), 0, static_cast<llama_pos>(end), -1);
  KDN_RETURN_IF_ERROR(e.perturb_kv_ulp(b, end - b));
  KDN_RETURN_IF_ERROR(e.prefill(std::span(tokens).subspan(end), end, {}));
  Scored s;
  KDN_RETURN_IF_ERROR(score(e, ref, tokens.size(), s));
  return s;
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

// Per policy, what a size class (or all of them) gathered.
struct PolicyTotals {
  std::vector<double> ttft, ttft_full, ttft_prefix, agree, kl, ttft_warm, ttft_full_warm;
  uint64_t identical = 0, prompts = 0, fallbacks = 0, agree_pos = 0, positions = 0;
  uint64_t served = 0, recomputed = 0, loaded = 0, prompt_tokens = 0;

  // One prompt's figures (ttft_prefix: 0 when the prefix cache was not run).
  void add(const Scored& s, double ttft_full_s, double ttft_prefix_s, size_t tokens) {
    ttft.push_back(s.ttft_s);
    ttft_full.push_back(ttft_full_s);
    if (ttft_prefix_s > 0) ttft_prefix.push_back(ttft_prefix_s);
    if (s.blended && s.segments_computed == 0) {  // every document came from the cache
      ttft_warm.push_back(s.ttft_s);
      ttft_full_warm.push_back(ttft_full_s);
    }
    agree.push_back(double(s.agree) / double(s.positions));
    kl.push_back(s.kl_mean);
    identical += s.identical;
    prompts += 1;
    fallbacks += !s.blended;
    agree_pos += s.agree;
    positions += s.positions;
    served += s.served;
    recomputed += s.recomputed;
    loaded += s.loaded;
    prompt_tokens += tokens;
  }

  // Everything `t` gathered, after what this one holds.
  void add(const PolicyTotals& t) {
    for (auto [dst, src] : {std::pair{&ttft, &t.ttft},
                            {&ttft_full, &t.ttft_full},
                            {&ttft_prefix, &t.ttft_prefix},
                            {&agree, &t.agree},
                            {&kl, &t.kl},
                            {&ttft_warm, &t.ttft_warm},
                            {&ttft_full_warm, &t.ttft_full_warm}})
      dst->insert(dst->end(), src->begin(), src->end());
    identical += t.identical;
    prompts += t.prompts;
    fallbacks += t.fallbacks;
    agree_pos += t.agree_pos;
    positions += t.positions;
    served += t.served;
    recomputed += t.recomputed;
    loaded += t.loaded;
    prompt_tokens += t.prompt_tokens;
  }
};

void report_policy(Report& r, const std::string& k, const PolicyTotals& t) {
  r.set(k + "ttft_blend_s", mean(t.ttft));
  r.set(k + "speedup_vs_full", kdn::bench::ratio(mean(t.ttft_full), mean(t.ttft)));
  r.set(k + "speedup_vs_full_median", kdn::bench::median([&] {
          std::vector<double> v;
          for (size_t i = 0; i < t.ttft.size(); ++i) v.push_back(t.ttft_full[i] / t.ttft[i]);
          return v;
        }()));
  r.set(k + "warm_prompts", uint64_t(t.ttft_warm.size()));
  r.set(k + "speedup_vs_full_warm",
        t.ttft_warm.empty() ? std::nullopt : kdn::bench::ratio(mean(t.ttft_full_warm), mean(t.ttft_warm)));
  if (!t.ttft_prefix.empty())
    r.set(k + "speedup_vs_prefix_cache", kdn::bench::ratio(mean(t.ttft_prefix), mean(t.ttft)));
  r.set(k + "recomputed_fraction", t.loaded ? double(t.recomputed) / double(t.loaded) : 0.0);
  r.set(k + "served_from_cache", t.prompt_tokens ? double(t.served) / double(t.prompt_tokens) : 0.0);
  r.set(k + "top1_agreement", mean(t.agree));
  const auto ci = kdn::bench::bootstrap_mean_interval(t.agree);
  r.set_json(k + "top1_agreement_ci95", Json::array({ci.lo, ci.hi}));
  r.set(k + "top1_agreement_pooled", t.positions ? double(t.agree_pos) / double(t.positions) : 0.0);
  r.set(k + "kl_mean", mean(t.kl));
  const auto kci = kdn::bench::bootstrap_mean_interval(t.kl);
  r.set_json(k + "kl_mean_ci95", Json::array({kci.lo, kci.hi}));
  r.set(k + "answers_identical_fraction", t.prompts ? double(t.identical) / double(t.prompts) : 0.0);
  const auto ici = kdn::bench::proportion_interval(t.identical, t.prompts);
  r.set_json(k + "answers_identical_ci95", Json::array({ici.lo, ici.hi}));
  r.set(k + "prompts", t.prompts);
  r.set(k + "fallbacks", t.fallbacks);
}

void add_flags(CLI::App& app, Options& o) {
  app.add_option("--model", o.model, "GGUF model (default: the one setup-llama.sh unpacked)");
  app.add_option("--kdnd", o.kdnd, "kdnd binary");
  app.add_option("--sizes", o.sizes, "prompt size classes (tokens): 2048, 4096, 8192; others scale the 2K class")
      ->delimiter(',');
  app.add_option("--prompts", o.prompts, "prompts per size (default: 50, 20, 5)")->delimiter(',');
  app.add_option("--pool", o.pool,
                 "passages cut per size (default: 40, 30, 24); a smaller pool reuses passages sooner, so "
                 "a run of few prompts reaches prompts whose passages are all cached")
      ->delimiter(',')
      ->check(CLI::Range(1u, 1000u));
  app.add_option("--policies", o.policies, "blend policies: hkvd, boundary, none, all")->delimiter(',');
  app.add_option("--recompute-ratio", o.blend.recompute_ratio, "hkvd: share of document tokens recomputed")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--check-layer", o.blend.check_layer, "hkvd: the layer whose deviation ranks tokens");
  app.add_option_function<std::string>(
         "--deviation", [&o](const std::string& v) { (void)kdn::llama::parse_blend_deviation(v, &o.blend.deviation); },
         "hkvd: rows compared at the check layer: k, v or kv (default k)")
      ->check(CLI::IsMember({"k", "v", "kv"}));
  app.add_option("--boundary-tokens", o.blend.boundary_tokens, "boundary: tokens recomputed per document");
  app.add_option("--answer-tokens", o.answer_tokens, "reference answer positions scored per prompt (>= 32)")
      ->check(CLI::Range(1u, 512u));
  app.add_option("--threads", o.threads, "llama.cpp threads");
  app.add_option("--seed", o.seed, "workload seed");
  app.add_flag("!--no-prefix", o.prefix, "skip the prefix-cache comparison");
  app.add_flag("--f16-weights", o.f16_weights,
               "run on the model's weights stored as f16 (NAME.f16.gguf, written next to it once): llama.cpp "
               "then computes activations in floating point instead of rounding them to 8 bits");
  app.add_flag("--json", o.json, "print JSON");
}

Json policy_row(const Scored& s) {
  return {{"ttft_blend_s", s.ttft_s},
          {"blended", s.blended},
          {"fallback", s.fallback},
          {"segments_computed", s.segments_computed},
          {"tokens_served", s.served},
          {"tokens_recomputed", s.recomputed},
          {"top1_agreement", double(s.agree) / double(s.positions)},
          {"kl_mean", s.kl_mean},
          {"answer_identical", s.identical},
          {"phases_s",
           {{"lookup", s.phases.lookup_s},
            {"segment_prefill", s.phases.segment_prefill_s},
            {"segment_store", s.phases.segment_store_s},
            {"place", s.phases.place_s},
            {"retrieve", s.phases.retrieve_s},
            {"select", s.phases.select_s},
            {"recompute", s.phases.recompute_s}}}};
}

// What the whole run shares: options, the engine, kdnd, the corpus and the report.
struct Run {
  Options o;
  std::vector<BlendPolicy> policies;
  std::unique_ptr<Engine> engine;
  std::optional<kdn::bench::TempDir> tmp;
  kdn::bench::KdndOptions kdnd_options;
  std::optional<kdn::bench::KdndProcess> kdnd;
  std::vector<kdn::bench::RagDocument> corpus;
  Report r;
  std::map<BlendPolicy, PolicyTotals> all;  // over every size
  PolicyTotals all_prefix, all_control;

  uint32_t count_tokens(const std::string& text) const {
    auto t = engine->tokenize(text, false, false);
    return t.ok() ? uint32_t(t->size()) : 0u;
  }
};

// One size class as it runs: its prompts' texts, its namespaces and what they gathered.
struct SizeRun {
  uint32_t size = 0;
  std::vector<std::string> texts;  // the passages
  std::map<BlendPolicy, std::unique_ptr<kdn::llama::KdnChunkCache>> caches;
  std::unique_ptr<kdn::llama::KdnChunkCache> prefix_cache;
  std::map<BlendPolicy, PolicyTotals> totals;
  PolicyTotals prefix, control;
  std::vector<double> full_ttfts;
  uint64_t prompt_tokens = 0;
  Json rows = Json::array();
};

// 0, or the exit code: 2 for a bad command line.
int parse_options(int argc, char** argv, Run& run) {
  CLI::App app("kdn-bench blend: blended RAG prompts vs full prefill and prefix caching (docs/blend.md)");
  Options& o = run.o;
  add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? -1 : 2;  // -1: --help was printed
  }
  for (const std::string& name : o.policies) {
    BlendPolicy p;
    if (!kdn::llama::parse_blend_policy(name, &p)) {
      std::fprintf(stderr, "blend bench: unknown policy %s\n", name.c_str());
      return 2;
    }
    run.policies.push_back(p);
  }
  if (!o.prompts.empty() && o.prompts.size() != o.sizes.size()) {
    std::fprintf(stderr, "blend bench: --prompts needs one count per size\n");
    return 2;
  }
  if (!o.pool.empty() && o.pool.size() != o.sizes.size()) {
    std::fprintf(stderr, "blend bench: --pool needs one count per size\n");
    return 2;
  }
  return 0;
}

// The engine (on the f16 copy of the weights if asked) and a kdnd whose arena holds every
// passage of the largest class. Errors are printed.
bool start(Run& run) {
  Options& o = run.o;
  if (o.f16_weights) {
    const kdn::Result<std::string> f16 = kdn::llama::f16_weights_model(o.model);
    if (!f16.ok()) {
      std::fprintf(stderr, "blend bench: %s: %s\n", o.model.c_str(), f16.status().what());
      return false;
    }
    o.model = f16.value();
  }
  const uint32_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  kdn::llama::EngineOptions eo;
  eo.model_path = o.model;
  eo.n_threads = o.threads;
  eo.n_ctx = std::max<uint32_t>(1024, largest + largest / 16 + o.answer_tokens + 256);
  auto engine = Engine::open(eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "blend bench: %s\n", engine.status().what());
    return false;
  }
  run.engine = std::move(engine.value());
  if (!run.engine->cache_support().ok()) {
    std::fprintf(stderr, "blend bench: no cache support: %s\n", run.engine->cache_support().what());
    return false;
  }
  auto tmp = kdn::bench::TempDir::create("kdn-blend-bench");
  if (!tmp.ok()) return false;
  run.tmp.emplace(std::move(tmp.value()));
  kdn::bench::KdndOptions& ko = run.kdnd_options;
  ko.binary = o.kdnd;
  ko.socket_path = run.tmp->path() + "/kdnd.sock";
  ko.log_path = run.tmp->path() + "/kdnd.log";
  // Per namespace (libkdn maps each one's arena pre-faulted): every passage of every class asked
  // for fits (4K: 30 passages of at most 5 chunks, 885 MB); the prefix cache evicts beyond it.
  // A size's namespaces are released, with their memory, once it is done.
  uint64_t arena = 0;
  const kdn::llama::KvGeometry& g = run.engine->identity().geometry;
  for (uint32_t size : o.sizes) {
    const kdn::bench::RagClass c = kdn::bench::rag_class(size);
    arena = std::max<uint64_t>(
        arena, uint64_t{c.pool} * ((c.max_tokens + g.chunk_tokens - 1) / g.chunk_tokens + 1) * g.chunk_bytes());
  }
  ko.host_arena_bytes = (arena + (64ull << 20) - 1) & ~((64ull << 20) - 1);
  ko.extra_args = {"--set", "namespace_grace_s=1", "--set", "tier.host.populate=false"};
  auto kdnd = kdn::bench::KdndProcess::start(ko);
  if (!kdnd.ok()) {
    std::fprintf(stderr, "blend bench: %s\n%s", kdn::bench::describe(kdnd.status()).c_str(),
                 kdn::bench::file_tail(ko.log_path).c_str());
    return false;
  }
  run.kdnd.emplace(std::move(kdnd.value()));
  run.corpus = kdn::bench::rag_corpus();
  return true;
}

void report_setup(Run& run) {
  const Options& o = run.o;
  Report& r = run.r;
  r.set("model", o.model.substr(o.model.find_last_of('/') + 1));
  r.set("threads", int64_t(o.threads));
  r.set("chunk_tokens", int64_t(run.engine->identity().geometry.chunk_tokens));
  r.set("answer_tokens", int64_t(o.answer_tokens));
  r.set("recompute_ratio", o.blend.recompute_ratio);
  r.set("check_layer", int64_t(o.blend.check_layer));
  r.set("deviation", std::string(kdn::llama::blend_deviation_name(o.blend.deviation)));
  r.set("boundary_tokens", int64_t(o.blend.boundary_tokens));
  r.set("corpus.documents", uint64_t(run.corpus.size()));
  Json docs = Json::array();
  for (const auto& d : run.corpus) docs.push_back({d.name, run.count_tokens(d.text)});
  r.set_json("corpus.tokens_per_document", docs);
}

// One namespace per (size, policy) and for the prefix cache: each starts empty.
bool connect_caches(Run& run, SizeRun& sr) {
  const kdn_model_desc& desc = run.engine->identity().desc;
  const std::string& socket = run.kdnd_options.socket_path;
  const std::string size = std::to_string(sr.size);
  for (BlendPolicy p : run.policies) {
    auto cc = kdn::llama::KdnChunkCache::connect(
        desc, socket, "blend-" + size + "-" + std::string(kdn::llama::blend_policy_name(p)), true);
    if (!cc.ok()) {
      std::fprintf(stderr, "blend bench: %s\n", cc.status().what());
      return false;
    }
    sr.caches[p] = std::move(cc.value());
  }
  if (run.o.prefix) {
    auto cc = kdn::llama::KdnChunkCache::connect(desc, socket, "prefix-" + size, true);
    if (!cc.ok()) {
      std::fprintf(stderr, "blend bench: %s\n", cc.status().what());
      return false;
    }
    sr.prefix_cache = std::move(cc.value());
  }
  return true;
}

// One prompt, back to back: the full prefill (the reference), the control, the prefix cache and
// every policy. Errors are printed.
bool run_prompt(Run& run, SizeRun& sr, const kdn::bench::RagPromptSpec& spec, const kdn::llama::RagPrompt& rp) {
  Engine& e = *run.engine;
  const std::vector<int32_t> tokens = rp.tokens();
  auto ref = reference(e, tokens, run.o.answer_tokens);
  if (!ref.ok()) {
    std::fprintf(stderr, "blend bench: full prefill: %s\n", ref.status().what());
    return false;
  }
  sr.full_ttfts.push_back(ref->ttft_s);
  sr.prompt_tokens += tokens.size();
  auto ctl = run_control(e, rp, tokens, ref.value());
  if (!ctl.ok()) {
    std::fprintf(stderr, "blend bench: control: %s\n", ctl.status().what());
    return false;
  }
  sr.control.add(ctl.value(), ref->ttft_s, 0, tokens.size());
  Json row = {{"tokens", tokens.size()},       {"passages", spec.passages},
              {"question", spec.question},     {"ttft_full_prefill_s", ref->ttft_s},
              {"answer_end", ref->answer_end}, {"floor_top1_agreement", double(ctl->agree) / double(ctl->positions)},
              {"floor_kl_mean", ctl->kl_mean}};
  double prefix_ttft = 0;
  if (sr.prefix_cache) {
    auto g = e.generate(tokens, 1, sr.prefix_cache.get());
    if (!g.ok()) {
      std::fprintf(stderr, "blend bench: prefix cache: %s\n", g.status().what());
      return false;
    }
    prefix_ttft = g->stats.ttft_s;
    sr.prefix.ttft.push_back(prefix_ttft);
    sr.prefix.served += g->stats.tokens_reused;
    sr.prefix.prompt_tokens += tokens.size();
    row["ttft_prefix_cache_s"] = prefix_ttft;
    row["prefix_tokens_reused"] = g->stats.tokens_reused;
  }
  for (BlendPolicy p : run.policies) {
    kdn::llama::BlendOptions bo = run.o.blend;
    bo.policy = p;
    const std::string name(kdn::llama::blend_policy_name(p));
    auto s = run_policy(e, *sr.caches[p], rp, tokens, bo, ref.value());
    if (!s.ok()) {
      std::fprintf(stderr, "blend bench: %s: %s\n", name.c_str(), s.status().what());
      return false;
    }
    sr.totals[p].add(s.value(), ref->ttft_s, prefix_ttft, tokens.size());
    row[name] = policy_row(s.value());
    std::fprintf(stderr, "  %-8s ttft %.2f s (full %.2f s), top-1 %.3f, KL %.4f%s\n", name.c_str(), s->ttft_s,
                 ref->ttft_s, double(s->agree) / double(s->positions), s->kl_mean, s->blended ? "" : " (fell back)");
  }
  sr.rows.push_back(std::move(row));
  return true;
}

// A size class's figures, and its share of the run's.
void report_size(Run& run, const SizeRun& sr, const kdn::bench::RagClass& c, size_t passages, size_t prompts) {
  Report& r = run.r;
  const std::string sk = "sizes." + std::to_string(sr.size) + ".";
  r.set(sk + "passages", uint64_t(passages));
  r.set(sk + "passages_asked", uint64_t(c.pool));
  r.set(sk + "passage_tokens", std::to_string(c.min_tokens) + "-" + std::to_string(c.max_tokens));
  r.set(sk + "passages_per_prompt", std::to_string(c.min_k) + "-" + std::to_string(c.max_k));
  r.set(sk + "prompts", uint64_t(prompts));
  r.set(sk + "prompt_tokens_mean", prompts == 0 ? 0.0 : double(sr.prompt_tokens) / double(prompts));
  r.set(sk + "ttft_full_prefill_s", mean(sr.full_ttfts));
  r.set(sk + "floor_top1_agreement", mean(sr.control.agree));
  r.set(sk + "floor_kl_mean", mean(sr.control.kl));
  r.set(sk + "floor_answers_identical_fraction",
        sr.control.prompts ? double(sr.control.identical) / double(sr.control.prompts) : 0.0);
  run.all_control.add(sr.control);
  if (sr.prefix_cache) {
    r.set(sk + "ttft_prefix_cache_s", mean(sr.prefix.ttft));
    r.set(sk + "prefix_served_from_cache",
          sr.prefix.prompt_tokens ? double(sr.prefix.served) / double(sr.prefix.prompt_tokens) : 0.0);
    r.set(sk + "prefix_speedup_vs_full", kdn::bench::ratio(mean(sr.full_ttfts), mean(sr.prefix.ttft)));
    run.all_prefix.add(sr.prefix);
  }
  for (BlendPolicy p : run.policies) {
    const PolicyTotals& t = sr.totals.at(p);
    report_policy(r, sk + "policies." + std::string(kdn::llama::blend_policy_name(p)) + ".", t);
    run.all[p].add(t);
  }
  r.set_json(sk + "per_prompt", sr.rows);
}

// One size class: its passages, its prompts, each prompt run. Errors are printed.
bool run_size(Run& run, size_t si) {
  const Options& o = run.o;
  Engine& e = *run.engine;
  SizeRun sr;
  sr.size = o.sizes[si];
  kdn::bench::RagClass c = kdn::bench::rag_class(sr.size);
  if (!o.prompts.empty()) c.prompts = o.prompts[si];
  if (!o.pool.empty()) c.pool = o.pool[si];
  const auto pool = kdn::bench::cut_passages(
      run.corpus, c, [&](const std::string& t) { return run.count_tokens(t); }, o.seed);
  for (const auto& p : pool) sr.texts.push_back(p.text);
  const auto prompt_of = [&](const kdn::bench::RagPromptSpec& spec) {
    std::vector<std::string> d;
    for (uint32_t i : spec.passages) d.push_back(sr.texts[i]);
    return e.rag_prompt(d, spec.question);
  };
  const uint32_t max_tokens = e.context_size() - o.answer_tokens - 1;
  const auto specs = kdn::bench::draw_prompts(pool, c, o.seed, max_tokens, [&](const kdn::bench::RagPromptSpec& s) {
    auto p = prompt_of(s);
    return p.ok() ? uint32_t(p->size()) : UINT32_MAX;
  });
  if (!connect_caches(run, sr)) return false;
  for (size_t pi = 0; pi < specs.size(); ++pi) {
    auto rp = prompt_of(specs[pi]);
    if (!rp.ok()) {
      std::fprintf(stderr, "blend bench: building prompt %zu: %s\n", pi + 1, rp.status().what());
      return false;
    }
    std::fprintf(stderr, "blend bench: %u: prompt %zu/%zu, %llu tokens, %zu passages\n", sr.size, pi + 1, specs.size(),
                 static_cast<unsigned long long>(rp->size()), specs[pi].passages.size());
    if (!run_prompt(run, sr, specs[pi], rp.value())) return false;
    // A daemon that died would turn every later prompt into a fallback: not a measurement.
    if (!run.kdnd->running()) {
      std::fprintf(stderr, "blend bench: kdnd exited during the run\n%s",
                   kdn::bench::file_tail(run.kdnd_options.log_path).c_str());
      return false;
    }
  }
  report_size(run, sr, c, pool.size(), specs.size());
  return true;
}

// Over every prompt of the run, and the bars (docs/blend.md), read on hkvd at the ratio given
// (the bars are stated for 0.15).
void report_all(Run& run) {
  Report& r = run.r;
  for (BlendPolicy p : run.policies)
    report_policy(r, "all." + std::string(kdn::llama::blend_policy_name(p)) + ".", run.all[p]);
  r.set("all.floor_top1_agreement", mean(run.all_control.agree));
  r.set("all.floor_kl_mean", mean(run.all_control.kl));
  if (run.o.prefix) {
    r.set("all.ttft_prefix_cache_s", mean(run.all_prefix.ttft));
    r.set("all.prefix_served_from_cache",
          run.all_prefix.prompt_tokens ? double(run.all_prefix.served) / double(run.all_prefix.prompt_tokens) : 0.0);
  }
  using kdn::bench::BarOp;
  if (!run.all.count(BlendPolicy::kHkvd)) return;
  for (uint32_t size : run.o.sizes) {
    const std::string k = "sizes." + std::to_string(size) + ".policies.hkvd.";
    if (size == 4096) r.set_bar("bars.hkvd_speedup_4k", r.number(k + "speedup_vs_full"), BarOp::kAtLeast, 2.5);
    if (size == 8192) r.set_bar("bars.hkvd_speedup_8k", r.number(k + "speedup_vs_full"), BarOp::kAtLeast, 3.0);
    r.set_bar("bars.hkvd_top1_agreement_" + std::to_string(size), r.number(k + "top1_agreement"), BarOp::kAtLeast,
              0.95);
  }
  if (run.all.count(BlendPolicy::kNone)) {
    const auto h = r.number("all.hkvd.top1_agreement"), n = r.number("all.none.top1_agreement");
    r.set_bar("bars.none_below_hkvd", h && n ? std::optional<double>(*h - *n) : std::nullopt, BarOp::kAtLeast, 0.05);
  }
  if (run.o.prefix)
    r.set_bar("bars.hkvd_vs_prefix_cache_mean_ttft",
              kdn::bench::ratio(mean(run.all[BlendPolicy::kHkvd].ttft), mean(run.all_prefix.ttft)), BarOp::kBelow, 1.0);
}

}  // namespace

int run_blend_bench(int argc, char** argv) {
  Run run;
  if (int code = parse_options(argc, argv, run); code != 0) return code < 0 ? 0 : code;
  if (!start(run)) return 1;
  report_setup(run);
  for (size_t si = 0; si < run.o.sizes.size(); ++si)
    if (!run_size(run, si)) return 1;
  (void)run.kdnd->stop();
  report_all(run);
  std::printf("%s\n", run.o.json ? run.r.to_json().c_str() : run.r.to_table().c_str());
  return 0;
}
