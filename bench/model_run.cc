#include "model_run.h"

#include "baseline_figures.h"
#include "engine_fleet.h"
#include "kdnd_process.h"
#include "stats.h"

#include <kdn/common/clock.h>

#include <algorithm>
#include <optional>
#include <thread>

namespace kdn::bench {
namespace {

constexpr auto kCopyPhaseTimeout = std::chrono::seconds(600);
constexpr auto kLookupPhaseTimeout = std::chrono::seconds(300);

// First engine's start to last engine's end.
uint64_t wall_ns(const std::vector<EngineReport>& reports) {
  uint64_t first = UINT64_MAX, last = 0;
  for (const EngineReport& r : reports) {
    first = std::min(first, r.start_ns);
    last = std::max(last, r.end_ns);
  }
  return last > first ? last - first : 0;
}

EngineReport sum(const std::vector<EngineReport>& reports) {
  EngineReport t;
  for (const EngineReport& r : reports) {
    t.requests += r.requests;
    t.requested_chunks += r.requested_chunks;
    t.lookup_hit_chunks += r.lookup_hit_chunks;
    t.retrieve_bytes += r.retrieve_bytes;
    t.retrieve_ns += r.retrieve_ns;
    t.retrieved_chunks += r.retrieved_chunks;
    t.store_bytes += r.store_bytes;
    t.store_ns += r.store_ns;
    t.stored_chunks += r.stored_chunks;
    t.store_skipped_chunks += r.store_skipped_chunks;
    t.store_no_space += r.store_no_space;
    t.corrupt_chunks += r.corrupt_chunks;
    t.minor_faults += r.minor_faults;
  }
  return t;
}

// "; kdnd log: <tail>" when the daemon wrote anything, for error messages.
std::string log_note(const std::string& log_path) {
  std::string tail = file_tail(log_path, 1500);
  return tail.empty() ? std::string() : "; kdnd log: " + tail;
}

std::optional<double> fraction(uint64_t part, uint64_t whole) {
  if (whole == 0) return std::nullopt;
  return static_cast<double>(part) / static_cast<double>(whole);
}

class ModelRun {
 public:
  ModelRun(const ModelPlan& plan, Report& report)
      : plan_(plan), report_(report), prefix_("models." + std::string(plan.layout.name)) {}

  bool run();

 private:
  std::string key(const std::string& name) const { return prefix_ + "." + name; }
  bool fail(const char* phase, const std::string& why);
  bool run_phase(const char* phase, const std::vector<std::optional<EngineCommand>>& commands,
                 std::chrono::seconds timeout, std::vector<EngineReport>& out);
  uint32_t store_doc_of(unsigned engine) const { return plan_.corpus_docs + engine * plan_.store_docs; }

  bool start();
  bool store_phase();
  bool memcpy_phase();
  bool retrieve_phase();
  bool lookup_phase();
  bool zipf_phase();
  bool idle_phase();
  void record_daemon_stats();
  bool stop();

  const ModelPlan& plan_;
  Report& report_;
  std::string prefix_;
  std::optional<TempDir> dir_;
  std::optional<KdndProcess> kdnd_;
  std::optional<EngineFleet> fleet_;
  uint64_t corrupt_chunks_ = 0;
};

bool ModelRun::fail(const char* phase, const std::string& why) {
  progress("%s: %s failed: %s", std::string(plan_.layout.name).c_str(), phase, why.c_str());
  report_.set(key(std::string("errors.") + phase), why);
  return false;
}

bool ModelRun::run_phase(const char* phase, const std::vector<std::optional<EngineCommand>>& commands,
                         std::chrono::seconds timeout, std::vector<EngineReport>& out) {
  progress("%s: %s phase", std::string(plan_.layout.name).c_str(), phase);
  Result<std::vector<EngineReport>> reports = fleet_->run(commands, timeout);
  if (!reports.ok()) return fail(phase, describe(reports.status()));
  out = std::move(reports).value();
  for (const EngineReport& r : out) {
    corrupt_chunks_ += r.corrupt_chunks;
    if (r.status != KDN_OK) return fail(phase, r.error);
  }
  return true;
}

bool ModelRun::start() {
  Result<TempDir> dir = TempDir::create("kdn-bench-node");
  if (!dir.ok()) return fail("start", describe(dir.status()));
  dir_.emplace(std::move(dir).value());
  KdndOptions options;
  options.binary = plan_.kdnd_binary;
  options.socket_path = dir_->path() + "/kdnd.sock";
  options.host_arena_bytes = plan_.arena_bytes;
  options.log_path = dir_->path() + "/kdnd.log";
  options.extra_args = plan_.kdnd_args;
  progress("%s: starting %s (host arena %.1f GiB)", std::string(plan_.layout.name).c_str(), options.binary.c_str(),
           static_cast<double>(plan_.arena_bytes) / (1ull << 30));
  Result<KdndProcess> kdnd = KdndProcess::start(options);
  if (!kdnd.ok()) return fail("start", describe(kdnd.status()) + log_note(options.log_path));
  kdnd_.emplace(std::move(kdnd).value());
  EngineSetup setup{options.socket_path, plan_.layout, plan_.seed};
  progress("%s: starting %u engine processes", std::string(plan_.layout.name).c_str(), plan_.processes);
  Result<EngineFleet> fleet = EngineFleet::start(setup, plan_.processes);
  if (!fleet.ok()) return fail("start", describe(fleet.status()) + log_note(options.log_path));
  fleet_.emplace(std::move(fleet).value());
  return true;
}

bool ModelRun::store_phase() {
  std::vector<std::optional<EngineCommand>> commands;
  for (unsigned e = 0; e < plan_.processes; ++e) {
    EngineCommand cmd;
    cmd.task = EngineTask::kStore;
    cmd.first_doc = store_doc_of(e);
    cmd.n_docs = plan_.store_docs;
    commands.push_back(cmd);
  }
  std::vector<EngineReport> reports;
  if (!run_phase("store", commands, kCopyPhaseTimeout, reports)) return false;
  EngineReport t = sum(reports);
  report_.set(key("kdn.store_gbps"), gb_per_s(t.store_bytes, wall_ns(reports)));
  report_.set(key("kdn.store_phase_bytes"), t.store_bytes);
  report_.set(key("kdn.store_phase_no_space"), t.store_no_space);
  report_.set(key("kdn.store_phase_minor_faults"), t.minor_faults);
  return true;
}

// The retrieve phase's copies without kdn, in the same processes, right before it: the
// memcpy limit under the machine's load of this very moment.
bool ModelRun::memcpy_phase() {
  EngineCommand cmd;
  cmd.task = EngineTask::kMemcpy;
  cmd.n_docs = plan_.store_docs;
  cmd.passes = plan_.retrieve_passes;
  std::vector<std::optional<EngineCommand>> commands(plan_.processes, cmd);
  std::vector<EngineReport> reports;
  if (!run_phase("engine memcpy", commands, kCopyPhaseTimeout, reports)) return false;
  uint64_t bytes = 0;
  for (const EngineReport& r : reports) bytes += r.memcpy_bytes;
  report_.set(key("baselines.engine_memcpy_gbps"), gb_per_s(bytes, wall_ns(reports)));
  return true;
}

bool ModelRun::retrieve_phase() {
  std::vector<std::optional<EngineCommand>> commands;
  for (unsigned e = 0; e < plan_.processes; ++e) {
    EngineCommand cmd;
    cmd.task = EngineTask::kRetrieve;
    cmd.first_doc = store_doc_of((e + 1) % plan_.processes);
    cmd.n_docs = plan_.store_docs;
    cmd.passes = plan_.retrieve_passes;
    commands.push_back(cmd);
  }
  std::vector<EngineReport> reports;
  if (!run_phase("retrieve", commands, kCopyPhaseTimeout, reports)) return false;
  EngineReport t = sum(reports);
  report_.set(key("kdn.retrieve_gbps"), gb_per_s(t.retrieve_bytes, wall_ns(reports)));
  report_.set(key("kdn.retrieve_phase_bytes"), t.retrieve_bytes);
  report_.set(key("kdn.retrieve_phase_minor_faults"), t.minor_faults);
  // Everything retrieved here was stored moments before into an arena twice its size: a
  // miss means kdnd dropped a committed chunk it had room for.
  report_.set(key("kdn.retrieve_phase_hit_ratio"), fraction(t.retrieved_chunks, t.requested_chunks));
  return true;
}

bool ModelRun::lookup_phase() {
  std::vector<std::optional<EngineCommand>> commands(plan_.processes);
  EngineCommand cmd;
  cmd.task = EngineTask::kLookupLoop;
  cmd.first_doc = store_doc_of(0);
  cmd.samples = plan_.lookup_samples;
  commands[0] = cmd;
  std::vector<EngineReport> reports;
  if (!run_phase("lookup", commands, kLookupPhaseTimeout, reports)) return false;
  const EngineReport& r = reports.at(0);
  report_.set(key("kdn.lookup_rtt_p50_us"), r.lookup_p50_us);
  report_.set(key("kdn.lookup_rtt_p99_us"), r.lookup_p99_us);
  report_.set(key("kdn.lookup_rtt_mean_us"), r.lookup_mean_us);
  report_.set(key("kdn.prefix_keys_p50_us"), r.prefix_keys_p50_us);
  report_.set(key("kdn.lookup_tokens_rtt_p50_us"), r.lookup_tokens_p50_us);
  report_.set(key("kdn.ping_rtt_p50_us"), r.ping_p50_us);
  report_.set(key("kdn.ping_rtt_p99_us"), r.ping_p99_us);
  report_.set(key("kdn.lookup_samples"), plan_.lookup_samples);
  report_.set(key("kdn.lookup_not_fully_cached"), r.lookup_not_cached);
  return true;
}

bool ModelRun::zipf_phase() {
  std::vector<std::optional<EngineCommand>> commands;
  for (unsigned e = 0; e < plan_.processes; ++e) {
    EngineCommand cmd;
    cmd.task = EngineTask::kZipf;
    cmd.requests = plan_.requests / plan_.processes + (e < plan_.requests % plan_.processes);
    cmd.corpus_docs = plan_.corpus_docs;
    cmd.zipf_s = plan_.zipf_s;
    cmd.stream_seed = plan_.seed * 0x9E3779B97F4A7C15ull + e + 1;
    commands.push_back(cmd);
  }
  std::vector<EngineReport> reports;
  if (!run_phase("zipf", commands, kCopyPhaseTimeout, reports)) return false;
  EngineReport t = sum(reports);
  report_.set(key("kdn.hit_ratio"), fraction(t.lookup_hit_chunks, t.requested_chunks));
  report_.set(key("kdn.zipf.requests"), t.requests);
  report_.set(key("kdn.zipf.retrieved_fraction"), fraction(t.retrieved_chunks, t.requested_chunks));
  // Mean rate of one engine while it retrieves / stores, under the mixed load.
  report_.set(key("kdn.zipf.retrieve_gbps_per_engine"), gb_per_s(t.retrieve_bytes, t.retrieve_ns));
  report_.set(key("kdn.zipf.store_gbps_per_engine"), gb_per_s(t.store_bytes, t.store_ns));
  report_.set(key("kdn.zipf.bytes_moved"), t.retrieve_bytes + t.store_bytes);
  report_.set(key("kdn.zipf.wall_s"), static_cast<double>(wall_ns(reports)) / 1e9);
  report_.set(key("kdn.zipf.store_skipped_chunks"), t.store_skipped_chunks);
  report_.set(key("kdn.zipf.store_no_space"), t.store_no_space);
  report_.set(key("kdn.zipf.minor_faults"), t.minor_faults);
  return true;
}

bool ModelRun::idle_phase() {
  progress("%s: idle phase (%u s, engines connected)", std::string(plan_.layout.name).c_str(), plan_.idle_seconds);
  Result<double> before = process_cpu_seconds(kdnd_->pid());
  uint64_t t0 = now_ns();
  std::this_thread::sleep_for(std::chrono::seconds(plan_.idle_seconds));
  Result<double> after = process_cpu_seconds(kdnd_->pid());
  uint64_t t1 = now_ns();
  if (!before.ok() || !after.ok()) {
    report_.set_null(key("kdn.idle_cpu_percent"));
    return fail("idle", "cannot read kdnd CPU time from /proc");
  }
  double wall_s = static_cast<double>(t1 - t0) / 1e9;
  report_.set(key("kdn.idle_cpu_percent"), (*after - *before) / wall_s * 100.0);
  report_.set(key("kdn.idle_seconds"), wall_s);
  return true;
}

void ModelRun::record_daemon_stats() {
  std::vector<std::optional<EngineCommand>> commands(plan_.processes);
  commands[0] = EngineCommand{};  // kStats
  std::vector<EngineReport> reports;
  if (!run_phase("stats", commands, kLookupPhaseTimeout, reports)) return;
  const kdn_stats& s = reports.at(0).stats;
  report_.set(key("kdnd.stored_chunks"), s.stored_chunks);
  report_.set(key("kdnd.retrieved_chunks"), s.retrieved_chunks);
  report_.set(key("kdnd.evicted_chunks"), s.evicted_chunks);
  report_.set(key("kdnd.resident_bytes"), s.resident_bytes);
  report_.set(key("kdnd.capacity_bytes"), s.capacity_bytes);
  report_.set(key("kdnd.active_leases"), s.active_leases);
  report_.set(key("kdnd.open_reservations"), s.open_reservations);
  report_.set(key("kdnd.sessions"), s.sessions);
  report_.set(key("kdnd.protocol_errors"), s.protocol_errors);
}

bool ModelRun::stop() {
  bool ok = true;
  if (fleet_) {
    Status quit = fleet_->quit();
    if (!quit.ok()) ok = fail("engine exit", describe(quit));
    fleet_.reset();
  }
  if (kdnd_) {
    Result<int> exited = kdnd_->stop();
    std::string how = exited.ok() ? describe_wait_status(*exited) : describe(exited.status());
    report_.set(key("kdnd.exit_after_sigterm"), how);
    if (how != "exit 0") ok = fail("kdnd exit", how + log_note(dir_->path() + "/kdnd.log"));
    kdnd_.reset();
  }
  return ok;
}

bool ModelRun::run() {
  bool ok =
      start() && store_phase() && memcpy_phase() && retrieve_phase() && lookup_phase() && zipf_phase() && idle_phase();
  if (fleet_) record_daemon_stats();
  ok &= stop();
  report_.set(key("kdn.corrupt_chunks"), corrupt_chunks_);
  if (corrupt_chunks_ > 0) ok = fail("verify", "retrieved chunks did not hold what was stored");
  return ok;
}

}  // namespace

bool run_model(const ModelPlan& plan, Report& report) {
  ModelRun run(plan, report);
  return run.run();
}

}  // namespace kdn::bench
