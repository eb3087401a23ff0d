// The leasing loop every leasing opcode runs, and LEASE / LEASE_EACH's continuation. The
// opcode's traits (ipc/ops.h) say how it leases: a prefix that ends at the first miss or each
// key on its own, and whether the leases are the session's or kdnd's own (GPU copies). The
// GPU opcodes' continuations are in gpu/gpu_requests.cc.
#include "request_handler.h"

#include "gpu/gpu_request.h"
#include "request_slices.h"

#include <kdn/ipc/ops.h>

namespace kdn::sidecar {

using Lease = ipc::OpTraits::Lease;
using Holder = ipc::OpTraits::Holder;

namespace {

// A chunk the session already leases: the same lease id again, its count grown.
Result<uint64_t> lease_again(Session& s, uint64_t id, uint32_t max_lease_count) {
  LeaseHold& h = s.leases[id];
  if (h.count >= max_lease_count) return Status(Code::kLimit, "a chunk leased max_lease_count times by this session");
  ++h.count;
  return id;
}

// A chunk acquired for the session: a new lease id, or a refusal past max_leases or
// max_lease_bytes (the pin is given back either way on failure). Leased chunks cannot be
// evicted: the byte cap keeps one session from pinning its namespace's arena whole.
Result<uint64_t> hold_for_session(Session& s, TieredStore& store, Entry* e, uint64_t bytes, const Config& cfg,
                                  LeasePins& pins) {
  const auto of_uid = pins.per_uid.find(s.uid);
  if (s.leases.size() >= cfg.max_leases) {  // a new chunk past the limit: none of it
    store.unpin(e);
    return Status(Code::kLimit, "more leased chunks than max_leases");
  }
  if (of_uid != pins.per_uid.end() && of_uid->second >= cfg.max_leases_per_uid) {
    store.unpin(e);
    return Status(Code::kLimit, "this uid's sessions hold max_leases_per_uid leased chunks");
  }
  if (pins.total >= cfg.max_leases_total) {
    store.unpin(e);
    return Status(Code::kLimit, "kdnd's sessions hold max_leases_total leased chunks");
  }
  if (s.leased_bytes + bytes > cfg.max_lease_bytes) {
    store.unpin(e);
    return Status(Code::kLimit, "more leased bytes than max_lease_bytes");
  }
  const uint64_t id = s.next_handle++;
  try {
    s.leases.emplace(id, LeaseHold{e, 1, bytes});
    s.lease_ids.emplace(e, id);
    ++pins.per_uid[s.uid];  // last: nothing after it throws
    ++pins.total;
    s.leased_bytes += bytes;
  } catch (...) {
    s.leases.erase(id);
    s.lease_ids.erase(e);
    store.unpin(e);
    throw;
  }
  return id;
}

// A chunk acquired for kdnd's copies: the copies' own lease, released when they land.
void hold_for_daemon(gpu::GpuRequest& g, TieredStore& store, Entry* e, bool positions, uint32_t at) {
  try {
    g.leased.push_back(e);
    if (positions) g.position.push_back(at);  // misses leave gaps
  } catch (...) {
    if (g.leased.empty() || g.leased.back() != e) store.unpin(e);
    throw;
  }
}

}  // namespace

// Every lease taken goes to op.taken (rollback, touch order; kdnd's own leases as id 0); a miss
// takes nothing. A prefix stops at the first miss; `each` writes a zero record for it and goes on.
std::optional<Step> RequestHandler::lease_records(Op& op, uint64_t deadline_ns, uint32_t wanted) {
  Session& s = *op.session;
  TieredStore& store = *s.ns->store;
  const bool each = op.traits->lease == Lease::kEach;
  const bool daemon = op.traits->holder == Holder::kDaemon;
  const uint64_t bytes = op.model->chunk_bytes;
  ReadProgress& rd = op.read;
  kdn_key keys[kBatch];
  ipc::LeaseRecord out[kBatch];
  bool stopped = op.finishing;
  op.wants_room = false;
  while (op.cursor < wanted && !stopped) {
    const uint32_t first = op.cursor, m = std::min(kBatch, wanted - first);
    Status in = s.shm.payload().copy_in_slice(op.sqe, first, std::span(keys, m));
    if (!in.ok()) {
      rollback(op);
      return finish(op, in);
    }
    const uint64_t now = now_ns();
    uint32_t filled = 0;
    bool wait = false;
    for (; filled < m; ++filled) {
      const uint32_t at = first + filled;
      if (at == rd.stop_at) {
        if (each) {  // its promotion failed: a miss here, go on with the next key
          out[filled] = ipc::LeaseRecord{};
          rd.stop_at = UINT32_MAX;
          continue;
        }
        stopped = true;
        break;
      }
      Entry* e = store.index().find(keys[filled]);
      uint64_t id = 0;
      if (auto held = e && !daemon ? s.lease_ids.find(e) : s.lease_ids.end(); held != s.lease_ids.end()) {
        make_room(op.taken, 1);
        auto again = lease_again(s, held->second, config_.max_lease_count);
        if (!again.ok()) {
          rollback(op);
          return finish(op, again.status());
        }
        id = *again;
      } else {
        bool miss = false;
        switch (store.acquire(keys[filled], bytes, op.token, &e, now, &rd.promoted_from)) {
          case TieredStore::Acquired::kMiss:
            // Not on this node: the shared tier is asked about this key and the rest, once.
            if (ask_remote(op, at, wanted))
              wait = true;
            else
              miss = true;
            break;
          case TieredStore::Acquired::kNoRoomYet:
            if (room_wait_over(op, now, config_.room_wait_ms)) {
              miss = true;  // no room came in time: the prefix ends here (each: a miss)
              break;
            }
            op.wants_room = true;
            wait = true;
            break;
          case TieredStore::Acquired::kPromoting:
            if (rd.waited_at == at) {  // promoted once and gone again: a miss now
              miss = true;
              break;
            }
            rd.waited_at = at;
            ++op.waiting;
            store.prefetch(std::span(keys + filled + 1, m - filled - 1), bytes, read_ahead_limit(store));
            wait = true;
            break;
          case TieredStore::Acquired::kLeased: {
            try {
              make_room(op.taken, 1);  // before the hold: a lease taken is always one rollback finds
            } catch (...) {
              store.unpin(e);
              throw;
            }
            if (daemon) {
              hold_for_daemon(*op.gpu, store, e, op.traits->segment_records, at);
              break;
            }
            auto held_now = hold_for_session(s, store, e, bytes, config_, pins_);
            if (!held_now.ok()) {
              rollback(op);
              return finish(op, held_now.status());
            }
            id = *held_now;
            break;
          }
        }
        if (miss && each) {
          out[filled] = ipc::LeaseRecord{};
          continue;
        }
        stopped = miss;
        if (stopped || wait) break;
      }
      op.taken.push_back(id);
      const bool promoted = rd.waited_at == at;  // it was brought up for this request
      const uint32_t from = tier_index(promoted ? rd.promoted_from : TierId::kHost);
      ++rd.per_tier[from];
      out[filled] = ipc::LeaseRecord{arena_ref(s, e), id, from, 0};
    }
    Status wrote = daemon
                       ? OkStatus()
                       : s.shm.payload().copy_out_slice(op.sqe, first, std::span<const ipc::LeaseRecord>(out, filled));
    if (!wrote.ok()) {
      rollback(op);
      return finish(op, wrote);
    }
    op.cursor = first + filled;
    if (wait) return Step::kWait;
    if (!stopped && op.cursor < wanted && past(deadline_ns)) return Step::kMore;
  }
  op.finishing = true;
  const uint64_t now = now_ns();
  const bool touched = daemon
                           ? settle_backwards(op, op.gpu->leased, deadline_ns, [&](Entry* e) { store.touch(e, now); })
                           : settle_backwards(op, op.taken, deadline_ns, [&](uint64_t id) {
                               if (auto h = s.leases.find(id); h != s.leases.end()) store.touch(h->second.entry, now);
                             });
  if (!touched) return Step::kMore;
  return std::nullopt;
}

// A prefix lease counts the keys past the one it stopped at as misses, as LOOKUP does.
void RequestHandler::note_leases(const Op& op, uint32_t wanted) const noexcept {
  const ReadOp read = op.traits->lease == Lease::kEach ? ReadOp::kLeaseEach : ReadOp::kLease;
  op.session->ns->store->note_read(read, op.read.per_tier, wanted - op.taken.size());
}

// ---- LEASE, LEASE_EACH ------------------------------------------------------------------------

// The records not served are zero; the count of leases taken is the answer (both opcodes').
Step RequestHandler::answer_leases(Op& op, uint32_t wanted) {
  Status z = op.session->shm.payload().zero_out_records<ipc::LeaseRecord>(op.sqe, op.cursor, wanted);
  if (!z.ok()) {
    rollback(op);
    return finish(op, z);
  }
  note_leases(op, wanted);
  const uint32_t leased = uint32_t(op.taken.size());
  if (op.traits->lease == Lease::kEach)
    ipc::LeaseEachOp::put({leased}, op.cqe);
  else
    ipc::LeaseOp::put({leased}, op.cqe);
  return finish(op, OkStatus());
}

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::LeaseOp) {
  const uint32_t wanted = ipc::LeaseOp::wanted(ipc::LeaseOp::args(op.sqe), op.shape.in_records);
  if (auto step = lease_records(op, deadline_ns, wanted)) return *step;
  return answer_leases(op, wanted);
}

Step RequestHandler::serve(Op& op, uint64_t deadline_ns, ipc::LeaseEachOp) {
  if (auto step = lease_records(op, deadline_ns, op.shape.in_records)) return *step;
  return answer_leases(op, op.shape.in_records);
}

}  // namespace kdn::sidecar
