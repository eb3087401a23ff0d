// RequestHandler: serves one session's requests, each as an Op that may finish at once, be
// cut into slices, or wait for transfers.
//
// step(op, deadline) does the request's work from where it stopped until it finishes, the
// deadline passes (a slice of ~200 µs: the daemon then serves other sessions and comes back,
// round-robin), or it must wait for a transfer (a COMMIT's copies into the arena, a LEASE's
// promotion from a lower tier) or for room in a full tier. Completions come back through
// on_event. Most requests are small and finish in their first step with no Op kept.
//
// Untrusted input: every SQE is checked (ipc/payload.h) before anything is read; records are
// copied out of the client's payload area once, in slices, and outputs written with bounds
// checks. A request over a limit gets KDN_ERR_LIMIT and changes nothing. Anything thrown
// while serving a request (std::bad_alloc included) ends that request alone, with what it
// took rolled back.
//
// Not thread-safe: the daemon's event loop owns the handler and every Op.
#pragma once

#include "daemon_counters.h"
#include "model_table.h"
#include "session.h"

#include <kdn/ipc/ops.h>
#include <kdn/ipc/payload.h>
#include <kdn/ipc/protocol.h>
#include <kdn/sidecar/config.h>

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

namespace kdn::sidecar {

namespace gpu {
class GpuService;
struct GpuRequest;
struct Registration;
struct SegmentWork;
}  // namespace gpu

// What a request that reads chunks (LOOKUP, LOOKUP_EACH, PREFETCH, the leasing opcodes) has
// learned so far, kept across its steps.
struct ReadProgress {
  uint32_t stop_at = UINT32_MAX;         // a record that must be treated as a miss (failed promotion)
  uint32_t waited_at = UINT32_MAX;       // the record a promotion was last awaited for
  uint32_t read_ahead = 0;               // promotions this request started ahead of its records
  bool remote_asked = false;             // the shared tier (T3) was asked about its local misses (once)
  TierId promoted_from = TierId::kHost;  // the tier the awaited promotion came from
  uint64_t per_tier[kTierCount] = {};    // hits (lookups) or records served (leases), by tier
};

// A request being served.
struct Op {
  uint64_t token = 0;       // names it to the transfers it waits for (unique, never 0)
  uint64_t started_ns = 0;  // when the loop popped it (latency histograms)
  Session* session = nullptr;
  ipc::Sqe sqe{};
  ipc::SqeShape shape{};
  const ipc::OpTraits* traits = nullptr;  // set with shape by the check
  ipc::Cqe cqe{};                         // the completion, written once the op ends
  bool checked = false;                   // the SQE passed check_sqe and the op's preconditions
  bool queued = false;                    // in the daemon's runnable queue (at most once)
  uint32_t cursor = 0;                    // input records done
  uint32_t waiting = 0;                   // transfers it waits for
  bool wants_room = false;                // waiting for room in a full tier (RESERVE, LEASE, GPU_STORE)
  uint64_t room_deadline_ns = 0;
  const ModelInfo* model = nullptr;
  Status first_error;           // kept to answer with once the op ends
  uint64_t done = 0;            // records finished (committed, leased, evicted, ...)
  uint64_t skipped = 0;         // records passed over (EVICT: leased or moving)
  bool unknown_handle = false;  // an id in COMMIT/ABORT/RELEASE was not this session's
  bool finishing = false;       // past its records: settling what it took (also in slices)
  size_t settled = 0;           // of op.taken / op.committed, from the back
  ReadProgress read;
  std::vector<uint64_t> taken;           // handles this request created, for rollback and touch order
  std::vector<kdn_key> committed;        // COMMIT: keys copied, settled tail first at the end
  std::shared_ptr<gpu::GpuRequest> gpu;  // the GPU opcodes: what it holds meanwhile
};

enum class Step : uint8_t {
  kDone,  // op.cqe is the completion
  kMore,  // yielded at the deadline: step again later
  kWait,  // waits for transfers (on_event) or for room
};

// (session, chunk) leases held, per uid and in all.
struct LeasePins {
  std::unordered_map<uint32_t, uint64_t> per_uid;
  uint64_t total = 0;
};

class RequestHandler {
 public:
  RequestHandler(ModelTable& models, DaemonCounters& counters, const Config& config);

  Step step(Op& op, uint64_t deadline_ns) noexcept;
  // A transfer `op` waited for finished. The op is runnable again once op.waiting is 0.
  void on_event(Op& op, const StoreEvent& event) noexcept;
  // The GPU batch a GPU_STORE waited for landed (or failed).
  void on_gpu_done(Op& op, bool failed) noexcept;
  // The GPU tier (null: none, every GPU opcode is unsupported). Not owned.
  void set_gpu(gpu::GpuService* gpu) noexcept { gpu_ = gpu; }
  // kdnd-test's seam (DaemonFaults::stall_lease_file): while `file` exists, each request that
  // takes leases logs and holds the loop for `ms` before it is served.
  void set_lease_stall(std::string file, uint32_t ms) {
    stall_lease_file_ = std::move(file);
    stall_lease_ms_ = ms;
  }

  // Ends a session's holdings: releases its leases, aborts its reservations, releases its
  // models. Requests still in flight are the caller's (they keep the session until their
  // transfers land).
  void drop_holdings(Session& s) noexcept;
  // Aborts reservations older than the reservation timeout; returns how many.
  uint64_t expire_reservations(Session& s, uint64_t now_ns) noexcept;

  // The limits the handler enforces, as told to clients at the handshake.
  ipc::SessionLimits limits() const noexcept;
  // STATS of a namespace (daemon-wide fields only for admins of every namespace).
  ipc::StatsRecord stats(const Namespace& ns, bool node_admin) const noexcept;
  // METRICS renders kdnd's Prometheus page with this, as the admin session asking may see it
  // (the daemon's, which knows every namespace).
  void set_metrics_renderer(std::function<std::string(const Session&)> render) { render_metrics_ = std::move(render); }
  // TIER_STATS of a namespace: one record per tier.
  std::array<ipc::TierStatsRecord, kTierCount> tier_stats(const Namespace& ns) const noexcept;

 private:
  using Serve = Step (RequestHandler::*)(Op&, uint64_t deadline_ns);
  template <class... Ops>
  static constexpr std::array<Serve, ipc::kMaxOpcode + 1> dispatch_table(ipc::OpList<Ops...>) noexcept;
  template <class O>
  Step serve_as(Op& op, uint64_t deadline_ns) {
    return serve(op, deadline_ns, O{});
  }

  // The frame (request_handler.cc).
  Step dispatch(Op& op, uint64_t deadline_ns);
  Status check(Op& op);
  void stall_for_test();
  void rollback(Op& op) noexcept;
  Step finish(Op& op, Status status);

  // One handler per opcode, by family. Data (request_data.cc):
  Step serve(Op& op, uint64_t deadline_ns, ipc::PingOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::RegisterModelOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::LookupOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::LookupEachOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::PrefetchOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::ReserveOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::CommitOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::AbortOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::ReleaseOp);
  // Leases (request_lease.cc):
  Step serve(Op& op, uint64_t deadline_ns, ipc::LeaseOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::LeaseEachOp);
  // Admin and introspection (request_admin.cc):
  Step serve(Op& op, uint64_t deadline_ns, ipc::StatsOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::ListOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::EvictOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::TierStatsOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::MetricsOp);
  // The GPU tier (gpu/gpu_requests.cc):
  Step serve(Op& op, uint64_t deadline_ns, ipc::GpuRegisterOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::GpuUnregisterOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::GpuInfoOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::GpuRetrieveOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::GpuSegmentRetrieveOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::GpuBlendSelectOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::GpuPrefetchOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::GpuStoreOp);
  Step serve(Op& op, uint64_t deadline_ns, ipc::GpuCheckOp);

  // The leasing loop of every opcode whose traits lease (request_lease.cc): leases the first
  // `wanted` records as the traits say (a prefix or each key; for the session or for kdnd's
  // copies), promoting from slower tiers, then touches what it took. Returns nothing once that
  // is done (the opcode's continuation answers), or the step to return now.
  std::optional<Step> lease_records(Op& op, uint64_t deadline_ns, uint32_t wanted);
  // Counts a finished leasing loop's hits and misses in the store's read counters.
  void note_leases(const Op& op, uint32_t wanted) const noexcept;
  // LEASE and LEASE_EACH after their loop: zero records past the served ones, the answer.
  Step answer_leases(Op& op, uint32_t wanted);

  // GPU requests: checks a request's registration and layout before anything is taken.
  Status gpu_prepare(Op& op);
  // A GPU request that leases: prepares it once, then runs the leasing loop.
  std::optional<Step> gpu_lease(Op& op, uint64_t deadline_ns, uint32_t wanted);
  Step gpu_queue_retrieve(Op& op);
  Result<gpu::Registration*> gpu_take_prefix(Op& op, std::vector<Entry*>& chunks);
  Status gpu_read_segment_chunks(Op& op, gpu::GpuRequest& req);
  // What a segment retrieve (or a blend selection) works on once leased; the other leases are
  // given back.
  Status gpu_segment_work(Op& op, gpu::SegmentWork& w);
  Step gpu_queue_segment(Op& op);
  Step gpu_queue_blend(Op& op);
  Step gpu_queue_prefetch(Op& op);
  Step gpu_collect(Op& op, uint64_t deadline_ns);
  Step gpu_commit(Op& op, uint64_t deadline_ns);

  // ABORT and RELEASE: each id this session holds is finished by `finish_one`.
  template <class Holds, class FinishOne>
  Step finish_handles(Op& op, uint64_t deadline_ns, Holds holds, FinishOne finish_one, const char* unknown);
  // A local miss at record `at`: asks the shared tier (once per request) about records [at, end)
  // in one pipelined round trip; true when the request now waits for that answer.
  bool ask_remote(Op& op, uint32_t at, uint32_t end);
  // Chunks promoted ahead of a request that met lower tiers.
  uint32_t read_ahead_limit(const TieredStore& store) const noexcept;
  void abort_reservation(Session& s, uint64_t id) noexcept;
  // A reservation leaves s.reservations: its bytes no longer count as the session's.
  void forget_reserved(Session& s, const Reservation& r) noexcept;
  // Fair room-making (admission.h): writers of s's namespace holding more reserved bytes give up
  // their oldest reservations until `bytes` of them are freed or none should give more; the
  // bytes given up.
  uint64_t take_room_for(Session& s, uint64_t bytes) noexcept;
  // s's reservation of `key` (a chunk of `bytes` of model `fingerprint`), making room as above
  // when the arena is full.
  Result<TieredStore::Reserved> reserve_fairly(Session& s, const kdn_key& key, const kdn_key& fingerprint,
                                               uint64_t bytes, uint64_t now);
  void release_lease(Session& s, uint64_t id, uint32_t count) noexcept;
  void forget_leases_of_uid(uint32_t uid, uint64_t n) noexcept;
  ipc::SlotRef arena_ref(const Session& s, const Entry* e) const noexcept;

  std::function<std::string(const Session&)> render_metrics_;
  ModelTable& models_;
  DaemonCounters& counters_;
  const Config& config_;
  gpu::GpuService* gpu_ = nullptr;
  std::string stall_lease_file_;
  uint32_t stall_lease_ms_ = 0;
  // Chunks the sessions hold leased, by uid (max_leases_per_uid) and in all (max_leases_total):
  // each costs kdnd ~100 bytes of bookkeeping, which no tenant's sessions, nor all of them
  // together, may grow without bound.
  LeasePins pins_;
};

}  // namespace kdn::sidecar
