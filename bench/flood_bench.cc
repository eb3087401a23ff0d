// The node benchmark's flood phase: how long one session's lookup waits while another
// session keeps 64 LEASE requests of 65,536 keys each in flight.
//
// A fresh kdnd. The flooder, a forked process speaking the protocol directly (a client
// written from docs/protocol.md; libkdn has no call that keeps 64 leases in flight), stores
// 65,536 chunks of a 1 KiB model, then keeps `flood_in_flight` LEASEs of all of them
// submitted: whenever one completes it releases what it leased and submits it again. Every
// LEASE is the daemon's work of leasing 65,536 chunks, which it cuts into slices and serves
// round-robin with other sessions. The measuring client (this process, through libkdn)
// stores 32 chunks and times kdn_lookup_keys of them one by one: first with the flooder
// idle (the same daemon, the same sessions), then under the flood.
//
// Figures (under <prefix>): lookup_idle_p50_us/_p99_us/_max_us, lookup_under_flood_p50_us/
// _p99_us/_max_us, flood_leased_chunks_per_s (the flooder's rate: the work is real),
// flood_requests_completed, flood_in_flight.
#include "flood_bench.h"

#include "baseline_figures.h"
#include "kdnd_process.h"
#include "process.h"
#include "report.h"
#include "stats.h"

#include <kdn/common/clock.h>
#include <kdn/common/model_presets.h>
#include <kdn/ipc/handshake.h>
#include <kdn/ipc/ops.h>
#include <kdn/ipc/session.h>
#include <kdn/ipc/uds.h>
#include <kdn/kdn.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

namespace kdn::bench {

namespace {

// A 1 KiB chunk: 1 layer, 1 KV head, 16 dims, 16 tokens, f16.
kdn_model_desc flood_model() { return shaped_desc(1, 1, 16, 16, "kdn-bench/flood"); }

kdn_key flood_key(uint32_t i) { return kdn_key{0x666c6f6f64000000ull | i, 0x9E3779B97F4A7C15ull * (i + 1)}; }

// Shared between the flooder and the bench: a flag to start, one to stop, its counters.
struct FloodControl {
  std::atomic<uint32_t> ready{0};  // 1: chunks stored; 2: failed
  std::atomic<uint32_t> go{0};     // set by the bench: start flooding
  std::atomic<uint32_t> stop{0};
  std::atomic<uint64_t> leased{0};     // chunks leased by completed LEASEs
  std::atomic<uint64_t> completed{0};  // LEASEs completed
  std::atomic<uint64_t> flooding_ns{0};
  std::atomic<int32_t> error{0};
};

class Flooder {
 public:
  Flooder(const std::string& socket, const FloodOptions& o, FloodControl& ctl) : socket_(socket), o_(o), ctl_(ctl) {}
  int run();

 private:
  Status connect();
  Status call(ipc::Sqe q, ipc::Cqe* out);
  Status store_all();
  Status flood();
  Status submit_lease();

  std::string socket_;
  FloodOptions o_;
  FloodControl& ctl_;
  ipc::UniqueFd sock_;
  ipc::ClientSession s_;
  uint32_t model_ = 0;
  uint64_t next_ud_ = 1;
  // Payload: keys at 0, the LEASEs' shared output after them, a RELEASE's ids after that.
  uint32_t out_off_ = 0, ids_off_ = 0;
};

Status Flooder::connect() {
  auto fd = ipc::uds_connect(socket_, 5000);
  if (!fd.ok()) return fd.status();
  sock_ = std::move(*fd);
  ipc::HelloRequest req;
  req.ring_entries = 256;
  req.payload_bytes = 8u << 20;
  req.staging_bytes = 64ull << 20;
  auto hello = ipc::make_hello(req);
  if (!hello.ok()) return hello.status();
  auto hs = ipc::client_handshake(sock_.get(), *hello, 5000);
  if (!hs.ok()) return hs.status();
  auto cs = ipc::ClientSession::attach(std::move(*hs));
  if (!cs.ok()) return cs.status();
  s_ = std::move(*cs);
  out_off_ = o_.keys * sizeof(kdn_key);
  ids_off_ = out_off_ + o_.keys * uint32_t(sizeof(ipc::LeaseRecord));
  if (uint64_t(ids_off_) + o_.keys * 8ull > s_.payload_bytes()) return Status(Code::kInvalidArgument, "flood payload");
  const ipc::ModelRecord rec = ipc::to_wire(flood_model());
  std::memcpy(s_.payload(), &rec, sizeof rec);
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kRegisterModel);
  q.in_len = sizeof rec;
  ipc::Cqe c{};
  KDN_RETURN_IF_ERROR(call(q, &c));
  auto r = ipc::RegisterModelOp::result(c);
  if (!r.ok()) return r.status();
  model_ = r->model_id;
  return OkStatus();
}

Status Flooder::call(ipc::Sqe q, ipc::Cqe* out) {
  q.user_data = next_ud_++;
  auto n = s_.submit(std::span<const ipc::Sqe>(&q, 1));
  if (!n.ok() || *n != 1) return Status(Code::kBusy, "submission ring full");
  for (;;) {
    auto r = s_.reap(std::span<ipc::Cqe>(out, 1));
    if (!r.ok()) return r.status();
    if (*r == 1) return out->status == KDN_OK ? OkStatus() : Status(Code(out->status), "flood request failed");
    KDN_RETURN_IF_ERROR(s_.wait_for_completion(5'000'000'000));
  }
}

// Stores the flood's chunks in batches that fit the staging area.
Status Flooder::store_all() {
  constexpr uint32_t kBatch = 4096;
  for (uint32_t i = 0; i < o_.keys; ++i) {
    const kdn_key k = flood_key(i);
    std::memcpy(s_.payload() + i * sizeof k, &k, sizeof k);
  }
  const uint64_t chunk = 1024;
  for (uint32_t first = 0; first < o_.keys; first += kBatch) {
    const uint32_t n = std::min(kBatch, o_.keys - first);
    ipc::Sqe q{};
    q.opcode = uint8_t(ipc::Opcode::kReserve);
    q.model_id = model_;
    q.in_off = first * uint32_t(sizeof(kdn_key));
    q.in_len = n * uint32_t(sizeof(kdn_key));
    q.out_off = out_off_;
    q.out_len = n * uint32_t(sizeof(ipc::ReserveRecord));
    ipc::Cqe c{};
    KDN_RETURN_IF_ERROR(call(q, &c));
    std::vector<uint64_t> ids;
    for (uint32_t i = 0; i < n; ++i) {
      ipc::ReserveRecord rec;
      std::memcpy(&rec, s_.payload() + out_off_ + i * sizeof rec, sizeof rec);
      if (rec.state != uint32_t(ipc::ReserveState::kReserved)) continue;
      auto slot = s_.resolve(rec.slot, chunk, ipc::RegionKind::kStaging);
      if (!slot.ok()) return slot.status();
      std::memset(*slot, int(i & 0xFF), chunk);
      ids.push_back(rec.reservation_id);
    }
    std::memcpy(s_.payload() + ids_off_, ids.data(), ids.size() * 8);
    q = {};
    q.opcode = uint8_t(ipc::Opcode::kCommit);
    q.in_off = ids_off_;
    q.in_len = uint32_t(ids.size() * 8);
    KDN_RETURN_IF_ERROR(call(q, &c));
  }
  return OkStatus();
}

Status Flooder::submit_lease() {
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kLease);
  q.model_id = model_;
  q.user_data = next_ud_++;
  q.in_len = o_.keys * uint32_t(sizeof(kdn_key));
  q.out_off = out_off_;  // every LEASE writes the same place: the same session gets the same ids
  q.out_len = o_.keys * uint32_t(sizeof(ipc::LeaseRecord));
  auto n = s_.submit(std::span<const ipc::Sqe>(&q, 1));
  if (!n.ok()) return n.status();
  return *n == 1 ? OkStatus() : Status(Code::kBusy, "submission ring full");
}

// Keeps in_flight LEASEs submitted; releases what each one leased when it completes.
Status Flooder::flood() {
  for (uint32_t i = 0; i < o_.in_flight; ++i) KDN_RETURN_IF_ERROR(submit_lease());
  uint32_t in_flight = o_.in_flight;
  const uint64_t t0 = now_ns();
  while (in_flight > 0) {
    ipc::Cqe c[64];
    auto r = s_.reap(c);
    if (!r.ok()) return r.status();
    if (*r == 0) {
      Status w = s_.wait_for_completion(1'000'000'000);  // kTimeout: look again
      if (!w.ok() && w.code() != Code::kTimeout) return w;
      continue;
    }
    // Each completion is a LEASE or a RELEASE (user_data's top bit).
    for (uint32_t i = 0; i < *r; ++i) {
      if (c[i].status != KDN_OK) return Status(Code(c[i].status), "flood request failed");
      --in_flight;
      if (!(c[i].user_data & 1ull << 63)) {
        ctl_.leased.fetch_add(c[i].res[0], std::memory_order_relaxed);
        ctl_.completed.fetch_add(1, std::memory_order_relaxed);
        // Release what it leased: the ids are the LEASE output's, the same for every LEASE.
        for (uint32_t k = 0; k < c[i].res[0]; ++k) {
          ipc::LeaseRecord rec;
          std::memcpy(&rec, s_.payload() + out_off_ + k * sizeof rec, sizeof rec);
          std::memcpy(s_.payload() + ids_off_ + k * 8, &rec.lease_id, 8);
        }
        ipc::Sqe q{};
        q.opcode = uint8_t(ipc::Opcode::kRelease);
        q.user_data = (next_ud_++) | 1ull << 63;
        q.in_off = ids_off_;
        q.in_len = uint32_t(c[i].res[0] * 8);
        auto n = s_.submit(std::span<const ipc::Sqe>(&q, 1));
        if (!n.ok() || *n != 1) return Status(Code::kBusy, "submission ring full");
        ++in_flight;
      }
      if (!ctl_.stop.load(std::memory_order_relaxed) && !(c[i].user_data & 1ull << 63)) {
        KDN_RETURN_IF_ERROR(submit_lease());
        ++in_flight;
      }
    }
  }
  ctl_.flooding_ns.store(now_ns() - t0, std::memory_order_relaxed);
  return OkStatus();
}

int Flooder::run() {
  Status st = connect();
  if (st.ok()) st = store_all();
  if (!st.ok()) {
    ctl_.error.store(st.raw());
    ctl_.ready.store(2);
    return 1;
  }
  ctl_.ready.store(1);
  while (!ctl_.go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  st = flood();
  if (!st.ok()) ctl_.error.store(st.raw());
  return st.ok() ? 0 : 1;
}

// The measuring client: 32 chunks of the flood model stored, their keys looked up.
struct Prober {
  kdn_client* client = nullptr;
  kdn_model* model = nullptr;
  std::vector<kdn_key> keys;
  ~Prober() { kdn_disconnect(client); }
  Status open(const std::string& socket) {
    kdn_connect_opts o{};
    o.struct_size = sizeof o;
    o.socket_path = socket.c_str();
    if (int rc = kdn_connect(&o, &client); rc != KDN_OK) return Status(Code(rc), "probe connect");
    kdn_model_desc d = flood_model();
    d.engine_salt[0] = 1;  // its own model: its chunks are not the flood's
    if (int rc = kdn_register_model(client, &d, &model); rc != KDN_OK) {
      progress("flood: probe model: %s", kdn_strerror(rc));
      return Status(Code(rc), "probe model");
    }
    std::vector<int32_t> tokens(32 * 16);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 7 % 1000);
    keys.resize(32);
    size_t n = 0;
    kdn_prefix_keys(&d, tokens.data(), tokens.size(), keys.data(), keys.size(), &n);
    kdn_store* s = nullptr;
    if (kdn_store_reserve(client, model, tokens.data(), tokens.size(), 0, 32, &s) != KDN_OK)
      return Status(Code::kInternal, "probe reserve");
    for (uint32_t i = 0; i < kdn_store_chunks(s); ++i)
      if (void* p = kdn_store_chunk_data(s, i)) std::memset(p, 3, 1024);
    if (kdn_store_commit(client, s) != KDN_OK) return Status(Code::kInternal, "probe commit");
    return OkStatus();
  }
  // Times `samples` lookups one by one (after 1,000 untimed).
  Result<LatencySummary> time_lookups(uint32_t samples) {
    std::vector<uint64_t> ns;
    ns.reserve(samples);
    for (uint32_t i = 0; i < samples + 1000; ++i) {
      kdn_lookup_result r{};
      const uint64_t t0 = now_ns();
      if (kdn_lookup_keys(client, model, keys.data(), keys.size(), &r) != KDN_OK || r.hit_chunks != 32)
        return Status(Code::kInternal, "probe lookup missed");
      if (i >= 1000) ns.push_back(now_ns() - t0);
    }
    return summarize_ns(ns);
  }
};

}  // namespace

bool add_flood_figures(Report& report, const std::string& prefix, const FloodOptions& o) {
  auto fail = [&](const std::string& why) {
    report.set(prefix + ".errors.flood", why);
    progress("flood: %s", why.c_str());
    return false;
  };
  KdndOptions ko;
  ko.binary = o.kdnd_binary;
  ko.socket_path = o.dir + "/flood.sock";
  ko.host_arena_bytes = 512ull << 20;
  ko.log_path = o.dir + "/kdnd-flood.log";
  auto kdnd = KdndProcess::start(ko);
  if (!kdnd.ok()) return fail(describe(kdnd.status()));
  void* shared = ::mmap(nullptr, sizeof(FloodControl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return fail("mmap");
  auto* ctl = new (shared) FloodControl();
  progress("flood: storing %u chunks, then %u LEASEs of %u keys in flight", o.keys, o.in_flight, o.keys);
  auto child = fork_child([&] { return Flooder(ko.socket_path, o, *ctl).run(); });
  if (!child.ok()) return fail(describe(child.status()));
  Prober probe;
  Status opened = probe.open(ko.socket_path);
  while (ctl->ready.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  bool ok = true;
  if (!opened.ok())
    ok = fail(describe(opened));
  else if (ctl->ready.load() != 1)
    ok = fail(std::string("flooder: ") + kdn_strerror(ctl->error.load()));
  if (ok) {
    auto idle = probe.time_lookups(o.lookup_samples);
    ctl->go.store(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the flood is under way
    const uint64_t before = ctl->leased.load();
    const uint64_t t0 = now_ns();
    auto flooded = probe.time_lookups(o.lookup_samples);
    const uint64_t t1 = now_ns();
    const uint64_t leased = ctl->leased.load() - before;
    ctl->stop.store(1);
    if (!idle.ok() || !flooded.ok()) {
      ok = fail("probe lookups failed");
    } else {
      set_latency(report, prefix + ".lookup_idle", *idle);
      set_latency(report, prefix + ".lookup_under_flood", *flooded);
      report.set(prefix + ".flood_leased_chunks_per_s", double(leased) / (double(t1 - t0) / 1e9));
      report.set(prefix + ".flood_in_flight", o.in_flight);
      report.set(prefix + ".flood_keys_per_lease", o.keys);
    }
  }
  ctl->stop.store(1);
  ctl->go.store(1);
  auto exited = child->wait_for(std::chrono::seconds(120));
  if (ok && (!exited.ok() || *exited != 0)) ok = fail(std::string("flooder exit: ") + kdn_strerror(ctl->error.load()));
  report.set(prefix + ".flood_requests_completed", ctl->completed.load());
  ::munmap(shared, sizeof(FloodControl));
  Result<int> stopped = kdnd->stop();
  if (!stopped.ok() || *stopped != 0) ok = fail("kdnd did not exit cleanly after the flood");
  return ok;
}

}  // namespace kdn::bench
