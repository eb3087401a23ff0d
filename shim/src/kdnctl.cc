// kdnctl: operator CLI for kdnd.
//
//   kdnctl ping                      round trip through the rings, prints the latency
//   kdnctl stats [--json|--prometheus]
//   kdnctl ls [--limit N]            chunks of the namespace: key, model, tier, state, leases, size
//   kdnctl evict --all | --key HEX   evict unleased chunks
#include "client.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/protocol.h>

#include <CLI/CLI.hpp>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using kdn::Status;
using kdn::ipc::Opcode;
using kdn::shim::Client;
using kdn::shim::Request;

namespace {

int fail(const char* what, const Status& st) {
  std::fprintf(stderr, "kdnctl: %s: %s\n", what, st.what());
  return 1;
}
int fail_code(const char* what, int code) {
  std::fprintf(stderr, "kdnctl: %s: %s\n", what, kdn::code_name(kdn::Code(code)));
  return 1;
}

int cmd_ping(Client& c, int count) {
  std::vector<double> us;
  for (int i = 0; i < count; ++i) {
    Request r;
    r.sqe.opcode = uint8_t(Opcode::kPing);
    const uint64_t t0 = kdn::now_ns();
    auto cqe = c.call(r);
    if (!cqe.ok()) return fail("ping", cqe.status());
    us.push_back((kdn::now_ns() - t0) / 1e3);
  }
  std::sort(us.begin(), us.end());
  std::printf("kdnd is alive: %d pings, round trip p50 %.2f us, max %.2f us\n", count, us[us.size() / 2], us.back());
  return 0;
}

int cmd_stats(Client& c, bool json, bool prom) {
  auto o = c.alloc_payload(sizeof(kdn_stats));
  if (!o.ok()) return fail("stats", o.status());
  Request r;
  r.sqe.opcode = uint8_t(Opcode::kStats);
  r.out = *o;
  r.sqe.out_len = sizeof(kdn_stats);
  auto cqe = c.call(r);
  if (!cqe.ok()) return fail("stats", cqe.status());
  if (cqe->status) return fail_code("stats", cqe->status);
  kdn_stats s;
  std::memcpy(&s, c.payload_ptr(*o), sizeof s);
  struct F { const char* name; uint64_t v; } f[] = {
      {"lookups", s.lookups}, {"lookup_hit_chunks", s.lookup_hit_chunks},
      {"lookup_miss_chunks", s.lookup_miss_chunks}, {"stored_chunks", s.stored_chunks},
      {"stored_bytes", s.stored_bytes}, {"retrieved_chunks", s.retrieved_chunks},
      {"retrieved_bytes", s.retrieved_bytes}, {"evicted_chunks", s.evicted_chunks},
      {"resident_chunks", s.resident_chunks}, {"resident_bytes", s.resident_bytes},
      {"capacity_bytes", s.capacity_bytes}, {"active_leases", s.active_leases},
      {"open_reservations", s.open_reservations}, {"sessions", s.sessions},
      {"protocol_errors", s.protocol_errors}};
  if (json) {
    std::printf("{");
    for (size_t i = 0; i < std::size(f); ++i) std::printf("%s\"%s\": %" PRIu64, i ? ", " : "", f[i].name, f[i].v);
    std::printf("}\n");
  } else if (prom) {
    for (auto& x : f) std::printf("kdn_%s %" PRIu64 "\n", x.name, x.v);
  } else {
    for (auto& x : f) std::printf("%-20s %" PRIu64 "\n", x.name, x.v);
    const uint64_t looked = s.lookup_hit_chunks + s.lookup_miss_chunks;
    if (looked) std::printf("%-20s %.1f%%\n", "hit_ratio", 100.0 * s.lookup_hit_chunks / looked);
  }
  return 0;
}

int cmd_ls(Client& c, uint64_t limit) {
  const uint32_t cap = 1024;
  auto o = c.alloc_payload(cap * sizeof(kdn::ipc::ListEntry));
  if (!o.ok()) return fail("ls", o.status());
  std::printf("%-34s %5s %-5s %-9s %6s %12s\n", "key", "model", "tier", "state", "leases", "bytes");
  uint64_t cursor = 0, shown = 0;
  do {
    Request r;
    r.sqe.opcode = uint8_t(Opcode::kList);
    r.sqe.arg[0] = cursor;
    r.out = *o;
    r.sqe.out_len = cap * sizeof(kdn::ipc::ListEntry);
    auto cqe = c.call(r);
    if (!cqe.ok()) return fail("ls", cqe.status());
    if (cqe->status) return fail_code("ls", cqe->status);
    const uint64_t n = std::min<uint64_t>(cqe->res[0], cap);
    std::vector<kdn::ipc::ListEntry> e(n);
    std::memcpy(e.data(), c.payload_ptr(*o), n * sizeof(e[0]));
    for (auto& x : e) {
      if (limit && shown >= limit) return 0;
      std::printf("%016" PRIx64 "%016" PRIx64 "   %5u %-5s %-9s %6u %12" PRIu64 "\n", x.key.hi, x.key.lo, x.model_id,
                  x.tier == 1 ? "host" : x.tier == 2 ? "disk" : x.tier == 0 ? "gpu" : "remote",
                  x.state == 2 ? "committed" : "reserved", x.leases, x.bytes);
      ++shown;
    }
    cursor = cqe->res[1];
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

int cmd_evict(Client& c, bool all, const std::vector<std::string>& keys) {
  Request r;
  r.sqe.opcode = uint8_t(Opcode::kEvict);
  r.sqe.arg[0] = uint64_t(all ? kdn::ipc::EvictMode::kAll : kdn::ipc::EvictMode::kByKeys);
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
  std::printf("evicted %" PRIu64 " chunks, skipped %" PRIu64 " (leased or being written)\n", cqe->res[0], cqe->res[1]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdnctl: inspect and manage kdnd"};
  std::string socket, ns = "default", token;
  app.add_option("-s,--socket", socket, "kdnd socket (default: as kdnd)");
  app.add_option("-n,--namespace", ns, "namespace");
  app.add_option("--token", token, "shared secret, if kdnd requires one");
  app.require_subcommand(1);
  int count = 5;
  auto* ping = app.add_subcommand("ping", "check that kdnd answers");
  ping->add_option("-c,--count", count, "round trips")->check(CLI::Range(1, 1000000));
  bool json = false, prom = false;
  auto* stats = app.add_subcommand("stats", "counters of the namespace and the daemon");
  stats->add_flag("--json", json);
  stats->add_flag("--prometheus", prom);
  uint64_t limit = 0;
  auto* ls = app.add_subcommand("ls", "list chunks");
  ls->add_option("--limit", limit, "at most N rows");
  bool all = false;
  std::vector<std::string> keys;
  auto* evict = app.add_subcommand("evict", "evict unleased chunks");
  evict->add_flag("--all", all, "every unleased chunk of the namespace");
  evict->add_option("--key", keys, "chunk key(s) as printed by ls");
  CLI11_PARSE(app, argc, argv);

  kdn_connect_opts o{};
  o.struct_size = sizeof o;
  o.socket_path = socket.empty() ? nullptr : socket.c_str();
  o.name_space = ns.c_str();
  o.token = token.empty() ? nullptr : token.c_str();
  o.payload_bytes = 1 << 20;
  auto c = Client::connect(&o, kdn::ipc::kHelloFlagAdmin);
  if (!c.ok()) return fail("connect", c.status());
  if (ping->parsed()) return cmd_ping(**c, count);
  if (stats->parsed()) return cmd_stats(**c, json, prom);
  if (ls->parsed()) return cmd_ls(**c, limit);
  if (!all && keys.empty()) {
    std::fprintf(stderr, "kdnctl evict: give --all or --key\n");
    return 2;
  }
  return cmd_evict(**c, all, keys);
}
