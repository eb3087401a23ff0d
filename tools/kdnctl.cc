// kdnctl: operator CLI for kdnd.
//
//   kdnctl ping [-c N] [-w N]        round trips through the rings: busy-poll and wake-up
//   kdnctl stats [--json|--prometheus]   the namespace's counters, then one block per tier
//   kdnctl stats --watch [S] [--count N] a live view: counters and rates every S seconds
//   kdnctl ls [--limit N] [--tier T]     chunks: key, model, fastest tier, tiers holding a copy,
//                                        state, leases, size, age, idle time, prefix chain/position
//   kdnctl evict --all | --key HEX       evict unleased chunks from every tier
//   kdnctl evict --all --tier host       move unleased chunks out of the arena into the disk tier
//
// kdnctl connects read-only (no staging area) and asks for admin rights; kdnd grants them
// only to uids its configuration names (admin_uids), which `ls` and `evict` need.
#include "client.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/ops.h>
#include <kdn/ipc/protocol.h>

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using kdn::Status;
using kdn::shim::Client;
using kdn::shim::Request;

namespace {

int fail(const char* what, const Status& st) {
  std::fprintf(stderr, "kdnctl: %s: %s\n", what, st.what());
  return 1;
}
int fail_code(const char* what, int code) {
  std::fprintf(stderr, "kdnctl: %s: %s\n", what, kdn::code_name(kdn::Code(code)));
  if (code == KDN_ERR_PERMISSION)
    std::fprintf(stderr,
                 "kdnctl: this needs admin rights: add this uid to admin_uids (daemon-wide or in "
                 "[namespace.NAME]) in kdnd's configuration\n");
  return 1;
}

// One ping's round trip in microseconds; negative after printing the failure.
double ping_once(Client& c, uint64_t seq) {
  using Op = kdn::ipc::PingOp;
  Request r;
  r.sqe.opcode = uint8_t(Op::kOpcode);
  const Op::Args args{seq};
  Op::put(args, r.sqe);
  const uint64_t t0 = kdn::now_ns();
  auto cqe = c.call(r);
  if (!cqe.ok()) return fail("ping", cqe.status()), -1;
  if (cqe->status) return fail_code("ping", cqe->status), -1;
  if (auto ok = Op::result(*cqe, args); !ok.ok()) return fail("ping", ok.status()), -1;
  return double(kdn::now_ns() - t0) / 1e3;
}

void print_round_trips(const char* label, std::vector<double> us, const char* why) {
  std::sort(us.begin(), us.end());
  const auto at = [&](double q) { return us[std::min(us.size() - 1, size_t(q * double(us.size())))]; };
  std::printf("  %-22s p50 %8.2f us   p99 %8.2f us   max %8.2f us   (%zu pings: %s)\n", label, at(0.5), at(0.99),
              us.back(), us.size(), why);
}

// Two round trips an engine can see. Busy-poll: requests back to back, kdnd spinning on the
// rings (the control path's own cost). Wake-up: a request after kdnd went to sleep (it sleeps
// spin_us after its last request), which rings the doorbell and pays for the kernel waking
// it. A quiet node shows the first near 1 us; an engine that sends requests further apart
// than spin_us pays the second.
int cmd_ping(Client& c, int count, int wakes) {
  std::vector<double> busy, wake;
  uint64_t seq = 1;
  for (int i = 0; i < count; ++i) {
    const double us = ping_once(c, seq++);
    if (us < 0) return 1;
    if (i > 0 || count == 1) busy.push_back(us);  // the first one may have woken kdnd
  }
  int not_asleep = 0;
  for (int i = 0; i < wakes; ++i) {
    const uint64_t deadline = kdn::now_ns() + 2'000'000'000ull;
    while (!c.daemon_sleeping() && kdn::now_ns() < deadline) ::usleep(100);
    not_asleep += !c.daemon_sleeping();  // other sessions keep it awake
    const double us = ping_once(c, seq++);
    if (us < 0) return 1;
    wake.push_back(us);
  }
  std::printf("kdnd is alive:\n");
  print_round_trips("busy-poll round trip", busy, "back to back, kdnd spinning");
  if (!wake.empty())
    print_round_trips("wake-up round trip", wake,
                      not_asleep ? "kdnd was kept awake by other sessions" : "each after kdnd went to sleep");
  return 0;
}

struct Field {
  std::string name;
  uint64_t v;
};

std::vector<Field> stats_fields(const kdn::ipc::StatsRecord& s, bool admin) {
  std::vector<Field> f = {{"lookups", s.lookups},
                          {"lookup_hit_chunks", s.lookup_hit_chunks},
                          {"lookup_miss_chunks", s.lookup_miss_chunks},
                          {"leases", s.leases},
                          {"lease_hit_chunks", s.lease_hit_chunks},
                          {"lease_miss_chunks", s.lease_miss_chunks},
                          {"stored_chunks", s.stored_chunks},
                          {"stored_bytes", s.stored_bytes},
                          {"retrieved_chunks", s.retrieved_chunks},
                          {"retrieved_bytes", s.retrieved_bytes},
                          {"evicted_chunks", s.evicted_chunks},
                          {"dropped_chunks", s.dropped_chunks},
                          {"demoted_chunks", s.demoted_chunks},
                          {"promoted_chunks", s.promoted_chunks},
                          {"corrupt_chunks", s.corrupt_chunks},
                          {"active_leases", s.active_leases},
                          {"open_reservations", s.open_reservations},
                          {"expired_reservations", s.expired_reservations},
                          {"transfers_in_flight", s.in_flight_ops},
                          {"sessions", s.sessions},
                          {"staging_bytes", s.staging_bytes},
                          {"protocol_errors", s.protocol_errors},
                          {"limit_errors", s.limit_errors},
                          {"host_prefault_left_bytes", s.host_prefault_left_bytes}};
  static const char* kTiers[] = {"gpu", "host", "disk", "remote"};
  for (uint32_t t = 0; t < kdn::ipc::kTierCount; ++t) {
    if (s.capacity_bytes[t] == 0) continue;
    f.push_back({std::string("resident_chunks.") + kTiers[t], s.resident_chunks[t]});
    f.push_back({std::string("resident_bytes.") + kTiers[t], s.resident_bytes[t]});
    f.push_back({std::string("capacity_bytes.") + kTiers[t], s.capacity_bytes[t]});
  }
  // An admin of one namespace only gets no daemon-wide words (zeros; daemon.namespaces, at
  // least the session's own for an admin of every namespace, tells them apart).
  if (admin && s.daemon_namespaces > 0) {
    f.push_back({"daemon.sessions", s.daemon_sessions});
    f.push_back({"daemon.requests", s.daemon_requests});
    f.push_back({"daemon.handshakes_refused", s.daemon_handshakes_refused});
    f.push_back({"daemon.namespaces", s.daemon_namespaces});
  }
  return f;
}

const char* codec_label(uint64_t c) {
  static const char* kCodecs[] = {"none", "lossless", "int8", "kivi4"};
  return c < 4 ? kCodecs[c] : "?";
}

// Sends an op that takes no input and writes up to `n` records; its result and the records it
// wrote, or false when kdnd refused it (the payload is freed either way).
template <class Op>
bool call_records(Client& c, uint32_t n, typename Op::Result* result, std::vector<typename Op::OutRecord>* recs) {
  auto o = c.alloc_payload(n * sizeof(typename Op::OutRecord));
  if (!o.ok()) return false;
  Request r;
  r.sqe.opcode = uint8_t(Op::kOpcode);
  r.out = *o;
  r.sqe.out_len = n * sizeof(typename Op::OutRecord);
  auto cqe = c.call(r);
  bool ok = cqe.ok() && cqe->status == KDN_OK;
  if (ok) {
    auto got = Op::result(*cqe, n);
    ok = got.ok();
    if (ok) {
      *result = *got;
      recs->resize(got->written);
      std::memcpy(recs->data(), c.payload_ptr(*o), recs->size() * sizeof(typename Op::OutRecord));
    }
  }
  c.free_payload(*o);
  return ok;
}

// TIER_STATS as fields "tier.<name>.<counter>"; empty when kdnd predates it.
std::vector<Field> tier_fields(Client& c) {
  using Op = kdn::ipc::TierStatsOp;
  std::vector<Field> f;
  if (c.welcome().proto_minor < 1) return f;
  constexpr uint32_t n = kdn::ipc::kTierCount;
  Op::Result got;
  std::vector<Op::OutRecord> recs;
  if (!call_records<Op>(c, n, &got, &recs)) return f;
  static const char* kTiers[] = {"gpu", "host", "disk", "remote"};
  for (const auto& t : recs) {
    if (!t.present || t.tier >= n) continue;
    const std::string p = std::string("tier.") + kTiers[t.tier] + ".";
    auto add = [&](const char* name, uint64_t v) { f.push_back({p + name, v}); };
    add("capacity_bytes", t.capacity_bytes);
    add("used_bytes", t.used_bytes);
    add("resident_chunks", t.resident_chunks);
    add("resident_bytes", t.resident_bytes);
    add("lookup_hit_chunks", t.lookup_hit_chunks);
    if (c.welcome().proto_minor >= 3) add("lease_hit_chunks", t.lease_hit_chunks);
    add("in_flight", t.in_flight);
    if (t.tier == uint32_t(kdn::ipc::ChunkTier::kRemote)) {
      add("found_chunks", t.recovered_chunks);
      add("promoted_chunks", t.promoted_chunks);
      add("promoted_bytes", t.promoted_bytes);
      add("uploaded_chunks", t.written_through_chunks);
      add("reads", t.reads);
      add("read_bytes", t.read_bytes);
      add("writes", t.writes);
      add("write_bytes", t.write_bytes);
      add("faults.unreachable", t.fault_io);
      add("faults.no_space", t.fault_no_space);
      add("faults.missing", t.fault_eof);
      add("faults.damaged", t.fault_crc);
      add("faults.decode", t.fault_decode);
      add("raw_bytes_written", t.raw_bytes_written);
      add("stored_bytes_written", t.stored_bytes_written);
      continue;
    }
    if (t.tier == uint32_t(kdn::ipc::ChunkTier::kGpu)) {  // T0: the devices', every namespace's
      add("promoted_chunks", t.promoted_chunks);
      add("promoted_bytes", t.promoted_bytes);
      continue;
    }
    if (t.tier != uint32_t(kdn::ipc::ChunkTier::kDisk)) continue;
    add("promoted_chunks", t.promoted_chunks);
    add("promoted_bytes", t.promoted_bytes);
    add("demoted_chunks", t.demoted_chunks);
    add("demoted_bytes", t.demoted_bytes);
    add("written_through_chunks", t.written_through_chunks);
    add("reads", t.reads);
    add("read_bytes", t.read_bytes);
    add("writes", t.writes);
    add("write_bytes", t.write_bytes);
    add("raw_bytes_written", t.raw_bytes_written);
    add("stored_bytes_written", t.stored_bytes_written);
    add("reencoded_chunks", t.reencoded_chunks);
    add("pending_reencode", t.pending_reencode);
    add("faults.io", t.fault_io);
    add("faults.no_space", t.fault_no_space);
    add("faults.end_of_file", t.fault_eof);
    add("faults.crc", t.fault_crc);
    add("faults.decode", t.fault_decode);
    add("retries", t.retries);
    add("short_transfers", t.short_transfers);
    add("recovered_chunks", t.recovered_chunks);
    add("queue_depth", t.queue_depth);
    add("codec", t.codec);
    add("fixed_buffers", (t.flags & kdn::ipc::kTierStatsFixedBuffers) ? 1 : 0);
    add("degraded", (t.flags & kdn::ipc::kTierStatsDegraded) ? 1 : 0);
  }
  return f;
}

// kdnd's Prometheus page, exactly as its endpoint and metrics file serve it (admin).
int cmd_metrics(Client& c) {
  using Op = kdn::ipc::MetricsOp;
  uint32_t room = std::min<uint32_t>(64 * 1024, c.welcome().payload_bytes);
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto o = c.alloc_payload(room);
    if (!o.ok()) return fail("stats --prometheus", o.status());
    Request r;
    r.sqe.opcode = uint8_t(Op::kOpcode);
    r.out = *o;
    r.sqe.out_len = room;
    auto cqe = c.call(r);
    c.free_payload(*o);
    if (!cqe.ok()) return fail("stats --prometheus", cqe.status());
    if (cqe->status == KDN_ERR_NO_SPACE && cqe->res[1] > room && cqe->res[1] + 4096 <= c.welcome().payload_bytes) {
      room = uint32_t(cqe->res[1]) + 4096;  // the page may grow a little meanwhile
      continue;
    }
    if (cqe->status) return fail_code("stats --prometheus", cqe->status);
    auto got = Op::result(*cqe, room);
    if (!got.ok()) return fail("stats --prometheus", got.status());
    std::fwrite(c.payload_ptr(*o), 1, got->written, stdout);
    return 0;
  }
  return fail("stats --prometheus", kdn::Status(kdn::Code::kNoSpace, "the metrics page does not fit the payload area"));
}

// STATS into *s (words a daemon of an older minor does not send stay zero); 0 or 1 after
// printing the failure.
int read_stats(Client& c, kdn::ipc::StatsRecord* s) {
  using Op = kdn::ipc::StatsOp;
  constexpr uint32_t kWords = sizeof(kdn::ipc::StatsRecord) / sizeof(uint64_t);
  auto o = c.alloc_payload(sizeof(kdn::ipc::StatsRecord));
  if (!o.ok()) return fail("stats", o.status());
  Request r;
  r.sqe.opcode = uint8_t(Op::kOpcode);
  r.out = *o;
  r.sqe.out_len = sizeof(kdn::ipc::StatsRecord);
  auto cqe = c.call(r);
  if (!cqe.ok()) return c.free_payload(*o), fail("stats", cqe.status());
  if (cqe->status) return c.free_payload(*o), fail_code("stats", cqe->status);
  auto got = Op::result(*cqe, kWords);
  if (!got.ok()) return c.free_payload(*o), fail("stats", got.status());
  *s = kdn::ipc::StatsRecord{};
  std::memcpy(s, c.payload_ptr(*o), got->words * sizeof(uint64_t));
  c.free_payload(*o);
  return 0;
}

volatile std::sig_atomic_t g_interrupted = 0;
void on_sigint(int) { g_interrupted = 1; }

// Sleeps `seconds`, waking early on SIGINT; false if interrupted.
bool sleep_unless_interrupted(double seconds) {
  const uint64_t until = kdn::now_ns() + uint64_t(seconds * 1e9);
  while (!g_interrupted && kdn::now_ns() < until) ::usleep(20'000);
  return !g_interrupted;
}

// What `stats --watch` shows each interval: totals and the rate since the previous refresh.
struct WatchRow {
  const char* name;
  uint64_t (*get)(const kdn::ipc::StatsRecord&);
};
const WatchRow kWatchRows[] = {
    {"hit_chunks", [](const kdn::ipc::StatsRecord& s) { return s.lookup_hit_chunks + s.lease_hit_chunks; }},
    {"miss_chunks", [](const kdn::ipc::StatsRecord& s) { return s.lookup_miss_chunks + s.lease_miss_chunks; }},
    {"lookups", [](const kdn::ipc::StatsRecord& s) { return s.lookups; }},
    {"leases", [](const kdn::ipc::StatsRecord& s) { return s.leases; }},
    {"stored_chunks", [](const kdn::ipc::StatsRecord& s) { return s.stored_chunks; }},
    {"bytes_in", [](const kdn::ipc::StatsRecord& s) { return s.stored_bytes; }},
    {"bytes_out", [](const kdn::ipc::StatsRecord& s) { return s.retrieved_bytes; }},
    {"evicted_chunks", [](const kdn::ipc::StatsRecord& s) { return s.evicted_chunks; }},
};

void print_watch(const std::string& ns, int refresh, double dt, const kdn::ipc::StatsRecord& now,
                 const kdn::ipc::StatsRecord& before, bool clear) {
  if (clear) std::printf("\033[H\033[2J");
  std::printf("kdnd namespace %s, refresh %d, over the last %.2f s (Ctrl-C to stop)\n", ns.c_str(), refresh, dt);
  std::printf("%-16s %16s %14s\n", "counter", "total", "per_s");
  for (const WatchRow& row : kWatchRows) {
    const uint64_t v = row.get(now), was = row.get(before);
    std::printf("%-16s %16" PRIu64 " %14.1f\n", row.name, v, dt > 0 && v >= was ? double(v - was) / dt : 0.0);
  }
  const uint64_t hits = kWatchRows[0].get(now) - kWatchRows[0].get(before);
  const uint64_t asked = hits + kWatchRows[1].get(now) - kWatchRows[1].get(before);
  if (asked)
    std::printf("%-16s %15.1f%%\n", "hit_ratio", 100.0 * double(hits) / double(asked));
  else
    std::printf("%-16s %16s\n", "hit_ratio", "-");
  std::printf("%-16s %16" PRIu64 "\n%-16s %16" PRIu64 "\n%-16s %16" PRIu64 "\n", "active_leases", now.active_leases,
              "sessions", now.sessions, "resident.host", now.resident_chunks[uint32_t(kdn::ipc::ChunkTier::kHost)]);
  std::fflush(stdout);
}

// A live view like top: the counters every `interval` s with their rates, until SIGINT (or
// `count` refreshes, if not 0). On a terminal each refresh replaces the last.
int cmd_watch(Client& c, const std::string& ns, double interval, int count) {
  std::signal(SIGINT, on_sigint);
  const bool clear = ::isatty(STDOUT_FILENO) != 0;
  kdn::ipc::StatsRecord before{}, now{};
  if (int e = read_stats(c, &before)) return e;
  uint64_t then = kdn::now_ns();
  for (int refresh = 1; count == 0 || refresh <= count; ++refresh) {
    if (!sleep_unless_interrupted(interval)) break;
    if (int e = read_stats(c, &now)) return e;
    const uint64_t t = kdn::now_ns();
    print_watch(ns, refresh, double(t - then) / 1e9, now, before, clear);
    if (!clear) std::printf("\n");
    before = now;
    then = t;
  }
  return 0;
}

// GPU_INFO as fields "gpu.*" (devices, the peer matrix as a bit mask per device, T0); empty
// when kdnd predates it. Device names go to `names` (ordinal, name).
std::vector<Field> gpu_fields(Client& c, std::vector<std::pair<uint32_t, std::string>>* names) {
  using Op = kdn::ipc::GpuInfoOp;
  std::vector<Field> f;
  if (c.welcome().proto_minor < 4) return f;
  constexpr uint32_t n = kdn::ipc::kGpuMaxDevices;
  Op::Result got;
  std::vector<Op::OutRecord> recs;
  if (!call_records<Op>(c, n, &got, &recs)) return f;
  f.push_back({"gpu.enabled", got.enabled});
  f.push_back({"gpu.devices", got.devices});
  f.push_back({"gpu.registrations", got.registrations});
  for (const auto& d : recs) {
    const std::string p = "gpu.device" + std::to_string(d.ordinal) + ".";
    f.push_back({p + "sm", d.sm});
    f.push_back({p + "memory_bytes", d.memory_bytes});
    f.push_back({p + "peer_mask", d.peer_mask});
    f.push_back({p + "t0_capacity_bytes", d.t0_capacity_bytes});
    f.push_back({p + "t0_used_bytes", d.t0_used_bytes});
    f.push_back({p + "t0_chunks", d.t0_chunks});
    char name[sizeof d.name + 1] = {};
    std::memcpy(name, d.name, sizeof d.name);  // NUL-terminated by kdnd; bounded here regardless
    names->emplace_back(d.ordinal, name);
  }
  return f;
}

int cmd_stats(Client& c, bool json, bool prom) {
  if (prom) return cmd_metrics(c);
  kdn::ipc::StatsRecord s{};
  if (int e = read_stats(c, &s)) return e;
  const bool admin = (c.welcome().flags & kdn::ipc::kHelloFlagAdmin) != 0;
  std::vector<Field> f = stats_fields(s, admin);
  const std::vector<Field> tiers = tier_fields(c);
  f.insert(f.end(), tiers.begin(), tiers.end());
  std::vector<std::pair<uint32_t, std::string>> gpu_names;
  const std::vector<Field> gpus = gpu_fields(c, &gpu_names);
  f.insert(f.end(), gpus.begin(), gpus.end());
  if (json) {
    std::printf("{");
    for (size_t i = 0; i < f.size(); ++i) std::printf("%s\"%s\": %" PRIu64, i ? ", " : "", f[i].name.c_str(), f[i].v);
    std::printf("}\n");
  } else {
    for (auto& x : f) {
      if (x.name == "tier.disk.codec")
        std::printf("%-34s %s\n", x.name.c_str(), codec_label(x.v));
      else
        std::printf("%-34s %" PRIu64 "\n", x.name.c_str(), x.v);
    }
    for (const auto& [ordinal, name] : gpu_names)
      std::printf("%-34s %s\n", ("gpu.device" + std::to_string(ordinal) + ".name").c_str(), name.c_str());
    const uint64_t looked = s.lookup_hit_chunks + s.lookup_miss_chunks;
    if (looked) std::printf("%-34s %.1f%%\n", "hit_ratio", 100.0 * s.lookup_hit_chunks / looked);
    const uint64_t leased = s.lease_hit_chunks + s.lease_miss_chunks;
    if (leased) std::printf("%-34s %.1f%%\n", "lease_hit_ratio", 100.0 * s.lease_hit_chunks / leased);
    uint64_t raw = 0, stored = 0;
    for (auto& x : tiers) {
      if (x.name == "tier.disk.raw_bytes_written") raw = x.v;
      if (x.name == "tier.disk.stored_bytes_written") stored = x.v;
    }
    if (stored) std::printf("%-34s %.2f\n", "tier.disk.codec_ratio", double(raw) / double(stored));
    if (!admin) std::printf("(daemon-wide counters need admin rights)\n");
  }
  return 0;
}

const char* tier_label(uint8_t t) {
  static const char* kTiers[] = {"gpu", "host", "disk", "remote"};
  return t < 4 ? kTiers[t] : "?";
}

const char* state_label(uint8_t s) {
  switch (kdn::ipc::ChunkState(s)) {
    case kdn::ipc::ChunkState::kReserved:
      return "reserved";
    case kdn::ipc::ChunkState::kCommitted:
      return "committed";
    case kdn::ipc::ChunkState::kMoving:
      return "moving";
    case kdn::ipc::ChunkState::kWriting:
      return "writing";
  }
  return "?";
}

// "host+disk": the tiers holding a copy.
std::string tiers_label(uint8_t mask) {
  std::string out;
  for (uint8_t t = 0; t < 4; ++t)
    if (mask & (1u << t)) out += (out.empty() ? "" : "+") + std::string(tier_label(t));
  return out.empty() ? "-" : out;
}

// "12.3": seconds between two daemon clock readings; "-" when unknown.
std::string seconds_label(uint64_t since, uint64_t now) {
  if (since == 0 || now < since) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", double(now - since) / 1e9);
  return b;
}

// "3f2a9c01/4": the chain's first key (its top 32 bits) and the chunk's position in it.
std::string chain_label(const kdn::ipc::ListRecordExt& x) {
  if (x.chain_pos == 0) return "-";
  char b[48];
  std::snprintf(b, sizeof b, "%08" PRIx64 "/%u", x.chain_head.hi >> 32, x.chain_pos - 1);
  return b;
}

int cmd_ls(Client& c, uint64_t limit, const std::string& tier) {
  using Op = kdn::ipc::ListOp;
  const uint32_t cap = 1024;  // chunks per page
  int only = -1;              // show chunks with a copy in this tier only
  for (uint8_t t = 0; t < 4 && !tier.empty(); ++t)
    if (tier == tier_label(t)) only = t;
  if (!tier.empty() && only < 0) {
    std::fprintf(stderr, "kdnctl ls: unknown tier '%s' (gpu, host, disk, remote)\n", tier.c_str());
    return 2;
  }
  // A kdnd of minor 3 or later also says each chunk's age and place in its prefix chain.
  const bool extended = c.welcome().proto_minor >= 3;
  const uint32_t record = extended ? sizeof(kdn::ipc::ListRecordExt) : sizeof(Op::OutRecord);
  auto o = c.alloc_payload(cap * record);
  if (!o.ok()) return fail("ls", o.status());
  std::printf("%-34s %10s %-6s %-10s %-9s %6s %12s %9s %9s %s\n", "key", "model", "tier", "copies", "state", "leases",
              "bytes", "age_s", "idle_s", "chain/pos");
  uint64_t cursor = 0, shown = 0;
  do {
    Request r;
    r.sqe.opcode = uint8_t(Op::kOpcode);
    Op::put(Op::Args{cursor, extended}, r.sqe);
    r.out = *o;
    r.sqe.out_len = cap * record;
    auto cqe = c.call(r);
    if (!cqe.ok()) return fail("ls", cqe.status());
    if (cqe->status) return fail_code("ls", cqe->status);
    auto got = Op::result(*cqe, cap * record / sizeof(Op::OutRecord));
    if (!got.ok()) return fail("ls", got.status());
    std::vector<kdn::ipc::ListRecordExt> e(extended ? got->written / 2 : got->written);
    for (size_t i = 0; i < e.size(); ++i) std::memcpy(&e[i], c.payload_ptr(*o) + i * record, record);
    for (auto& ext : e) {
      const kdn::ipc::ListRecord& x = ext.base;
      if (limit && shown >= limit) return 0;
      if (only >= 0 && !(x.tier_mask & (1u << only))) continue;
      std::printf("%016" PRIx64 "%016" PRIx64 "   %10u %-6s %-10s %-9s %6u %12" PRIu64 " %9s %9s %s\n", x.key.hi,
                  x.key.lo, x.model_id, tier_label(x.tier), tiers_label(x.tier_mask).c_str(), state_label(x.state),
                  x.leases, x.bytes, seconds_label(ext.created, ext.now).c_str(),
                  seconds_label(x.last_access, ext.now).c_str(), chain_label(ext).c_str());
      ++shown;
    }
    cursor = got->next_cursor;
  } while (cursor);
  std::printf("%" PRIu64 " chunks\n", shown);
  return 0;
}

bool parse_key(const std::string& hex, kdn_key* k) {
  if (hex.size() != 32) return false;
  char* end = nullptr;
  const std::string hi = hex.substr(0, 16), lo = hex.substr(16);
  k->hi = std::strtoull(hi.c_str(), &end, 16);
  if (*end) return false;
  k->lo = std::strtoull(lo.c_str(), &end, 16);
  return !*end;
}

int cmd_evict(Client& c, bool all, const std::vector<std::string>& keys, const std::string& tier) {
  using Op = kdn::ipc::EvictOp;
  Request r;
  r.sqe.opcode = uint8_t(Op::kOpcode);
  if (!tier.empty()) {
    if (tier != "host" || !all || !keys.empty()) {
      std::fprintf(stderr, "kdnctl evict: --tier takes 'host', with --all (moves every unleased chunk to disk)\n");
      return 2;
    }
    if (c.welcome().proto_minor < 1) {
      std::fprintf(stderr, "kdnctl evict: this kdnd predates --tier host\n");
      return 1;
    }
    Op::put(Op::Args{kdn::ipc::EvictMode::kHost}, r.sqe);
    auto cqe = c.call(r);
    if (!cqe.ok()) return fail("evict", cqe.status());
    if (cqe->status) return fail_code("evict", cqe->status);
    auto got = Op::result(*cqe);
    std::printf("moved %" PRIu64 " chunks out of the arena into the disk tier; %" PRIu64 " stay (leased or moving)\n",
                got->evicted, got->skipped);
    return 0;
  }
  Op::put(Op::Args{all ? kdn::ipc::EvictMode::kAll : kdn::ipc::EvictMode::kByKeys}, r.sqe);
  if (!all) {
    std::vector<kdn_key> k(keys.size());
    for (size_t i = 0; i < keys.size(); ++i)
      if (!parse_key(keys[i], &k[i])) {
        std::fprintf(stderr, "kdnctl: bad key '%s' (32 hex digits, as kdnctl ls prints)\n", keys[i].c_str());
        return 2;
      }
    auto in = c.alloc_payload(uint32_t(k.size() * sizeof(kdn_key)));
    if (!in.ok()) return fail("evict", in.status());
    std::memcpy(c.payload_ptr(*in), k.data(), k.size() * sizeof(kdn_key));
    r.in = *in;
    r.sqe.in_len = uint32_t(k.size() * sizeof(kdn_key));
  }
  auto cqe = c.call(r);
  if (!cqe.ok()) return fail("evict", cqe.status());
  if (cqe->status) return fail_code("evict", cqe->status);
  auto got = Op::result(*cqe);
  std::printf("evicted %" PRIu64 " chunks, skipped %" PRIu64 " (leased, or being written or moved)\n", got->evicted,
              got->skipped);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdnctl: inspect and manage kdnd"};
  std::string socket, ns = "default", token;
  app.add_option("-s,--socket", socket,
                 "kdnd socket (default: $KDN_SOCKET, $XDG_RUNTIME_DIR/kdn/kdnd.sock or "
                 "/tmp/kdn-$UID/kdnd.sock, as kdnd)");
  app.add_option("-n,--namespace", ns, "namespace")->capture_default_str();
  app.add_option("--token", token, "the namespace's token, if kdnd requires one");
  app.require_subcommand(1);
  int count = 1000, wakes = 5;
  auto* ping = app.add_subcommand("ping", "check that kdnd answers; time its busy-poll and wake-up round trips");
  ping->add_option("-c,--count", count, "back-to-back round trips (kdnd spinning)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  ping->add_option("-w,--wakes", wakes, "round trips each sent after kdnd went to sleep")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  bool json = false, prom = false;
  auto* stats = app.add_subcommand("stats", "counters of the namespace (and of the daemon, for admins)");
  stats->add_flag("--json", json, "one JSON object");
  stats->add_flag("--prometheus", prom, "kdnd's Prometheus page, as its endpoint serves it (admin)");
  double watch = 0;
  int watch_count = 0;
  auto* watch_opt =
      stats->add_option("--watch", watch, "a live view: the counters and their rates every SECONDS, until Ctrl-C")
          ->expected(0, 1)
          ->default_str("1")
          ->check(CLI::Range(0.05, 3600.0));
  stats->add_option("--count", watch_count, "with --watch: stop after N refreshes (0: never)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  uint64_t limit = 0;
  std::string ls_tier, evict_tier;
  auto* ls = app.add_subcommand("ls", "list chunks (admin)");
  ls->add_option("--limit", limit, "at most N rows (0: all)")->capture_default_str();
  ls->add_option("--tier", ls_tier, "only chunks with a copy in this tier (gpu, host, disk, remote)");
  bool all = false;
  std::vector<std::string> keys;
  auto* evict = app.add_subcommand("evict", "evict unleased chunks (admin)");
  evict->add_flag("--all", all, "every unleased chunk of the namespace");
  evict->add_option("--key", keys, "chunk key(s) as printed by ls");
  evict->add_option("--tier", evict_tier, "host: move chunks out of the arena into the disk tier instead");
  CLI11_PARSE(app, argc, argv);

  kdn_connect_opts o{};
  o.struct_size = sizeof o;
  o.socket_path = socket.empty() ? nullptr : socket.c_str();
  o.name_space = ns.c_str();
  o.token = token.empty() ? nullptr : token.c_str();
  o.payload_bytes = 1 << 20;
  o.flags = KDN_CONNECT_READ_ONLY;  // kdnctl never stores: no staging area
  auto c = Client::connect(&o, kdn::ipc::kHelloFlagAdmin, /*map_eagerly=*/false);
  if (!c.ok()) {
    if (c.status().code() == kdn::Code::kNotFound)
      std::fprintf(stderr, "kdnctl: kdnd has no namespace '%s'\n", ns.c_str());
    return fail("connect", c.status());
  }
  if (ping->parsed()) return cmd_ping(**c, count, wakes);
  if (stats->parsed() && watch_opt->count() > 0) return cmd_watch(**c, ns, watch, watch_count);
  if (stats->parsed()) return cmd_stats(**c, json, prom);
  if (ls->parsed()) return cmd_ls(**c, limit, ls_tier);
  if (!all && keys.empty()) {
    std::fprintf(stderr, "kdnctl evict: give --all or --key\n");
    return 2;
  }
  return cmd_evict(**c, all, keys, evict_tier);
}
