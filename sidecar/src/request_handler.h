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

#include "model_table.h"
#include "session.h"

#include <kdn/ipc/payload.h>
#include <kdn/ipc/protocol.h>
#include <kdn/sidecar/config.h>

#include <functional>
#include <memory>
#include <iterator>
#include <array>
#include <vector>

namespace kdn::sidecar {

namespace gpu {
class GpuService;
struct GpuRequest;
struct Registration;
struct SegmentWork;
}  // namespace gpu

// Why a connection did not become a session.
enum class Refusal : uint8_t {
  kUid,        // at accept: its uid and groups open no namespace and may create none
  kPending,    // at accept: max_pending_handshakes (in all, or of its uid) are waiting
  kTimeout,    // no hello within handshake_timeout_ms
  kHello,      // a malformed hello
  kVersion,    // another protocol major
  kAccess,     // the namespace does not exist, or refuses this uid or token
  kLimit,      // a session cap
  kResources,  // kdnd could not set the session up (memory, descriptors)
  kCount
};
const char* refusal_name(Refusal r) noexcept;

// Request latency, from the loop's first look at a request to its completion being queued for
// the client, in fixed buckets (Prometheus' cumulative form is made when rendering).
struct LatencyHistogram {
  static constexpr uint64_t kBoundsNs[] = {1'000,     2'500,     5'000,      10'000,     25'000,      50'000,
                                           100'000,   250'000,   500'000,    1'000'000,  2'500'000,   10'000'000,
                                           100'000'000, 1'000'000'000};
  static constexpr size_t kBuckets = std::size(kBoundsNs) + 1;  // the last: above every bound
  uint64_t buckets[kBuckets] = {};
  uint64_t count = 0, sum_ns = 0;
  void observe(uint64_t ns) noexcept {
    size_t b = 0;
    while (b < std::size(kBoundsNs) && ns > kBoundsNs[b]) ++b;
    ++buckets[b];
    ++count;
    sum_ns += ns;
  }
};

struct DaemonCounters {
  static constexpr size_t kOpcodeSlots = 32;  // latency[op]; opcodes past it count in [0]
  uint64_t sessions_total = 0, sessions_active = 0, protocol_errors = 0, requests = 0;
  uint64_t handshakes_refused = 0, limit_errors = 0, namespaces = 0;
  uint64_t pending_handshakes = 0;
  uint64_t refused[size_t(Refusal::kCount)] = {};  // handshakes_refused by reason
  LatencyHistogram latency[kOpcodeSlots];
  void refuse(Refusal r) noexcept {
    ++handshakes_refused;
    ++refused[size_t(r)];
  }
  void observe(uint8_t opcode, uint64_t ns) noexcept { latency[opcode < kOpcodeSlots ? opcode : 0].observe(ns); }
};

// A request being served.
struct Op {
  uint64_t token = 0;          // names it to the transfers it waits for (unique, never 0)
  uint64_t started_ns = 0;     // when the loop popped it (latency histograms)
  Session* session = nullptr;
  ipc::Sqe sqe{};
  ipc::SqeShape shape{};
  ipc::Cqe cqe{};              // results so far
  bool checked = false;        // the SQE passed check_sqe and the op's preconditions
  bool queued = false;         // in the daemon's runnable queue (at most once)
  uint32_t cursor = 0;         // input records done
  uint32_t waiting = 0;        // transfers it waits for
  bool wants_room = false;     // waiting for room in a full tier (RESERVE)
  uint64_t room_deadline_ns = 0;
  uint32_t stop_at = UINT32_MAX;  // a record that must be treated as a miss (failed promotion)
  uint32_t waited_at = UINT32_MAX; // the record a promotion was last awaited for
  uint32_t read_ahead = 0;     // promotions this request started ahead of its records
  bool remote_asked = false;   // the shared tier (T3) was asked about its local misses (once)
  TierId promoted_from = TierId::kHost;  // LEASE: the tier the awaited promotion came from
  uint64_t served_from[kTierCount] = {};  // LEASE: records served, by the tier they came from
  const ModelInfo* model = nullptr;
  Status first_error;          // kept to answer with once the op ends
  bool unknown_handle = false; // an id in COMMIT/ABORT/RELEASE was not this session's
  uint64_t done = 0;           // records finished (committed, leased, ...)
  bool finishing = false;      // past its records: settling what it took (also in slices)
  size_t settled = 0;          // of op.taken / op.committed, from the back
  std::vector<uint64_t> taken; // handles this request created, for rollback and touch order
  std::vector<kdn_key> committed;  // COMMIT: keys copied, settled tail first at the end
  std::shared_ptr<gpu::GpuRequest> gpu;  // GPU_RETRIEVE / GPU_STORE: what it holds meanwhile
};

enum class Step : uint8_t {
  kDone,  // op.cqe is the completion
  kMore,  // yielded at the deadline: step again later
  kWait,  // waits for transfers (on_event) or for room
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

  // Ends a session's holdings: releases its leases, aborts its reservations, releases its
  // models. Requests still in flight are the caller's (they keep the session until their
  // transfers land).
  void drop_holdings(Session& s) noexcept;
  // Aborts reservations older than the reservation timeout; returns how many.
  uint64_t expire_reservations(Session& s, uint64_t now_ns) noexcept;

  // The limits the handler enforces, as told to clients at the handshake.
  ipc::SessionLimits limits() const noexcept;
  // STATS of a namespace (daemon-wide fields only for admins).
  ipc::StatsRecord stats(const Namespace& ns, bool admin) const noexcept;
  // METRICS renders kdnd's Prometheus page with this (the daemon's, which knows every namespace).
  void set_metrics_renderer(std::function<std::string()> render) { render_metrics_ = std::move(render); }
  // TIER_STATS of a namespace: one record per tier.
  std::array<ipc::TierStatsRecord, kTierCount> tier_stats(const Namespace& ns) const noexcept;

 private:
  std::function<std::string()> render_metrics_;
  Step dispatch(Op& op, uint64_t deadline_ns);
  Status check(Op& op);
  void rollback(Op& op) noexcept;
  Step finish(Op& op, Status status);

  Step ping(Op& op);
  Step register_model(Op& op);
  Step lookup(Op& op, uint64_t deadline_ns);
  Step reserve(Op& op, uint64_t deadline_ns);
  Step commit(Op& op, uint64_t deadline_ns);
  Step abort(Op& op, uint64_t deadline_ns);
  Step lookup_each(Op& op, uint64_t deadline_ns);
  Step lease(Op& op, uint64_t deadline_ns);
  Step release(Op& op, uint64_t deadline_ns);
  Step stats(Op& op);
  Step list(Op& op);
  Step evict(Op& op, uint64_t deadline_ns);
  Step prefetch(Op& op, uint64_t deadline_ns);
  Step tier_stats(Op& op);
  Step metrics(Op& op);
  Step gpu_register(Op& op);
  Step gpu_unregister(Op& op);
  Step gpu_info(Op& op);
  Step gpu_store(Op& op, uint64_t deadline_ns);
  // GPU_RETRIEVE leases through lease(); this checks its registration and layout first, and
  // queues the copies once the prefix is leased.
  Status gpu_prepare(Op& op);
  Step gpu_queue_retrieve(Op& op);
  Result<gpu::Registration*> gpu_take_prefix(Op& op, std::vector<Entry*>& chunks);
  Status gpu_read_segment_chunks(Op& op, gpu::GpuRequest& req);
  // What a segment retrieve (or a blend selection) works on once leased; the other leases are
  // given back.
  Status gpu_segment_work(Op& op, gpu::SegmentWork& w);
  Step gpu_queue_segment(Op& op);
  // GPU_BLEND_SELECT: leases as GPU_SEGMENT_RETRIEVE does, queues the selection, answers once it
  // landed.
  Step gpu_blend(Op& op, uint64_t deadline_ns);
  Step gpu_queue_blend(Op& op);
  Step gpu_check(Op& op);
  Step gpu_queue_prefetch(Op& op);
  Step gpu_collect(Op& op, uint64_t deadline_ns);
  Step gpu_commit(Op& op, uint64_t deadline_ns);

  template <class Holds, class FinishOne>
  Step finish_handles(Op& op, uint64_t deadline_ns, Holds holds, FinishOne finish_one, const char* unknown);
  // A local miss at record `at`: asks the shared tier (once per request) about records [at, end)
  // in one pipelined round trip; true when the request now waits for that answer.
  bool ask_remote(Op& op, uint32_t at, uint32_t end);
  // Chunks promoted ahead of a request that met lower tiers.
  uint32_t read_ahead_limit(const TieredStore& store) const noexcept;
  void abort_reservation(Session& s, uint64_t id) noexcept;
  void release_lease(Session& s, uint64_t id, uint32_t count) noexcept;
  ipc::SlotRef arena_ref(const Session& s, const Entry* e) const noexcept;

  ModelTable& models_;
  DaemonCounters& counters_;
  const Config& config_;
  gpu::GpuService* gpu_ = nullptr;
};

}  // namespace kdn::sidecar
