// kdn-gpu-engine: a stand-in for a GPU serving engine. It allocates a vLLM-style paged KV cache
// on one device (cudaMalloc + legacy IPC, or VMM with a POSIX fd), registers it with kdnd, and
// stores a token sequence's KV from it or retrieves it into other blocks and checks every byte.
//
//   kdn-gpu-engine --mode store    --alloc ipc --socket S --tokens 1024 --seed 7
//   kdn-gpu-engine --mode retrieve --alloc vmm --socket S --tokens 1024 --seed 7   (another process)
//
// Exit status: 0 done and every byte right; 1 a failure (an error, or any wrong byte); 2 a usage
// error or no CUDA device. --json prints one result line on stdout; progress goes to stderr.
#include "engine_run.h"

#include <kdn/common/model_presets.h>
#include <kdn/gpu_engine/engine_session.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

namespace {

using namespace kdn::gpu_engine;

struct Options {
  SessionOptions session;
  RunOptions run;
  std::string mode = "both";
  std::string alloc = "ipc";
  uint64_t kv_mib = 0;  // 0: twice the sequence plus a few blocks
  bool json = false;
};

int report(const Options& o, const RunResult& r, const EngineStatus& st) {
  if (o.json) {
    nlohmann::ordered_json j;
    j["mode"] = o.mode;
    j["alloc"] = o.alloc;
    j["model"] = o.session.model;
    j["device"] = o.session.device;
    j["tokens"] = o.run.tokens;
    j["seed"] = o.run.seed;
    j["chunks"] = r.chunks;
    j["stored"] = r.stored;
    j["loaded"] = r.loaded;
    j["rounds"] = r.rounds;
    j["mismatches"] = r.mismatches;
    if (!r.checks.empty()) j["checks"] = r.checks;
    j["ok"] = st.ok();
    if (!st.ok()) j["error"] = st.message();
    std::printf("%s\n", j.dump().c_str());
  }
  if (!st.ok()) std::fprintf(stderr, "kdn-gpu-engine: %s\n", st.message().c_str());
  return st.ok() ? 0 : 1;
}

EngineStatus run(const Options& o, RunResult* r) {
  std::unique_ptr<EngineSession> s;
  if (auto st = EngineSession::open(o.session, &s); !st.ok()) return st;
  std::fprintf(stderr, "kdn-gpu-engine: registered %s cache of %u blocks (%.1f MiB) on device %d\n", o.alloc.c_str(),
               s->shape().num_blocks, s->shape().kv_bytes() / 1048576.0, o.session.device);
  if (o.mode == "stale") return run_stale(*s, o.run, r);
  if (o.mode == "store" || o.mode == "both") {
    if (auto st = run_store(*s, o.run, r); !st.ok()) return st;
    std::fprintf(stderr, "kdn-gpu-engine: stored %u of %u chunks\n", r->stored, r->chunks);
  }
  if (o.mode == "retrieve" || o.mode == "both") {
    if (auto st = run_retrieve(*s, o.run, r); !st.ok()) return st;
    std::fprintf(stderr, "kdn-gpu-engine: %u rounds of %u chunks retrieved, every byte right\n", r->rounds, r->loaded);
  }
  return s->unregister();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kdn-gpu-engine: a paged KV cache on a GPU, registered with kdnd"};
  app.add_option("--mode", o.mode, "store | retrieve | both | stale")
      ->check(CLI::IsMember({"store", "retrieve", "both", "stale"}));
  app.add_option("--alloc", o.alloc, "ipc (cudaMalloc) | vmm (cuMemCreate, POSIX fd)")
      ->check(CLI::IsMember({"ipc", "vmm"}));
  app.add_option("--socket", o.session.socket_path, "kdnd's socket (default: libkdn's)");
  app.add_option("--namespace", o.session.name_space, "namespace (created if missing)");
  app.add_option("--model", o.session.model, "model preset")->check(CLI::IsMember({"llama3-8b", "smollm2-135m"}));
  app.add_option("--tokens", o.run.tokens, "tokens of the sequence (whole chunks)");
  app.add_option("--seed", o.run.seed, "the sequence and its KV pattern");
  app.add_option("--device", o.session.device, "CUDA device ordinal");
  app.add_option("--repeat", o.run.repeat, "retrieve + verify rounds")->check(CLI::Range(1u, 1u << 30));
  app.add_option("--kv-mib", o.kv_mib, "cache size in MiB (default: twice the sequence)");
  app.add_option("--timeout-ms", o.session.timeout_ms, "bound of every wait")->check(CLI::Range(100u, 600000u));
  app.add_flag("--json", o.json, "print one JSON result line");
  CLI11_PARSE(app, argc, argv);

  if (device_count() == 0) {
    std::fprintf(stderr, "kdn-gpu-engine: no CUDA device\n");
    return 2;
  }
  (void)parse_alloc_kind(o.alloc, &o.session.alloc);
  const kdn::ModelPreset* preset = kdn::find_model_preset(o.session.model);
  const kdn_model_desc desc = kdn::preset_desc(*preset, preset->name);
  const uint64_t per_block = shape_for(desc, 1, o.session.block_size).kv_bytes();
  const uint64_t seq_blocks = (o.run.tokens + o.session.block_size - 1) / o.session.block_size;
  o.session.kv_bytes = o.kv_mib ? o.kv_mib << 20 : (2 * seq_blocks + 8) * per_block;
  RunResult r;
  const EngineStatus st = run(o, &r);
  return report(o, r, st);
}
