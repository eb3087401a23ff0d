// Requests: a session's submission ring served within its in-flight bounds, parked requests and
// their slices in the runnable queue, retiring them, and delivering completions (with a backlog
// when the completion ring is full).
#include "daemon_impl.h"

#include <kdn/common/clock.h>
#include <spdlog/spdlog.h>

namespace kdn::sidecar {
using namespace daemon_detail;

// ---- requests -----------------------------------------------------------------------------------

void DaemonImpl::deliver(Session& s, const ipc::Cqe& c) {
  if (s.closed || s.ring_broken) return;
  if (s.backlog.empty()) {
    auto n = s.shm.complete(std::span<const ipc::Cqe>(&c, 1));
    if (!n.ok()) {
      // Closed at the top of the next turn, not here: the request being retired still
      // counts against the session.
      ++counters_.protocol_errors;
      s.ring_broken = true;
      broken_.push_back(&s);
      return;
    }
    if (*n == 1) return;
  }
  s.backlog.push_back(c);  // the client is not reaping: it gets it later, never lost
}

void DaemonImpl::close_broken() {
  for (Session* s : broken_) close_session(s, "completion ring corrupted by the client");
  broken_.clear();
}

bool DaemonImpl::flush_backlog(Session& s) {
  while (!s.backlog.empty()) {
    const ipc::Cqe c = s.backlog.front();
    auto n = s.shm.complete(std::span<const ipc::Cqe>(&c, 1));
    if (!n.ok() || *n == 0) return false;
    s.backlog.pop_front();
  }
  return true;
}

void DaemonImpl::park(std::unique_ptr<Op> op, Step step) {
  Op* raw = op.get();
  ops_.emplace(raw->token, std::move(op));
  if (step == Step::kMore || (step == Step::kWait && raw->waiting == 0 && !raw->wants_room)) make_runnable(raw);
}

// A request ended: its completion goes out and it stops counting against its session.
void DaemonImpl::retire(Session& s, const Op& op) {
  counters_.observe(op.sqe.opcode, now_ns() - op.started_ns);  // not the client's wake-up
  deliver(s, op.cqe);
  --s.ops_in_flight;
  s.records_in_flight -= std::min<uint64_t>(s.records_in_flight, op.sqe.in_len / sizeof(uint64_t));
}

void DaemonImpl::op_done(Op& op) {
  Session* s = op.session;
  retire(*s, op);
  ops_.erase(op.token);  // destroys op
  if (s->closed && s->ops_in_flight == 0) destroy_session(s);
}

// Pops and starts this session's new requests; false if there were none.
bool DaemonImpl::serve_session(Session& s) {
  if (!s.backlog.empty() && !flush_backlog(s)) return false;  // not reaping: back-pressure
  bool any = false;
  while (s.ops_in_flight < cfg_.max_in_flight && s.records_in_flight < kMaxRecordsInFlight) {
    ipc::Sqe sqe;
    auto n = s.shm.poll(std::span(&sqe, 1));
    if (!n.ok()) {
      ++counters_.protocol_errors;
      close_session(&s, "submission ring corrupted by the client");
      return true;
    }
    if (*n == 0) break;
    any = true;
    ++s.requests;
    ++counters_.requests;
    ++s.ops_in_flight;
    s.records_in_flight += sqe.in_len / sizeof(uint64_t);
    // Most requests finish in their first step: they live on the stack and cost no allocation.
    Op local;
    local.token = next_token_++;
    local.started_ns = now_ns();
    local.session = &s;
    local.sqe = sqe;
    if (sqe.in_len > kInlineInputBytes) {  // large: its turn comes in the runnable queue
      park(std::make_unique<Op>(std::move(local)), Step::kMore);
      continue;
    }
    const Step step = handler_.step(local, local.started_ns + uint64_t(cfg_.slice_us) * 1000);
    if (step != Step::kDone) {
      park(std::make_unique<Op>(std::move(local)), step);
      continue;
    }
    retire(s, local);
    if (s.ring_broken) return true;
  }
  return any;
}

bool DaemonImpl::poll_sessions() {
  bool any = false;
  const size_t n = active_.size();
  for (size_t i = 0; i < n && i < active_.size(); ++i) {
    Session* s = active_[(rr_ + i) % active_.size()];
    any |= serve_session(*s);
  }
  if (!active_.empty()) rr_ = (rr_ + 1) % active_.size();
  return any;
}

// One slice of the oldest runnable request.
bool DaemonImpl::run_slice() {
  if (runnable_.empty()) return false;
  Op* op = runnable_.front();
  runnable_.pop_front();
  op->queued = false;
  // A closed session's requests only finish what they started: a COMMIT settles the chunks
  // its copies published; anything else would take holdings nobody releases.
  if (op->session->closed && !settles_after_close(*op)) {
    if (op->waiting == 0) op_done(*op);
    return true;
  }
  const Step step = handler_.step(*op, now_ns() + uint64_t(cfg_.slice_us) * 1000);
  if (step == Step::kDone)
    op_done(*op);
  else if (step == Step::kMore || (op->waiting == 0 && !op->wants_room))
    make_runnable(op);
  return true;
}

}  // namespace kdn::sidecar
