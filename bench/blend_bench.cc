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

#include <CLI/CLI.hpp>
#include <llama.h>

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
  if (!t.ttft_prefix.empty()) r.set(k + "speedup_vs_prefix_cache", kdn::bench::ratio(mean(t.ttft_prefix), mean(t.ttft)));
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
  app.add_option("--check-layer", o.blend.check_layer, "hkvd: the layer whose K deviation ranks tokens");
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

}  // namespace

int run_blend_bench(int argc, char** argv) {
  CLI::App app("kdn-bench blend: blended RAG prompts vs full prefill and prefix caching (docs/blend.md)");
  Options o;
  add_flags(app, o);
  CLI11_PARSE(app, argc, argv);
  std::vector<BlendPolicy> policies;
  for (const std::string& name : o.policies) {
    BlendPolicy p;
    if (!kdn::llama::parse_blend_policy(name, &p)) {
      std::fprintf(stderr, "blend bench: unknown policy %s\n", name.c_str());
      return 2;
    }
    policies.push_back(p);
  }
  if (!o.prompts.empty() && o.prompts.size() != o.sizes.size()) {
    std::fprintf(stderr, "blend bench: --prompts needs one count per size\n");
    return 2;
  }
  if (!o.pool.empty() && o.pool.size() != o.sizes.size()) {
    std::fprintf(stderr, "blend bench: --pool needs one count per size\n");
    return 2;
  }
  if (o.f16_weights) {
    const kdn::Result<std::string> f16 = kdn::llama::f16_weights_model(o.model);
    if (!f16.ok()) {
      std::fprintf(stderr, "blend bench: %s: %s\n", o.model.c_str(), f16.status().what());
      return 1;
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
    return 1;
  }
  Engine& e = *engine.value();
  if (!e.cache_support().ok()) {
    std::fprintf(stderr, "blend bench: no cache support: %s\n", e.cache_support().what());
    return 1;
  }
  auto tmp = kdn::bench::TempDir::create("kdn-blend-bench");
  if (!tmp.ok()) return 1;
  kdn::bench::KdndOptions ko;
  ko.binary = o.kdnd;
  ko.socket_path = tmp->path() + "/kdnd.sock";
  ko.log_path = tmp->path() + "/kdnd.log";
  // Per namespace (libkdn maps each one's arena pre-faulted): every passage of every class asked
  // for fits (4K: 30 passages of at most 5 chunks, 885 MB); the prefix cache evicts beyond it.
  // A size's namespaces are released, with their memory, once it is done.
  uint64_t arena = 0;
  const uint64_t chunk_bytes = e.identity().geometry.chunk_bytes(), t = e.identity().geometry.chunk_tokens;
  for (uint32_t size : o.sizes) {
    const kdn::bench::RagClass c = kdn::bench::rag_class(size);
    arena = std::max<uint64_t>(arena, uint64_t{c.pool} * ((c.max_tokens + t - 1) / t + 1) * chunk_bytes);
  }
  ko.host_arena_bytes = (arena + (64ull << 20) - 1) & ~((64ull << 20) - 1);
  ko.extra_args = {"--set", "namespace_grace_s=1", "--set", "tier.host.populate=false"};
  auto kdnd = kdn::bench::KdndProcess::start(ko);
  if (!kdnd.ok()) {
    std::fprintf(stderr, "blend bench: %s\n%s", kdn::bench::describe(kdnd.status()).c_str(),
                 kdn::bench::file_tail(ko.log_path).c_str());
    return 1;
  }

  const std::vector<kdn::bench::RagDocument> corpus = kdn::bench::rag_corpus();
  const auto count = [&](const std::string& text) {
    auto t = e.tokenize(text, false, false);
    return t.ok() ? uint32_t(t->size()) : 0u;
  };
  Report r;
  r.set("model", o.model.substr(o.model.find_last_of('/') + 1));
  r.set("threads", int64_t(o.threads));
  r.set("chunk_tokens", int64_t(e.identity().geometry.chunk_tokens));
  r.set("answer_tokens", int64_t(o.answer_tokens));
  r.set("recompute_ratio", o.blend.recompute_ratio);
  r.set("check_layer", int64_t(o.blend.check_layer));
  r.set("boundary_tokens", int64_t(o.blend.boundary_tokens));
  r.set("corpus.documents", uint64_t(corpus.size()));
  Json docs = Json::array();
  for (const auto& d : corpus) docs.push_back({d.name, count(d.text)});
  r.set_json("corpus.tokens_per_document", docs);

  std::map<BlendPolicy, PolicyTotals> all;
  PolicyTotals all_prefix, all_control;
  for (size_t si = 0; si < o.sizes.size(); ++si) {
    const uint32_t size = o.sizes[si];
    kdn::bench::RagClass c = kdn::bench::rag_class(size);
    if (!o.prompts.empty()) c.prompts = o.prompts[si];
    if (!o.pool.empty()) c.pool = o.pool[si];
    const auto pool = kdn::bench::cut_passages(corpus, c, count, o.seed);
    std::vector<std::string> texts;
    for (const auto& p : pool) texts.push_back(p.text);
    const auto prompt_of = [&](const kdn::bench::RagPromptSpec& spec) {
      std::vector<std::string> d;
      for (uint32_t i : spec.passages) d.push_back(texts[i]);
      return e.rag_prompt(d, spec.question);
    };
    const uint32_t max_tokens = e.context_size() - o.answer_tokens - 1;
    const auto specs = kdn::bench::draw_prompts(pool, c, o.seed, max_tokens, [&](const kdn::bench::RagPromptSpec& s) {
      auto p = prompt_of(s);
      return p.ok() ? uint32_t(p->size()) : UINT32_MAX;
    });
    const std::string sk = "sizes." + std::to_string(size) + ".";
    r.set(sk + "passages", uint64_t(pool.size()));
    r.set(sk + "passages_asked", uint64_t(c.pool));
    r.set(sk + "passage_tokens", std::to_string(c.min_tokens) + "-" + std::to_string(c.max_tokens));
    r.set(sk + "passages_per_prompt", std::to_string(c.min_k) + "-" + std::to_string(c.max_k));

    // One namespace per (size, policy) and for the prefix cache: each starts empty.
    std::map<BlendPolicy, std::unique_ptr<kdn::llama::KdnChunkCache>> caches;
    for (BlendPolicy p : policies) {
      auto cc = kdn::llama::KdnChunkCache::connect(e.identity().desc, ko.socket_path,
                                                   "blend-" + std::to_string(size) + "-" + std::string(kdn::llama::blend_policy_name(p)), true);
      if (!cc.ok()) {
        std::fprintf(stderr, "blend bench: %s\n", cc.status().what());
        return 1;
      }
      caches[p] = std::move(cc.value());
    }
    std::unique_ptr<kdn::llama::KdnChunkCache> prefix_cache;
    if (o.prefix) {
      auto cc = kdn::llama::KdnChunkCache::connect(e.identity().desc, ko.socket_path, "prefix-" + std::to_string(size), true);
      if (!cc.ok()) return 1;
      prefix_cache = std::move(cc.value());
    }

    std::map<BlendPolicy, PolicyTotals> totals;
    PolicyTotals prefix, control;
    std::vector<double> full_ttfts;
    uint64_t prompt_tokens = 0;
    Json rows = Json::array();
    for (size_t pi = 0; pi < specs.size(); ++pi) {
      auto rp = prompt_of(specs[pi]);
      if (!rp.ok()) return 1;
      const std::vector<int32_t> tokens = rp->tokens();
      std::fprintf(stderr, "blend bench: %u: prompt %zu/%zu, %zu tokens, %zu passages\n", size, pi + 1, specs.size(),
                   tokens.size(), specs[pi].passages.size());
      auto ref = reference(e, tokens, o.answer_tokens);
      if (!ref.ok()) {
        std::fprintf(stderr, "blend bench: full prefill: %s\n", ref.status().what());
        return 1;
      }
      full_ttfts.push_back(ref->ttft_s);
      prompt_tokens += tokens.size();
      auto ctl = run_control(e, rp.value(), tokens, ref.value());
      if (!ctl.ok()) {
        std::fprintf(stderr, "blend bench: control: %s\n", ctl.status().what());
        return 1;
      }
      control.agree.push_back(double(ctl->agree) / double(ctl->positions));
      control.kl.push_back(ctl->kl_mean);
      control.identical += ctl->identical;
      control.prompts += 1;
      Json row = {{"tokens", tokens.size()},
                  {"passages", specs[pi].passages},
                  {"question", specs[pi].question},
                  {"ttft_full_prefill_s", ref->ttft_s},
                  {"answer_end", ref->answer_end},
                  {"floor_top1_agreement", double(ctl->agree) / double(ctl->positions)},
                  {"floor_kl_mean", ctl->kl_mean}};
      double prefix_ttft = 0;
      if (prefix_cache) {
        auto g = e.generate(tokens, 1, prefix_cache.get());
        if (!g.ok()) return 1;
        prefix_ttft = g->stats.ttft_s;
        prefix.ttft.push_back(prefix_ttft);
        prefix.served += g->stats.tokens_reused;
        prefix.prompt_tokens += tokens.size();
        row["ttft_prefix_cache_s"] = prefix_ttft;
        row["prefix_tokens_reused"] = g->stats.tokens_reused;
      }
      for (BlendPolicy p : policies) {
        kdn::llama::BlendOptions bo = o.blend;
        bo.policy = p;
        auto s = run_policy(e, *caches[p], rp.value(), tokens, bo, ref.value());
        if (!s.ok()) {
          std::fprintf(stderr, "blend bench: %s: %s\n", std::string(kdn::llama::blend_policy_name(p)).c_str(),
                       s.status().what());
          return 1;
        }
        PolicyTotals& t = totals[p];
        t.ttft.push_back(s->ttft_s);
        t.ttft_full.push_back(ref->ttft_s);
        if (prefix_cache) t.ttft_prefix.push_back(prefix_ttft);
        if (s->blended && s->segments_computed == 0) {
          t.ttft_warm.push_back(s->ttft_s);
          t.ttft_full_warm.push_back(ref->ttft_s);
        }
        t.agree.push_back(double(s->agree) / double(s->positions));
        t.kl.push_back(s->kl_mean);
        t.identical += s->identical;
        t.prompts += 1;
        t.fallbacks += !s->blended;
        t.agree_pos += s->agree;
        t.positions += s->positions;
        t.served += s->served;
        t.recomputed += s->recomputed;
        t.loaded += s->loaded;
        t.prompt_tokens += tokens.size();
        row[std::string(kdn::llama::blend_policy_name(p))] = {
            {"ttft_blend_s", s->ttft_s},          {"blended", s->blended},
            {"fallback", s->fallback},            {"segments_computed", s->segments_computed},
            {"tokens_served", s->served},          {"tokens_recomputed", s->recomputed},
            {"top1_agreement", double(s->agree) / double(s->positions)},
            {"kl_mean", s->kl_mean},               {"answer_identical", s->identical},
            {"phases_s", {{"lookup", s->phases.lookup_s},
                          {"segment_prefill", s->phases.segment_prefill_s},
                          {"segment_store", s->phases.segment_store_s},
                          {"place", s->phases.place_s},
                          {"retrieve", s->phases.retrieve_s},
                          {"select", s->phases.select_s},
                          {"recompute", s->phases.recompute_s}}}};
        std::fprintf(stderr, "  %-8s ttft %.2f s (full %.2f s), top-1 %.3f, KL %.4f%s\n",
                     std::string(kdn::llama::blend_policy_name(p)).c_str(), s->ttft_s, ref->ttft_s,
                     double(s->agree) / double(s->positions), s->kl_mean, s->blended ? "" : " (fell back)");
      }
      rows.push_back(row);
      // A daemon that died would turn every later prompt into a fallback: not a measurement.
      if (!kdnd.value().running()) {
        std::fprintf(stderr, "blend bench: kdnd exited during the run\n%s", kdn::bench::file_tail(ko.log_path).c_str());
        return 1;
      }
    }
    r.set(sk + "prompts", uint64_t(specs.size()));
    r.set(sk + "prompt_tokens_mean", specs.empty() ? 0.0 : double(prompt_tokens) / double(specs.size()));
    r.set(sk + "ttft_full_prefill_s", mean(full_ttfts));
    r.set(sk + "floor_top1_agreement", mean(control.agree));
    r.set(sk + "floor_kl_mean", mean(control.kl));
    r.set(sk + "floor_answers_identical_fraction", control.prompts ? double(control.identical) / double(control.prompts) : 0.0);
    all_control.agree.insert(all_control.agree.end(), control.agree.begin(), control.agree.end());
    all_control.kl.insert(all_control.kl.end(), control.kl.begin(), control.kl.end());
    if (prefix_cache) {
      r.set(sk + "ttft_prefix_cache_s", mean(prefix.ttft));
      r.set(sk + "prefix_served_from_cache", prefix.prompt_tokens ? double(prefix.served) / double(prefix.prompt_tokens) : 0.0);
      r.set(sk + "prefix_speedup_vs_full", kdn::bench::ratio(mean(full_ttfts), mean(prefix.ttft)));
      all_prefix.ttft.insert(all_prefix.ttft.end(), prefix.ttft.begin(), prefix.ttft.end());
      all_prefix.served += prefix.served;
      all_prefix.prompt_tokens += prefix.prompt_tokens;
    }
    for (BlendPolicy p : policies) {
      report_policy(r, sk + "policies." + std::string(kdn::llama::blend_policy_name(p)) + ".", totals[p]);
      PolicyTotals& a = all[p];
      const PolicyTotals& t = totals[p];
      for (auto [dst, src] : {std::pair{&a.ttft, &t.ttft}, {&a.ttft_full, &t.ttft_full}, {&a.ttft_prefix, &t.ttft_prefix},
                              {&a.agree, &t.agree}, {&a.kl, &t.kl}, {&a.ttft_warm, &t.ttft_warm},
                              {&a.ttft_full_warm, &t.ttft_full_warm}})
        dst->insert(dst->end(), src->begin(), src->end());
      a.identical += t.identical;
      a.prompts += t.prompts;
      a.fallbacks += t.fallbacks;
      a.agree_pos += t.agree_pos;
      a.positions += t.positions;
      a.served += t.served;
      a.recomputed += t.recomputed;
      a.loaded += t.loaded;
      a.prompt_tokens += t.prompt_tokens;
    }
    r.set_json(sk + "per_prompt", rows);
  }
  (void)kdnd.value().stop();

  // Over every prompt of the run.
  for (BlendPolicy p : policies) report_policy(r, "all." + std::string(kdn::llama::blend_policy_name(p)) + ".", all[p]);
  r.set("all.floor_top1_agreement", mean(all_control.agree));
  r.set("all.floor_kl_mean", mean(all_control.kl));
  if (o.prefix) {
    r.set("all.ttft_prefix_cache_s", mean(all_prefix.ttft));
    r.set("all.prefix_served_from_cache",
          all_prefix.prompt_tokens ? double(all_prefix.served) / double(all_prefix.prompt_tokens) : 0.0);
  }
  // Bars (docs/blend.md): read on hkvd at the ratio given (the bars are stated for 0.15).
  using kdn::bench::BarOp;
  if (all.count(BlendPolicy::kHkvd)) {
    for (uint32_t size : o.sizes) {
      const std::string k = "sizes." + std::to_string(size) + ".policies.hkvd.";
      if (size == 4096) r.set_bar("bars.hkvd_speedup_4k", r.number(k + "speedup_vs_full"), BarOp::kAtLeast, 2.5);
      if (size == 8192) r.set_bar("bars.hkvd_speedup_8k", r.number(k + "speedup_vs_full"), BarOp::kAtLeast, 3.0);
      r.set_bar("bars.hkvd_top1_agreement_" + std::to_string(size), r.number(k + "top1_agreement"), BarOp::kAtLeast, 0.95);
    }
    if (all.count(BlendPolicy::kNone)) {
      const auto h = r.number("all.hkvd.top1_agreement"), n = r.number("all.none.top1_agreement");
      r.set_bar("bars.none_below_hkvd", h && n ? std::optional<double>(*h - *n) : std::nullopt, BarOp::kAtLeast, 0.05);
    }
    if (o.prefix)
      r.set_bar("bars.hkvd_vs_prefix_cache_mean_ttft",
                kdn::bench::ratio(mean(all[BlendPolicy::kHkvd].ttft), mean(all_prefix.ttft)), BarOp::kBelow, 1.0);
  }
  std::printf("%s\n", o.json ? r.to_json().c_str() : r.to_table().c_str());
  return 0;
}
