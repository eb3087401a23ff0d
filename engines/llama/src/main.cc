// kdn-llama: answers a question about a document with llama.cpp, reusing the document's KV
// from kdnd when another engine on the node has computed it, and storing what it computes.
//
//   kdn-llama --model M.gguf --prompt-file doc.txt --question "..." [--n-predict 32]
//             [--context-tokens 4096] [--no-cache] [--socket PATH] [--json] [--dump-kv DIR]
//   kdn-llama --serve --prompt-file doc.txt [...]     questions on stdin, one per line
//
// Prints the time to first token, the tokens reused and computed, and the answer (--serve:
// one answer per question, one JSON line each with --json). The document's prefix is
// prefetched from kdnd before the question is tokenized, so a document kdnd holds on disk is
// on its way into the arena while the prompt is built. A server keeps serving when kdnd
// restarts: questions are answered by prefilling while it is away, and libkdn reconnects by
// itself once it is back (and if it was not there at the start, the engine connects later).
//
// RAG mode (docs/blend.md): documents in any order, each one's KV reused wherever it lands.
//
//   kdn-llama --segment a.txt --segment b.txt ... --question "..." [--blend hkvd|boundary|none|all|prefix]
//             [--recompute-ratio 0.15] [--boundary-tokens 16] [--check-layer 1]
#include <kdn/llama/engine.h>
#include <kdn/llama/kdn_chunk_cache.h>
#include <kdn/llama/kv_dump.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <kdn/common/clock.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct CliOptions {
  kdn::llama::EngineOptions engine;
  std::string prompt_file;
  std::vector<std::string> segments;
  std::string blend = "hkvd";  // a BlendPolicy name, or "prefix" (prefix caching only)
  kdn::llama::BlendOptions blend_options;
  std::string name_space;
  std::string question;
  uint32_t n_predict = 32;
  uint32_t context_tokens = 0;
  bool no_cache = false;
  std::string socket;
  std::string dump_kv;
  bool json = false;
  bool serve = false;
  bool progress = false;
};

// --help in kdnd's style: choices as a plain "a|b|c" list (no CLI11 validator text) and every
// default shown.
void add_flags(CLI::App& app, CliOptions& o) {
  o.engine.model_path = kdn::llama::default_model_path();
  app.add_option("--model", o.engine.model_path, "GGUF model file (default: the one setup-llama.sh unpacked)");
  auto* doc = app.add_option("--prompt-file", o.prompt_file, "document to answer questions about");
  auto* seg = app.add_option("--segment", o.segments,
                             "RAG mode: a document, repeated in prompt order; each one's KV is reused at any position");
  doc->excludes(seg);
  app.add_option("--question", o.question, "question about the document(s) (required unless --serve)");
  app.add_flag("--serve", o.serve, "answer questions read from stdin, one per line, with one engine")->excludes(seg);
  app.add_option("--blend", o.blend,
                 "RAG mode: hkvd (recompute the tokens whose K deviates most), boundary (the first tokens of "
                 "each document after the first), none (re-rotate only), all (recompute everything), "
                 "prefix (no blending: prefix caching only)")
      ->check(CLI::IsMember({"hkvd", "boundary", "none", "all", "prefix"}).description(""))
      ->type_name("hkvd|boundary|none|all|prefix")
      ->capture_default_str();
  app.add_option("--recompute-ratio", o.blend_options.recompute_ratio, "hkvd: share of document tokens recomputed")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--boundary-tokens", o.blend_options.boundary_tokens, "boundary: tokens recomputed per document")
      ->capture_default_str();
  app.add_option("--check-layer", o.blend_options.check_layer, "hkvd: the layer whose deviation ranks tokens")
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--deviation",
         [&o](const std::string& v) { (void)kdn::llama::parse_blend_deviation(v, &o.blend_options.deviation); },
         "hkvd: rows compared at the check layer: K, V or both")
      ->check(CLI::IsMember({"k", "v", "kv"}).description(""))
      ->type_name("k|v|kv")
      ->default_str("k");
  app.add_option("--namespace", o.name_space, "kdnd namespace, created if kdnd allows it (default: libkdn's)");
  app.add_option("--n-predict", o.n_predict, "tokens to generate (greedy)")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  app.add_option("--context-tokens", o.context_tokens,
                 "cut the document so the prompt up to its end is exactly this many tokens (0: whole)")
      ->capture_default_str();
  app.add_flag("--no-cache", o.no_cache, "do not use kdnd: prefill everything");
  app.add_option("--socket", o.socket, "kdnd socket (default: libkdn's)");
  app.add_option("--ctx", o.engine.n_ctx, "KV cache size in tokens")->capture_default_str();
  app.add_option("--chunk-tokens", o.engine.chunk_tokens, "kdn chunk size and prefill batch")->capture_default_str();
  app.add_option("--threads", o.engine.n_threads, "compute threads (0: all)")->capture_default_str();
  app.add_flag("!--no-flash-attn", o.engine.flash_attn, "run without flash attention (V transposed)");
  const std::map<std::string, kdn::llama::LoadOverlap> overlap = {{"auto", kdn::llama::LoadOverlap::kAuto},
                                                                  {"on", kdn::llama::LoadOverlap::kOn},
                                                                  {"off", kdn::llama::LoadOverlap::kOff}};
  app.add_option_function<std::string>(
         "--load-overlap",
         [&o, overlap](const std::string& v) {
           if (auto it = overlap.find(CLI::detail::to_lower(v)); it != overlap.end())
             o.engine.load_overlap = it->second;
         },
         "copy a hit's KV beside the prefill, layer by layer: auto (when --threads leaves a core free), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}, CLI::ignore_case).description(""))
      ->type_name("auto|on|off")
      ->default_str("auto");
  app.add_option("--dump-kv", o.dump_kv, "write the prompt's canonical KV chunks here (.kv + .json)");
  app.add_flag("--json", o.json, "print one JSON object instead of text");
  app.add_flag("--verbose", o.engine.verbose, "show llama.cpp's log");
  app.add_flag("--progress", o.progress, "show prefill progress on stderr (tokens computed of the prompt's)");
}

// A document: a regular file with some text in it (a directory or an empty file is an error,
// not a 12-token prompt). False with the reason in *why.
bool read_file(const std::string& path, std::string& out, std::string* why) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec) {
    *why = path + ": " + ec.message();
    return false;
  }
  if (std::filesystem::is_directory(st)) {
    *why = path + " is a directory, not a document";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *why = "cannot read " + path;
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  if (out.find_first_not_of(" \t\r\n") == std::string::npos) {
    *why = path + " is empty";
    return false;
  }
  return true;
}

// Opens kdnd's store, or says why the engine runs without one.
std::unique_ptr<kdn::llama::ChunkCache> open_store(const CliOptions& o, const kdn::llama::Engine& e,
                                                   std::string& cache_state) {
  if (o.no_cache) {
    cache_state = "disabled (--no-cache)";
    return nullptr;
  }
  if (!e.cache_support().ok()) {
    cache_state = std::string("unsupported: ") + e.cache_support().what();
    return nullptr;
  }
  auto s = kdn::llama::KdnChunkCache::connect(e.identity().desc, o.socket, o.name_space, !o.name_space.empty());
  if (!s.ok()) {
    cache_state = std::string("unavailable (") + s.status().what() + "): prefilling everything";
    return nullptr;
  }
  cache_state = "kdnd";
  return std::move(s.value());
}

void print_text(const kdn::llama::Engine& e, size_t prompt_tokens, const std::string& cache_state,
                const kdn::llama::Generation& g, const std::string& answer) {
  const kdn::llama::RequestStats& s = g.stats;
  const kdn::llama::KvGeometry& geo = e.identity().geometry;
  std::printf("model:   %s (%u layers, %u KV heads x %u, chunk %u tokens)\n", e.identity().desc.name, geo.n_layer,
              geo.n_kv_heads, geo.head_dim, geo.chunk_tokens);
  std::printf("cache:   %s\n", cache_state.c_str());
  std::printf("prompt:  %zu tokens\n", prompt_tokens);
  std::printf("ttft:    %.3f s (retrieve %.4f s, load %.4f s, prefill %.3f s)\n", s.ttft_s, s.retrieve_s, s.load_s,
              s.prefill_s);
  if (e.overlaps_load() && s.chunks_loaded > 0)
    std::printf("overlap: KV copied beside the prefill in %.4f s; the prefill waited %.4f s for it\n", s.load_copy_s,
                s.load_wait_s);
  std::printf("reused:  %u tokens (%u chunks, %.1f MB)\n", s.tokens_reused, s.chunks_loaded, s.bytes_loaded / 1e6);
  std::printf("computed: %u tokens; stored %u chunks (%.1f MB) in %.4f s\n", s.tokens_computed, s.chunks_stored,
              s.bytes_stored / 1e6, s.store_s);
  if (s.blend.used || s.blend.segments > 0) {
    const kdn::llama::BlendStats& b = s.blend;
    std::printf(
        "blend:   %u documents: %u reused, %u computed and stored (%u chunks); %llu of their tokens "
        "loaded, %llu recomputed\n",
        b.segments, b.segments_reused, b.segments_computed, b.chunks_stored,
        static_cast<unsigned long long>(b.tokens_loaded), static_cast<unsigned long long>(b.tokens_recomputed));
    std::printf(
        "         lookup %.4f s, document prefill %.3f s, store %.4f s, place %.3f s, load %.4f s, "
        "select %.4f s, recompute %.3f s\n",
        b.lookup_s, b.segment_prefill_s, b.segment_store_s, b.place_s, b.retrieve_s, b.select_s, b.recompute_s);
  }
  if (!s.cache_status.ok()) std::printf("note:    cache not used: %s\n", s.cache_status.what());
  std::printf("answer:  %s\n", answer.c_str());
}

nlohmann::json blend_json(const kdn::llama::BlendStats& b) {
  return {{"used", b.used},
          {"segments", b.segments},
          {"segments_reused", b.segments_reused},
          {"segments_computed", b.segments_computed},
          {"chunks_stored", b.chunks_stored},
          {"tokens_loaded", b.tokens_loaded},
          {"tokens_recomputed", b.tokens_recomputed},
          {"tokens_checked", b.tokens_checked},
          {"lookup_s", b.lookup_s},
          {"segment_prefill_s", b.segment_prefill_s},
          {"segment_store_s", b.segment_store_s},
          {"place_s", b.place_s},
          {"retrieve_s", b.retrieve_s},
          {"select_s", b.select_s},
          {"recompute_s", b.recompute_s}};
}

void print_json(const kdn::llama::Engine& e, size_t prompt_tokens, const std::string& cache_state,
                const kdn::llama::Generation& g, const std::string& answer, double request_ttft_s,
                const std::string& question) {
  const kdn::llama::RequestStats& s = g.stats;
  nlohmann::json j = {
      {"question", question},
      {"request_ttft_s", request_ttft_s},
      {"model", e.identity().desc.name},
      {"cache", cache_state},
      {"prompt_tokens", prompt_tokens},
      {"ttft_s", s.ttft_s},
      {"retrieve_s", s.retrieve_s},
      {"load_s", s.load_s},
      {"load_overlapped", e.overlaps_load()},
      {"load_copy_s", s.load_copy_s},
      {"load_wait_s", s.load_wait_s},
      {"prefill_s", s.prefill_s},
      {"store_s", s.store_s},
      {"tokens_reused", s.tokens_reused},
      {"tokens_computed", s.tokens_computed},
      {"chunks_loaded", s.chunks_loaded},
      {"bytes_loaded", s.bytes_loaded},
      {"chunks_stored", s.chunks_stored},
      {"bytes_stored", s.bytes_stored},
      {"cache_status", s.cache_status.ok() ? "ok" : s.cache_status.what()},
      {"answer_tokens", g.tokens},
      {"answer", answer},
  };
  if (s.blend.segments > 0) j["blend"] = blend_json(s.blend);
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(stdout);
}

// One question: prefetch the document's prefix, build the prompt, generate, print.
// request_ttft_s counts from the question's arrival: prefetch and tokenization included.
int answer(const CliOptions& o, kdn::llama::Engine& e, kdn::llama::ChunkCache* store, const std::string& cache_state,
           const std::string& doc, const std::vector<int32_t>& prefix, const std::string& question) {
  const uint64_t t0 = kdn::now_ns();
  if (store) (void)store->prefetch(prefix);  // a hint: a failure only means it did not start
  auto prompt = e.chat_prompt(doc, question, o.context_tokens);
  if (!prompt.ok()) {
    std::fprintf(stderr, "kdn-llama: %s\n", prompt.status().what());
    return 1;
  }
  const uint64_t t1 = kdn::now_ns();
  auto gen = e.generate(prompt.value(), o.n_predict, store);
  if (!gen.ok()) {
    std::fprintf(stderr, "kdn-llama: %s\n", gen.status().what());
    return 1;
  }
  const double request_ttft_s = double(t1 - t0) * 1e-9 + gen->stats.ttft_s;
  const std::string text = e.detokenize(gen->tokens);
  if (o.json)
    print_json(e, prompt->size(), cache_state, gen.value(), text, request_ttft_s, question);
  else
    print_text(e, prompt->size(), cache_state, gen.value(), text);
  if (!o.dump_kv.empty()) {
    const uint32_t whole = static_cast<uint32_t>(prompt->size() / e.identity().geometry.chunk_tokens);
    const kdn::Status st = kdn::llama::dump_kv_chunks(e, whole, o.dump_kv);
    if (!st.ok()) {
      std::fprintf(stderr, "kdn-llama: --dump-kv: %s\n", st.what());
      return 1;
    }
  }
  return 0;
}

// RAG mode: the chat template around the documents and the question, blended from kdnd.
int run_rag(const CliOptions& o, kdn::llama::Engine& e) {
  std::vector<std::string> docs;
  for (const std::string& path : o.segments) {
    docs.emplace_back();
    std::string why;
    if (!read_file(path, docs.back(), &why)) {
      std::fprintf(stderr, "kdn-llama: --segment %s\n", why.c_str());
      return 2;
    }
  }
  auto prompt = e.rag_prompt(docs, o.question);
  if (!prompt.ok()) {
    std::fprintf(stderr, "kdn-llama: %s\n", prompt.status().what());
    return 1;
  }
  const std::vector<int32_t> tokens = prompt->tokens();
  if (tokens.size() + o.n_predict > e.context_size()) {
    std::fprintf(stderr, "kdn-llama: the prompt (%zu tokens) and the answer (%u) do not fit in the context (%u)\n",
                 tokens.size(), o.n_predict, e.context_size());
    return 1;
  }
  std::string cache_state;
  std::unique_ptr<kdn::llama::ChunkCache> store = open_store(o, e, cache_state);
  kdn::Result<kdn::llama::Generation> gen = kdn::Status(kdn::Code::kInternal, "not run");
  if (o.blend == "prefix") {
    gen = e.generate(tokens, o.n_predict, store.get());
  } else {
    kdn::llama::BlendOptions bo = o.blend_options;
    (void)kdn::llama::parse_blend_policy(o.blend, &bo.policy);
    gen = e.generate_blend(prompt.value(), o.n_predict, store.get(), bo);
    if (gen.ok() && !gen->stats.blend.used) cache_state += ", blend fell back to a full prefill";
  }
  if (!gen.ok()) {
    std::fprintf(stderr, "kdn-llama: %s\n", gen.status().what());
    return 1;
  }
  const std::string answer = e.detokenize(gen->tokens);
  if (o.json)
    print_json(e, tokens.size(), cache_state, gen.value(), answer, gen->stats.ttft_s, o.question);
  else
    print_text(e, tokens.size(), cache_state, gen.value(), answer);
  return 0;
}

int run(const CliOptions& o) {
  if (!o.serve && o.question.empty()) {
    std::fprintf(stderr, "kdn-llama: --question is required (or --serve)\n");
    return 2;
  }
  if (o.prompt_file.empty() && o.segments.empty()) {
    std::fprintf(stderr, "kdn-llama: give --prompt-file, or --segment (RAG mode)\n");
    return 2;
  }
  std::string doc, why;
  if (o.segments.empty() && !read_file(o.prompt_file, doc, &why)) {
    std::fprintf(stderr, "kdn-llama: --prompt-file %s\n", why.c_str());
    return 2;
  }
  kdn::llama::EngineOptions engine_options = o.engine;
  if (o.progress) {
    // One line, redrawn every batch (256 tokens); a long prefill is seconds to minutes on a CPU.
    engine_options.on_prefill_batch = [](uint64_t done, uint64_t total) {
      std::fprintf(stderr, "\r  prefilling: %llu / %llu tokens", static_cast<unsigned long long>(done),
                   static_cast<unsigned long long>(total));
      if (done == total) std::fputc('\n', stderr);
      std::fflush(stderr);
    };
  }
  auto engine = kdn::llama::Engine::open(engine_options);
  if (!engine.ok()) {
    std::fprintf(stderr, "kdn-llama: %s\n", engine.status().what());
    return 1;
  }
  if (!o.segments.empty()) return run_rag(o, *engine.value());
  kdn::llama::Engine& e = *engine.value();
  // The part of every prompt that no question changes: prefetched before each question.
  auto prefix = e.document_prefix(doc, o.context_tokens);
  if (!prefix.ok()) {
    std::fprintf(stderr, "kdn-llama: %s\n", prefix.status().what());
    return 1;
  }
  std::string cache_state;
  std::unique_ptr<kdn::llama::ChunkCache> store = open_store(o, e, cache_state);
  if (!o.serve) return answer(o, e, store.get(), cache_state, doc, prefix.value(), o.question);
  std::string question;
  uint64_t last_try = kdn::now_ns();
  while (std::getline(std::cin, question)) {
    if (question.empty()) continue;
    // kdnd was not there at the start: try again, at most once a second.
    if (!store && !o.no_cache && kdn::now_ns() - last_try > 1'000'000'000) {
      store = open_store(o, e, cache_state);
      last_try = kdn::now_ns();
    }
    if (int rc = answer(o, e, store.get(), cache_state, doc, prefix.value(), question); rc != 0) return rc;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("kdn-llama: llama.cpp engine with kdn KV reuse");
  CliOptions o;
  add_flags(app, o);
  CLI11_PARSE(app, argc, argv);
  return run(o);
}
