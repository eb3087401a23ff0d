// The frame every request goes through: check, dispatch to its opcode's handler, finish,
// roll back, and the events that wake it; and what a session holds. The handlers live by
// family in request_data.cc, request_lease.cc, request_admin.cc and gpu/gpu_requests.cc.
#include "request_handler.h"

#include "admission.h"

#include "gpu/gpu_request.h"
#include "gpu/gpu_service.h"
#include "request_slices.h"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace kdn::sidecar {

using ipc::Opcode;

RequestHandler::RequestHandler(ModelTable& models, DaemonCounters& counters, const Config& config)
    : models_(models), counters_(counters), config_(config) {}

ipc::SessionLimits RequestHandler::limits() const noexcept {
  ipc::SessionLimits l{};
  l.max_leases = config_.max_leases;
  l.max_lease_count = config_.max_lease_count;
  l.max_reservations = config_.max_reservations;
  l.max_in_flight = config_.max_in_flight;
  l.max_models = config_.max_models;
  l.reservation_timeout_ms = config_.reservation_timeout_ms;
  l.max_lease_bytes = config_.max_lease_bytes;
  return l;
}

// ---- the frame every request goes through -------------------------------------------------------

Step RequestHandler::step(Op& op, uint64_t deadline_ns) noexcept {
  try {
    if (!op.checked) {
      Status st = check(op);
      if (!st.ok()) return finish(op, st);
      op.checked = true;
      if (op.traits->lease != ipc::OpTraits::Lease::kNone) stall_for_test();
    }
    return dispatch(op, deadline_ns);
  } catch (const std::bad_alloc&) {
    op.first_error = Status(Code::kNoMemory, "kdnd ran out of memory serving this request");
  } catch (...) {
    op.first_error = Status(Code::kInternal, "kdnd failed serving this request");
  }
  rollback(op);
  if (op.waiting > 0) return Step::kWait;  // its copies still read staging: finish when they land
  return finish(op, op.first_error);
}

void RequestHandler::stall_for_test() {
  if (stall_lease_file_.empty() || ::access(stall_lease_file_.c_str(), F_OK) != 0) return;
  spdlog::warn("test seam: stalling a lease for {} ms", stall_lease_ms_);
  std::this_thread::sleep_for(std::chrono::milliseconds(stall_lease_ms_));
}

Status RequestHandler::check(Op& op) {
  Session& s = *op.session;
  auto shape = ipc::check_sqe(op.sqe, s.shm.payload().size(), s.admin);
  if (!shape.ok()) return shape.status();
  op.shape = *shape;
  op.traits = ipc::op_traits(op.sqe.opcode);
  if (!op.traits->model) return OkStatus();
  if (std::find(s.models.begin(), s.models.end(), op.sqe.model_id) == s.models.end())
    return Status(Code::kNotFound, "model_id not registered by this session");
  op.model = models_.get(op.sqe.model_id);
  if (op.model == nullptr) return Status(Code::kInternal, "a session's model is missing from the table");
  return OkStatus();
}

// Indexed by opcode; built from ipc::AllOps, so an op in the list without a handler does not
// compile.
template <class... Ops>
constexpr std::array<RequestHandler::Serve, ipc::kMaxOpcode + 1> RequestHandler::dispatch_table(
    ipc::OpList<Ops...>) noexcept {
  std::array<Serve, ipc::kMaxOpcode + 1> t{};
  ((t[size_t(Ops::kOpcode)] = &RequestHandler::serve_as<Ops>), ...);
  return t;
}

Step RequestHandler::dispatch(Op& op, uint64_t deadline_ns) {
  static constexpr auto kServe = dispatch_table(ipc::AllOps{});
  // check() let only known opcodes through.
  const Serve serve = op.sqe.opcode <= ipc::kMaxOpcode ? kServe[op.sqe.opcode] : nullptr;
  if (serve == nullptr) return finish(op, Status(Code::kUnsupported, "unknown opcode"));
  return (this->*serve)(op, deadline_ns);
}

Step RequestHandler::finish(Op& op, Status status) {
  Session& s = *op.session;
  op.cqe.user_data = op.sqe.user_data;
  op.cqe.status = status.raw();
  if (status.code() == Code::kProtocol) {
    ++s.protocol_errors;
    ++s.ns->counters.protocol_errors;
    ++counters_.protocol_errors;
  } else if (status.code() == Code::kLimit) {
    ++s.ns->counters.limit_errors;
    ++counters_.limit_errors;
  }
  return Step::kDone;
}

void RequestHandler::rollback(Op& op) noexcept {
  Session& s = *op.session;
  if (op.sqe.opcode == uint8_t(Opcode::kReserve)) {
    for (uint64_t id : op.taken) abort_reservation(s, id);
  } else if (op.traits != nullptr && op.traits->lease != ipc::OpTraits::Lease::kNone) {
    for (uint64_t id : op.taken) release_lease(s, id, 1);
  }
  // A GPU_STORE whose gathers are in flight keeps its slots until its batch lands (its Op
  // lives until then and gives them back).
  if (op.gpu && op.gpu->phase != gpu::GpuRequest::Phase::kCopying) op.gpu->release();
  op.taken.clear();
  op.done = 0;
}

void RequestHandler::on_event(Op& op, const StoreEvent& ev) noexcept {
  if (op.waiting > 0) --op.waiting;
  if (ev.probe) return;  // what the shared tier held is in the index now: the request goes on
  Session& s = *op.session;
  const bool leases = op.traits != nullptr && op.traits->lease != ipc::OpTraits::Lease::kNone;
  if (op.sqe.opcode == uint8_t(Opcode::kCommit)) {
    s.staging.free(ev.cookie);  // the copy has read the slot: it is the session's again
    if (ev.status.ok())
      ++op.done;
    else if (op.first_error.ok())
      op.first_error = Status(Code::kIo, "copying a chunk into the arena failed");
  } else if (leases && !ev.status.ok()) {
    op.read.stop_at = op.cursor;  // the promotion of the chunk at the cursor failed: a miss there
  } else if (op.sqe.opcode == uint8_t(Opcode::kGpuStore)) {
    if (ev.status.ok())
      ++op.done;
    else if (op.first_error.ok())
      op.first_error = Status(Code::kIo, "publishing a chunk stored from the GPU failed");
  } else if (op.sqe.opcode == uint8_t(Opcode::kEvict) && ev.status.ok()) {
    ++op.done;  // EVICT kHost: a demotion landed
  }
}

// ---- holdings ---------------------------------------------------------------------------------

void RequestHandler::abort_reservation(Session& s, uint64_t id) noexcept {
  auto it = s.reservations.find(id);
  if (it == s.reservations.end()) return;
  forget_reserved(s, it->second);
  s.ns->store->abort(it->second.entry);
  s.staging.free(it->second.staging_offset);
  s.reservations.erase(it);
}

void RequestHandler::forget_reserved(Session& s, const Reservation& r) noexcept {
  const uint64_t bytes = r.entry->bytes;
  s.reserved_bytes = bytes < s.reserved_bytes ? s.reserved_bytes - bytes : 0;
}

uint64_t RequestHandler::take_room_for(Session& s, uint64_t bytes) noexcept {
  uint64_t given = 0;
  while (given < bytes) {
    Session* giver = writer_to_give_way(*s.ns, s, bytes);
    if (giver == nullptr || giver->reservation_order.empty()) break;
    const uint64_t id = giver->reservation_order.front();
    giver->reservation_order.pop_front();
    auto it = giver->reservations.find(id);
    if (it == giver->reservations.end()) continue;  // committed or aborted already
    given += it->second.entry->bytes;
    abort_reservation(*giver, id);
    ++giver->ns->counters.yielded_reservations;
  }
  return given;
}

Result<TieredStore::Reserved> RequestHandler::reserve_fairly(Session& s, const kdn_key& key, const kdn_key& fingerprint,
                                                             uint64_t bytes, uint64_t now) {
  TieredStore& store = *s.ns->store;
  auto r = store.reserve(key, fingerprint, bytes, s.id, now);
  // Room for a chunk of another size than the givers' comes only when a whole slab empties, and
  // the givers' oldest reservations may straddle two slabs: up to a slab's bytes (the chunk's,
  // when it spans more) plus one chunk are given up for one chunk, a chunk's bytes at a time.
  // The work per chunk is bounded as eviction's is (a slab's slots), and a writer whose chunks
  // are larger than the holder's still gets room.
  const uint64_t budget = std::max(bytes, config_.host.slab_bytes) + bytes;
  for (uint64_t given = 0; !r.ok() && r.status().code() == Code::kNoSpace && given < budget;) {
    const uint64_t freed = take_room_for(s, bytes);
    if (freed == 0) break;
    given += freed;
    r = store.reserve(key, fingerprint, bytes, s.id, now);
  }
  return r;
}

void RequestHandler::release_lease(Session& s, uint64_t id, uint32_t count) noexcept {
  auto it = s.leases.find(id);
  if (it == s.leases.end()) return;
  LeaseHold& h = it->second;
  h.count = count < h.count ? h.count - count : 0;
  if (h.count > 0) return;
  s.ns->store->unpin(h.entry);
  s.leased_bytes -= h.bytes;
  s.lease_ids.erase(h.entry);
  s.leases.erase(it);
  forget_leases_of_uid(s.uid, 1);
}

void RequestHandler::forget_leases_of_uid(uint32_t uid, uint64_t n) noexcept {
  auto it = pins_.per_uid.find(uid);
  if (it == pins_.per_uid.end()) return;
  const uint64_t gone = n < it->second ? n : it->second;
  it->second -= gone;
  pins_.total -= gone < pins_.total ? gone : pins_.total;
  if (it->second == 0) pins_.per_uid.erase(it);
}

void RequestHandler::drop_holdings(Session& s) noexcept {
  for (auto& [id, h] : s.leases) s.ns->store->unpin(h.entry);
  forget_leases_of_uid(s.uid, s.leases.size());
  s.leases.clear();
  s.leased_bytes = 0;
  s.lease_ids.clear();
  for (auto& [id, r] : s.reservations) s.ns->store->abort(r.entry);
  s.reservations.clear();
  s.reservation_order.clear();
  s.reserved_bytes = 0;
  s.ns->writers.erase(&s);
  for (uint32_t m : s.models) models_.release(m, s.uid, s.ns->region_id);
  s.models.clear();
  if (gpu_) gpu_->drop_session(s.id);  // closed once their copies land
}

uint64_t RequestHandler::expire_reservations(Session& s, uint64_t now_ns) noexcept {
  uint64_t expired = 0;
  while (!s.reservation_order.empty()) {
    const uint64_t id = s.reservation_order.front();
    auto it = s.reservations.find(id);
    if (it != s.reservations.end()) {
      if (it->second.deadline_ns > now_ns) break;
      abort_reservation(s, id);
      ++expired;
    }
    s.reservation_order.pop_front();
  }
  s.ns->counters.expired_reservations += expired;
  return expired;
}

ipc::SlotRef RequestHandler::arena_ref(const Session& s, const Entry* e) const noexcept {
  return ipc::SlotRef{s.ns->region_id, s.ns->region_generation, e->placement[tier_index(TierId::kHost)].offset};
}

}  // namespace kdn::sidecar
