// libFuzzer harness for the wire protocol as kdnd serves it: ring entries and payload bytes a
// client controls, fed to the request handler of a real namespace (a sealed memfd arena, the
// host tier's copy workers) and a real session (its shared segment and staging area).
//
// Input: the first bytes fill the start of the session's payload area (keys, ids, model
// records, whatever the entries point at); the rest is a sequence of 64-byte submission
// entries, served one after the other the way the daemon's loop serves them — in slices,
// with transfer completions delivered as they land. Before the input runs, the session has a
// model registered and a few chunks stored, so leases, commits and evictions reach real
// entries. Every entry must get a completion; afterwards the namespace's books must balance:
// no lease, reservation or pin survives the session's end.
#include "request_handler.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/ops.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace {

using namespace kdn;
using namespace kdn::sidecar;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint32_t kPayload = 64 << 10;
constexpr uint32_t kMaxEntries = 64;

void require(bool ok) {
  if (!ok) std::abort();
}

kdn_model_desc fuzz_model() {
  kdn_model_desc d{};
  d.struct_size = sizeof d;
  d.num_layers = 1;
  d.num_kv_heads = 1;
  d.head_dim = 16;
  d.dtype = KDN_DTYPE_F16;
  d.chunk_tokens = 16;  // 1 KiB chunks
  d.rope_style = KDN_ROPE_NEOX;
  d.rope_theta = 10000;
  return d;
}

struct World {
  Config config;
  ModelTable models{64};
  DaemonCounters counters;
  Namespace ns;
  std::unique_ptr<RequestHandler> handler;
  std::unique_ptr<Session> session;
  uint64_t next_token = 1;

  World() {
    config.fill_defaults();
    config.max_reservations = 64;
    config.max_leases = 256;
    config.max_lease_count = 8;
    config.reservation_timeout_ms = 1;
    ipc::SegmentOptions so;
    so.seal_writes = true;
    auto seg = ipc::SharedSegment::create("fuzz-arena", 4 * kMiB, so);
    require(seg.ok());
    HostArenaOptions ho;
    ho.slab_bytes = 1 * kMiB;
    ho.copy_threads = 1;
    ho.inline_bytes = 512;  // 1 KiB chunks go to the worker: completions arrive later
    auto host = HostArenaTier::create(std::move(*seg), ho);
    require(host.ok());
    ns.name = "fuzz";
    ns.region_id = 1;
    ns.region_generation = 1;
    ns.host = std::move(*host);
    std::array<Tier*, kTierCount> tiers{};
    std::array<TierRules, kTierCount> rules{};
    tiers[tier_index(TierId::kHost)] = ns.host.get();
    ns.store = std::make_unique<TieredStore>(TierPolicy(tiers, rules));
    handler = std::make_unique<RequestHandler>(models, counters, config);
    session = std::make_unique<Session>();
    session->id = 1;
    auto layout = ipc::SessionLayout::compute(16, kPayload);
    auto shm = ipc::DaemonSession::create(*layout, 1);
    require(shm.ok());
    session->shm = std::move(*shm);
    auto staging = StagingArea::create(1 * kMiB);
    require(staging.ok());
    session->staging = std::move(*staging);
    session->staging_region = 2;
    session->ns = &ns;
  }

  std::byte* payload() { return session->shm.segment().data() + session->shm.layout().payload_offset; }

  // Serves one entry to its completion, as the loop would.
  ipc::Cqe serve(const ipc::Sqe& sqe) {
    Op op;
    op.token = next_token++;
    op.session = session.get();
    op.sqe = sqe;
    for (int turn = 0; turn < 100000; ++turn) {
      const Step st = handler->step(op, now_ns() + 50'000);
      if (st == Step::kDone) return op.cqe;
      if (st == Step::kWait) deliver(op);
    }
    std::abort();  // a request that never ends is a finding
  }

  void deliver(Op& op) {
    std::vector<StoreEvent> events;
    for (int i = 0; i < 1000000 && (op.waiting > 0 || op.wants_room); ++i) {
      events.clear();
      bool room = false;
      ns.store->poll(events, &room);
      for (const StoreEvent& ev : events)
        if (ev.waiter == op.token) handler->on_event(op, ev);
      if (room || (op.wants_room && now_ns() >= op.room_deadline_ns)) op.wants_room = false;
    }
    require(op.waiting == 0);
  }

  // A registered model and four stored chunks (keys 1..4), so entries can reach real ones.
  uint32_t prepare() {
    const ipc::ModelRecord rec = ipc::to_wire(fuzz_model());
    std::memcpy(payload(), &rec, sizeof rec);
    ipc::Sqe q{};
    q.opcode = uint8_t(ipc::Opcode::kRegisterModel);
    q.in_len = sizeof rec;
    const ipc::Cqe c = serve(q);
    require(c.status == KDN_OK);
    const uint32_t model = uint32_t(c.res[0]);
    for (uint64_t i = 1; i <= 4; ++i) {
      const kdn_key k{i, i};
      std::memcpy(payload(), &k, sizeof k);
      q = {};
      q.opcode = uint8_t(ipc::Opcode::kReserve);
      q.model_id = model;
      q.in_len = sizeof k;
      q.out_off = 4096;
      q.out_len = sizeof(ipc::ReserveRecord);
      require(serve(q).status == KDN_OK);
      ipc::ReserveRecord r;
      std::memcpy(&r, payload() + 4096, sizeof r);
      std::memcpy(payload(), &r.reservation_id, 8);
      q = {};
      q.opcode = uint8_t(ipc::Opcode::kCommit);
      q.in_len = 8;
      require(serve(q).status == KDN_OK);
    }
    return model;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World w;
  const uint32_t model = w.prepare();
  const size_t prefix = std::min<size_t>(size, 4096);
  std::memcpy(w.payload(), data, prefix);
  data += prefix;
  size -= prefix;
  for (uint32_t n = 0; n < kMaxEntries && size >= sizeof(ipc::Sqe); ++n) {
    ipc::Sqe q;
    std::memcpy(&q, data, sizeof q);
    data += sizeof q;
    size -= sizeof q;
    if (q.model_id == 1) q.model_id = model;  // let the fuzzer name the model cheaply
    const ipc::Cqe c = w.serve(q);
    require(c.user_data == q.user_data);
    require(c.status <= 0 && c.status >= KDN_ERR_LIMIT);
  }
  // The session ends: nothing it held may survive.
  w.handler->drop_holdings(*w.session);
  require(w.ns.store->active_leases() == 0);
  require(w.ns.store->open_reservations() == 0);
  require(w.ns.store->transfers_in_flight() == 0);
  w.ns.store->index().for_each([](Entry& e) {
    require(e.leases == 0 && e.io == 0 && e.committed());
    return true;
  });
  return 0;
}
