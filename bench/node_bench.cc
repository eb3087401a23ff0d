// `kdn-bench node`: kdnd end to end against the same-run baselines.
//
// The run: common baselines (memcpy and streaming copy 1 and P threads, the integrity
// measurement, Unix-socket echo, spin ping-pong), then
// per model a redis baseline with that model's chunk size and a model run (model_run.h).
// The top-level kdn / ratios / bars describe the headline model (the first one run, in the
// order llama3-8b, smollm2-135m); every model's own figures are under models.<name>.
#include "baseline_figures.h"
#include "commands.h"
#include "flood_bench.h"
#include "kdnd_process.h"
#include "model_run.h"
#include "node_workload.h"
#include "report.h"
#include "staging_churn_bench.h"

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <thread>

namespace kdn::bench {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

struct NodeOptions {
  bool json = false;
  unsigned processes = 2;
  std::string model = "both";
  uint32_t docs = 0;      // 0: 2.5x what the arena holds
  uint32_t requests = 0;  // 0: enough to move 10x the arena
  double arena_gib = 0;   // 0: max(4 GiB, 2 documents per engine)
  double zipf_s = 1.1;
  uint64_t seed = 42;
  std::string kdnd;
  std::vector<std::string> kdnd_args;
  uint32_t idle_seconds = 10;
  uint32_t lookup_samples = 20000;
  uint32_t retrieve_passes = 3;
  size_t memcpy_mib = 512;
  size_t integrity_chunks = IntegrityOptions{}.chunks_per_thread;
  uint32_t flood_in_flight = FloodOptions{}.in_flight;
  uint32_t flood_keys = FloodOptions{}.keys;
  bool no_flood = false;
  bool no_staging_churn = false;
  uint64_t churn_written_mib = StagingChurnOptions{}.written_staging_bytes >> 20;
  bool no_redis = false;
  bool require_bars = false;
};

std::string join(const std::string& prefix, const char* name) { return prefix.empty() ? name : prefix + "." + name; }

ModelPlan plan_for(const ModelLayout& layout, const NodeOptions& o) {
  ModelPlan p;
  p.layout = layout;
  p.processes = o.processes;
  uint64_t doc = layout.doc_bytes();
  p.arena_bytes = o.arena_gib > 0 ? static_cast<uint64_t>(o.arena_gib * static_cast<double>(kGiB))
                                  : std::max<uint64_t>(4 * kGiB, 2ull * o.processes * doc);
  // The store/retrieve documents fill at most half the arena, so none is evicted before it
  // is retrieved.
  p.store_docs = static_cast<uint32_t>(std::clamp<uint64_t>(p.arena_bytes / (2 * o.processes * doc), 1, 8));
  double arena_docs = static_cast<double>(p.arena_bytes) / static_cast<double>(doc);
  p.corpus_docs = o.docs ? o.docs : static_cast<uint32_t>(std::max(2.0, std::ceil(2.5 * arena_docs)));
  uint32_t requests = o.requests ? o.requests : static_cast<uint32_t>(std::ceil(10 * arena_docs));
  p.requests = std::max(requests, o.processes);
  p.retrieve_passes = o.retrieve_passes;
  p.lookup_samples = o.lookup_samples;
  p.idle_seconds = o.idle_seconds;
  p.zipf_s = o.zipf_s;
  p.seed = o.seed;
  p.kdnd_binary = o.kdnd.empty() ? default_kdnd_path() : o.kdnd;
  p.kdnd_args = o.kdnd_args;
  return p;
}

// Refuses plans that would push a shared machine into swap or the OOM killer.
bool fits_in_memory(const ModelPlan& p) {
  double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  double need = static_cast<double>(p.arena_bytes + p.processes * p.layout.doc_bytes());
  if (need <= 0.8 * ram) return true;
  std::fprintf(stderr,
               "kdn-bench: %s needs %.1f GiB (arena + engine buffers), more than 80%% of "
               "this machine's %.1f GiB; lower --arena-gib or --processes\n",
               std::string(p.layout.name).c_str(), need / kGiB, ram / kGiB);
  return false;
}

std::vector<ModelLayout> selected_models(const std::string& name) {
  if (name == "both") return bench_models();
  return {*find_model(name)};
}

// Ratios and bars of one model's figures (under `kdn`) against the common baselines (under
// `base`) and the model's own baselines (redis, engine memcpy; under `model_base`). Retrieve
// and store are held to the machine's copy bandwidth (the faster of memcpy and a streaming
// copy, copy_gbps_pt); the ratios against memcpy alone are informational.
void add_verdicts(Report& out, const std::string& prefix, const Report& figures, const std::string& kdn,
                  const std::string& base, const std::string& model_base) {
  auto get = [&](const std::string& k) { return figures.number(k); };
  auto retrieve = get(kdn + ".retrieve_gbps"), store = get(kdn + ".store_gbps");
  auto lookup = get(kdn + ".lookup_rtt_p50_us"), idle = get(kdn + ".idle_cpu_percent");
  auto flood_p99 = get("kdn.flood.lookup_under_flood_p99_us");
  auto copy_pt = get(base + ".copy_gbps_pt"), memcpy_pt = get(base + ".memcpy_gbps_pt");
  auto uds = get(base + ".uds_echo_rtt_p50_us");
  auto spin = get(base + ".spin_pingpong_rtt_p50_us");
  auto redis_get = get(model_base + ".redis_get_gbps");
  auto redis_set = get(model_base + ".redis_set_gbps");
  auto engine_memcpy = get(model_base + ".engine_memcpy_gbps");
  out.set(join(prefix, "ratios.retrieve_vs_copy"), ratio(retrieve, copy_pt));
  out.set(join(prefix, "ratios.store_vs_copy"), ratio(store, copy_pt));
  out.set(join(prefix, "ratios.retrieve_vs_memcpy"), ratio(retrieve, memcpy_pt));
  out.set(join(prefix, "ratios.store_vs_memcpy"), ratio(store, memcpy_pt));
  out.set(join(prefix, "ratios.retrieve_vs_engine_memcpy"), ratio(retrieve, engine_memcpy));
  out.set(join(prefix, "ratios.store_vs_engine_memcpy"), ratio(store, engine_memcpy));
  out.set(join(prefix, "ratios.lookup_vs_uds"), ratio(lookup, uds));
  out.set(join(prefix, "ratios.lookup_vs_spin"), ratio(lookup, spin));
  out.set(join(prefix, "ratios.retrieve_vs_redis"), ratio(retrieve, redis_get));
  out.set(join(prefix, "ratios.store_vs_redis"), ratio(store, redis_set));
  // A retrieve is one copy out of the arena; under staging a store is two (client into its
  // staging memory, kdnd into the arena), so its bar is half the retrieve's.
  out.set_bar(join(prefix, "bars.retrieve_vs_copy"), ratio(retrieve, copy_pt), BarOp::kAtLeast, 0.8);
  out.set_bar(join(prefix, "bars.store_vs_copy"), ratio(store, copy_pt), BarOp::kAtLeast, 0.4);
  out.set_bar(join(prefix, "bars.lookup_rtt_p50_us"), lookup, BarOp::kAtMost, 1.0);
  out.set_bar(join(prefix, "bars.lookup_vs_uds"), ratio(lookup, uds), BarOp::kAtMost, 0.25);
  out.set_bar(join(prefix, "bars.retrieve_vs_redis"), ratio(retrieve, redis_get), BarOp::kAtLeast, 4.0);
  out.set_bar(join(prefix, "bars.idle_cpu_percent"), idle, BarOp::kBelow, 1.0);
  // One session's lookups while another keeps 64 LEASEs of 65,536 keys in flight (the flood
  // phase runs once per run, against its own kdnd): requests are served in slices.
  if (prefix.empty()) out.set_bar("bars.lookup_under_flood_p99_us", flood_p99, BarOp::kAtMost, 1000.0);
  // Another session's PING while sessions with 4 GiB of staging open and close (the staging
  // churn phase, once per run, against its own kdnd): set-up and tear-down cost the loop O(1).
  if (prefix.empty()) {
    auto churn_p99 = get("kdn.staging_churn.ping_under_staging_churn_p99_us");
    auto churn_max = get("kdn.staging_churn.ping_under_staging_churn_max_us");
    auto churn_idle = get("kdn.staging_churn.ping_idle_p99_us");
    out.set("ratios.ping_p99_under_staging_churn_vs_idle", ratio(churn_p99, churn_idle));
    out.set_bar("bars.ping_under_staging_churn_p99_us", churn_p99, BarOp::kAtMost, 1000.0);
    out.set_bar("bars.ping_under_staging_churn_max_us", churn_max, BarOp::kAtMost, 50000.0);
  }
}

void copy_subtree(Report& to, const std::string& to_key, const Report& from, const std::string& from_key) {
  if (const Report::Json* node = from.find(from_key)) to.set_json(to_key, *node);
}

// Runs one model: its redis baseline, then kdnd with engines. Figures go to `runs`.
bool run_one_model(const ModelPlan& plan, const NodeOptions& o, Report& runs) {
  std::string prefix = "models." + std::string(plan.layout.name);
  runs.set(prefix + ".config.chunk_bytes", plan.layout.chunk_bytes());
  runs.set(prefix + ".config.doc_bytes", plan.layout.doc_bytes());
  runs.set(prefix + ".config.arena_bytes", plan.arena_bytes);
  runs.set(prefix + ".config.corpus_docs", plan.corpus_docs);
  runs.set(prefix + ".config.requests", plan.requests);
  runs.set(prefix + ".config.store_docs_per_engine", plan.store_docs);
  runs.set(prefix + ".config.retrieve_passes", plan.retrieve_passes);
  if (2ull * plan.processes * plan.store_docs * plan.layout.doc_bytes() > plan.arena_bytes) {
    progress(
        "%s: warning: the arena is too small for the store/retrieve documents; expect "
        "retrieve misses and refused reservations",
        std::string(plan.layout.name).c_str());
  }
  bool ok = true;
  if (o.no_redis) {
    runs.set_null(prefix + ".baselines.redis_get_gbps");
    runs.set_null(prefix + ".baselines.redis_set_gbps");
  } else {
    ok &= add_redis_baseline(runs, prefix + ".baselines", plan.layout.chunk_bytes());
  }
  ok &= run_model(plan, runs);
  return ok;
}

void set_config(Report& r, const NodeOptions& o) {
  r.set("config.processes", o.processes);
  r.set("config.model", o.model);
  r.set("config.zipf_s", o.zipf_s);
  r.set("config.seed", o.seed);
  r.set("config.doc_tokens", kDocTokens);
  r.set("config.chunk_tokens", kBenchChunkTokens);
  r.set("config.online_cpus", std::thread::hardware_concurrency());
  std::string kdnd_args;
  for (const std::string& a : o.kdnd_args) kdnd_args += (kdnd_args.empty() ? "" : " ") + a;
  r.set("config.kdnd_args", kdnd_args);
  r.set("machine.loadavg_1m_start", load_average());
}

void add_cli_options(CLI::App& app, NodeOptions& o) {
  app.add_flag("--json", o.json, "print JSON instead of a table");
  app.add_option("--processes", o.processes, "engine processes (P)")->check(CLI::Range(1u, 64u));
  app.add_option("--model", o.model, "model layout")->check(CLI::IsMember({"llama3-8b", "smollm2-135m", "both"}));
  app.add_option("--docs", o.docs, "Zipf corpus size in 8K-token documents (default 2.5x the arena)")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--requests", o.requests, "Zipf requests over all engines (default: 10x the arena)")
      ->check(CLI::Range(1u, 1u << 24));
  app.add_option("--arena-gib", o.arena_gib, "kdnd host arena (default max(4, 2 docs per engine))")
      ->check(CLI::Range(0.01, 4096.0));
  app.add_option("--zipf-s", o.zipf_s, "Zipf exponent of document popularity")->check(CLI::Range(0.0, 10.0));
  app.add_option("--seed", o.seed, "corpus and request seed");
  app.add_option("--kdnd", o.kdnd, "kdnd binary (default: next to kdn-bench)");
  app.add_option("--kdnd-arg", o.kdnd_args, "extra kdnd flag, repeatable (--kdnd-arg=--spin-us=200)");
  app.add_option("--idle-seconds", o.idle_seconds, "idle CPU window")->check(CLI::Range(1u, 3600u));
  app.add_option("--lookup-samples", o.lookup_samples, "timed lookups")->check(CLI::Range(1u, 1u << 26));
  app.add_option("--retrieve-passes", o.retrieve_passes, "passes of the retrieve phase")->check(CLI::Range(1u, 1000u));
  app.add_option("--memcpy-mib", o.memcpy_mib, "memcpy baseline MiB per thread")
      ->check(CLI::Range(size_t{1}, size_t{1} << 16));
  app.add_option("--integrity-chunks", o.integrity_chunks, "SmolLM2-135M chunks per thread of the integrity baseline")
      ->check(CLI::Range(size_t{1}, size_t{1} << 16));
  app.add_flag("--no-redis", o.no_redis, "skip the redis baseline");
  app.add_option("--flood-in-flight", o.flood_in_flight, "flood phase: LEASEs the flooder keeps in flight")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  app.add_option("--flood-keys", o.flood_keys, "flood phase: keys per LEASE (all cached)")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_flag("--no-flood", o.no_flood, "skip the flood phase");
  app.add_flag("--no-staging-churn", o.no_staging_churn, "skip the staging churn phase");
  app.add_option("--staging-churn-written-mib", o.churn_written_mib,
                 "staging churn phase: MiB each written session writes before closing")
      ->check(CLI::Range(uint64_t{1}, uint64_t{4096}))
      ->capture_default_str();
  app.add_flag("--require-bars", o.require_bars, "exit 3 unless every headline bar passes");
}

// The final report: config, baselines, the headline model's kdn/ratios/bars, every model.
Report assemble(const Report& common, const Report& runs, const std::string& headline) {
  Report out;
  copy_subtree(out, "config", common, "config");
  copy_subtree(out, "machine", common, "machine");
  out.set("headline_model", headline);
  copy_subtree(out, "baselines", common, "baselines");
  std::string model = "models." + headline;
  copy_subtree(out, "baselines.redis_get_gbps", runs, model + ".baselines.redis_get_gbps");
  copy_subtree(out, "baselines.redis_set_gbps", runs, model + ".baselines.redis_set_gbps");
  copy_subtree(out, "baselines.redis_value_bytes", runs, model + ".baselines.redis_value_bytes");
  copy_subtree(out, "baselines.engine_memcpy_gbps", runs, model + ".baselines.engine_memcpy_gbps");
  copy_subtree(out, "kdn", runs, model + ".kdn");
  copy_subtree(out, "kdn.flood", common, "kdn.flood");
  copy_subtree(out, "kdn.staging_churn", common, "kdn.staging_churn");
  add_verdicts(out, "", out, "kdn", "baselines", "baselines");
  copy_subtree(out, "models", runs, "models");
  return out;
}

}  // namespace

int run_node_bench(int argc, char** argv) {
  CLI::App app{
      "kdn-bench node: kdnd end to end with P engine processes, against copy, "
      "Unix-socket, spin ping-pong and redis baselines measured in the same run"};
  NodeOptions o;
  add_cli_options(app, o);
  CLI11_PARSE(app, argc, argv);

  std::vector<ModelPlan> plans;
  for (const ModelLayout& layout : selected_models(o.model)) plans.push_back(plan_for(layout, o));
  for (const ModelPlan& p : plans) {
    if (!fits_in_memory(p)) return 2;
  }
  if (access(plans.front().kdnd_binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "kdn-bench: no kdnd at %s (build target kdnd, or pass --kdnd PATH)\n",
                 plans.front().kdnd_binary.c_str());
    return 2;
  }
  Report common, runs;
  set_config(common, o);
  CommonBaselineOptions baseline_options;
  baseline_options.threads = o.processes;
  baseline_options.memcpy_bytes_per_thread = o.memcpy_mib << 20;
  baseline_options.integrity_chunk_bytes = find_model("smollm2-135m")->chunk_bytes();
  baseline_options.integrity_chunks_per_thread = o.integrity_chunks;
  bool ok = add_common_baselines(common, "baselines", baseline_options);
  for (const ModelPlan& p : plans) {
    ok &= run_one_model(p, o, runs);
  }
  if (o.no_flood) {
    common.set_null("kdn.flood.lookup_under_flood_p99_us");
  } else {
    Result<TempDir> dir = TempDir::create("kdn-bench-flood");
    FloodOptions fo;
    fo.kdnd_binary = plans.front().kdnd_binary;
    fo.in_flight = o.flood_in_flight;
    fo.keys = o.flood_keys;
    fo.lookup_samples = o.lookup_samples;
    if (dir.ok()) fo.dir = dir->path();
    ok &= dir.ok() && add_flood_figures(common, "kdn.flood", fo);
  }
  if (o.no_staging_churn) {
    common.set_null("kdn.staging_churn.ping_under_staging_churn_p99_us");
  } else {
    Result<TempDir> dir = TempDir::create("kdn-bench-churn");
    StagingChurnOptions co;
    co.kdnd_binary = plans.front().kdnd_binary;
    co.written_staging_bytes = o.churn_written_mib << 20;
    co.ping_samples = o.lookup_samples;
    if (dir.ok()) co.dir = dir->path();
    ok &= dir.ok() && add_staging_churn_figures(common, "kdn.staging_churn", co);
  }
  // Per-model ratios need the common baselines and the model's figures side by side, as
  // they are in the assembled report.
  Report out = assemble(common, runs, std::string(plans.front().layout.name));
  for (const ModelPlan& p : plans) {
    std::string prefix = "models." + std::string(p.layout.name);
    add_verdicts(out, prefix, out, prefix + ".kdn", "baselines", prefix + ".baselines");
  }
  out.set("machine.loadavg_1m_end", load_average());
  std::cout << (o.json ? out.to_json() + "\n" : out.to_table()) << std::flush;
  if (!ok) return 1;
  if (o.require_bars && !out.all_bars_pass("bars")) return 3;
  return 0;
}

}  // namespace kdn::bench
