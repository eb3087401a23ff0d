// The node benchmark's staging-churn phase: one session's PING latency while sessions that
// ask for the largest staging area open and close in a loop.
//
// A fresh kdnd. The churner, a forked process speaking the protocol directly (libkdn hides
// the staging mapping), repeats: a session asking for `idle_staging_bytes` that writes none
// of it, closed at once; then a session asking for `written_staging_bytes` that writes every
// page (as an engine that stored that much would), closed. Each close leaves kdnd the last
// holder of those pages. The measuring client (this process, through libkdn) times kdn_ping
// one by one: first with the churner idle (the same daemon), then under the churn.
//
// Figures (under <prefix>): ping_idle_{p50,p99,max}_us, ping_under_staging_churn_{p50,p99,
// max}_us, staging_churn_sessions_per_s and staging_churn_written_gib_per_s (the churn is real).
#include "staging_churn_bench.h"

#include "baseline_figures.h"
#include "kdnd_process.h"
#include "process.h"
#include "stats.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/handshake.h>
#include <kdn/ipc/session.h>
#include <kdn/ipc/uds.h>
#include <kdn/kdn.h>

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <new>
#include <thread>
#include <vector>

namespace kdn::bench {
namespace {

// Shared between the churner and the bench.
struct ChurnControl {
  std::atomic<uint32_t> go{0};
  std::atomic<uint32_t> stop{0};
  std::atomic<uint64_t> sessions{0};       // opened and closed
  std::atomic<uint64_t> written_bytes{0};  // staging written before a close
  std::atomic<int32_t> error{0};
};

// One session with `staging` bytes, mapped; closed (socket and mappings) when destroyed.
Status open_session(const std::string& socket, uint64_t staging, ipc::UniqueFd* sock, ipc::ClientSession* s) {
  auto fd = ipc::uds_connect(socket, 5000);
  if (!fd.ok()) return fd.status();
  *sock = std::move(*fd);
  ipc::HelloRequest req;
  req.staging_bytes = staging;
  auto hello = ipc::make_hello(req);
  if (!hello.ok()) return hello.status();
  auto hs = ipc::client_handshake(sock->get(), *hello, 5000);
  if (!hs.ok()) return hs.status();
  auto cs = ipc::ClientSession::attach(std::move(*hs));
  if (!cs.ok()) return cs.status();
  *s = std::move(*cs);
  return OkStatus();
}

Status write_every_page(const ipc::ClientSession& s) {
  const ipc::ClientRegion* r = s.region(ipc::RegionKind::kStaging);
  if (!r) return Status(Code::kInternal, "no staging region");
  if (::madvise(r->segment.data(), r->segment.size(), MADV_POPULATE_WRITE) == 0) return OkStatus();
  for (uint64_t i = 0; i < r->segment.size(); i += 4096) r->segment.data()[i] = std::byte{1};
  return OkStatus();
}

Status churn_once(const std::string& socket, const StagingChurnOptions& o, ChurnControl& ctl) {
  {
    ipc::UniqueFd sock;
    ipc::ClientSession s;
    KDN_RETURN_IF_ERROR(open_session(socket, o.idle_staging_bytes, &sock, &s));
  }
  ipc::UniqueFd sock;
  ipc::ClientSession s;
  KDN_RETURN_IF_ERROR(open_session(socket, o.written_staging_bytes, &sock, &s));
  KDN_RETURN_IF_ERROR(write_every_page(s));
  ctl.sessions.fetch_add(2, std::memory_order_relaxed);
  ctl.written_bytes.fetch_add(o.written_staging_bytes, std::memory_order_relaxed);
  return OkStatus();
}

int churn(const std::string& socket, const StagingChurnOptions& o, ChurnControl& ctl) {
  while (!ctl.go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  while (!ctl.stop.load(std::memory_order_relaxed)) {
    Status st = churn_once(socket, o, ctl);
    if (!st.ok()) {
      ctl.error.store(st.raw());
      return 1;
    }
  }
  return 0;
}

Result<LatencySummary> time_pings(kdn_client* c, uint32_t samples) {
  std::vector<uint64_t> ns;
  ns.reserve(samples);
  for (uint32_t i = 0; i < samples; ++i) {
    const uint64_t t0 = now_ns();
    if (kdn_ping(c) != KDN_OK) return Status(Code::kInternal, "ping failed");
    ns.push_back(now_ns() - t0);
    std::this_thread::sleep_for(std::chrono::microseconds(100));  // a steady probe, not a flood
  }
  return summarize_ns(ns);
}

}  // namespace

bool add_staging_churn_figures(Report& report, const std::string& prefix, const StagingChurnOptions& o) {
  auto fail = [&](const std::string& why) {
    report.set(prefix + ".errors.staging_churn", why);
    progress("staging churn: %s", why.c_str());
    return false;
  };
  KdndOptions ko;
  ko.binary = o.kdnd_binary;
  ko.socket_path = o.dir + "/churn.sock";
  ko.host_arena_bytes = 256ull << 20;
  ko.log_path = o.dir + "/kdnd-churn.log";
  auto kdnd = KdndProcess::start(ko);
  if (!kdnd.ok()) return fail(describe(kdnd.status()));
  void* shared = ::mmap(nullptr, sizeof(ChurnControl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return fail("mmap");
  auto* ctl = new (shared) ChurnControl();
  progress("staging churn: sessions of %llu MiB (unwritten) and %llu MiB (written) open and close",
           (unsigned long long)(o.idle_staging_bytes >> 20), (unsigned long long)(o.written_staging_bytes >> 20));
  auto child = fork_child([&] { return churn(ko.socket_path, o, *ctl); });
  if (!child.ok()) return fail(describe(child.status()));
  kdn_connect_opts co{};
  co.struct_size = sizeof co;
  co.socket_path = ko.socket_path.c_str();
  kdn_client* probe = nullptr;
  bool ok = kdn_connect(&co, &probe) == KDN_OK || fail("probe connect");
  if (ok) {
    auto idle = time_pings(probe, o.ping_samples);
    ctl->go.store(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the churn is under way
    const uint64_t sessions0 = ctl->sessions.load(), bytes0 = ctl->written_bytes.load(), t0 = now_ns();
    auto churned = time_pings(probe, o.ping_samples);
    const double seconds = double(now_ns() - t0) / 1e9;
    if (!idle.ok() || !churned.ok()) {
      ok = fail("probe pings failed");
    } else {
      set_latency(report, prefix + ".ping_idle", *idle);
      set_latency(report, prefix + ".ping_under_staging_churn", *churned);
      report.set(prefix + ".staging_churn_sessions_per_s", double(ctl->sessions.load() - sessions0) / seconds);
      report.set(prefix + ".staging_churn_written_gib_per_s",
                 double(ctl->written_bytes.load() - bytes0) / double(1ull << 30) / seconds);
    }
  }
  kdn_disconnect(probe);
  ctl->stop.store(1);
  ctl->go.store(1);
  auto exited = child->wait_for(std::chrono::seconds(120));
  if (ok && (!exited.ok() || *exited != 0)) ok = fail(std::string("churner: ") + kdn_strerror(ctl->error.load()));
  ::munmap(shared, sizeof(ChurnControl));
  Result<int> stopped = kdnd->stop();
  if (!stopped.ok() || *stopped != 0) ok = fail("kdnd did not exit cleanly after the staging churn");
  return ok;
}

}  // namespace kdn::bench
