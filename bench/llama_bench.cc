// kdn-bench llama: what kdn saves a real engine. For prompts of 1K..8K tokens (a real
// document plus a question) and SmolLM2-135M on llama.cpp:
//   ttft_miss_s          engine process A prefills everything (and stores its chunks in kdnd);
//   ttft_hit_s           engine process B, another process, asks the same prompt and loads
//                        A's KV from kdnd (median of at least --reps runs, more until the
//                        scored pairs have run --pair-seconds, after --warmup unscored ones);
//   ttft_slot_restore_s  the engine's own alternative, measured in B: llama-server's slot
//                        save/restore, llama_state_seq_save_file by A of the same prefix and
//                        llama_state_seq_load_file by B (median), then the same suffix prefill;
//   hit_vs_slot_restore  the median over repetitions of hit / slot restore, each pair run back
//                        to back: both sides do the same suffix prefill, whose run-to-run noise
//                        on a shared machine is far larger than the load they differ in, and
//                        a pair sees the same machine state (the ratio of the two medians is
//                        reported beside it, and a 95% interval for the paired median);
//   hit_load_*           the hit's load: hit_load_s places the cells and, with the overlapped
//                        load (engines with a hardware thread to spare, as here), starts the
//                        copy that runs beside the suffix prefill (hit_load_copy_s) and that
//                        the prefill waited for hit_load_wait_s; all of it is inside ttft_hit_s;
//   tokens_identical     B's greedy tokens (hit) equal A's (miss), and the slot restore's too;
//   ttft_disk_hit_s      (at --disk-size, 4096 by default) process D, in a namespace with kdnd's
//                        disk tier: the document's chunks moved to disk only (an operator's
//                        evict --all --tier host) before each run, the engine prefetches the
//                        document's prefix before it tokenizes the question, then generates;
//                        from the request's arrival (prefetch and tokenization included) to the
//                        first token. Paired with a run whose chunks stay in the arena, measured
//                        the same way (disk_hit_vs_hit), and with a run that does not prefetch;
//   codec.*              KVC1 (kivi4, or --codec MODE) on the same prefix: top-1 next-token agreement,
//                        perplexity delta and KL over the document's next tokens vs exact KV, with
//                        uniform widths and (codec.calibrated.*) with per-layer widths of the same
//                        mean calibrated first on another part of the text, on the model's f16
//                        weights (calibrate_codec_bits). Scored on the served weights in B and
//                        (codec_f16.*, process C) on their f16 copy, where llama.cpp computes the
//                        activations in floating point: on Q4_1 weights it rounds them to 8 bits
//                        and a one-ulp change of the KV already moves the top-1 token (floor_*).
// Every figure comes from this run; the miss prefill is the baseline the speedup divides.
#include "admin_client.h"
#include "commands.h"
#include "documents.h"
#include "kdnd_process.h"
#include "process.h"
#include "report.h"
#include "stats.h"

#include <kdn/common/clock.h>
#include <kdn/llama/codec_quality.h>
#include <kdn/llama/engine.h>
#include <kdn/llama/kdn_chunk_cache.h>

#include <llama.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Json = nlohmann::json;
using kdn::bench::default_documents;
using kdn::bench::median;
using kdn::bench::read_documents;
using kdn::llama::Engine;

struct Options {
  std::string model = kdn::llama::default_model_path();
  std::vector<std::string> docs;
  std::string kdnd = kdn::bench::default_kdnd_path();
  std::vector<uint32_t> sizes = {1024, 2048, 4096, 8192};
  int32_t threads = 1;
  uint32_t reps = 21;        // scored hit/slot-restore pairs at least
  double pair_seconds = 60;  // ... and more until they have run this long
  uint32_t max_pairs = 401;  // ... but no more than this
  uint32_t warmup = 1;       // unscored hit and slot-restore runs first (first-touch page faults)
  uint32_t n_predict = 32;
  uint32_t eval_tokens = 256;
  std::string question = "Summarize the terms above in one sentence.";
  kdn::kernels::CodecMode codec = kdn::kernels::CodecMode::kKivi4;  // the mode whose quality is measured
  uint32_t k_bits = 0;                                              // 0: the mode's
  uint32_t v_bits = 0;                                              // 0: the mode's
  std::vector<uint8_t> layer_k_bits;                                // empty, or one width per layer
  std::vector<uint8_t> layer_v_bits;
  uint32_t k_group_tokens = 0;                                  // 0: the codec's default
  uint32_t v_group_channels = 0;                                // 0: the codec's default
  bool rotate = false;                                          // Hadamard-rotated rows (CodecConfig::rotate)
  uint32_t sink_tokens = kdn::kernels::kDefaultSinkTokens;      // exact leading rows of the first chunk
  uint32_t recent_tokens = kdn::kernels::kDefaultRecentTokens;  // exact trailing rows of the last chunk
  bool f16_weights = false;
  bool f16_codec = true;                // also score the codec on the f16 copy of the weights (process C)
  bool calibrate = true;                // per-layer widths from calibrate_codec_bits (quantized modes)
  std::vector<std::string> calib_docs;  // empty: the document's last tokens
  uint32_t calib_probe_bits = 0;        // 0: the mode's width
  uint32_t calib_min_bits = kdn::llama::CalibrationOptions{}.min_bits;  // narrowest width a plane may get
  uint32_t calib_chunks = 4;
  uint32_t calib_eval_tokens = 256;
  int32_t calib_threads = 0;  // 0: every core (nothing else runs while it does)
  uint32_t disk_size = 4096;  // prompt size of the disk-hit runs (0: none)
  uint32_t disk_reps = 11;    // disk-hit / arena-hit / no-prefetch triples
  bool json = false;
};

// What the calibration child found; empty widths when it did not run.
struct Calibration {
  std::vector<uint8_t> k_bits, v_bits;
  Json report;
};

int32_t argmax(std::span<const float> l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

// A failure inside a child process: its message becomes the child's JSON answer.
Json failure(const std::string& what, const kdn::Status& st) { return Json{{"error", what + ": " + st.what()}}; }

struct Side {
  const Options& o;
  const std::string& doc;
  const Calibration& cal;
  uint32_t size;
  std::string socket, name_space, slot_path;

  kdn::Result<std::unique_ptr<Engine>> open_engine(const std::string& model, int32_t threads) const {
    kdn::llama::EngineOptions eo;
    eo.model_path = model;
    eo.n_threads = threads;
    eo.n_ctx = size + o.eval_tokens + 512;
    return Engine::open(eo);
  }
};

// What each side's process starts with: its engine, a kdnd connection and the prompt.
struct Session {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<kdn::llama::KdnChunkCache> store;
  std::vector<int32_t> prompt;

  // Null on success, else the failure to report. `threads` 0: every core (the engine's default).
  std::optional<Json> open(const Side& s, const std::string& model, int32_t threads) {
    auto e = s.open_engine(model, threads);
    if (!e.ok()) return failure("engine", e.status());
    engine = std::move(e.value());
    // The per-size namespaces (llama-bench-N) are not in kdnd's configuration: created here.
    auto c = kdn::llama::KdnChunkCache::connect(engine->identity().desc, s.socket, s.name_space, /*create=*/true);
    if (!c.ok()) return failure("kdnd", c.status());
    store = std::move(c.value());
    auto p = engine->chat_prompt(s.doc, s.o.question, s.size);
    if (!p.ok()) return failure("prompt", p.status());
    prompt = std::move(p.value());
    return std::nullopt;
  }
};

// Process A: the miss. Prefills the prompt, stores its chunks in kdnd, and saves the same
// prefix as a slot file the way llama-server's slot save does.
Json run_store_side(const Side& s) {
  Session ss;
  if (auto err = ss.open(s, s.o.model, s.o.threads)) return *err;
  Engine& e = *ss.engine;
  auto gen = e.generate(ss.prompt, s.o.n_predict, ss.store.get());
  if (!gen.ok()) return failure("generate", gen.status());
  if (gen->stats.tokens_reused != 0 || !gen->stats.cache_status.ok())
    return Json{{"error", "the store side was not a clean miss"}};

  llama_context* ctx = e.context();
  llama_memory_t mem = llama_get_memory(ctx);
  llama_memory_seq_cp(mem, 0, 1, 0, static_cast<llama_pos>(s.size));
  const size_t saved = llama_state_seq_save_file(ctx, s.slot_path.c_str(), 1, ss.prompt.data(), s.size);
  llama_memory_seq_rm(mem, 1, -1, -1);
  if (saved == 0) return Json{{"error", "llama_state_seq_save_file failed"}};
  const auto& st = gen->stats;
  return Json{{"prompt_tokens", ss.prompt.size()},
              {"ttft_s", st.ttft_s},
              {"store_s", st.store_s},
              {"chunks_stored", st.chunks_stored},
              {"bytes_stored", st.bytes_stored},
              {"slot_file_bytes", saved},
              {"tokens", gen->tokens}};
}

struct SlotRun {
  double load_s = 0;  // llama_state_seq_load_file
  double ttft_s = 0;  // load + suffix prefill + first token
};

// Slot restore as llama-server does it: load the file (checking its tokens are the prompt's
// prefix), then prefill the rest. `tokens` (may be null) gets the greedy answer.
kdn::Result<SlotRun> slot_restore(Engine& e, const Side& s, const std::vector<int32_t>& prompt,
                                  std::vector<int32_t>* tokens) {
  e.reset();
  std::vector<int32_t> saved(s.size);
  size_t n = 0;
  const uint64_t t0 = kdn::now_ns();
  if (llama_state_seq_load_file(e.context(), s.slot_path.c_str(), 0, saved.data(), saved.size(), &n) == 0 ||
      n != s.size || !std::equal(saved.begin(), saved.end(), prompt.begin()))
    return kdn::Status(kdn::Code::kCorrupt, "slot file did not restore the prompt's prefix");
  const uint64_t t1 = kdn::now_ns();
  KDN_RETURN_IF_ERROR(e.prefill(std::span(prompt).subspan(s.size), s.size, {}));
  const int32_t first = argmax(e.last_logits());
  SlotRun run;
  run.ttft_s = static_cast<double>(kdn::now_ns() - t0) * 1e-9;
  run.load_s = static_cast<double>(t1 - t0) * 1e-9;
  if (tokens) {
    tokens->assign(1, first);
    KDN_RETURN_IF_ERROR(e.decode_greedy(*tokens, s.o.n_predict));
  }
  return run;
}

// The codec settings the options name (uniform widths unless --layer-*-bits).
kdn::kernels::CodecConfig codec_config(const Options& o) {
  kdn::kernels::CodecConfig cfg;
  cfg.mode = o.codec;
  cfg.k_group_tokens = o.k_group_tokens;
  cfg.k_bits = static_cast<uint8_t>(o.k_bits);
  cfg.v_bits = static_cast<uint8_t>(o.v_bits);
  if (!o.layer_k_bits.empty()) cfg.layer_k_bits = o.layer_k_bits.data();
  if (!o.layer_v_bits.empty()) cfg.layer_v_bits = o.layer_v_bits.data();
  cfg.v_group_channels = o.v_group_channels;
  cfg.rotate = o.rotate;
  cfg.sink_tokens = o.sink_tokens;
  cfg.recent_tokens = o.recent_tokens;
  return cfg;
}

Json quality_json(const kdn::llama::CodecQualityReport& q) {
  return Json{{"top1_agreement", q.top1_agreement},
              {"agreeing_positions", static_cast<uint32_t>(q.top1_agreement * q.eval_tokens + 0.5)},
              {"eval_tokens", q.eval_tokens},
              {"ppl_exact", q.ppl_exact},
              {"ppl_codec", q.ppl_codec},
              {"ppl_delta_pct", q.ppl_delta_pct},
              {"kl", q.kl},
              {"flip_margin_median", q.flip_margin_median},
              {"margin_median", q.margin_median},
              {"ratio_vs_fp16", q.ratio_vs_fp16},
              {"rel_frobenius_error", q.rel_frobenius_error},
              {"cosine_min", q.cosine_min},
              {"floor_top1_agreement", q.floor_top1_agreement},
              {"floor_agreeing_positions", static_cast<uint32_t>(q.floor_top1_agreement * q.eval_tokens + 0.5)},
              {"floor_ppl_delta_pct", q.floor_ppl_delta_pct},
              {"floor_kl", q.floor_kl}};
}

// Calibration child: per-layer widths for the options' codec, measured on `tokens` (another part
// of the text than the one scored later) with the model's f16 weights.
Json run_calibration(const Options& o, const std::string& f16_model, const std::string& text, bool from_tail) {
  kdn::llama::EngineOptions eo;
  eo.model_path = f16_model;
  eo.n_threads = o.calib_threads;  // 0: every core
  const uint32_t need = o.calib_chunks * eo.chunk_tokens + o.calib_eval_tokens;
  eo.n_ctx = need + 256;
  auto e = Engine::open(eo);
  if (!e.ok()) return failure("calibration engine", e.status());
  auto tokens = e.value()->tokenize(text, false, false);
  if (!tokens.ok()) return failure("calibration tokens", tokens.status());
  const std::vector<int32_t>& t = tokens.value();
  // From the document's tail: far enough from the scored prefix that the two never overlap.
  const uint64_t scored_end = uint64_t{*std::max_element(o.sizes.begin(), o.sizes.end())} + o.eval_tokens + 512;
  if (t.size() < need || (from_tail && t.size() < scored_end + need))
    return Json{{"error", "calibration: the text is too short for " + std::to_string(need) +
                              " tokens apart from the scored part (give --calib-doc)"}};
  const std::span<const int32_t> part = std::span(t).subspan(from_tail ? t.size() - need : 0, need);
  kdn::llama::CalibrationOptions co;
  co.context_chunks = o.calib_chunks;
  co.eval_tokens = o.calib_eval_tokens;
  co.min_bits = o.calib_min_bits;
  co.progress = [](uint32_t done, uint32_t total) {
    if (done % 10 == 0 || done == total) std::fprintf(stderr, "llama bench: calibration: %u/%u runs\n", done, total);
  };
  const uint64_t t0 = kdn::now_ns();
  kdn::kernels::CodecConfig probe = codec_config(o);
  // The allocation keeps the uniform width's mean, whatever width the probe measures at.
  co.mean_bits = probe.k_bits ? probe.k_bits : kdn::kernels::codec_mode_default_bits(o.codec);
  if (o.calib_probe_bits) probe.k_bits = probe.v_bits = o.calib_probe_bits;
  auto cal = kdn::llama::calibrate_codec_bits(*e.value(), part, probe, co);
  if (!cal.ok()) return failure("calibration", cal.status());
  return Json{{"model", f16_model.substr(f16_model.find_last_of('/') + 1)},
              {"text", from_tail ? "the document's last tokens" : "--calib-doc"},
              {"context_tokens", cal->context_tokens},
              {"eval_tokens", cal->eval_tokens},
              {"probe_bits", cal->probe_bits},
              {"k_bits", cal->k_bits},
              {"v_bits", cal->v_bits},
              {"mean_bits", cal->mean_bits},
              {"k_sensitivity", cal->k_sensitivity},
              {"v_sensitivity", cal->v_sensitivity},
              {"modelled_kl_uniform", cal->modelled_kl_uniform},
              {"modelled_kl_allocated", cal->modelled_kl_allocated},
              {"seconds", static_cast<double>(kdn::now_ns() - t0) * 1e-9}};
}

// The KVC1 4-bit codec on the prefix A stored: exact chunks leased from kdnd, the document's
// next eval_tokens tokens scored on top of them and of their decoded copies.
Json codec_quality(Engine& e, kdn::llama::ChunkCache& store, const Side& s) {
  auto ext = e.chat_prompt(s.doc, s.o.question, s.size + s.o.eval_tokens);
  if (!ext.ok()) return failure("codec prompt", ext.status());
  const uint32_t chunks = s.size / e.identity().geometry.chunk_tokens;
  auto lease = store.retrieve(std::span(ext.value()).first(s.size), chunks);
  if (!lease.ok()) return failure("codec lease", lease.status());
  if ((*lease)->chunks() != chunks) return Json{{"error", "codec: prefix not in kdnd"}};
  std::vector<std::span<const uint8_t>> exact;
  for (uint32_t i = 0; i < chunks; ++i) exact.push_back((*lease)->chunk(i));
  const uint32_t layers = e.identity().geometry.n_layer;
  for (const auto* bits : {&s.o.layer_k_bits, &s.o.layer_v_bits, &s.cal.k_bits, &s.cal.v_bits})
    if (!bits->empty() && bits->size() != layers)
      return Json{{"error", "codec: per-layer widths need one width per layer (" + std::to_string(layers) + ")"}};
  std::vector<kdn::kernels::CodecConfig> configs = {codec_config(s.o)};
  if (!s.cal.k_bits.empty()) {
    configs.push_back(configs.front());
    configs.back().layer_k_bits = s.cal.k_bits.data();
    configs.back().layer_v_bits = s.cal.v_bits.data();
  }
  auto q =
      kdn::llama::measure_codec_quality(e, exact, std::span(ext.value()).subspan(s.size, s.o.eval_tokens), configs);
  if (!q.ok()) return failure("codec", q.status());
  Json out = quality_json(q->front());
  out["mode"] = kdn::kernels::codec_mode_name(s.o.codec);
  out["rotate"] = s.o.rotate;
  out["sink_tokens"] = s.o.sink_tokens;
  out["recent_tokens"] = s.o.recent_tokens;
  if (q->size() > 1) out["calibrated"] = quality_json(q->back());
  return out;
}

// Process B: the hit, the slot-restore baseline and the codec, all on A's work.
Json run_reuse_side(const Side& s) {
  Session ss;
  if (auto err = ss.open(s, s.o.model, s.o.threads)) return *err;
  Engine& e = *ss.engine;

  // Hit and slot-restore runs alternate, so both see the same machine load.
  Json out;
  std::vector<double> hit, hit_retrieve, hit_load, hit_copy, hit_wait, slot, slot_load;
  std::vector<int32_t> slot_tokens;
  auto run_hit = [&](uint32_t r) -> std::optional<Json> {
    auto gen = e.generate(ss.prompt, s.o.n_predict, ss.store.get());
    if (!gen.ok()) return failure("generate", gen.status());
    const auto& st = gen->stats;
    if (st.tokens_reused != s.size) return Json{{"error", std::string("hit incomplete: ") + st.cache_status.what()}};
    hit.push_back(st.ttft_s);
    hit_retrieve.push_back(st.retrieve_s);
    hit_load.push_back(st.load_s);
    hit_copy.push_back(st.load_copy_s);
    hit_wait.push_back(st.load_wait_s);
    if (r == 0) {
      out["tokens"] = gen->tokens;
      out["hit"] = {{"tokens_reused", st.tokens_reused},
                    {"tokens_computed", st.tokens_computed},
                    {"bytes_loaded", st.bytes_loaded}};
    }
    return std::nullopt;
  };
  auto run_slot = [&](uint32_t r) -> std::optional<Json> {
    auto run = slot_restore(e, s, ss.prompt, r == 0 ? &slot_tokens : nullptr);
    if (!run.ok()) return failure("slot restore", run.status());
    slot.push_back(run->ttft_s);
    slot_load.push_back(run->load_s);
    return std::nullopt;
  };
  // The order flips every repetition, so neither side always runs right after the other. The
  // warm-up pairs (first-touch faults of the cache and the file buffer) are reported apart.
  // Pairs are cheap at the small sizes, where the load the two sides differ in is the smallest
  // part of the TTFT: running them for a fixed time rather than a fixed count narrows the
  // interval where it is needed most.
  uint64_t scored_from = kdn::now_ns();
  for (uint32_t r = 0;; ++r) {
    const uint32_t scored = r > s.o.warmup ? r - s.o.warmup : 0;
    if (scored >= s.o.reps &&
        (scored >= s.o.max_pairs || static_cast<double>(kdn::now_ns() - scored_from) / 1e9 >= s.o.pair_seconds))
      break;
    const bool hit_first = r % 2 == 0;
    std::optional<Json> err = hit_first ? run_hit(r) : run_slot(r);
    if (!err) err = hit_first ? run_slot(r) : run_hit(r);
    if (err) return *err;
    if (r + 1 == s.o.warmup) {
      out["warmup_hit_runs_s"] = hit;
      out["warmup_slot_restore_runs_s"] = slot;
      for (auto* v : {&hit, &hit_retrieve, &hit_load, &hit_copy, &hit_wait, &slot, &slot_load}) v->clear();
      scored_from = kdn::now_ns();
    }
  }
  std::vector<double> paired;
  uint32_t hit_faster = 0;
  for (size_t i = 0; i < hit.size(); ++i) {
    paired.push_back(hit[i] / slot[i]);
    hit_faster += hit[i] < slot[i];
  }
  out["hit_vs_slot_restore_paired"] = median(paired);
  const kdn::bench::Interval ci = kdn::bench::median_interval(paired, 0.95);
  out["hit_vs_slot_restore_ci95"] = {ci.lo, ci.hi};
  out["hit_faster_pairs"] = hit_faster;
  out["ttft_hit_s"] = median(hit);
  out["ttft_hit_runs_s"] = hit;
  out["hit_retrieve_s"] = median(hit_retrieve);
  out["hit_load_s"] = median(hit_load);
  out["hit_load_runs_s"] = hit_load;
  out["hit_load_overlapped"] = e.overlaps_load();
  out["hit_load_copy_s"] = median(hit_copy);
  out["hit_load_wait_s"] = median(hit_wait);
  out["ttft_slot_restore_s"] = median(slot);
  out["ttft_slot_restore_runs_s"] = slot;
  out["slot_load_s"] = median(slot_load);
  out["slot_load_runs_s"] = slot_load;
  out["slot_tokens"] = slot_tokens;
  out["codec"] = codec_quality(e, *ss.store, s);
  return out;
}

// Process D: hits from the disk tier. Its namespace is declared in kdnd's configuration (only
// declared namespaces have a disk tier); the engine stores the prompt first (a miss).
Json run_disk_side(const Side& s) {
  Session ss;
  if (auto err = ss.open(s, s.o.model, s.o.threads)) return *err;
  Engine& e = *ss.engine;
  auto miss = e.generate(ss.prompt, s.o.n_predict, ss.store.get());
  if (!miss.ok()) return failure("disk miss", miss.status());
  if (miss->stats.chunks_stored == 0)
    return Json{{"error", std::string("disk: nothing stored: ") + miss->stats.cache_status.what()}};
  kdn::bench::AdminClient admin(s.socket, s.name_space);
  if (!admin.ok()) return Json{{"error", "disk: no admin session (is this uid among kdnd's admin_uids?)"}};
  auto prefix = e.document_prefix(s.doc, s.size);
  if (!prefix.ok()) return failure("disk prefix", prefix.status());
  enum Kind { kDisk, kArena, kDiskNoPrefetch };
  std::vector<double> runs[3], engine_ttft[3];
  uint64_t promoted = 0;
  bool identical = true;
  // One request as kdn-llama serves it: prefetch the document, build the prompt, generate.
  auto request = [&](Kind k) -> std::optional<Json> {
    if (k != kArena) {
      const auto before = admin.disk_stats();
      if (!admin.demote_all() || !before) return Json{{"error", "disk: moving the document to disk failed"}};
      promoted -= before->promoted_chunks;
    }
    const uint64_t t0 = kdn::now_ns();
    if (k != kDiskNoPrefetch) (void)ss.store->prefetch(prefix.value());
    auto prompt = e.chat_prompt(s.doc, s.o.question, s.size);
    if (!prompt.ok()) return failure("disk prompt", prompt.status());
    const uint64_t t1 = kdn::now_ns();
    auto gen = e.generate(prompt.value(), s.o.n_predict, ss.store.get());
    if (!gen.ok()) return failure("disk generate", gen.status());
    const auto& st = gen->stats;
    if (st.tokens_reused != s.size)
      return Json{{"error", std::string(k == kArena  ? "arena"
                                        : k == kDisk ? "disk"
                                                     : "disk without prefetch") +
                                " hit incomplete: " + std::to_string(st.tokens_reused) + " of " +
                                std::to_string(s.size) + " tokens reused (" + st.cache_status.what() + ")"}};
    identical &= gen->tokens == miss->tokens;
    runs[k].push_back(static_cast<double>(t1 - t0) * 1e-9 + st.ttft_s);
    engine_ttft[k].push_back(st.ttft_s);
    if (k != kArena) {
      const auto after = admin.disk_stats();
      if (after) promoted += after->promoted_chunks;
    }
    return std::nullopt;
  };
  for (uint32_t r = 0; r < s.o.disk_reps + s.o.warmup; ++r) {
    // The order rotates, so no kind always runs right after another.
    for (uint32_t i = 0; i < 3; ++i)
      if (auto err = request(Kind((r + i) % 3))) return *err;
    if (r + 1 == s.o.warmup)
      for (auto& v : runs) v.clear();
    if (r + 1 == s.o.warmup)
      for (auto& v : engine_ttft) v.clear();
  }
  std::vector<double> paired, paired_no_prefetch;
  for (size_t i = 0; i < runs[kDisk].size(); ++i) {
    paired.push_back(runs[kDisk][i] / runs[kArena][i]);
    paired_no_prefetch.push_back(runs[kDiskNoPrefetch][i] / runs[kArena][i]);
  }
  const kdn::bench::Interval ci = kdn::bench::median_interval(paired, 0.95);
  return Json{{"ttft_disk_hit_s", median(runs[kDisk])},
              {"ttft_disk_hit_runs_s", runs[kDisk]},
              {"ttft_disk_hit_engine_s", median(engine_ttft[kDisk])},
              {"ttft_disk_hit_no_prefetch_s", median(runs[kDiskNoPrefetch])},
              {"ttft_disk_hit_no_prefetch_runs_s", runs[kDiskNoPrefetch]},
              {"ttft_arena_hit_request_s", median(runs[kArena])},
              {"ttft_arena_hit_request_runs_s", runs[kArena]},
              {"disk_hit_vs_hit", median(paired)},
              {"disk_hit_vs_hit_ci95", {ci.lo, ci.hi}},
              {"disk_hit_no_prefetch_vs_hit", median(paired_no_prefetch)},
              {"disk_promoted_chunks", promoted},
              {"disk_tokens_identical", identical},
              {"ttft_miss_s", miss->stats.ttft_s}};
}

// Process C: the codec on the f16 copy of the weights, every core. It prefills the prompt and
// stores its chunks (their fingerprint names this model file, so they never meet A's), then
// leases and scores them as B does.
Json run_f16_codec_side(const Side& s, const std::string& f16_model) {
  Session ss;
  if (auto err = ss.open(s, f16_model, 0)) return *err;
  auto gen = ss.engine->generate(ss.prompt, 1, ss.store.get());
  if (!gen.ok()) return failure("f16 prefill", gen.status());
  return codec_quality(*ss.engine, *ss.store, s);  // fails if kdnd does not hold the whole prefix
}

// Runs `body` in a forked process (llama.cpp and OpenMP never start in the bench itself) and
// returns the JSON it wrote to a pipe.
kdn::Result<Json> in_child(const std::function<Json()>& body) {
  int fds[2];
  if (pipe(fds) != 0) return kdn::Status::from_errno("pipe", errno);
  auto child = kdn::bench::fork_child([&]() -> int {
    close(fds[0]);
    const std::string text = body().dump();
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = write(fds[1], text.data() + done, text.size() - done);
      if (n <= 0) return 1;
      done += static_cast<size_t>(n);
    }
    return 0;
  });
  close(fds[1]);
  if (!child.ok()) {
    close(fds[0]);
    return child.status();
  }
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  (void)child.value().wait_for(std::chrono::minutes(5));
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded()) return kdn::Status(kdn::Code::kInternal, "engine process died without an answer");
  if (j.contains("error")) {
    std::fprintf(stderr, "llama bench: %s\n", j["error"].get<std::string>().c_str());
    return kdn::Status(kdn::Code::kInternal, "an engine process failed");
  }
  return j;
}

// One codec_quality answer under `k` (".codec." or ".codec_f16." of a size).
void report_codec(kdn::bench::Report& r, const std::string& k, const Json& c) {
  if (c.contains("error")) {
    r.set(k + "error", c["error"].get<std::string>());
    return;
  }
  const auto fields = {
      "top1_agreement",       "ppl_exact",           "ppl_codec",     "ppl_delta_pct",       "kl",
      "flip_margin_median",   "margin_median",       "ratio_vs_fp16", "rel_frobenius_error", "cosine_min",
      "floor_top1_agreement", "floor_ppl_delta_pct", "floor_kl"};
  for (const char* f : fields) r.set(k + f, c[f].get<double>());
  r.set(k + "eval_tokens", c["eval_tokens"].get<uint64_t>());
  if (c.contains("calibrated"))
    for (const char* f :
         {"top1_agreement", "ppl_delta_pct", "kl", "flip_margin_median", "ratio_vs_fp16", "rel_frobenius_error"})
      r.set(k + "calibrated." + f, c["calibrated"][f].get<double>());
}

void report_size(kdn::bench::Report& r, uint32_t size, const Json& a, const Json& b) {
  const std::string k = "prompt_" + std::to_string(size) + ".";
  const double miss = a["ttft_s"], hit = b["ttft_hit_s"], slot = b["ttft_slot_restore_s"];
  r.set(k + "prompt_tokens", a["prompt_tokens"].get<uint64_t>());
  r.set(k + "ttft_miss_s", miss);
  r.set(k + "ttft_hit_s", hit);
  r.set(k + "speedup", miss / hit);
  r.set(k + "ttft_slot_restore_s", slot);
  for (const char* runs : {"ttft_hit_runs_s", "ttft_slot_restore_runs_s", "hit_load_runs_s", "slot_load_runs_s"})
    r.set_json(k + runs, kdn::bench::Report::Json::parse(b[runs].dump()));
  for (const char* runs : {"warmup_hit_runs_s", "warmup_slot_restore_runs_s"})
    if (b.contains(runs)) r.set_json(k + runs, kdn::bench::Report::Json::parse(b[runs].dump()));
  r.set(k + "hit_vs_slot_restore", b["hit_vs_slot_restore_paired"].get<double>());
  r.set(k + "hit_vs_slot_restore_of_medians", hit / slot);
  r.set_json(k + "hit_vs_slot_restore_ci95", kdn::bench::Report::Json::parse(b["hit_vs_slot_restore_ci95"].dump()));
  r.set(k + "hit_faster_pairs", b["hit_faster_pairs"].get<uint64_t>());
  r.set(k + "pairs", b["ttft_hit_runs_s"].size());
  r.set(k + "tokens_identical", a["tokens"] == b["tokens"]);
  r.set(k + "slot_tokens_identical", a["tokens"] == b["slot_tokens"]);
  r.set(k + "tokens_reused", b["hit"]["tokens_reused"].get<uint64_t>());
  r.set(k + "tokens_computed", b["hit"]["tokens_computed"].get<uint64_t>());
  r.set(k + "hit_retrieve_s", b["hit_retrieve_s"].get<double>());
  r.set(k + "hit_load_s", b["hit_load_s"].get<double>());
  r.set(k + "hit_load_overlapped", b["hit_load_overlapped"].get<bool>());
  r.set(k + "hit_load_copy_s", b["hit_load_copy_s"].get<double>());
  r.set(k + "hit_load_wait_s", b["hit_load_wait_s"].get<double>());
  r.set(k + "slot_load_s", b["slot_load_s"].get<double>());
  r.set(k + "bytes_loaded", b["hit"]["bytes_loaded"].get<uint64_t>());
  r.set(k + "store_s", a["store_s"].get<double>());
  r.set(k + "slot_file_bytes", a["slot_file_bytes"].get<uint64_t>());
  report_codec(r, k + "codec.", b["codec"]);
}

void add_flags(CLI::App& app, Options& o) {
  app.add_flag("--json", o.json, "print JSON");
  app.add_option("--model", o.model, "GGUF model (default: the one setup-llama.sh unpacked)");
  app.add_flag("--f16-weights", o.f16_weights,
               "run on the model's weights stored as f16 (NAME.f16.gguf, written next to it once)");
  app.add_flag("!--no-f16-codec", o.f16_codec,
               "score the codec on the served weights only (by default also on their f16 copy, process C)");
  app.add_option("--doc", o.docs, "document file(s), concatenated (default: /usr/share/common-licenses/*)");
  app.add_option("--sizes", o.sizes, "prompt sizes in tokens (multiples of 256)")->delimiter(',');
  app.add_option("--threads", o.threads, "llama.cpp threads per engine (default 1: stable under other load)");
  app.add_option("--reps", o.reps, "hit and slot-restore pairs at least (median)")->check(CLI::Range(1u, 401u));
  app.add_option("--pair-seconds", o.pair_seconds,
                 "keep running pairs past --reps until they have run this long (0: exactly --reps)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--max-pairs", o.max_pairs, "pairs at most, whatever --pair-seconds says")
      ->check(CLI::Range(1u, 4001u));
  app.add_option("--warmup", o.warmup, "unscored hit and slot-restore pairs before them")->check(CLI::Range(0u, 10u));
  app.add_option("--n-predict", o.n_predict, "greedy tokens compared between hit and miss");
  app.add_option("--eval-tokens", o.eval_tokens, "document tokens scored for the codec")->check(CLI::Range(2u, 4096u));
  app.add_option("--kdnd", o.kdnd, "kdnd binary (default: next to kdn-bench)");
  app.add_option("--disk-size", o.disk_size, "prompt size of the disk-tier hits (0: none)")->capture_default_str();
  app.add_option("--disk-reps", o.disk_reps, "disk-hit / arena-hit / no-prefetch triples")
      ->check(CLI::Range(1u, 401u))
      ->capture_default_str();
  using kdn::kernels::CodecMode;
  // Names as the codec spells them; the callback stores the mode itself.
  static const std::map<std::string, CodecMode> modes = [] {
    std::map<std::string, CodecMode> m;
    for (CodecMode c : {CodecMode::kRaw, CodecMode::kLossless, CodecMode::kInt8, CodecMode::kKivi4, CodecMode::kKivi2})
      m.emplace(kdn::kernels::codec_mode_name(c), c);
    return m;
  }();
  std::vector<std::string> names;
  for (const auto& [name, mode] : modes) names.push_back(name);
  app.add_option_function<std::string>(
         "--codec", [&o](const std::string& v) { o.codec = modes.at(v); },
         "KVC1 mode whose quality is measured (default kivi4; the bar applies to kivi4)")
      ->check(CLI::IsMember(names));
  app.add_option("--k-bits", o.k_bits, "quantized modes: K code bits (default: the mode's)")->check(CLI::Range(1u, 8u));
  app.add_option("--v-bits", o.v_bits, "quantized modes: V code bits (default: the mode's)")->check(CLI::Range(1u, 8u));
  app.add_option("--layer-k-bits", o.layer_k_bits, "quantized modes: K code bits per layer, one per layer")
      ->delimiter(',')
      ->check(CLI::Range(1, 8));
  app.add_option("--layer-v-bits", o.layer_v_bits, "quantized modes: V code bits per layer, one per layer")
      ->delimiter(',')
      ->check(CLI::Range(1, 8));
  app.add_option("--k-group-tokens", o.k_group_tokens, "kivi modes: tokens per K channel group (default: the codec's)")
      ->check(CLI::Range(1u, 4096u));
  app.add_option("--v-group-channels", o.v_group_channels,
                 "kivi modes: channels per V token group, dividing head_dim (default: head_dim)")
      ->check(CLI::Range(1u, 1024u));
  app.add_flag("--rotate", o.rotate, "quantized modes: quantize Hadamard-rotated K and V rows (both per token)");
  app.add_option("--sink-tokens", o.sink_tokens,
                 "quantized modes: leading tokens of the context stored exactly (attention sinks; 0: none)")
      ->check(CLI::Range(0u, 4096u));
  app.add_option("--recent-tokens", o.recent_tokens,
                 "quantized modes: last tokens of the context stored exactly (KIVI's recent window; 0: none)")
      ->check(CLI::Range(0u, 4096u));
  app.add_flag("!--no-calibrate", o.calibrate,
               "skip the per-layer width calibration (by default it runs first, on the model's f16 weights)");
  app.add_option("--calib-doc", o.calib_docs, "text file(s) to calibrate on (default: the document's last tokens)");
  app.add_option("--calib-probe-bits", o.calib_probe_bits,
                 "width every plane is quantized to when its sensitivity is measured (default: the mode's)")
      ->check(CLI::Range(1u, 8u));
  app.add_option("--calib-min-bits", o.calib_min_bits, "narrowest width the calibrated allocation may give a plane")
      ->check(CLI::Range(1u, 8u));
  app.add_option("--calib-chunks", o.calib_chunks, "calibration context in chunks")->check(CLI::Range(1u, 32u));
  app.add_option("--calib-eval-tokens", o.calib_eval_tokens, "positions scored per calibration run")
      ->check(CLI::Range(2u, 4096u));
  app.add_option("--calib-threads", o.calib_threads, "llama.cpp threads for the calibration (default 0: every core)")
      ->check(CLI::Range(0, 256));
}

// Scored positions over all sizes: where the codec's run and the one-ulp control agree with the exact run.
struct Agreement {
  uint64_t codec = 0, calibrated = 0, floor = 0, scored = 0;

  void add(const Json& c) {
    if (!c.contains("agreeing_positions")) return;
    codec += c["agreeing_positions"].get<uint64_t>();
    if (c.contains("calibrated")) calibrated += c["calibrated"]["agreeing_positions"].get<uint64_t>();
    floor += c["floor_agreeing_positions"].get<uint64_t>();
    scored += c["eval_tokens"].get<uint64_t>();
  }
};

std::optional<double> fraction(uint64_t part, uint64_t whole) {
  if (whole == 0) return std::nullopt;
  return static_cast<double>(part) / static_cast<double>(whole);
}

// Pooled figures of one set of weights under `k` ("codec." or "codec_f16."); the calibrated
// widths' top-1 (the same mean, 4 bits for kivi4) when they ran, else the uniform widths'.
std::optional<double> report_agreement(kdn::bench::Report& r, const std::string& k, const Calibration& cal,
                                       const Agreement& a) {
  // The 95% interval treats the scored positions as independent trials; neighbouring positions
  // share most of their context, so it understates the figure's sampling error if anything.
  const auto set_interval = [&](const std::string& key, uint64_t hits) {
    if (a.scored == 0) return;
    const kdn::bench::Interval ci = kdn::bench::proportion_interval(hits, a.scored, 0.95);
    r.set_json(key, kdn::bench::Report::Json::array({ci.lo, ci.hi}));
  };
  const std::optional<double> top1 = fraction(a.codec, a.scored);
  r.set(k + "top1_agreement", top1);
  set_interval(k + "top1_agreement_ci95", a.codec);
  r.set(k + "floor_top1_agreement", fraction(a.floor, a.scored));
  r.set(k + "scored_positions", a.scored);
  if (cal.k_bits.empty()) return top1;
  const std::optional<double> calibrated = fraction(a.calibrated, a.scored);
  r.set(k + "calibrated.top1_agreement", calibrated);
  set_interval(k + "calibrated.top1_agreement_ci95", a.calibrated);
  return calibrated;
}

void set_bars(kdn::bench::Report& r, const Options& o, const Calibration& cal, bool all_identical,
              const Agreement& served, const Agreement& f16) {
  if (std::find(o.sizes.begin(), o.sizes.end(), 4096u) != o.sizes.end())
    r.set_bar("bars.speedup_4k", r.number("prompt_4096.speedup"), kdn::bench::BarOp::kAtLeast, 20);
  for (uint32_t size : o.sizes) {
    const std::string k = "prompt_" + std::to_string(size);
    r.set_bar("bars.hit_vs_slot_restore_" + std::to_string(size), r.number(k + ".hit_vs_slot_restore"),
              kdn::bench::BarOp::kAtMost, 1.0);
  }
  r.set_bar("bars.tokens_identical", all_identical ? 1.0 : 0.0, kdn::bench::BarOp::kAtLeast, 1.0);
  r.set("codec.mode", kdn::kernels::codec_mode_name(o.codec));
  r.set("codec.rotate", o.rotate);
  r.set("codec.sink_tokens", o.sink_tokens);
  r.set("codec.recent_tokens", o.recent_tokens);
  const std::optional<double> top1 = report_agreement(r, "codec.", cal, served);
  // The bar is read on f16 weights when they were scored: there a one-ulp change of the KV
  // leaves the top-1 token alone, so the figure is the codec's, not the 8-bit activations'.
  const std::optional<double> top1_f16 = f16.scored ? report_agreement(r, "codec_f16.", cal, f16) : std::nullopt;
  if (o.codec == kdn::kernels::CodecMode::kKivi4)
    r.set_bar("bars.codec_top1_agreement", f16.scored ? top1_f16 : top1, kdn::bench::BarOp::kAtLeast, 0.98);
}

// ---- kdn-bench remote: the engine end to end across two nodes -----------------------------------

// Node A's engine prefills the prompt (a miss, its chunks uploaded to T3 by A's kdnd); node B's
// engine then asks for the same prompt. Each of B's rounds first makes B's kdnd forget every
// chunk (an operator's evict --all: T3 copies stay in the store), so B's request finds the
// prefix only in T3 (ttft_remote_hit_s), then asks again with it in B's arena (ttft_hit_s).
Json run_remote_sides(const Options& o, const std::string& doc, const std::string& socket_a,
                      const std::string& socket_b, const std::string& ns, uint32_t size, uint32_t reps) {
  const Calibration cal;
  const Side a{o, doc, cal, size, socket_a, ns, ""}, b{o, doc, cal, size, socket_b, ns, ""};
  auto miss = in_child([&]() -> Json {
    Session ss;
    if (auto err = ss.open(a, o.model, o.threads)) return *err;
    auto gen = ss.engine->generate(ss.prompt, o.n_predict, ss.store.get());
    if (!gen.ok()) return failure("node A generate", gen.status());
    if (gen->stats.tokens_reused != 0) return Json{{"error", "node A was not a clean miss"}};
    return Json{{"ttft_s", gen->stats.ttft_s}, {"chunks_stored", gen->stats.chunks_stored}, {"tokens", gen->tokens}};
  });
  if (!miss.ok()) return Json{{"error", std::string("node A: ") + miss.status().what()}};
  // write_through uploads run after the COMMIT: wait until A's T3 holds them.
  {
    kdn::bench::AdminClient admin(socket_a, ns);
    const uint64_t want = (*miss)["chunks_stored"];
    bool there = false;
    for (int i = 0; i < 1000 && admin.ok() && !there; ++i) {
      const auto t3 = admin.tier_stats(kdn::ipc::ChunkTier::kRemote);
      there = t3 && t3->resident_chunks >= want;
      if (!there) usleep(10000);
    }
    if (!there) return Json{{"error", "node A's chunks did not reach T3 within 10 s"}};
  }
  auto hits = in_child([&]() -> Json {
    Session ss;
    if (auto err = ss.open(b, o.model, o.threads)) return *err;
    kdn::bench::AdminClient admin(socket_b, ns);
    if (!admin.ok()) return Json{{"error", "node B: no admin session"}};
    std::vector<double> remote, local, paired;
    bool identical = true;
    for (uint32_t r = 0; r < reps + o.warmup; ++r) {
      if (!admin.evict_all()) return Json{{"error", "node B: evict --all failed"}};
      double t[2];
      for (int k = 0; k < 2; ++k) {  // k = 0: only in T3; k = 1: in B's arena
        auto gen = ss.engine->generate(ss.prompt, o.n_predict, ss.store.get());
        if (!gen.ok()) return failure("node B generate", gen.status());
        if (gen->stats.tokens_reused != size)
          return Json{{"error", std::string(k == 0 ? "remote" : "local") +
                                    " hit incomplete: " + std::to_string(gen->stats.tokens_reused) + " of " +
                                    std::to_string(size) + " tokens reused (" + gen->stats.cache_status.what() + ")"}};
        identical &= gen->tokens == (*miss)["tokens"].get<std::vector<int32_t>>();
        t[k] = gen->stats.ttft_s;
      }
      if (r < o.warmup) continue;
      remote.push_back(t[0]);
      local.push_back(t[1]);
      paired.push_back(t[0] / t[1]);
    }
    return Json{{"ttft_remote_hit_s", median(remote)}, {"ttft_remote_hit_runs_s", remote},
                {"ttft_hit_s", median(local)},         {"ttft_hit_runs_s", local},
                {"remote_hit_vs_hit", median(paired)}, {"tokens_identical", identical}};
  });
  if (!hits.ok()) return Json{{"error", std::string("node B: ") + hits.status().what()}};
  Json out = *hits;
  out["ttft_miss_s"] = (*miss)["ttft_s"];
  out["prompt_tokens"] = size;
  out["chunks"] = (*miss)["chunks_stored"];
  out["remote_hit_speedup_vs_miss"] = double((*miss)["ttft_s"]) / double(out["ttft_remote_hit_s"]);
  return out;
}

}  // namespace

std::string remote_llama_ttft_json(const std::string& socket_a, const std::string& socket_b, const std::string& ns,
                                   uint32_t size, uint32_t reps) {
  Options o;
  o.docs = default_documents();
  return run_remote_sides(o, read_documents(o.docs), socket_a, socket_b, ns, size, reps).dump();
}

int run_llama_bench(int argc, char** argv) {
  CLI::App app("kdn-bench llama: TTFT of llama.cpp with and without kdn, against slot save/restore");
  Options o;
  add_flags(app, o);
  CLI11_PARSE(app, argc, argv);
  if (o.docs.empty()) o.docs = default_documents();
  // Calibration needs layer_*_bits free and a quantized mode; it always runs on f16 weights.
  const bool calibrate = o.calibrate && kdn::kernels::codec_mode_default_bits(o.codec) != 0 && o.layer_k_bits.empty() &&
                         o.layer_v_bits.empty() && o.k_bits == o.v_bits;
  std::string f16_model;
  if (o.f16_weights || calibrate || o.f16_codec) {
    const kdn::Result<std::string> f16 = kdn::llama::f16_weights_model(o.model);
    if (!f16.ok()) {
      std::fprintf(stderr, "llama bench: %s: %s\n", o.model.c_str(), f16.status().what());
      return 1;
    }
    f16_model = f16.value();
    if (o.f16_weights) o.model = f16_model;
  }
  const std::string doc = read_documents(o.docs);
  for (uint32_t size : o.sizes)
    if (size == 0 || size % 256 != 0) {
      std::fprintf(stderr, "llama bench: sizes must be multiples of 256\n");
      return 2;
    }

  auto tmp = kdn::bench::TempDir::create("kdn-llama-bench");
  if (!tmp.ok()) return 1;
  // The disk-hit prompt is stored in the arena first, like the others.
  const uint32_t largest = std::max(*std::max_element(o.sizes.begin(), o.sizes.end()), o.disk_size);
  kdn::bench::KdndOptions ko;
  ko.binary = o.kdnd;
  ko.socket_path = tmp->path() + "/kdnd.sock";
  ko.log_path = tmp->path() + "/kdnd.log";
  // Room for the largest prompt's chunks twice (A's, and C's of the f16 weights) and then some.
  ko.host_arena_bytes = (uint64_t{largest} * 23040 * 3 + (64ull << 20)) & ~((1ull << 20) - 1);
  // The disk-hit namespace, declared so it has a disk tier, with its slab file in the run's
  // temporary directory.
  const std::string disk_ns = "llama-bench-disk";
  if (o.disk_size > 0) {
    if (o.disk_size % 256 != 0) {
      std::fprintf(stderr, "llama bench: --disk-size must be a multiple of 256\n");
      return 2;
    }
    std::filesystem::create_directories(tmp->path() + "/disk");
    const uint64_t disk_mib = std::max<uint64_t>(256, uint64_t{o.disk_size} * 23040 * 2 / (1u << 20) + 128);
    ko.extra_args = {"--set", "tier.disk.dirs=" + tmp->path() + "/disk",
                     "--set", "tier.disk.bytes=" + std::to_string(disk_mib) + "M",
                     "--set", "namespace." + disk_ns + ".disk_codec=none"};
  }
  auto kdnd = kdn::bench::KdndProcess::start(ko);
  if (!kdnd.ok()) {
    std::fprintf(stderr, "llama bench: %s\n%s", kdn::bench::describe(kdnd.status()).c_str(),
                 kdn::bench::file_tail(ko.log_path).c_str());
    return 1;
  }

  Calibration cal;
  if (calibrate) {
    std::fprintf(stderr, "llama bench: calibrating per-layer codec widths on %s...\n", f16_model.c_str());
    const std::string text = o.calib_docs.empty() ? doc : read_documents(o.calib_docs);
    auto c = in_child([&] { return run_calibration(o, f16_model, text, o.calib_docs.empty()); });
    if (!c.ok()) return 1;
    cal.report = c.value();
    cal.k_bits = cal.report["k_bits"].get<std::vector<uint8_t>>();
    cal.v_bits = cal.report["v_bits"].get<std::vector<uint8_t>>();
  }

  kdn::bench::Report r;
  r.set("model", o.model.substr(o.model.find_last_of('/') + 1));
  if (calibrate) r.set_json("codec.calibration", kdn::bench::Report::Json::parse(cal.report.dump()));
  r.set("threads", static_cast<int64_t>(o.threads));
  r.set("chunk_tokens", 256);
  bool all_identical = true;
  Agreement served, f16;
  const bool f16_codec = o.f16_codec && !o.f16_weights;  // f16_model is set whenever o.f16_codec
  for (uint32_t size : o.sizes) {
    // A namespace per size: the shorter prompts' chunks are prefixes of the longer ones'.
    const Side side{o,
                    doc,
                    cal,
                    size,
                    ko.socket_path,
                    "llama-bench-" + std::to_string(size),
                    tmp->path() + "/slot-" + std::to_string(size) + ".bin"};
    std::fprintf(stderr, "llama bench: %u tokens: process A (miss, store)...\n", size);
    auto a = in_child([&] { return run_store_side(side); });
    if (!a.ok()) return 1;
    std::fprintf(stderr, "llama bench: %u tokens: process B (hit, slot restore, codec)...\n", size);
    auto b = in_child([&] { return run_reuse_side(side); });
    if (!b.ok()) return 1;
    report_size(r, size, a.value(), b.value());
    all_identical &= a.value()["tokens"] == b.value()["tokens"] && a.value()["tokens"] == b.value()["slot_tokens"];
    served.add(b.value()["codec"]);
    if (f16_codec) {
      std::fprintf(stderr, "llama bench: %u tokens: process C (codec on f16 weights)...\n", size);
      auto c = in_child([&] { return run_f16_codec_side(side, f16_model); });
      if (!c.ok()) return 1;
      report_codec(r, "prompt_" + std::to_string(size) + ".codec_f16.", c.value());
      f16.add(c.value());
    }
  }
  if (o.disk_size > 0) {
    const Side side{o, doc, cal, o.disk_size, ko.socket_path, disk_ns, tmp->path() + "/slot-disk.bin"};
    std::fprintf(stderr, "llama bench: %u tokens: process D (hits from the disk tier)...\n", o.disk_size);
    auto d = in_child([&] { return run_disk_side(side); });
    if (!d.ok()) return 1;
    const std::string k = "prompt_" + std::to_string(o.disk_size) + ".";
    const Json& j = d.value();
    for (const char* f : {"ttft_disk_hit_s", "ttft_disk_hit_engine_s", "ttft_disk_hit_no_prefetch_s",
                          "ttft_arena_hit_request_s", "disk_hit_vs_hit", "disk_hit_no_prefetch_vs_hit"})
      r.set(k + f, j[f].get<double>());
    for (const char* f : {"ttft_disk_hit_runs_s", "ttft_disk_hit_no_prefetch_runs_s", "ttft_arena_hit_request_runs_s",
                          "disk_hit_vs_hit_ci95"})
      r.set_json(k + f, kdn::bench::Report::Json::parse(j[f].dump()));
    r.set(k + "disk_promoted_chunks", j["disk_promoted_chunks"].get<uint64_t>());
    r.set(k + "disk_tokens_identical", j["disk_tokens_identical"].get<bool>());
    r.set(k + "disk_side_ttft_miss_s", j["ttft_miss_s"].get<double>());
    if (auto hit = r.number(k + "ttft_hit_s"))
      r.set(k + "disk_hit_engine_vs_hit_of_medians", j["ttft_disk_hit_engine_s"].get<double>() / *hit);
    r.set_bar("bars.ttft_disk_hit_vs_hit_" + std::to_string(o.disk_size / 1024) + "k", r.number(k + "disk_hit_vs_hit"),
              kdn::bench::BarOp::kAtMost, 1.3);
    all_identical &= j["disk_tokens_identical"].get<bool>();
  }
  (void)kdnd.value().stop();
  set_bars(r, o, cal, all_identical, served, f16);
  std::printf("%s\n", o.json ? r.to_json().c_str() : r.to_table().c_str());
  return 0;
}
