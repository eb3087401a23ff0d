// `kdn-bench remote`: T3 (RemoteTier over kdn's own RESP client) against hiredis on the same
// Redis Cluster, in one run. docs/benchmarks.md describes the figures.
//
// Loopback: a cluster of this machine's redis-server on 127.0.0.1 (3 masters with a replica
// each), the chunks written once through RemoteTier, then per repeat, in alternating order:
//   baselines.redis_get_gbps   hiredis GETs of those values (hiredis_cluster.h): routed by slot
//                              over pool_size connections per master (as many as T3's pool), at
//                              T3's depth; each chunk copied into a pre-faulted 4 KiB-aligned slot
//   kdn.t3_fetch_gbps          RemoteTier reads of the same chunks into the same slots: the
//                              transfers of a T3 -> T1 promotion; decoded bytes per second
// and every byte of both compared with what was written (wrong bytes). The ratio is the median
// of the per-repeat pairs. Lookups: RemoteTier::probe of one document's chain (16 keys: 4K
// tokens of 256-token chunks), one probe at a time (kdn.t3_lookup_rtt_*), beside the same
// EXISTS batch through hiredis (baselines.redis_exists_rtt_*).
//
// Limited link: loopback is never the bottleneck, so a second cluster runs in a network
// namespace behind a veth pair shaped to --link-gbit each way (shaped_link.h), and the chunks
// (the model's synthetic KV) are read per codec (link.kdn.t3_fetch_gbps_by_codec), beside
// hiredis through the same link (the raw rate the link gives). Where the link is the bottleneck
// a codec must raise the decoded rate. A codec the tier refuses is null, with the tier's reason
// under link.kdn.t3_fetch_gbps_by_codec.errors; without root the link part is skipped and
// link.skipped says why. Other reasons sit under errors.* beside the null figure they explain.
//
// End to end (llama.*, builds with llama.cpp): two kdnd processes standing for two nodes on one
// loopback cluster, SmolLM2-135M on llama.cpp in an engine process per node. Node A's engine
// prefills a --llama-size-token prompt (baselines.ttft_miss_s) and A uploads its chunks; node B's
// engine asks for the same prompt with B's kdnd holding nothing (kdn.ttft_remote_hit_s: the
// lookup asks T3, the lease promotes), then again with the chunks in B's arena
// (kdn.ttft_hit_s), --llama-reps pairs; tokens must equal A's.
#include "baseline_figures.h"
#include "commands.h"
#include "cpu_account.h"
#include "hiredis_cluster.h"
#include "kdnd_process.h"
#include "node_workload.h"
#include "process.h"
#include "redis_servers.h"
#include "remote_chunks.h"
#include "remote_format.h"
#include "remote_tier.h"
#include "report.h"
#include "shaped_link.h"
#include "stats.h"
#include "tier_loop.h"

#include <kdn/common/clock.h>
#include <kdn/common/model.h>

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace kdn::bench {
namespace {

using sidecar::ChunkIdentity;
using sidecar::Placement;
using sidecar::RemoteTier;
using sidecar::Transfer;
using sidecar::remote::RemoteCodec;

constexpr uint64_t kMiB = 1ull << 20;
const RemoteCodec kCodecs[] = {RemoteCodec::kNone, RemoteCodec::kLossless, RemoteCodec::kInt8, RemoteCodec::kKivi4};

struct RemoteOptions {
  bool json = false;
  std::string model = "smollm2-135m";
  uint64_t chunk_bytes = 0;  // 0: the model's
  uint64_t data_mib = 256;
  uint32_t chunks = 0;  // 0: data_mib worth
  uint32_t pool = 2;
  uint32_t depth = 16;
  uint32_t repeats = 5;
  uint32_t masters = 3;
  uint32_t replicas = 1;
  uint32_t doc_chunks = 16;
  uint32_t probe_samples = 2000;
  uint32_t timeout_ms = 2000;
  bool no_link = false;
  double link_gbit = 10;
  uint32_t link_mtu = 1500;
  uint64_t link_mib = 256;
  uint32_t link_replicas = 0;
  bool no_llama = false;
  uint32_t llama_size = 4096;
  uint32_t llama_reps = 5;
};

void say(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  vprogress("kdn-bench remote: ", format, args);
  va_end(args);
}

// The codec needs the model's geometry (RemoteTier::learn_model, as DiskTier has one).
void teach_model(RemoteTier& tier, const ModelInfo& model) { tier.learn_model(model); }

// ---- T3 through RemoteTier -------------------------------------------------------------------

Result<std::unique_ptr<RemoteTier>> make_tier(const std::string& host, int port, const RemoteOptions& o,
                                              RemoteCodec codec, const std::string& name_space,
                                              std::chrono::milliseconds timeout) {
  sidecar::RemoteTierOptions t;
  t.redis.seeds = {sidecar::NodeAddress{host, uint16_t(port)}};
  t.redis.cluster = true;
  t.redis.pool_size = o.pool;
  t.name_space = name_space;
  t.timeout = timeout;
  t.max_in_flight = std::max<uint32_t>(o.depth, 256);
  t.codec = codec;
  // Every chunk written is encoded (as kdnd's uploads are): the writes wait for the encoders
  // rather than go raw, so the reads measure the codec alone.
  t.encode_queue = std::max<uint32_t>(o.depth, 4);
  t.encode_wait = std::chrono::milliseconds(60'000);
  return RemoteTier::create(std::move(t));
}

struct Stored {
  std::vector<Placement> placements;
  std::vector<std::string> keys;  // the Redis keys, for hiredis
  uint64_t write_ns = 0;
};

// Writes every chunk of `set` through the tier (what a demotion to T3 does).
Result<Stored> store_chunks(RemoteTier& tier, TierLoop& loop, const ChunkSet& set, const ModelInfo& model,
                            uint32_t depth) {
  Stored s;
  for (uint32_t i = 0; i < set.count; ++i) {
    Result<Placement> p = tier.allocate(set.chunk_bytes);
    if (!p.ok()) return p.status();
    s.placements.push_back(*p);
  }
  Status failed;
  const uint64_t t0 = now_ns();
  Status st = loop.transfer_all(
      set.count, depth,
      [&](size_t i) {
        Transfer t;
        t.direction = Transfer::Direction::kWrite;
        t.placement = s.placements[i];
        t.host = const_cast<std::byte*>(set.chunk(uint32_t(i)));
        t.bytes = set.chunk_bytes;
        t.chunk = ChunkIdentity{set.keys[i], model.fingerprint};
        return t;
      },
      [&](size_t, const Status& c) {
        if (!c.ok() && failed.ok()) failed = c;
      });
  s.write_ns = now_ns() - t0;
  if (!st.ok()) return st;
  if (!failed.ok()) return failed;
  for (const Placement& p : s.placements) s.keys.push_back(tier.key_of(p));
  return s;
}

struct ReadPass {
  double gbps = 0;
  uint64_t failed = 0;
  Status first_failure;
};

// Reads every stored chunk into its slot (the transfers of a promotion); decoded bytes / s.
Result<ReadPass> tier_read_pass(TierLoop& loop, const Stored& s, uint64_t chunk_bytes, PageBuffer& slots,
                                uint32_t depth) {
  ReadPass r;
  const uint64_t stride = slot_stride(chunk_bytes);
  const uint64_t t0 = now_ns();
  Status st = loop.transfer_all(
      s.placements.size(), depth,
      [&](size_t i) {
        Transfer t;
        t.direction = Transfer::Direction::kRead;
        t.placement = s.placements[i];
        t.host = slots.data() + i * stride;
        t.bytes = chunk_bytes;
        return t;
      },
      [&](size_t, const Status& c) {
        if (c.ok()) return;
        if (r.failed++ == 0) r.first_failure = c;
      });
  const uint64_t ns = now_ns() - t0;
  if (!st.ok()) return st;
  r.gbps = gb_per_s(s.placements.size() * chunk_bytes, ns);
  return r;
}

// The same chunks through hiredis: each value's payload (after T3's header) into its slot.
Result<double> hiredis_read_pass(HiredisCluster& h, const Stored& s, uint64_t chunk_bytes, PageBuffer& slots,
                                 uint32_t depth) {
  const uint64_t stride = slot_stride(chunk_bytes);
  std::vector<GetTarget> targets;
  for (size_t i = 0; i < s.keys.size(); ++i) {
    targets.push_back(GetTarget{slots.data() + i * stride, sidecar::remote::kHeaderBytes, chunk_bytes,
                                sidecar::remote::kHeaderBytes + chunk_bytes});
  }
  const uint64_t t0 = now_ns();
  if (Status st = h.get_all(s.keys, targets, depth); !st.ok()) return st;
  return gb_per_s(s.keys.size() * chunk_bytes, now_ns() - t0);
}

// Overwrites every slot, so bytes a pass did not deliver read wrong (not timed).
void poison(PageBuffer& slots, uint32_t pass) { std::memset(slots.data(), 0x5A ^ int(pass & 1) * 0xFF, slots.size()); }

// The median of `runs` under `key`, every run under `key`_runs (null when there is none).
void set_runs(Report& r, const std::string& key, const std::vector<double>& runs) {
  if (runs.empty()) return r.set_null(key);
  r.set(key, median(runs));
  r.set_json(key + "_runs", Report::Json(runs));
}

// ---- loopback -------------------------------------------------------------------------------

// Probes of one document's chain, one at a time, and the same EXISTS through hiredis.
void lookup_figures(Report& r, const RemoteOptions& o, TierLoop& loop, HiredisCluster* h, const ChunkSet& set,
                    const Stored& s, const ModelInfo& model) {
  const uint32_t n = std::min(o.doc_chunks, set.count);
  std::vector<ChunkIdentity> chain;
  for (uint32_t i = 0; i < n; ++i) chain.push_back(ChunkIdentity{set.keys[i], model.fingerprint});
  const std::vector<std::string> keys(s.keys.begin(), s.keys.begin() + n);
  say("lookups: %u probes of a %u-key chain, one at a time...", o.probe_samples, n);
  std::vector<uint64_t> kdn_ns, redis_ns;
  uint64_t misses = 0;
  std::vector<uint8_t> exists;
  const uint32_t warmup = std::min<uint32_t>(100, o.probe_samples);
  for (uint32_t i = 0; i < warmup + o.probe_samples; ++i) {
    const uint64_t t0 = now_ns();
    Status st = loop.probe(chain, &exists);
    const uint64_t ns = now_ns() - t0;
    if (!st.ok() || std::count(exists.begin(), exists.end(), 1) != int64_t(n)) {
      ++misses;
      continue;
    }
    if (i >= warmup) kdn_ns.push_back(ns);
  }
  for (uint32_t i = 0; h != nullptr && i < warmup + o.probe_samples; ++i) {
    const uint64_t t0 = now_ns();
    Result<uint64_t> found = h->exists_all(keys);
    const uint64_t ns = now_ns() - t0;
    if (!found.ok() || *found != n) break;
    if (i >= warmup) redis_ns.push_back(ns);
  }
  r.set("kdn.t3_lookup_keys", uint64_t(n));
  r.set("kdn.t3_lookup_failures", misses);
  // <key>_p50_us and <key>_p99_us of the samples, null without any.
  auto latency = [&r](const std::string& key, std::vector<uint64_t>& samples) {
    if (samples.empty()) {
      r.set_null(key + "_p50_us");
      r.set_null(key + "_p99_us");
      return;
    }
    const LatencySummary s = summarize_ns(samples);
    r.set(key + "_p50_us", s.p50_us);
    r.set(key + "_p99_us", s.p99_us);
  };
  latency("kdn.t3_lookup_rtt", kdn_ns);
  latency("baselines.redis_exists_rtt", redis_ns);
}

// Per repeat one hiredis pass and one RemoteTier pass over the same chunks into the same
// slots, in alternating order, each checked byte for byte.
struct PairedPasses {
  std::vector<double> redis, kdn, pairs;  // GB/s, and kdn / redis per repeat
  uint64_t kdn_wrong = 0, redis_wrong = 0, failed_reads = 0;
  std::string failure, redis_failure;
};

PairedPasses paired_passes(const RemoteOptions& o, TierLoop& loop, HiredisCluster* h, const Stored& stored,
                           const ChunkSet& set, PageBuffer& slots) {
  PairedPasses p;
  for (uint32_t rep = 0; rep < o.repeats; ++rep) {
    std::optional<double> b, k;
    for (int side = 0; side < 2; ++side) {
      poison(slots, rep * 2 + side);
      if ((side == 0) == (rep % 2 == 1)) {  // kdn's turn: second in even repeats, first in odd ones
        Result<ReadPass> pass = tier_read_pass(loop, stored, set.chunk_bytes, slots, o.depth);
        if (!pass.ok()) {
          p.failure = describe(pass.status());
          continue;
        }
        p.failed_reads += pass->failed;
        if (pass->failed > 0 && p.failure.empty()) p.failure = describe(pass->first_failure);
        p.kdn_wrong += wrong_bytes(slots, set);
        if (pass->failed == 0) k = pass->gbps;
      } else if (h != nullptr) {
        Result<double> g = hiredis_read_pass(*h, stored, set.chunk_bytes, slots, o.depth);
        if (!g.ok()) {
          p.redis_failure = h->last_error();
          continue;
        }
        p.redis_wrong += wrong_bytes(slots, set);
        b = *g;
      }
    }
    if (k) p.kdn.push_back(*k);
    if (b) p.redis.push_back(*b);
    if (k && b) p.pairs.push_back(*k / *b);
    say("repeat %u/%u: hiredis %.3f GB/s, kdn %.3f GB/s", rep + 1, o.repeats, b.value_or(0), k.value_or(0));
  }
  return p;
}

void report_paired(Report& r, const PairedPasses& p) {
  set_runs(r, "baselines.redis_get_gbps", p.redis);
  r.set("baselines.redis_wrong_bytes", p.redis_wrong);
  if (!p.redis_failure.empty()) r.set("baselines.errors.redis_get_gbps", p.redis_failure);
  set_runs(r, "kdn.t3_fetch_gbps", p.kdn);
  r.set("kdn.t3_wrong_bytes", p.kdn_wrong);
  r.set("kdn.t3_failed_reads", p.failed_reads);
  if (!p.failure.empty()) r.set("kdn.errors.t3_fetch_gbps", p.failure);
  set_runs(r, "ratios.t3_fetch_vs_redis_get", p.pairs);
}

bool loopback_failed(Report& r, const std::string& why) {
  say("loopback: %s", why.c_str());
  r.set("errors.loopback", why);
  return false;
}

// Returns false when nothing could be measured (the reason is under errors.loopback).
bool loopback_phase(Report& r, const RemoteOptions& o, const ModelInfo& model, const ChunkSet& set) {
  testing::ClusterOptions co;
  co.masters = int(o.masters);
  co.replicas = int(o.replicas);
  say("starting a Redis Cluster on loopback: %u masters, %u replica(s) each...", o.masters, o.replicas);
  std::string why;
  std::unique_ptr<testing::RedisServers> servers = testing::RedisServers::cluster(co, &why);
  if (!servers) return loopback_failed(r, "the cluster did not start: " + why);
  r.set("config.cluster_dir", servers->dir());  // its logs while it runs; removed at exit
  const std::string host = servers->host();
  const int port = servers->servers().front().port;
  const std::chrono::milliseconds timeout(o.timeout_ms);
  auto tier = make_tier(host, port, o, RemoteCodec::kNone, "bench", timeout);
  if (!tier.ok()) return loopback_failed(r, describe(tier.status()));
  TierLoop loop(**tier);
  say("writing %u chunks of %llu bytes through RemoteTier...", set.count, (unsigned long long)set.chunk_bytes);
  Result<Stored> stored = store_chunks(**tier, loop, set, model, o.depth);
  if (!stored.ok()) return loopback_failed(r, "writing: " + describe(stored.status()));
  r.set("kdn.t3_write_gbps", gb_per_s(uint64_t(set.count) * set.chunk_bytes, stored->write_ns));
  const auto* map = (*tier)->client().slot_map();
  r.set("config.connections", uint64_t(map ? map->masters().size() * o.pool : 0));

  std::string no_baseline;
  auto h = HiredisCluster::connect(host, port, o.pool, timeout, &no_baseline);
  if (!h.ok()) {
    say("no hiredis baseline: %s", no_baseline.c_str());
    r.set("baselines.errors.redis_get_gbps", no_baseline);
  }
  r.set("config.baseline_connections", h.ok() ? uint64_t((*h)->connections()) : uint64_t(0));
  Result<PageBuffer> slots = make_slots(set.chunk_bytes, set.count);
  if (!slots.ok()) return loopback_failed(r, describe(slots.status()));
  const PairedPasses p = paired_passes(o, loop, h.ok() ? h->get() : nullptr, *stored, set, *slots);
  report_paired(r, p);
  lookup_figures(r, o, loop, h.ok() ? h->get() : nullptr, set, *stored, model);
  return !p.kdn.empty();
}

// ---- end to end with llama.cpp ---------------------------------------------------------------

void llama_phase(Report& r, const RemoteOptions& o) {
#if KDN_BENCH_HAVE_LLAMA
  auto fail = [&](const std::string& why) {
    say("end to end: %s", why.c_str());
    r.set("errors.llama", why);
    for (const char* k : {"kdn.ttft_remote_hit_s", "kdn.ttft_hit_s", "baselines.ttft_miss_s"}) r.set_null(k);
  };
  testing::ClusterOptions co;
  co.masters = int(o.masters);
  co.replicas = 0;
  say("end to end: a Redis Cluster of %u masters and two kdnd (nodes A and B)...", o.masters);
  std::string why;
  std::unique_ptr<testing::RedisServers> servers = testing::RedisServers::cluster(co, &why);
  if (!servers) return fail("the cluster did not start: " + why);
  char tmpl[] = "/tmp/kdn-bench-remote-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return fail("mkdtemp failed");
  const std::string dir = tmpl;
  const std::string ns = "llama-remote";
  auto start = [&](const char* node) {
    KdndOptions k;
    k.binary = default_kdnd_path();
    k.socket_path = dir + "/" + node + ".sock";
    k.host_arena_bytes = 512 * kMiB;
    k.log_path = dir + "/" + node + ".log";
    k.extra_args = {"--no-populate",
                    "--set",
                    "tier.remote.seeds=" + servers->host() + ":" + std::to_string(servers->servers().front().port),
                    "--set",
                    "tier.remote.pool=" + std::to_string(o.pool),
                    "--set",
                    "namespace." + ns + ".max_bytes=256M"};
    return KdndProcess::start(k);
  };
  auto a = start("a");
  auto b = a.ok() ? start("b") : Result<KdndProcess>(a.status());
  if (!a.ok() || !b.ok()) {
    std::filesystem::remove_all(dir);
    return fail("kdnd did not start: " + describe(a.ok() ? b.status() : a.status()));
  }
  say("end to end: node A prefills %u tokens, node B gets them from T3 (%u pairs)...", o.llama_size, o.llama_reps);
  const std::string text = remote_llama_ttft_json(dir + "/a.sock", dir + "/b.sock", ns, o.llama_size, o.llama_reps);
  (void)a->stop();
  (void)b->stop();
  std::filesystem::remove_all(dir);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || j.contains("error"))
    return fail(j.is_discarded() ? "no answer" : j["error"].get<std::string>());
  r.set("llama.prompt_tokens", uint64_t(o.llama_size));
  r.set("llama.chunks", j["chunks"].get<uint64_t>());
  r.set("llama.tokens_identical", j["tokens_identical"].get<bool>());
  r.set("baselines.ttft_miss_s", j["ttft_miss_s"].get<double>());
  set_runs(r, "kdn.ttft_remote_hit_s", j["ttft_remote_hit_runs_s"].get<std::vector<double>>());
  set_runs(r, "kdn.ttft_hit_s", j["ttft_hit_runs_s"].get<std::vector<double>>());
  r.set("ratios.ttft_remote_hit_vs_hit", j["remote_hit_vs_hit"].get<double>());
  r.set("ratios.ttft_miss_vs_remote_hit", j["remote_hit_speedup_vs_miss"].get<double>());
#else
  r.set("errors.llama", "this kdn-bench was built without llama.cpp (KDN_BUILD_LLAMA=OFF)");
  (void)o;
#endif
}

// ---- the limited link -----------------------------------------------------------------------

std::string codec_key(const char* prefix, RemoteCodec c) {
  return std::string(prefix) + "." + sidecar::remote::remote_codec_name(c);
}

void link_nulls(Report& r, const std::string& why) {
  r.set("link.skipped", why);
  r.set_null("link.baselines.redis_get_gbps");
  for (RemoteCodec c : kCodecs) r.set_null(codec_key("link.kdn.t3_fetch_gbps_by_codec", c));
}

// What a codec's values decode to, read back through hiredis and decoded here: the expected
// bytes of every RemoteTier read (lossy codecs only), and the median error against the original.
Result<PageBuffer> reference_chunks(HiredisCluster& h, const Stored& s, const ChunkSet& set, const ModelInfo& model,
                                    const std::string& name_space, std::vector<double>* errors) {
  Result<PageBuffer> ref = make_slots(set.chunk_bytes, set.count);
  if (!ref.ok()) return ref.status();
  for (uint32_t i = 0; i < set.count; ++i) {
    Result<std::string> value = h.get_value(s.keys[i]);
    if (!value.ok()) return value.status();
    std::byte* out = ref->data() + uint64_t(i) * set.stride;
    Result<ReferenceDecode> d = decode_stored_value(*value, name_space, set.keys[i], model, out);
    if (!d.ok()) return d.status();
    errors->push_back(relative_error(model, set.chunk(i), out));
  }
  return ref;
}

uint64_t wrong_against(const PageBuffer& slots, const PageBuffer* reference, const ChunkSet& set) {
  if (reference == nullptr) return wrong_bytes(slots, set);
  uint64_t wrong = 0;
  for (uint32_t i = 0; i < set.count; ++i) {
    const uint64_t at = uint64_t(i) * set.stride;
    wrong += wrong_bytes(slots.data() + at, reference->data() + at, set.chunk_bytes);
  }
  return wrong;
}

struct LinkSetup {
  std::string host;
  int port = 0;
  std::chrono::milliseconds timeout{};
  std::vector<pid_t> redis_pids;  // the servers behind the link, for the CPU accounting
};

// Where the CPU of a codec's timed kdn passes went, per decoded GB, and the rate the same work
// would reach if this process and the Redis servers had every core to themselves. When that
// bound sits below a bar, the cores, not the link or the codec's ratio, hold the rate back.
void set_cpu_figures(Report& r, RemoteCodec codec, const CpuSample& c, double decoded_gb) {
  const std::string at = codec_key("link.cpu", codec) + ".";
  if (decoded_gb <= 0 || c.wall_s <= 0) return;
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  r.set(at + "wall_s", c.wall_s);
  r.set(at + "self_core_s_per_gb", c.self_s / decoded_gb);
  r.set(at + "redis_core_s_per_gb", c.others_s / decoded_gb);
  r.set(at + "rest_core_s_per_gb", std::max(0.0, c.busy_s - c.self_s - c.others_s) / decoded_gb);
  r.set(at + "machine_busy_fraction", c.busy_s / (c.wall_s * cores));
  const double per_gb = (c.self_s + c.others_s) / decoded_gb;
  if (per_gb > 0) r.set(at + "bound_gbps", cores / per_gb);
}

// One codec's values behind the link, written through its own tier (namespace bench-<codec>)
// and sized; for a lossy codec also the bytes every read must produce (reference_chunks).
struct CodecValues {
  std::unique_ptr<RemoteTier> tier;
  std::unique_ptr<TierLoop> loop;
  Stored stored;
  std::optional<PageBuffer> reference;
  bool lossy = false;
};

// Null figures and the reason when the tier refuses the codec or the writes fail.
std::optional<CodecValues> store_codec(Report& r, const RemoteOptions& o, const ModelInfo& model, const ChunkSet& set,
                                       const LinkSetup& link, HiredisCluster* h, RemoteCodec codec) {
  const char* name = sidecar::remote::remote_codec_name(codec);
  const std::string ns = std::string("bench-") + name;
  auto refuse = [&](const std::string& why) {
    say("link: codec %s: %s", name, why.c_str());
    r.set_null(codec_key("link.kdn.t3_fetch_gbps_by_codec", codec));
    r.set(codec_key("link.kdn.t3_fetch_gbps_by_codec.errors", codec), why);
    return std::nullopt;
  };
  auto tier = make_tier(link.host, link.port, o, codec, ns, link.timeout);
  if (!tier.ok()) return refuse(describe(tier.status()));
  CodecValues v;
  v.tier = std::move(tier).value();
  teach_model(*v.tier, model);
  v.loop = std::make_unique<TierLoop>(*v.tier);
  say("link: codec %s: writing %u chunks...", name, set.count);
  Result<Stored> stored = store_chunks(*v.tier, *v.loop, set, model, o.depth);
  if (!stored.ok()) return refuse("writing: " + describe(stored.status()));
  v.stored = std::move(stored).value();
  r.set(codec_key("link.kdn.t3_write_gbps_by_codec", codec),
        gb_per_s(uint64_t(set.count) * set.chunk_bytes, v.stored.write_ns));
  uint64_t payload = 0;  // what the store holds: raw bytes over payload bytes
  for (size_t i = 0; h != nullptr && i < v.stored.keys.size(); ++i) {
    Result<uint64_t> len = h->value_length(v.stored.keys[i]);
    if (!len.ok()) break;
    payload += *len - std::min<uint64_t>(*len, sidecar::remote::kHeaderBytes);
  }
  if (payload > 0)
    r.set(codec_key("link.kdn.codec_ratio", codec), double(uint64_t(set.count) * set.chunk_bytes) / double(payload));
  v.lossy = codec == RemoteCodec::kInt8 || codec == RemoteCodec::kKivi4;
  if (v.lossy && h != nullptr) {
    std::vector<double> errors;
    Result<PageBuffer> ref = reference_chunks(*h, v.stored, set, model, ns, &errors);
    if (ref.ok()) {
      v.reference.emplace(std::move(ref).value());
      r.set(codec_key("link.kdn.codec_rel_error", codec), median(errors));
    } else {
      say("link: codec %s: no reference decode: %s", name, describe(ref.status()).c_str());
    }
  }
  return v;
}

// One codec through the link: read `repeats` times and checked; with codec none, each read is
// paired with a hiredis pass over the same values (the rate the link gives hiredis).
void link_codec(Report& r, const RemoteOptions& o, const ModelInfo& model, const ChunkSet& set, const LinkSetup& link,
                HiredisCluster* h, RemoteCodec codec, uint64_t* wrong_total) {
  std::optional<CodecValues> v = store_codec(r, o, model, set, link, h, codec);
  if (!v) return;
  Result<PageBuffer> slots = make_slots(set.chunk_bytes, set.count);
  if (!slots.ok()) return;
  const bool checked = !v->lossy || v->reference;
  std::vector<double> runs, redis_runs;
  uint64_t wrong = 0, failed = 0;
  CpuSample cpu;
  double decoded_gb = 0;
  for (uint32_t rep = 0; rep < o.repeats; ++rep) {
    double redis = 0;
    if (codec == RemoteCodec::kNone && h != nullptr) {
      poison(*slots, rep);
      Result<double> g = hiredis_read_pass(*h, v->stored, set.chunk_bytes, *slots, o.depth);
      if (g.ok()) {
        redis_runs.push_back(redis = *g);
        *wrong_total += wrong_bytes(*slots, set);
      }
    }
    poison(*slots, rep + 1);
    const CpuSample before = cpu_sample(link.redis_pids);
    Result<ReadPass> p = tier_read_pass(*v->loop, v->stored, set.chunk_bytes, *slots, o.depth);
    if (!p.ok()) continue;
    failed += p->failed;
    if (p->failed == 0) {
      runs.push_back(p->gbps);
      cpu += cpu_sample(link.redis_pids) - before;
      decoded_gb += double(uint64_t(set.count) * set.chunk_bytes) * 1e-9;
    }
    if (checked) wrong += wrong_against(*slots, v->reference ? &*v->reference : nullptr, set);
    say("link: codec %s: repeat %u/%u: kdn %.3f GB/s decoded, hiredis %.3f GB/s",
        sidecar::remote::remote_codec_name(codec), rep + 1, o.repeats, p->failed ? 0.0 : p->gbps, redis);
  }
  set_runs(r, codec_key("link.kdn.t3_fetch_gbps_by_codec", codec), runs);
  set_cpu_figures(r, codec, cpu, decoded_gb);
  if (checked) {
    r.set(codec_key("link.kdn.wrong_bytes", codec), wrong);
  } else {
    r.set_null(codec_key("link.kdn.wrong_bytes", codec));  // nothing to compare with
  }
  r.set(codec_key("link.kdn.failed_reads", codec), failed);
  *wrong_total += wrong;
  if (codec == RemoteCodec::kNone) set_runs(r, "link.baselines.redis_get_gbps", redis_runs);
}

void link_phase(Report& r, const RemoteOptions& o, const ModelInfo& model, const ChunkSet* loopback_set,
                uint64_t* wrong_total) {
  if (o.no_link) return link_nulls(r, "--no-link");
  ShapedLinkOptions lo;
  lo.rate_gbit = o.link_gbit;
  lo.mtu = o.link_mtu;
  say("link: a network namespace behind a veth pair at %.3g Gbit/s each way...", o.link_gbit);
  std::string why;
  Result<std::unique_ptr<ShapedLink>> link = ShapedLink::create(lo, &why);
  if (!link.ok()) {
    say("link: skipped: %s", why.c_str());
    return link_nulls(r, why);
  }
  r.set("link.netns", (*link)->netns());
  r.set("link.rate_gbit", o.link_gbit);
  r.set("link.mtu", uint64_t(o.link_mtu));
  r.set("link.qdisc", (*link)->describe());
  r.set("link.baselines.link_gbps", o.link_gbit / 8);  // GB/s the link carries each way
  testing::ClusterOptions co;
  co.masters = int(o.masters);
  co.replicas = int(o.link_replicas);
  co.host = (*link)->peer_address();
  co.netns = (*link)->netns();
  say("link: starting a Redis Cluster in %s at %s: %u masters, %u replica(s) each...", co.netns.c_str(),
      co.host.c_str(), o.masters, o.link_replicas);
  std::unique_ptr<testing::RedisServers> servers = testing::RedisServers::cluster(co, &why);
  if (!servers) return link_nulls(r, "the cluster behind the link did not start: " + why);
  r.set("link.cluster_dir", servers->dir());

  // The model's chunks (synthetic KV: codecs need it); the loopback set when it is that.
  const uint32_t count = uint32_t(std::max<uint64_t>(o.depth, o.link_mib * kMiB / model.chunk_bytes));
  std::optional<ChunkSet> own;
  const ChunkSet* set = loopback_set;
  if (set == nullptr || !set->synthetic_kv || set->count != count) {
    say("link: generating %u chunks of synthetic KV...", count);
    Result<ChunkSet> made = make_chunks(model, model.chunk_bytes, count);
    if (!made.ok()) return link_nulls(r, describe(made.status()));
    own.emplace(std::move(made).value());
    set = &*own;
  }
  r.set("link.chunks", uint64_t(set->count));
  // Every request may wait behind a full pipeline at the link's rate.
  const double pipeline_s = double(o.depth) * double(set->chunk_bytes) / (o.link_gbit * 1e9 / 8);
  LinkSetup setup{co.host, servers->servers().front().port,
                  std::chrono::milliseconds(std::max<uint64_t>(o.timeout_ms, uint64_t(4000 * pipeline_s))), {}};
  for (const auto& server : servers->servers()) setup.redis_pids.push_back(server.pid);
  r.set("link.timeout_ms", uint64_t(setup.timeout.count()));
  std::string no_baseline;
  auto h = HiredisCluster::connect(setup.host, setup.port, o.pool, setup.timeout, &no_baseline);
  if (!h.ok()) {
    say("link: no hiredis baseline: %s", no_baseline.c_str());
    r.set("link.baselines.errors.redis_get_gbps", no_baseline);
  }
  for (RemoteCodec c : kCodecs) link_codec(r, o, model, *set, setup, h.ok() ? h->get() : nullptr, c, wrong_total);
  const auto none = r.number("link.kdn.t3_fetch_gbps_by_codec.none");
  for (RemoteCodec c : kCodecs) {
    r.set(codec_key("link.ratios.t3_fetch_vs_none", c),
          ratio(r.number(codec_key("link.kdn.t3_fetch_gbps_by_codec", c)), none));
    r.set(codec_key("link.ratios.cpu_bound_vs_none", c),
          ratio(r.number(codec_key("link.cpu", c) + ".bound_gbps"), none));
  }
  r.set("link.ratios.redis_get_vs_link", ratio(r.number("link.baselines.redis_get_gbps"), o.link_gbit / 8));
  r.set("link.ratios.t3_fetch_none_vs_link", ratio(none, o.link_gbit / 8));
}

}  // namespace

int run_remote_bench(int argc, char** argv) {
  CLI::App app(
      "kdn-bench remote: T3 (RemoteTier) against hiredis on the same Redis Cluster, on loopback and "
      "behind a rate-limited link");
  RemoteOptions o;
  app.add_flag("--json", o.json, "print JSON");
  app.add_option("--model", o.model, "chunk geometry (smollm2-135m, llama3-8b)")->capture_default_str();
  app.add_option("--chunk-bytes", o.chunk_bytes, "chunk size on loopback (0: the model's 256-token chunk)")
      ->capture_default_str();
  app.add_option("--data-mib", o.data_mib, "chunk bytes stored and read per pass on loopback")->capture_default_str();
  app.add_option("--chunks", o.chunks, "chunks on loopback (0: --data-mib worth)")->capture_default_str();
  app.add_option("--pool", o.pool, "connections per master (RemoteTier's pool and hiredis alike)")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  app.add_option("--depth", o.depth, "transfers in flight (both sides)")
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  app.add_option("--repeats", o.repeats, "read passes per side (medians)")
      ->check(CLI::Range(1u, 50u))
      ->capture_default_str();
  app.add_option("--masters", o.masters, "cluster masters")->check(CLI::Range(1u, 16u))->capture_default_str();
  app.add_option("--replicas", o.replicas, "replicas per master on loopback")
      ->check(CLI::Range(0u, 4u))
      ->capture_default_str();
  app.add_option("--doc-chunks", o.doc_chunks, "keys per lookup (16: a 4K-token document)")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  app.add_option("--probe-samples", o.probe_samples, "lookups timed per side")->capture_default_str();
  app.add_option("--timeout-ms", o.timeout_ms, "request deadline (RemoteTier's remote_timeout_ms)")
      ->capture_default_str();
  app.add_flag("--no-link", o.no_link, "skip the rate-limited link");
  app.add_flag("--no-llama", o.no_llama, "skip the end-to-end part with llama.cpp");
  app.add_option("--llama-size", o.llama_size, "prompt tokens of the end-to-end part")->capture_default_str();
  app.add_option("--llama-reps", o.llama_reps, "remote-hit / hit pairs of the end-to-end part")
      ->check(CLI::Range(1u, 100u))
      ->capture_default_str();
  app.add_option("--link-gbit", o.link_gbit, "the link's rate each way, Gbit/s")->capture_default_str();
  app.add_option("--link-mtu", o.link_mtu, "the link's MTU")->capture_default_str();
  app.add_option("--link-mib", o.link_mib, "chunk bytes per codec behind the link")->capture_default_str();
  app.add_option("--link-replicas", o.link_replicas, "replicas per master behind the link")
      ->check(CLI::Range(0u, 4u))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::optional<ModelLayout> layout = find_model(o.model);
  if (!layout) {
    std::fprintf(stderr, "kdn-bench remote: unknown model %s\n", o.model.c_str());
    return 2;
  }
  if (std::string why = testing::redis_missing(); !why.empty()) {
    std::fprintf(stderr, "kdn-bench remote: %s\n", why.c_str());
    return 1;
  }
  Result<ModelInfo> model = ModelInfo::from_desc(model_desc(*layout));
  if (!model.ok()) return 1;
  const uint64_t chunk = o.chunk_bytes ? o.chunk_bytes : model->chunk_bytes;
  const uint32_t count = o.chunks ? o.chunks : uint32_t(std::max<uint64_t>(o.depth, o.data_mib * kMiB / chunk));

  Report r;
  r.set("config.model", o.model);
  r.set("config.chunk_bytes", chunk);
  r.set("config.chunks", uint64_t(count));
  r.set("config.data_bytes", chunk * count);
  r.set("config.masters", uint64_t(o.masters));
  r.set("config.replicas", uint64_t(o.replicas));
  r.set("config.pool_size", uint64_t(o.pool));
  r.set("config.depth", uint64_t(o.depth));
  r.set("config.repeats", uint64_t(o.repeats));
  r.set("config.timeout_ms", uint64_t(o.timeout_ms));
  r.set("machine.cores", uint64_t(::sysconf(_SC_NPROCESSORS_ONLN)));
  r.set("machine.loadavg_1m_start", load_average());

  say("generating %u chunks of %llu bytes%s...", count, (unsigned long long)chunk,
      chunk == model->chunk_bytes ? " of synthetic KV" : "");
  Result<ChunkSet> set = make_chunks(*model, chunk, count);
  if (!set.ok()) {
    std::fprintf(stderr, "kdn-bench remote: %s\n", describe(set.status()).c_str());
    return 1;
  }
  const bool measured = loopback_phase(r, o, *model, *set);
  uint64_t link_wrong = 0;
  link_phase(r, o, *model, &*set, &link_wrong);
  if (!o.no_llama) llama_phase(r, o);
  r.set("machine.loadavg_1m_end", load_average());

  const auto kdn_wrong = r.number("kdn.t3_wrong_bytes"), redis_wrong = r.number("baselines.redis_wrong_bytes");
  std::optional<double> wrong;
  if (kdn_wrong) wrong = *kdn_wrong + redis_wrong.value_or(0) + double(link_wrong);
  if (wrong) {
    r.set("wrong_bytes_total", uint64_t(*wrong));
  } else {
    r.set_null("wrong_bytes_total");
  }
  r.set_bar("bars.t3_fetch_vs_redis_get", r.number("ratios.t3_fetch_vs_redis_get"), BarOp::kAtLeast, 0.8);
  r.set_bar("bars.kivi4_vs_none_on_link", r.number("link.ratios.t3_fetch_vs_none.kivi4"), BarOp::kAtLeast, 2.0);
  r.set_bar("bars.wrong_bytes", wrong, BarOp::kAtMost, 0.0);
  r.set_bar("bars.ttft_remote_hit_vs_hit", r.number("ratios.ttft_remote_hit_vs_hit"), BarOp::kAtMost, 1.5);
  std::printf("%s\n", o.json ? r.to_json().c_str() : r.to_table().c_str());
  return measured ? 0 : 1;
}

}  // namespace kdn::bench
