// kdn-bench gpu: kdnd's GPU tier with this process as the engine, against cudaMemcpyAsync in
// the same run (docs/gpu-engine.md).
//
// The bench registers a vLLM-style paged KV cache (llama3-8b geometry, one cudaMalloc) with a
// kdnd it starts with [tier.gpu] on, and times, from request to kdnd's done event (host clock,
// after cudaStreamWaitEvent and a drained stream):
//   t1_to_engine    chunks in kdnd's pinned host arena -> the engine's blocks
//   engine_to_t0    kdn_gpu_store of fresh chunks (returns once committed)
//   t0_to_engine    those chunks, now in T0, -> other blocks of the engine
//   decode_to_engine  the same with T0 holding kivi4 (KVC1) blobs (a second kdnd)
//   retrieve_latency  one chunk, request to event
//   decode_step_slowdown  a memory-bound read of the whole cache, alone vs while another thread
//                   keeps retrieving bulk KV into the same cache through kdnd
//   peer            T0 on device 0 -> an engine on device 1 (two GPUs or more)
// Every retrieve that is timed is also checked, every element and both guards of the cache
// (kdn.wrong_elements), except the lossy kivi4 one. A figure whose chunks were not in the tier
// it names (kdn_lookup's tier counts) is null, with the reason beside it.
#include "baseline_figures.h"
#include "commands.h"
#include "gpu_figures.h"
#include "gpu_plan.h"
#include "kdnd_process.h"
#include "process.h"
#include "report.h"
#include "stats.h"

#include <kdn/common/clock.h>
#include <kdn/common/model_presets.h>
#include <kdn/gpu_engine/engine_session.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace kdn::bench {
namespace {

using namespace gpu_engine;

struct GpuOptions {
  bool json = false;
  GpuBenchSizes sizes;
  std::string model = "llama3-8b";
  int device = 0;
  std::string kdnd;
  uint32_t timeout_ms = 60000;
};

void say(const char* format, ...) __attribute__((format(printf, 1, 2)));
void say(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  vprogress("[kdn-bench gpu] ", format, args);
  va_end(args);
}

// One bulk sequence: its tokens, and the blocks it is stored from and retrieved into.
struct Set {
  uint64_t seed = 0;
  std::vector<int32_t> tokens;
  BlockTables tables;
};

Set make_set(const EngineSession& s, uint64_t seed, uint32_t chunks) {
  Set set;
  set.seed = seed;
  set.tokens = sequence_tokens(seed, uint64_t(chunks) * s.chunk_tokens());
  const uint32_t blocks = uint32_t((set.tokens.size() + s.shape().block_size - 1) / s.shape().block_size);
  set.tables = store_and_retrieve_tables(s.shape().num_blocks, blocks, seed);
  return set;
}

std::vector<int64_t> slots_of(const EngineSession& s, const std::vector<int32_t>& table, uint64_t tokens) {
  return slot_mapping(table, tokens, s.shape().block_size);
}

std::array<uint32_t, KDN_TIER_COUNT> tiers_of(EngineSession& s, const std::vector<int32_t>& tokens) {
  kdn_lookup_result lr{};
  std::array<uint32_t, KDN_TIER_COUNT> t{};
  if (kdn_lookup(s.client(), s.model(), tokens.data(), tokens.size(), &lr) == KDN_OK) {
    std::copy(lr.tier_chunks, lr.tier_chunks + KDN_TIER_COUNT, t.begin());
  }
  return t;
}

std::string tiers_text(const std::array<uint32_t, KDN_TIER_COUNT>& t) {
  return "T0 " + std::to_string(t[0]) + ", T1 " + std::to_string(t[1]) + ", T2 " + std::to_string(t[2]) + ", T3 " +
         std::to_string(t[3]);
}

// Stores a set from host memory (reservations), the chunks filled with the pattern by a few
// threads: they land in T1 as an engine without a GPU path would put them there.
EngineStatus store_from_host(EngineSession& s, const Set& set) {
  const uint32_t T = s.chunk_tokens(), n = uint32_t(set.tokens.size() / T);
  const uint32_t batch = kdn_store_max_chunks(s.client(), s.model());
  if (batch == 0) return {KDN_ERR_LIMIT, "kdn_store_max_chunks: 0"};
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  for (uint32_t first = 0; first < n; first += batch) {
    const uint32_t m = std::min(batch, n - first);
    kdn_store* store = nullptr;
    if (auto st = EngineStatus::from_kdn(
            kdn_store_reserve(s.client(), s.model(), set.tokens.data(), set.tokens.size(), first, m, &store),
            "kdn_store_reserve");
        !st.ok())
      return st;
    std::atomic<uint32_t> next{0};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < std::min<unsigned>(threads, m); ++t) {
      pool.emplace_back([&] {
        for (uint32_t i; (i = next.fetch_add(1)) < m;) {
          if (void* slot = kdn_store_chunk_data(store, i)) {
            fill_canonical_chunk(static_cast<uint16_t*>(slot), s.shape(), T, set.seed, first + i);
          }
        }
      });
    }
    for (auto& t : pool) t.join();
    if (auto st = EngineStatus::from_kdn(kdn_store_commit(s.client(), store), "kdn_store_commit"); !st.ok()) return st;
  }
  return {};
}

struct Timed {
  double gbps = 0;
  uint64_t ns = 0;
  uint64_t mismatches = 0;
};

// Retrieves the first `chunks` chunks of a set into its retrieve blocks of a cache of canaries;
// timed from the request to the drained stream; then (if `verify`) every element checked.
EngineStatus timed_retrieve(EngineSession& s, const Set& set, uint32_t chunks, bool verify, Timed* out) {
  const uint64_t tokens = uint64_t(chunks) * s.chunk_tokens();
  std::vector<int32_t> prefix(set.tokens.begin(), set.tokens.begin() + tokens);
  auto layout = s.layout(slots_of(s, set.tables.retrieve, tokens));
  if (verify) {
    if (auto st = s.fill(set.seed, std::vector<int32_t>(s.shape().slots(), -1)); !st.ok()) return st;
    if (auto st = s.wait(); !st.ok()) return st;
  }
  uint32_t loaded = 0;
  const uint64_t t0 = now_ns();
  if (auto st = s.retrieve(prefix, *layout, chunks, &loaded); !st.ok()) return st;
  if (auto st = s.wait(); !st.ok()) return st;
  out->ns = now_ns() - t0;
  if (loaded != chunks) {
    return {KDN_ERR_NOT_FOUND, "kdn_gpu_retrieve loaded " + std::to_string(loaded) + " of " + std::to_string(chunks)};
  }
  out->gbps = gb_per_s(s.shape().token_bytes() * tokens, out->ns);
  if (verify) return s.verify(set.seed, slot_owners(layout->slots(), s.shape().slots()), &out->mismatches);
  return {};
}

// Fills a set's store blocks, then times kdn_gpu_store of all its chunks (to the commit).
EngineStatus timed_store(EngineSession& s, const Set& set, Timed* out) {
  auto slots = slots_of(s, set.tables.store, set.tokens.size());
  if (auto st = s.fill(set.seed, slot_owners(slots, s.shape().slots())); !st.ok()) return st;
  if (auto st = s.wait(); !st.ok()) return st;
  auto layout = s.layout(std::move(slots));
  const uint32_t n = uint32_t(set.tokens.size() / s.chunk_tokens());
  uint32_t stored = 0;
  const uint64_t t0 = now_ns();
  if (auto st = s.store(set.tokens, *layout, 0, n, &stored); !st.ok()) return st;
  out->ns = now_ns() - t0;
  if (stored != n)
    return {KDN_ERR_INTERNAL, "kdn_gpu_store wrote " + std::to_string(stored) + " of " + std::to_string(n)};
  out->gbps = gb_per_s(s.shape().token_bytes() * set.tokens.size(), out->ns);
  return {};
}

// The figures of one kind, their median, and the first reason one could not be measured.
struct Figure {
  std::vector<double> values;
  std::string reason;
  void fail(const std::string& why) {
    if (reason.empty()) reason = why;
  }
  void put(Report& r, const std::string& key) const {
    if (!values.empty() && reason.empty()) {
      r.set(key, median(values));
    } else {
      r.set_null(key);
      r.set(key + "_reason", reason.empty() ? "not measured" : reason);
    }
  }
};

struct Phase {
  const GpuOptions& o;
  const GpuPlan& plan;
  Report& r;
  std::string root;
  uint64_t wrong = 0;
  bool failed = false;
  std::string why;  // the first failure that left figures unmeasured

  Result<KdndProcess> start_kdnd(const std::string& tag, uint64_t arena, std::vector<std::string> sets,
                                 std::string* log) {
    KdndOptions ko;
    ko.binary = o.kdnd.empty() ? default_kdnd_path() : o.kdnd;
    ko.socket_path = root + "/" + tag + ".sock";
    ko.log_path = *log = root + "/" + tag + ".log";
    ko.host_arena_bytes = arena;
    std::vector<std::string> gpu = {"tier.gpu.enable=on", "tier.gpu.bytes=" + std::to_string(plan.t0_bytes),
                                    "tier.gpu.pin_host=true"};
    gpu.insert(gpu.end(), sets.begin(), sets.end());
    for (const auto& kv : gpu) ko.extra_args.insert(ko.extra_args.end(), {"--set", kv});
    ko.extra_args.insert(ko.extra_args.end(), {"--log-level", "info"});
    return KdndProcess::start(ko);
  }

  SessionOptions session(const std::string& socket, int device, uint64_t kv_bytes) const {
    SessionOptions so;
    so.socket_path = socket;
    // The default namespace: the one --host-arena-bytes sizes (a created one may get less).
    so.name_space = "";
    so.model = o.model;
    so.device = device;
    so.kv_bytes = kv_bytes;
    so.timeout_ms = o.timeout_ms;
    return so;
  }

  void count(const Timed& t) { wrong += t.mismatches; }
};

// Stores sets from the host and retrieves each from T1; *stored gets the first set kdnd took.
void t1_figures(Phase& ph, EngineSession& s, Figure* t1, std::optional<Set>* stored) {
  for (uint32_t i = 0; i < ph.plan.reps; ++i) {
    const Set set = make_set(s, 1000 + i, ph.plan.bulk_chunks);
    if (auto st = store_from_host(s, set); !st.ok()) return t1->fail(st.message());
    if (!*stored) *stored = set;
    const auto tiers = tiers_of(s, set.tokens);
    if (i == 0) ph.r.set("kdn.tiers.t1_set", tiers_text(tiers));
    if (tiers[1] != ph.plan.bulk_chunks)
      return t1->fail("chunks stored from the host were not all in T1: " + tiers_text(tiers));
    Timed t;
    if (auto st = timed_retrieve(s, set, ph.plan.bulk_chunks, true, &t); !st.ok()) return t1->fail(st.message());
    ph.count(t);
    t1->values.push_back(t.gbps);
    say("T1 -> engine: %.1f GB/s (%u chunks, %llu wrong elements)", t.gbps, ph.plan.bulk_chunks,
        (unsigned long long)t.mismatches);
  }
}

// Stores fresh sets from the engine (engine_to_t0), then retrieves each from T0 (t0_to_engine).
// Returns the first set (in T0) for the later phases.
std::optional<Set> t0_figures(Phase& ph, EngineSession& s, Figure* store, Figure* t0) {
  std::optional<Set> first;
  for (uint32_t i = 0; i < ph.plan.reps; ++i) {
    Set set = make_set(s, 2000 + i, ph.plan.bulk_chunks);
    Timed ts;
    if (auto st = timed_store(s, set, &ts); !st.ok()) {
      store->fail(st.message());
      t0->fail("no chunks stored from the engine: " + st.message());
      return first;
    }
    store->values.push_back(ts.gbps);
    const auto tiers = tiers_of(s, set.tokens);
    if (i == 0) ph.r.set("kdn.tiers.t0_set", tiers_text(tiers));
    if (tiers[0] != ph.plan.bulk_chunks) {
      t0->fail("chunks stored from the engine were not all in T0: " + tiers_text(tiers));
      continue;
    }
    Timed tr;
    if (auto st = timed_retrieve(s, set, ph.plan.bulk_chunks, true, &tr); !st.ok()) {
      t0->fail(st.message());
      continue;
    }
    ph.count(tr);
    t0->values.push_back(tr.gbps);
    say("engine -> T0: %.1f GB/s, T0 -> engine: %.1f GB/s (%llu wrong elements)", ts.gbps, tr.gbps,
        (unsigned long long)tr.mismatches);
    if (!first) first = std::move(set);
  }
  return first;
}

void latency_figure(Phase& ph, EngineSession& s, const Set& set) {
  const auto tiers = tiers_of(s, std::vector<int32_t>(set.tokens.begin(), set.tokens.begin() + s.chunk_tokens()));
  ph.r.set("kdn.retrieve_latency_tiers", tiers_text(tiers));
  std::vector<uint64_t> ns;
  Timed t;
  for (uint32_t i = 0; i < ph.plan.latency_samples; ++i) {
    if (auto st = timed_retrieve(s, set, 1, i + 1 == ph.plan.latency_samples, &t); !st.ok()) {
      ph.r.set_null("kdn.retrieve_latency_us");
      ph.r.set("kdn.retrieve_latency_us_reason", st.message());
      ph.failed = true;
      return;
    }
    ns.push_back(t.ns);
  }
  ph.count(t);
  const LatencySummary l = summarize_ns(ns);
  ph.r.set("kdn.retrieve_latency_us", l.p50_us);
  ph.r.set("kdn.retrieve_latency_p99_us", l.p99_us);
  say("one-chunk retrieve: p50 %.1f us, p99 %.1f us", l.p50_us, l.p99_us);
}

// Decode steps alone, then while a second thread keeps retrieving `set` into the same cache.
void decode_slowdown_figure(Phase& ph, EngineSession& s, const Set& set) {
  const void* kv = reinterpret_cast<const void*>(s.kv().kv_base());
  const uint64_t bytes = s.shape().kv_bytes();
  ph.r.set("kdn.decode_step_bytes", bytes);
  std::vector<double> alone, loaded;
  auto fail = [&](const std::string& why) {
    ph.r.set_null("kdn.decode_step_slowdown");
    ph.r.set("kdn.decode_step_slowdown_reason", why);
    ph.failed = true;
  };
  if (auto st = time_decode_steps(ph.o.device, kv, bytes, ph.plan.decode_steps, ph.o.timeout_ms, &alone); !st.ok())
    return fail(st.message());

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> moved{0};
  std::string bg_error;
  const uint64_t tokens = set.tokens.size();
  auto layout = s.layout(slots_of(s, set.tables.retrieve, tokens));
  const uint64_t t0 = now_ns();
  // SYNC: the thread alone uses the session until joined; this thread only uses its own
  // stream and events (time_decode_steps).
  std::thread bulk([&] {
    while (!stop.load(std::memory_order_relaxed)) {  // a flag only: no data rides on it
      uint32_t got = 0;
      EngineStatus st = s.retrieve(set.tokens, *layout, 0, &got);
      if (st.ok()) st = s.wait();
      if (st.ok() && uint64_t(got) * s.chunk_tokens() != tokens) {
        st = {KDN_ERR_NOT_FOUND,
              "loaded " + std::to_string(got) + " chunks of a set of " + std::to_string(tokens / s.chunk_tokens())};
      }
      if (!st.ok()) {
        bg_error = st.message();
        return;
      }
      moved.fetch_add(s.shape().token_bytes() * tokens, std::memory_order_relaxed);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the copies start
  const EngineStatus st = time_decode_steps(ph.o.device, kv, bytes, ph.plan.decode_steps, ph.o.timeout_ms, &loaded);
  stop.store(true, std::memory_order_relaxed);
  bulk.join();
  const uint64_t elapsed = now_ns() - t0;
  if (!st.ok()) return fail(st.message());
  if (!bg_error.empty()) return fail("background retrieve: " + bg_error);
  const double a = median(alone), b = median(loaded);
  ph.r.set("kdn.decode_step_alone_us", a);
  ph.r.set("kdn.decode_step_loaded_us", b);
  ph.r.set("kdn.decode_step_read_gbps", gb_per_s(bytes, uint64_t(a * 1e3)));
  ph.r.set("kdn.decode_background_retrieve_gbps", gb_per_s(moved.load(), elapsed));
  ph.r.set("kdn.decode_step_slowdown", a > 0 ? b / a : 0.0);
  say("decode step: %.0f us alone, %.0f us beside bulk retrieves (%.1f GB/s)", a, b, gb_per_s(moved.load(), elapsed));
}

void peer_figure(Phase& ph, const std::string& socket, const Set& set) {
  if (device_count() < 2) {
    ph.r.set_null("kdn.peer_gbps");
    ph.r.set("kdn.peer_gbps_reason", "one GPU");
    return;
  }
  Figure f;
  const int peer = ph.o.device == 0 ? 1 : 0;
  std::unique_ptr<EngineSession> s;
  if (auto st = EngineSession::open(ph.session(socket, peer, 2 * ph.plan.bulk_bytes), &s); !st.ok()) {
    f.fail(st.message());
  } else {
    Set on_peer = set;  // same chunks (in T0 of the first device), blocks of the peer's cache
    on_peer.tables = make_set(*s, set.seed, ph.plan.bulk_chunks).tables;
    Timed t;
    if (auto rs = timed_retrieve(*s, on_peer, ph.plan.bulk_chunks, true, &t); !rs.ok()) {
      f.fail(rs.message());
    } else {
      ph.count(t);
      f.values.push_back(t.gbps);
      say("T0 on device %d -> engine on device %d: %.1f GB/s", ph.o.device, peer, t.gbps);
    }
  }
  f.put(ph.r, "kdn.peer_gbps");
}

// kdnd with tier.gpu.bytes holding kivi4 blobs: engine -> T0 (encoded), T0 -> engine (decoded).
constexpr uint64_t kEncodeWaitNs = 60ull * 1'000'000'000;  // the longest wait for the encodes of one set
void decode_figure(Phase& ph) {
  Figure f;
  std::string log;
  // Only sets stored from the engine here: T1 needs room for their copies at most.
  // A retrieve decodes its T0 blobs in launches of as many chunks as the bounce buffer (half of
  // staging_bytes) holds outputs for: 1 GiB lets a launch decode 15 llama3-8b chunks.
  auto kdnd = ph.start_kdnd("kdnd-kivi4", ph.plan.host_arena_bytes / 2,
                            {"tier.gpu.codec=kivi4", "tier.gpu.staging_bytes=1G"}, &log);
  if (!kdnd.ok()) {
    f.fail("kdnd with tier.gpu.codec=kivi4 did not start: " + describe(kdnd.status()) + ": " + file_tail(log, 300));
    return f.put(ph.r, "kdn.decode_to_engine_gbps");
  }
  std::unique_ptr<EngineSession> s;
  if (auto st = EngineSession::open(ph.session(ph.root + "/kdnd-kivi4.sock", ph.o.device, 2 * ph.plan.bulk_bytes), &s);
      !st.ok()) {
    f.fail(st.message());
    return f.put(ph.r, "kdn.decode_to_engine_gbps");
  }
  for (uint32_t i = 0; i < ph.plan.reps; ++i) {
    const Set set = make_set(*s, 3000 + i, ph.plan.bulk_chunks);
    Timed ts, tr;
    if (auto st = timed_store(*s, set, &ts); !st.ok()) {
      f.fail(st.code() == KDN_ERR_UNSUPPORTED ? "kdnd does not support codec kivi4 in T0: " + st.message()
                                              : st.message());
      break;
    }
    // kdnd encodes the stored chunks on worker threads and publishes each blob in T0 once its
    // copy is queued: wait (bounded) until LOOKUP reports them all there.
    std::array<uint32_t, KDN_TIER_COUNT> tiers{};
    const uint64_t wait_from = now_ns();
    for (uint64_t waited = 0; waited < kEncodeWaitNs; waited = now_ns() - wait_from) {
      tiers = tiers_of(*s, set.tokens);
      if (tiers[0] == ph.plan.bulk_chunks) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (tiers[0] != ph.plan.bulk_chunks) {
      f.fail("kivi4 chunks stored from the engine were not all in T0 after " +
             std::to_string(kEncodeWaitNs / 1'000'000'000) + " s: " + tiers_text(tiers));
      break;
    }
    say("kivi4: %u chunks encoded into T0 %.0f ms after the store returned", ph.plan.bulk_chunks,
        double(now_ns() - wait_from) / 1e6);
    // kivi4 is lossy: the bytes cannot equal the pattern, so they are not compared.
    if (auto st = timed_retrieve(*s, set, ph.plan.bulk_chunks, false, &tr); !st.ok()) {
      f.fail(st.message());
      break;
    }
    f.values.push_back(tr.gbps);
    say("kivi4 T0 -> engine (decoded): %.1f GB/s", tr.gbps);
  }
  s.reset();
  (void)kdnd.value().stop();
  f.put(ph.r, "kdn.decode_to_engine_gbps");
}

void main_figures(Phase& ph) {
  std::string log;
  auto kdnd = ph.start_kdnd("kdnd", ph.plan.host_arena_bytes, {}, &log);
  if (!kdnd.ok()) {
    say("kdnd did not start: %s\n%s", describe(kdnd.status()).c_str(), file_tail(log).c_str());
    ph.failed = true;
    ph.why = "kdnd with [tier.gpu] on did not start: " + describe(kdnd.status()) + ": " + file_tail(log, 300);
    return;
  }
  const std::string socket = ph.root + "/kdnd.sock";
  std::unique_ptr<EngineSession> s;
  if (auto st = EngineSession::open(ph.session(socket, ph.o.device, ph.plan.engine_kv_bytes), &s); !st.ok()) {
    say("engine registration failed: %s\n%s", st.message().c_str(), file_tail(log).c_str());
    ph.failed = true;
    ph.why = "the engine could not register its cache: " + st.message();
    return;
  }
  say("registered %.1f GiB of paged KV (%u blocks of %u tokens) on device %d",
      s->shape().kv_bytes() / double(1ull << 30), s->shape().num_blocks, s->shape().block_size, ph.o.device);
  Figure t1, store, t0;
  std::optional<Set> from_host;
  t1_figures(ph, *s, &t1, &from_host);
  t1.put(ph.r, "kdn.t1_to_engine_gbps");
  auto resident = t0_figures(ph, *s, &store, &t0);
  // Without a set in T0 the later figures use chunks from the host (their tiers are reported).
  if (!resident) resident = std::move(from_host);
  store.put(ph.r, "kdn.engine_to_t0_gbps");
  t0.put(ph.r, "kdn.t0_to_engine_gbps");
  ph.failed |= t1.values.empty() || store.values.empty() || t0.values.empty();
  if (resident) {
    latency_figure(ph, *s, *resident);
    decode_slowdown_figure(ph, *s, *resident);
    peer_figure(ph, socket, *resident);
  } else {
    for (const char* k : {"kdn.retrieve_latency_us", "kdn.decode_step_slowdown", "kdn.peer_gbps"}) {
      ph.r.set_null(k);
      ph.r.set(std::string(k) + "_reason", "no chunks were stored");
    }
  }
  s.reset();
  (void)kdnd.value().stop();
}

}  // namespace

int run_gpu_bench(int argc, char** argv) {
  CLI::App app("kdn-bench gpu: kdnd's GPU tier with this process as the engine, against cudaMemcpyAsync");
  GpuOptions o;
  app.add_flag("--json", o.json, "print JSON");
  app.add_flag("--quick", o.sizes.quick, "smaller sizes (256 MiB per figure, a 2 GiB cache)");
  app.add_option("--model", o.model, "model preset")
      ->check(CLI::IsMember({"llama3-8b", "smollm2-135m"}))
      ->capture_default_str();
  app.add_option("--device", o.device, "CUDA device of the engine")->capture_default_str();
  app.add_option("--bulk-mib", o.sizes.bulk_mib, "bytes per bulk request and per baseline copy (MiB)");
  app.add_option("--reps", o.sizes.reps, "fresh sets per figure (median)")->check(CLI::Range(1u, 100u));
  app.add_option("--decode-mib", o.sizes.decode_mib, "KV the decode step reads (the engine's cache, MiB)");
  app.add_option("--latency-samples", o.sizes.latency_samples, "one-chunk retrieves timed")
      ->check(CLI::Range(1u, 100000u));
  app.add_option("--decode-steps", o.sizes.decode_steps, "decode steps timed per condition")
      ->check(CLI::Range(1u, 10000u));
  app.add_option("--kdnd", o.kdnd, "kdnd binary (default: next to kdn-bench)");
  app.add_option("--timeout-ms", o.timeout_ms, "bound of every device wait")->check(CLI::Range(1000u, 600000u));
  CLI11_PARSE(app, argc, argv);

  const int devices = device_count();
  if (devices == 0) {
    std::fprintf(stderr, "kdn-bench gpu: no CUDA device (or no driver): nothing to measure\n");
    return 2;
  }
  if (o.device < 0 || o.device >= devices) {
    std::fprintf(stderr, "kdn-bench gpu: no device %d (%d present)\n", o.device, devices);
    return 2;
  }
  const ModelPreset* preset = find_model_preset(o.model);
  const kdn_model_desc desc = preset_desc(*preset, preset->name);
  const PagedKvShape one_block = shape_for(desc, 1);
  const uint32_t T = desc.chunk_tokens ? desc.chunk_tokens : 256;
  const GpuPlan plan = plan_gpu_bench(o.sizes, one_block.token_bytes() * T, T);
  auto dir = TempDir::create("kdn-bench-gpu");
  if (!dir.ok()) {
    std::fprintf(stderr, "kdn-bench gpu: %s\n", describe(dir.status()).c_str());
    return 1;
  }

  Report r;
  r.set("device", device_name(o.device));
  r.set("devices", int64_t(devices));
  r.set("model", o.model);
  r.set("chunk_bytes", plan.chunk_bytes);
  r.set("bulk_chunks", uint64_t(plan.bulk_chunks));
  r.set("bulk_bytes", plan.bulk_bytes);
  r.set("reps", uint64_t(plan.reps));
  r.set("machine.loadavg_1m_start", load_average());

  say("baselines: cudaMemcpyAsync of %.2f GiB, pinned host and device...", plan.bulk_bytes / double(1ull << 30));
  CopyBaselines b;
  bool failed = false;
  if (auto st = measure_copy_baselines(o.device, plan.bulk_bytes, std::max(3u, plan.reps), &b); !st.ok()) {
    say("baselines failed: %s", st.message().c_str());
    failed = true;
    for (const char* k : {"baselines.h2d_pinned_gbps", "baselines.d2h_pinned_gbps", "baselines.d2d_gbps"})
      r.set_null(k);
  } else {
    r.set("baselines.h2d_pinned_gbps", b.h2d_pinned_gbps);
    r.set("baselines.d2h_pinned_gbps", b.d2h_pinned_gbps);
    r.set("baselines.d2d_gbps", b.d2d_gbps);
    say("h2d %.1f GB/s, d2h %.1f GB/s, d2d %.1f GB/s", b.h2d_pinned_gbps, b.d2h_pinned_gbps, b.d2d_gbps);
  }

  Phase ph{o, plan, r, dir.value().path()};
  main_figures(ph);
  decode_figure(ph);
  fill_missing_gpu_figures(
      r, ph.why.empty() ? "not measured: an earlier step failed (see the progress lines)" : ph.why.c_str());
  r.set("kdn.wrong_elements", ph.wrong);
  r.set("machine.loadavg_1m_end", load_average());
  add_gpu_ratios_and_bars(r);
  std::printf("%s\n", o.json ? r.to_json().c_str() : r.to_table().c_str());
  return failed || ph.failed || ph.wrong ? 1 : 0;
}

}  // namespace kdn::bench
