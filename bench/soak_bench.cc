// `kdn-bench soak`: kdnd under P engines at full rate while the bench kills engines and kdnd.
//
// The bench starts its own kdnd with a small host arena and a disk tier (write-through, so a
// SIGKILLed kdnd finds every committed chunk again when it restarts on the same directory),
// forks P engines (soak_engine.h) that store, look up, lease, release and prefetch documents
// of a fixed corpus with every byte checked against a stamp derived from the chunk's key, and
// meanwhile itself
//   - evicts chunks as an operator would (a document's keys; the whole arena to disk; all),
//   - SIGKILLs a random engine and forks its replacement (mean interval --engine-kill-every),
//   - SIGKILLs kdnd and restarts it on the same socket and disk directory (mean interval
//     --kdnd-kill-every, only in the first --kdnd-kills-until of the run, so the last
//     lifetime of kdnd is long enough to measure drift in); libkdn reconnects by itself,
//   - samples kdnd's RssAnon and open fds every --sample-ms.
// The first engine kill and the first kdnd kill come at a random time in the first half of
// the run, so every run has at least one of each.
//
// Drift is measured within kdnd's last lifetime, between two quiesced samples: an early one
// after its warm-up and one at the end. The warm-up lasts --warmup seconds and ends, halfway,
// with the largest burst the run can ask of kdnd (the whole corpus stored, then every eviction
// mode), so growth that is a high-water mark being reached is not read as drift. Quiesced:
// every engine has released its leases and sits connected, and kdnd has as many sessions as
// there are clients, so two samples see the same sessions and the fd counts are comparable.
#include "admin_client.h"
#include "commands.h"
#include "kdnd_process.h"
#include "process.h"
#include "report.h"
#include "soak_engine.h"

#include <kdn/common/clock.h>
#include <kdn/common/model_presets.h>
#include <kdn/kdn.h>

#include <signal.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kdn::bench {
namespace {

using soak::EngineSlot;
using soak::Op;
using soak::SoakBoard;

struct SoakOptions {
  double seconds = 60;
  uint32_t processes = 3;
  bool json = false;
  uint64_t seed = 1;
  std::string disk_dir;
  std::string kdnd;
  uint32_t docs = 128;
  uint32_t doc_chunks = 8;
  uint32_t held_leases = 4;
  uint64_t arena_mib = 32;
  uint64_t disk_mib = 256;
  double engine_kill_every_s = 8;
  double kdnd_kill_every_s = 12;
  double kdnd_kills_until = 0.5;
  double evict_every_ms = 300;
  double warmup_s = 10;
  uint32_t sample_ms = 1000;
  bool require_bars = false;
};

constexpr uint32_t kBenchSlot = SoakBoard::kMaxSlots - 1;  // the bench's evictions and warm-up stores

// The soak's model: 64 KiB chunks (2 layers, 2 KV heads of 64, 64 tokens, f16), so the disk
// tier, evictions and kills get many chunks through them in a minute on a small machine.
kdn_model_desc soak_model() { return shaped_desc(2, 2, 64, 64, "kdn-bench/soak-64k"); }

// ---- kdnd's memory and files -------------------------------------------------------------------------

struct KdndSample {
  double t_s = 0;
  uint32_t lifetime = 0;
  std::optional<uint64_t> rss_anon_kib;
  std::optional<uint64_t> fds;
  std::optional<uint64_t> threads;
  std::optional<uint64_t> sessions;  // quiesced samples only
  bool settled = false;              // quiesced samples: sessions and fds were steady
};

// A numeric field of /proc/<pid>/status ("RssAnon:" in KiB, "Threads:").
std::optional<uint64_t> status_field(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field, 0) == 0) return std::strtoull(line.c_str() + field.size(), nullptr, 10);
  return std::nullopt;
}

std::optional<uint64_t> open_fds(pid_t pid) {
  std::error_code ec;
  uint64_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end; !ec && it != end;
       it.increment(ec))
    ++n;
  if (ec) return std::nullopt;
  return n;
}

struct Lifetime {
  pid_t pid = 0;
  double start_s = 0, end_s = 0;
  double ready_s = 0;  // from spawn to answering with its arena pre-faulted
  std::string ended = "running";
};

// ---- the bench -------------------------------------------------------------------------------------

class Soak {
 public:
  Soak(const SoakOptions& o, SoakBoard* board) : o_(o), board_(board), rng_(o.seed * 0x2545F4914F6CDD1Dull + 7) {}
  ~Soak() { shutdown(); }

  bool setup(const std::string& socket_dir, const std::string& disk_dir);
  void run();
  void shutdown();
  // with_series: kdnd's samples as well (JSON; a table would print them on one line).
  Report report(bool with_series) const;
  void report_kdnd(Report& r, bool with_series) const;

 private:
  double now_s() const { return double(now_ns() - t0_ns_) / 1e9; }
  double exp_interval(double mean) { return std::exponential_distribution<double>(1.0 / mean)(rng_); }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }

  bool start_kdnd();
  void kill_kdnd();
  bool start_engine(uint32_t slot);
  void kill_engine();
  void reap_unexpected_exits();
  ipc::EvictMode random_evict_mode();
  void evict(ipc::EvictMode mode);
  void final_warm_up();
  void fill_corpus();
  KdndSample sample();
  KdndSample quiesced_sample();
  bool wait_parked(uint32_t gen);
  std::optional<uint64_t> sessions();
  void progress();

  const SoakOptions& o_;
  SoakBoard* board_;
  std::mt19937_64 rng_;
  soak::SoakWorkload w_;
  KdndOptions kdnd_options_;
  std::optional<KdndProcess> kdnd_;
  std::unique_ptr<AdminClient> admin_;
  kdn_client* stats_ = nullptr;  // an admin libkdn client: daemon-wide session count
  std::vector<ChildProcess> engines_;
  std::vector<std::vector<kdn_key>> doc_keys_;
  uint64_t t0_ns_ = 0;
  double duration_s_ = 0;
  uint64_t engine_kills_ = 0, kdnd_kills_ = 0, engine_exits_ = 0, kdnd_exits_ = 0, kdnd_restart_failures_ = 0;
  uint64_t evict_all_ = 0, evict_host_ = 0, evict_keys_ = 0, evicted_chunks_ = 0;
  std::vector<Lifetime> lifetimes_;
  std::vector<KdndSample> samples_;
  std::optional<KdndSample> early_, end_;
  std::optional<kdn_stats> end_stats_;  // kdnd's counters at the end (its last lifetime's)
  std::string exit_after_sigterm_;
  uint32_t pause_gen_ = 0;
  std::optional<double> loadavg_start_, loadavg_end_;  // other work on the machine
  std::optional<double> warmed_up_s_;                  // when the last lifetime's warm-up burst ended
  bool shut_ = false;
};

bool Soak::setup(const std::string& socket_dir, const std::string& disk_dir) {
  loadavg_start_ = load_average();
  w_.socket_path = socket_dir + "/kdnd.sock";
  w_.desc = soak_model();
  w_.seed = o_.seed;
  w_.docs = o_.docs;
  w_.doc_chunks = o_.doc_chunks;
  w_.held_leases = o_.held_leases;
  for (uint32_t d = 0; d < o_.docs; ++d) {
    auto tokens = soak::soak_document(w_, d);
    std::vector<kdn_key> keys(o_.doc_chunks);
    size_t n = 0;
    if (kdn_prefix_keys(&w_.desc, tokens.data(), tokens.size(), keys.data(), keys.size(), &n) != KDN_OK) return false;
    doc_keys_.push_back(std::move(keys));
  }
  kdnd_options_.binary = o_.kdnd.empty() ? default_kdnd_path() : o_.kdnd;
  kdnd_options_.socket_path = w_.socket_path;
  kdnd_options_.host_arena_bytes = o_.arena_mib << 20;
  kdnd_options_.log_path = socket_dir + "/kdnd.log";
  kdnd_options_.extra_args = {"--log-level", "info",
                              "--set",       "tier.disk.dirs=" + disk_dir,
                              "--set",       "tier.disk.bytes=" + std::to_string(o_.disk_mib) + "M",
                              "--set",       "tier.host.slab_bytes=4M",
                              "--set",       "tier.disk.slab_bytes=16M",
                              "--set",       "tier.disk.policy=write_through"};
  t0_ns_ = now_ns();
  if (!start_kdnd()) return false;
  for (uint32_t i = 0; i < o_.processes; ++i) {
    engines_.emplace_back();
    if (!start_engine(i)) return false;
  }
  return true;
}

bool Soak::start_kdnd() {
  Lifetime life;
  life.start_s = now_s();
  auto k = KdndProcess::start(kdnd_options_);
  if (!k.ok()) {
    std::fprintf(stderr, "kdn-bench soak: kdnd: %s\n%s", describe(k.status()).c_str(),
                 file_tail(kdnd_options_.log_path).c_str());
    return false;
  }
  kdnd_.emplace(std::move(k.value()));
  life.pid = kdnd_->pid();
  life.ready_s = now_s() - life.start_s;
  lifetimes_.push_back(life);
  // SYNC POINT WRITE: engines read these to tell an expected disconnection from a bug.
  if (lifetimes_.size() > 1) board_->kdnd_up_ns.store(now_ns(), std::memory_order_release);
  board_->kdnd_down.store(0, std::memory_order_release);
  admin_ = std::make_unique<AdminClient>(w_.socket_path, "default");
  if (stats_ == nullptr) {
    kdn_connect_opts co{};
    co.struct_size = sizeof co;
    co.socket_path = w_.socket_path.c_str();
    co.flags = KDN_CONNECT_ADMIN | KDN_CONNECT_READ_ONLY;
    if (kdn_connect(&co, &stats_) != KDN_OK) stats_ = nullptr;
  }
  return true;
}

void Soak::kill_kdnd() {
  board_->kdnd_down.store(1, std::memory_order_release);  // before the kill: see start_kdnd
  admin_.reset();
  (void)kdnd_->kill();
  lifetimes_.back().end_s = now_s();
  lifetimes_.back().ended = "SIGKILL (soak)";
  kdnd_.reset();
  ++kdnd_kills_;
  std::fprintf(stderr, "kdn-bench soak: %.1f s: kdnd SIGKILLed, restarting on the same disk tier\n", now_s());
}

bool Soak::start_engine(uint32_t slot) {
  const uint64_t stream = o_.seed * 1000003ull + slot * 7919ull + engine_kills_ * 104729ull + engine_exits_;
  auto child = fork_child([this, slot, stream] { return soak::run_soak_engine(w_, board_, slot, stream); });
  if (!child.ok()) {
    std::fprintf(stderr, "kdn-bench soak: fork: %s\n", describe(child.status()).c_str());
    return false;
  }
  engines_[slot] = std::move(child.value());
  return true;
}

void Soak::kill_engine() {
  const uint32_t slot = uint32_t(rng_() % engines_.size());
  (void)engines_[slot].stop(SIGKILL, std::chrono::seconds(5));
  ++engine_kills_;
  (void)start_engine(slot);
}

// An engine or kdnd that exited without being killed is a failure; both are restarted so the
// soak goes on.
void Soak::reap_unexpected_exits() {
  for (uint32_t i = 0; i < engines_.size(); ++i) {
    if (engines_[i].running()) continue;
    auto st = engines_[i].wait_for(std::chrono::milliseconds(0));
    std::fprintf(stderr, "kdn-bench soak: engine %u exited by itself (%s)\n", i,
                 st.ok() ? describe_wait_status(*st).c_str() : "?");
    ++engine_exits_;
    (void)start_engine(i);
  }
  if (kdnd_ && !kdnd_->running()) {
    std::fprintf(stderr, "kdn-bench soak: kdnd exited by itself:\n%s", file_tail(kdnd_options_.log_path).c_str());
    board_->kdnd_down.store(1, std::memory_order_release);
    lifetimes_.back().end_s = now_s();
    lifetimes_.back().ended = "exited by itself";
    admin_.reset();
    kdnd_.reset();
    ++kdnd_exits_;
    (void)start_kdnd();
  }
}

// What an operator does: evict one document's chunks (most often), move the whole arena to
// disk, or evict everything.
ipc::EvictMode Soak::random_evict_mode() {
  const uint32_t pick = uint32_t(rng_() % 100);
  return pick < 4 ? ipc::EvictMode::kAll : pick < 14 ? ipc::EvictMode::kHost : ipc::EvictMode::kByKeys;
}

void Soak::evict(ipc::EvictMode mode) {
  if (!admin_ || !admin_->ok()) admin_ = std::make_unique<AdminClient>(w_.socket_path, "default");
  const auto& keys = doc_keys_[rng_() % doc_keys_.size()];
  (mode == ipc::EvictMode::kAll ? evict_all_ : mode == ipc::EvictMode::kHost ? evict_host_ : evict_keys_)++;
  uint64_t evicted = 0;
  const uint64_t t0 = now_ns();
  const int st = admin_->evict(mode, keys.data(), keys.size(), &evicted);
  // kdnd is up (only this thread kills it): a disconnection here is not expected.
  soak::record(board_->slots[kBenchSlot], Op::kEvict, st, st == KDN_ERR_NOT_FOUND || st == KDN_ERR_BUSY, now_ns() - t0);
  evicted_chunks_ += evicted;
}

// The warm-up of kdnd's last lifetime ends with the largest burst the run can ask of it: the
// whole corpus stored (so the disk tier holds every chunk), then every eviction mode, the last
// one `evict --all`. A path's first run, or a larger burst than before, raises the heap's
// high-water mark (an `evict --all` frees a disk slot per chunk, with a 4 KiB header write
// each, all at once): growth the warm-up must include, or it would read as drift.
void Soak::final_warm_up() {
  fill_corpus();
  evict(ipc::EvictMode::kByKeys);
  evict(ipc::EvictMode::kHost);
  evict(ipc::EvictMode::kAll);
}

// Stores every chunk of every document (those not cached) through a client of the bench's own.
void Soak::fill_corpus() {
  kdn_connect_opts co{};
  co.struct_size = sizeof co;
  co.socket_path = w_.socket_path.c_str();
  co.staging_bytes = 8ull << 20;
  kdn_client* c = nullptr;
  kdn_model* m = nullptr;
  if (kdn_connect(&co, &c) != KDN_OK || kdn_register_model(c, &w_.desc, &m) != KDN_OK) {
    std::fprintf(stderr, "kdn-bench soak: the warm-up's client could not connect\n");
    soak::record(board_->slots[kBenchSlot], Op::kStore, KDN_ERR_UNAVAILABLE, false, 0);
    kdn_disconnect(c);
    return;
  }
  const uint64_t bytes = kdn_chunk_bytes(&w_.desc);
  for (uint32_t d = 0; d < o_.docs; ++d) {
    const auto tokens = soak::soak_document(w_, d);
    const uint64_t t0 = now_ns();
    kdn_store* st = nullptr;
    int rc = kdn_store_reserve(c, m, tokens.data(), tokens.size(), 0, o_.doc_chunks, &st);
    if (rc == KDN_OK) {
      for (uint32_t i = 0; i < kdn_store_chunks(st); ++i)
        if (void* p = kdn_store_chunk_data(st, i)) soak::fill_stamp(doc_keys_[d][i], p, bytes);
      rc = kdn_store_commit(c, st);
    }
    soak::record(board_->slots[kBenchSlot], Op::kStore, rc, rc == KDN_ERR_NO_SPACE, now_ns() - t0);
  }
  kdn_disconnect(c);
}

KdndSample Soak::sample() {
  KdndSample s;
  s.t_s = now_s();
  s.lifetime = uint32_t(lifetimes_.size() - 1);
  if (kdnd_) {
    s.rss_anon_kib = status_field(kdnd_->pid(), "RssAnon:");
    s.threads = status_field(kdnd_->pid(), "Threads:");
    s.fds = open_fds(kdnd_->pid());
  }
  return s;
}

std::optional<uint64_t> Soak::sessions() {
  if (stats_ == nullptr) return std::nullopt;
  kdn_stats st{};
  st.struct_size = sizeof st;
  if (kdn_get_stats(stats_, &st) != KDN_OK) return std::nullopt;
  return st.daemon_sessions;
}

bool Soak::wait_parked(uint32_t gen) {
  const uint64_t deadline = now_ns() + 30'000'000'000ull;
  while (now_ns() < deadline) {
    bool all = true;
    for (uint32_t i = 0; i < engines_.size(); ++i)
      all &= board_->slots[i].parked.load(std::memory_order_acquire) == gen;
    if (all) return true;
    reap_unexpected_exits();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// Parks every engine (leases released, connected), waits until kdnd serves exactly the
// clients there are and its fd count holds still, and samples it.
KdndSample Soak::quiesced_sample() {
  const uint32_t gen = ++pause_gen_;
  board_->pause.store(gen, std::memory_order_release);
  bool parked = wait_parked(gen);
  const uint64_t want = engines_.size() + 1 + (admin_ && admin_->ok() ? 1 : 0);
  const uint64_t deadline = now_ns() + 10'000'000'000ull;
  std::optional<uint64_t> last_fds, got_sessions;
  int steady = 0;
  while (parked && steady < 5 && now_ns() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    got_sessions = sessions();
    const auto fds = kdnd_ ? open_fds(kdnd_->pid()) : std::nullopt;
    steady = got_sessions == want && fds && fds == last_fds ? steady + 1 : 0;
    last_fds = fds;
  }
  KdndSample s = sample();
  s.sessions = got_sessions;
  s.settled = steady >= 5;
  board_->pause.store(0, std::memory_order_release);
  if (!s.settled)
    std::fprintf(stderr, "kdn-bench soak: kdnd did not settle for a sample (%s, sessions %lld of %llu)\n",
                 parked ? "engines parked" : "engines did not park", got_sessions ? (long long)*got_sessions : -1LL,
                 (unsigned long long)want);
  return s;
}

void Soak::progress() {
  uint64_t ops = 0, exp = 0, unexp = 0, wrong = 0;
  for (const EngineSlot& s : board_->slots) {
    for (uint32_t o = 0; o < soak::kOpCount; ++o) {
      ops += s.ops[o].load(std::memory_order_relaxed);
      for (uint32_t k = 0; k < soak::kErrKindCount; ++k) {
        exp += s.expected[o][k].load(std::memory_order_relaxed);
        unexp += s.unexpected[o][k].load(std::memory_order_relaxed);
      }
    }
    wrong += s.wrong_bytes.load(std::memory_order_relaxed);
  }
  const KdndSample k = samples_.empty() ? KdndSample{} : samples_.back();
  std::fprintf(stderr,
               "kdn-bench soak: %.0f/%.0f s: %llu ops, errors %llu expected / %llu unexpected, wrong bytes %llu, "
               "kills %llu engine / %llu kdnd, kdnd RssAnon %llu KiB, %llu fds\n",
               now_s(), o_.seconds, (unsigned long long)ops, (unsigned long long)exp, (unsigned long long)unexp,
               (unsigned long long)wrong, (unsigned long long)engine_kills_, (unsigned long long)kdnd_kills_,
               (unsigned long long)k.rss_anon_kib.value_or(0), (unsigned long long)k.fds.value_or(0));
}

void Soak::run() {
  const double end = o_.seconds, kills_until = o_.seconds * o_.kdnd_kills_until;
  const double warmup = std::min(o_.warmup_s, o_.seconds * 0.2);
  double next_engine_kill = uniform(0.1, 0.5) * o_.seconds;
  double next_kdnd_kill = uniform(0.15, std::max(0.2, o_.kdnd_kills_until - 0.05)) * o_.seconds;
  double next_evict = exp_interval(o_.evict_every_ms / 1000), next_sample = 0, next_progress = 10;
  for (double t = now_s(); t < end; t = now_s()) {
    reap_unexpected_exits();
    if (!kdnd_) {  // it did not come back: the soak cannot go on
      ++kdnd_restart_failures_;
      break;
    }
    if (t >= next_sample) {
      samples_.push_back(sample());
      next_sample = t + o_.sample_ms / 1000.0;
    }
    if (t >= next_evict) {
      evict(random_evict_mode());
      next_evict = t + exp_interval(o_.evict_every_ms / 1000);
    }
    if (t >= next_engine_kill) {
      kill_engine();
      next_engine_kill = t + exp_interval(o_.engine_kill_every_s);
    }
    if (t >= next_kdnd_kill && t < kills_until) {
      kill_kdnd();
      (void)start_kdnd();
      next_kdnd_kill = now_s() + exp_interval(o_.kdnd_kill_every_s);
    }
    if (!warmed_up_s_ && t >= kills_until && t >= lifetimes_.back().start_s + warmup / 2) {
      final_warm_up();
      warmed_up_s_ = now_s();
    }
    if (!early_ && warmed_up_s_ && t >= *warmed_up_s_ + warmup / 2) early_ = quiesced_sample();
    if (t >= next_progress) {
      progress();
      next_progress += 10;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (kdnd_) {
    end_ = quiesced_sample();
    kdn_stats st{};
    st.struct_size = sizeof st;
    if (stats_ != nullptr && kdn_get_stats(stats_, &st) == KDN_OK) end_stats_ = st;
  }
  duration_s_ = now_s();
  loadavg_end_ = load_average();
  progress();
  shutdown();
}

void Soak::shutdown() {
  if (shut_) return;
  shut_ = true;
  // Engines see the flag, release everything, disconnect and exit 0; one that does not is a
  // failure like any other exit of its own.
  board_->stop.store(1, std::memory_order_release);
  for (ChildProcess& e : engines_) {
    if (e.pid() <= 0) continue;
    auto st = e.wait_for(std::chrono::seconds(20));
    if (!st.ok()) {
      std::fprintf(stderr, "kdn-bench soak: an engine did not stop when told to\n");
      st = e.stop(SIGKILL, std::chrono::seconds(5));
      ++engine_exits_;
    } else if (*st != 0) {
      std::fprintf(stderr, "kdn-bench soak: an engine stopped with %s\n", describe_wait_status(*st).c_str());
      ++engine_exits_;
    }
  }
  kdn_disconnect(stats_);
  stats_ = nullptr;
  admin_.reset();
  if (kdnd_) {
    auto st = kdnd_->stop();
    exit_after_sigterm_ = st.ok() ? describe_wait_status(*st) : "did not exit";
    lifetimes_.back().end_s = now_s();
    lifetimes_.back().ended = "SIGTERM (end): " + exit_after_sigterm_;
    kdnd_.reset();
  }
}

// ---- the report -------------------------------------------------------------------------------------

struct Totals {
  uint64_t ops[soak::kOpCount] = {};
  uint64_t expected[soak::kOpCount][soak::kErrKindCount] = {};
  uint64_t unexpected[soak::kOpCount][soak::kErrKindCount] = {};
  uint64_t latency[soak::kOpCount][soak::kBuckets] = {};
  uint64_t verified_chunks = 0, verified_bytes = 0, wrong_chunks = 0, wrong_bytes = 0;
};

std::unique_ptr<Totals> add_up(const SoakBoard& b) {
  auto t = std::make_unique<Totals>();
  for (const EngineSlot& s : b.slots) {
    for (uint32_t o = 0; o < soak::kOpCount; ++o) {
      t->ops[o] += s.ops[o].load(std::memory_order_relaxed);
      for (uint32_t k = 0; k < soak::kErrKindCount; ++k) {
        t->expected[o][k] += s.expected[o][k].load(std::memory_order_relaxed);
        t->unexpected[o][k] += s.unexpected[o][k].load(std::memory_order_relaxed);
      }
      for (uint32_t k = 0; k < soak::kBuckets; ++k) t->latency[o][k] += s.latency[o][k].load(std::memory_order_relaxed);
    }
    t->verified_chunks += s.verified_chunks.load(std::memory_order_relaxed);
    t->verified_bytes += s.verified_bytes.load(std::memory_order_relaxed);
    t->wrong_chunks += s.wrong_chunks.load(std::memory_order_relaxed);
    t->wrong_bytes += s.wrong_bytes.load(std::memory_order_relaxed);
  }
  return t;
}

// Nearest-rank percentile of a histogram, in µs (the bucket's geometric middle: within 2.2%).
std::optional<double> hist_percentile(const uint64_t (&h)[soak::kBuckets], double q) {
  uint64_t n = 0;
  for (uint64_t c : h) n += c;
  if (n == 0) return std::nullopt;
  const uint64_t rank = std::max<uint64_t>(1, uint64_t(std::ceil(q * double(n))));
  uint64_t seen = 0;
  for (uint32_t b = 0; b < soak::kBuckets; ++b)
    if ((seen += h[b]) >= rank) return soak::bucket_ns(b) / 1000.0;
  return std::nullopt;
}

void report_errors(Report& r, const Totals& t, uint64_t engine_exits, uint64_t kdnd_exits,
                   uint64_t kdnd_restart_failures) {
  uint64_t exp_total = 0, unexp_total = engine_exits + kdnd_exits + kdnd_restart_failures;
  for (uint32_t o = 0; o < soak::kOpCount; ++o)
    for (uint32_t k = 0; k < soak::kErrKindCount; ++k) {
      exp_total += t.expected[o][k];
      unexp_total += t.unexpected[o][k];
    }
  r.set("errors.expected", exp_total);
  r.set("errors.unexpected", unexp_total);
  r.set_json("errors.expected_by_kind", Report::Json::object());
  r.set_json("errors.unexpected_by_kind", Report::Json::object());
  for (uint32_t o = 0; o < soak::kOpCount; ++o)
    for (uint32_t k = 0; k < soak::kErrKindCount; ++k) {
      const std::string key = std::string(soak::op_name(Op(o))) + "." + soak::error_name(k);
      if (t.expected[o][k]) r.set("errors.expected_by_kind." + key, t.expected[o][k]);
      if (t.unexpected[o][k]) r.set("errors.unexpected_by_kind." + key, t.unexpected[o][k]);
    }
  if (engine_exits) r.set("errors.unexpected_by_kind.engine_exited_by_itself", engine_exits);
  if (kdnd_exits) r.set("errors.unexpected_by_kind.kdnd_exited_by_itself", kdnd_exits);
  if (kdnd_restart_failures) r.set("errors.unexpected_by_kind.kdnd_did_not_restart", kdnd_restart_failures);
}

Report::Json sample_json(const KdndSample& s) {
  Report::Json j = {{"t_s", std::round(s.t_s * 10) / 10}, {"lifetime", s.lifetime}};
  j["rss_anon_kib"] = s.rss_anon_kib ? Report::Json(*s.rss_anon_kib) : Report::Json(nullptr);
  j["fds"] = s.fds ? Report::Json(*s.fds) : Report::Json(nullptr);
  if (s.threads) j["threads"] = *s.threads;
  if (s.sessions) j["sessions"] = *s.sessions;
  return j;
}

// kdnd's lifetimes, its samples, and the drift between the two quiesced samples of its last
// lifetime (null when either is missing or did not settle).
void Soak::report_kdnd(Report& r, bool with_series) const {
  Report::Json lives = Report::Json::array();
  for (const Lifetime& l : lifetimes_) {
    Report::Json j = {{"pid", l.pid},
                      {"start_s", std::round(l.start_s * 10) / 10},
                      {"end_s", std::round(l.end_s * 10) / 10},
                      {"ready_s", l.ready_s},
                      {"ended", l.ended}};
    std::optional<uint64_t> first_rss, last_rss, max_rss, first_fds, last_fds;
    for (const KdndSample& s : samples_) {
      if (&lifetimes_[s.lifetime] != &l || !s.rss_anon_kib || !s.fds) continue;
      if (!first_rss) first_rss = s.rss_anon_kib, first_fds = s.fds;
      last_rss = s.rss_anon_kib, last_fds = s.fds;
      max_rss = std::max(max_rss.value_or(0), *s.rss_anon_kib);
    }
    if (first_rss) {
      j["rss_anon_kib"] = {{"first", *first_rss}, {"last", *last_rss}, {"max", *max_rss}};
      j["fds"] = {{"first", *first_fds}, {"last", *last_fds}};
    }
    lives.push_back(j);
  }
  r.set("kdnd.lifetimes_count", uint64_t(lifetimes_.size()));
  r.set("kdnd.ready_s_max", std::max_element(lifetimes_.begin(), lifetimes_.end(), [](auto& a, auto& b) {
                              return a.ready_s < b.ready_s;
                            })->ready_s);
  const bool both = early_ && end_ && early_->settled && end_->settled && early_->lifetime == end_->lifetime &&
                    early_->rss_anon_kib && end_->rss_anon_kib && early_->fds && end_->fds;
  r.set_json("kdnd.drift_early", early_ ? sample_json(*early_) : Report::Json(nullptr));
  r.set_json("kdnd.drift_end", end_ ? sample_json(*end_) : Report::Json(nullptr));
  if (both) {
    const double e = double(*early_->rss_anon_kib), n = double(*end_->rss_anon_kib);
    r.set("kdnd.drift_window_s", end_->t_s - early_->t_s);
    r.set("kdnd.rss_anon_drift", e > 0 ? (n - e) / e : 0.0);
    r.set("kdnd.fd_drift", int64_t(*end_->fds) - int64_t(*early_->fds));
    r.set("kdnd.fd_drift_abs", uint64_t(std::llabs(int64_t(*end_->fds) - int64_t(*early_->fds))));
  } else {
    r.set_null("kdnd.drift_window_s");
    r.set_null("kdnd.rss_anon_drift");
    r.set_null("kdnd.fd_drift");
    r.set_null("kdnd.fd_drift_abs");
  }
  r.set("kdnd.exit_after_sigterm", exit_after_sigterm_);
  if (end_stats_) {
    const kdn_stats& k = *end_stats_;
    const std::string p = "kdnd.last_lifetime.";
    r.set(p + "stored_chunks", k.stored_chunks);
    r.set(p + "retrieved_chunks", k.retrieved_chunks);
    r.set(p + "evicted_chunks", k.evicted_chunks);
    r.set(p + "dropped_chunks", k.dropped_chunks);
    r.set(p + "demoted_chunks", k.demoted_chunks);
    r.set(p + "promoted_chunks", k.promoted_chunks);
    r.set(p + "corrupt_chunks", k.corrupt_chunks);
    r.set(p + "protocol_errors", k.protocol_errors);
    r.set(p + "limit_errors", k.limit_errors);
    r.set(p + "expired_reservations", k.expired_reservations);
  }
  r.set_json("kdnd.lifetimes", lives);
  if (!with_series) return;
  Report::Json series = Report::Json::array();
  for (const KdndSample& s : samples_) series.push_back(sample_json(s));
  r.set_json("kdnd.samples", series);
}

Report Soak::report(bool with_series) const {
  Report r;
  r.set("config.seconds", o_.seconds);
  r.set("config.processes", uint64_t(o_.processes));
  r.set("config.seed", o_.seed);
  r.set("config.docs", uint64_t(o_.docs));
  r.set("config.doc_chunks", uint64_t(o_.doc_chunks));
  r.set("config.chunk_bytes", kdn_chunk_bytes(&w_.desc));
  r.set("config.arena_mib", o_.arena_mib);
  r.set("config.disk_mib", o_.disk_mib);
  r.set("config.disk_policy", "write_through");
  r.set("config.engine_kill_every_s", o_.engine_kill_every_s);
  r.set("config.kdnd_kill_every_s", o_.kdnd_kill_every_s);
  r.set("config.kdnd_kills_until_s", o_.seconds * o_.kdnd_kills_until);
  r.set("config.evict_every_ms", o_.evict_every_ms);
  r.set("duration_s", duration_s_);
  r.set("machine.cpus", uint64_t(std::thread::hardware_concurrency()));
  r.set("machine.loadavg_1m_start", loadavg_start_);
  r.set("machine.loadavg_1m_end", loadavg_end_);
  const auto t = add_up(*board_);
  uint64_t total = 0;
  for (uint32_t o = 0; o < soak::kOpCount; ++o) total += t->ops[o];
  r.set("ops.total", total);
  for (uint32_t o = 0; o < soak::kOpCount; ++o) r.set(std::string("ops.") + soak::op_name(Op(o)), t->ops[o]);
  r.set("ops.per_s", duration_s_ > 0 ? double(total) / duration_s_ : 0.0);
  r.set("evictions.by_keys", evict_keys_);
  r.set("evictions.host_to_disk", evict_host_);
  r.set("evictions.all", evict_all_);
  r.set("evictions.chunks", evicted_chunks_);
  r.set("verified.chunks", t->verified_chunks);
  r.set("verified.bytes", t->verified_bytes);
  r.set("wrong_chunks", t->wrong_chunks);
  r.set("wrong_bytes", t->wrong_bytes);
  report_errors(r, *t, engine_exits_, kdnd_exits_, kdnd_restart_failures_);
  r.set("kills.engine", engine_kills_);
  r.set("kills.kdnd", kdnd_kills_);
  for (uint32_t o = 0; o < soak::kOpCount; ++o) {
    const std::string k = std::string("latency_us.") + soak::op_name(Op(o));
    r.set(k + ".p50", hist_percentile(t->latency[o], 0.50));
    r.set(k + ".p99", hist_percentile(t->latency[o], 0.99));
    r.set(k + ".p999", hist_percentile(t->latency[o], 0.999));
  }
  report_kdnd(r, with_series);
  r.set_bar("bars.wrong_bytes", double(t->wrong_bytes), BarOp::kAtMost, 0);
  r.set_bar("bars.unexpected_errors", r.number("errors.unexpected"), BarOp::kAtMost, 0);
  r.set_bar("bars.rss_anon_drift", r.number("kdnd.rss_anon_drift"), BarOp::kAtMost, 0.05);
  r.set_bar("bars.fd_drift", r.number("kdnd.fd_drift_abs"), BarOp::kAtMost, 0);
  return r;
}

// --help shows "--seconds N=60": the value's name and its default, no parser types.
template <class T>
void option(CLI::App& app, const char* name, T& value, const char* meta, const std::string& help) {
  CLI::Option* opt = app.add_option(name, value, help)->capture_default_str();
  opt->option_text(std::string(meta) + "=" + opt->get_default_str());
}

void add_options(CLI::App& app, SoakOptions& o) {
  option(app, "--seconds", o.seconds, "N", "how long to run, 5 to 86400");
  option(app, "--processes", o.processes, "P", "engine processes, 1 to 64");
  app.add_flag("--json", o.json, "print JSON (default: a table)");
  option(app, "--seed", o.seed, "S", "seeds the corpus, the operation mix and the kill schedule");
  app.add_option("--disk-dir", o.disk_dir,
                 "the disk tier goes into a new directory in DIR, removed at the end "
                 "(default: $TMPDIR, else /tmp)")
      ->option_text("DIR");
  app.add_option("--kdnd", o.kdnd, "kdnd binary (default: the one next to kdn-bench)")->option_text("PATH");
  option(app, "--docs", o.docs, "D", "documents of the corpus");
  option(app, "--doc-chunks", o.doc_chunks, "C", "64 KiB chunks per document, 1 to 64");
  option(app, "--held-leases", o.held_leases, "L", "leases an engine keeps before releasing one, 0 to 64");
  option(app, "--arena-mib", o.arena_mib, "MIB",
         "kdnd's host arena, at least 8 (below the corpus: chunks move to disk)");
  option(app, "--disk-mib", o.disk_mib, "MIB", "kdnd's disk tier (write-through), at least 64");
  option(app, "--engine-kill-every", o.engine_kill_every_s, "SECONDS", "mean time between engine SIGKILLs");
  option(app, "--kdnd-kill-every", o.kdnd_kill_every_s, "SECONDS", "mean time between kdnd SIGKILLs");
  option(app, "--kdnd-kills-until", o.kdnd_kills_until, "FRACTION",
         "kdnd is killed only in this leading fraction of the run, 0.2 to 0.9 (the rest is its last lifetime)");
  option(app, "--evict-every-ms", o.evict_every_ms, "MS", "mean time between admin evictions");
  option(app, "--warmup", o.warmup_s, "SECONDS",
         "of kdnd's last lifetime before the early drift sample (at most a fifth of the run)");
  option(app, "--sample-ms", o.sample_ms, "MS", "kdnd RssAnon and fd sampling interval, at least 10");
  app.add_flag("--require-bars", o.require_bars, "exit 3 unless every bar passes");
}

// Ranges are checked here rather than by CLI11's validators, which would print their types in --help.
bool valid(const SoakOptions& o) {
  const auto bad = [](const char* what) {
    std::fprintf(stderr, "kdn-bench soak: %s\n", what);
    return false;
  };
  if (o.seconds < 5 || o.seconds > 86400) return bad("--seconds: 5 to 86400");
  if (o.processes < 1 || o.processes + 1 > SoakBoard::kMaxSlots) return bad("--processes: 1 to 64");
  if (o.docs < 1 || o.docs > (1u << 20)) return bad("--docs: 1 to 1048576");
  if (o.doc_chunks < 1 || o.doc_chunks > 64) return bad("--doc-chunks: 1 to 64");
  if (o.held_leases > 64) return bad("--held-leases: 0 to 64");
  if (o.arena_mib < 8 || o.disk_mib < 64) return bad("--arena-mib: at least 8; --disk-mib: at least 64");
  if (!(o.engine_kill_every_s >= 0.1) || !(o.kdnd_kill_every_s >= 0.5))
    return bad("kill intervals: at least 0.1 s (engines) and 0.5 s (kdnd)");
  if (!(o.kdnd_kills_until >= 0.2 && o.kdnd_kills_until <= 0.9)) return bad("--kdnd-kills-until: 0.2 to 0.9");
  if (!(o.evict_every_ms >= 1) || !(o.warmup_s >= 0) || o.sample_ms < 10)
    return bad("--evict-every-ms >= 1, --warmup >= 0, --sample-ms >= 10");
  return true;
}

}  // namespace

int run_soak_bench(int argc, char** argv) {
  CLI::App app{
      "kdn-bench soak: P engines at full rate against kdnd while engines and kdnd are SIGKILLed "
      "and restarted; every retrieved byte checked; kdnd's RssAnon and fd drift"};
  SoakOptions o;
  add_options(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help, or a usage error
  }
  if (!o.kdnd.empty() && ::access(o.kdnd.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "kdn-bench soak: no kdnd at %s\n", o.kdnd.c_str());
    return 2;
  }
  if (!valid(o)) return 2;
  auto run_dir = TempDir::create("kdn-soak");
  if (!run_dir.ok()) {
    std::fprintf(stderr, "kdn-bench soak: %s\n", describe(run_dir.status()).c_str());
    return 1;
  }
  std::string disk = run_dir->path() + "/disk";
  std::optional<TempDir> disk_parent;
  if (!o.disk_dir.empty()) {
    std::string tmpl = o.disk_dir + "/kdn-soak-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::fprintf(stderr, "kdn-bench soak: cannot create a directory in %s: %s\n", o.disk_dir.c_str(),
                   std::strerror(errno));
      return 2;
    }
    disk = tmpl;
  } else {
    std::filesystem::create_directories(disk);
  }
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } cleanup{disk};
  SoakBoard* board = SoakBoard::create();
  if (board == nullptr) return 1;
  int code = 0;
  {
    Soak soak(o, board);
    std::fprintf(stderr, "kdn-bench soak: %.0f s, %u engines, disk tier in %s\n", o.seconds, o.processes, disk.c_str());
    if (!soak.setup(run_dir->path(), disk)) {
      code = 1;
    } else {
      soak.run();
      Report r = soak.report(o.json);
      std::cout << (o.json ? r.to_json() + "\n" : r.to_table()) << std::flush;
      if (o.require_bars && !r.all_bars_pass("bars")) code = 3;
    }
  }
  SoakBoard::destroy(board);
  return code;
}

}  // namespace kdn::bench
