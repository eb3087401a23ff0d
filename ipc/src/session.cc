#include <kdn/ipc/session.h>

#include <kdn/common/clock.h>

#include <utility>

namespace kdn::ipc {
namespace {

std::byte* at(const SharedSegment& segment, uint64_t offset) noexcept { return segment.data() + offset; }

}  // namespace

// ---- daemon --------------------------------------------------------------------------------------
Result<DaemonSession> DaemonSession::create(const SessionLayout& layout, uint64_t session_id,
                                            const SegmentOptions& options) noexcept {
  DaemonSession s;
  Result<SharedSegment> segment = SharedSegment::create("kdn-session", layout.total_bytes, options);
  if (!segment.ok()) return segment.status();
  s.segment_ = std::move(*segment);
  // The memfd is fresh (all zero), so the rings start empty and both flags clear.
  init_session_header(*s.header(), layout, session_id);
  Result<RingConsumer<Sqe>> sq = RingConsumer<Sqe>::attach(at(s.segment_, layout.sq_offset),
                                                           layout.cq_offset - layout.sq_offset, layout.ring_entries);
  if (!sq.ok()) return sq.status();
  Result<RingProducer<Cqe>> cq = RingProducer<Cqe>::attach(
      at(s.segment_, layout.cq_offset), layout.payload_offset - layout.cq_offset, layout.ring_entries);
  if (!cq.ok()) return cq.status();
  Result<EventDoorbell> bell = EventDoorbell::create();
  if (!bell.ok()) return bell.status();
  s.sq_ = *sq;
  s.cq_ = *cq;
  s.doorbell_ = std::move(*bell);
  s.payload_ = PayloadArea(at(s.segment_, layout.payload_offset), layout.payload_bytes);
  s.layout_ = layout;
  s.id_ = session_id;
  return s;
}

Result<uint32_t> DaemonSession::complete(std::span<const Cqe> cqes) noexcept {
  Result<uint32_t> pushed = cq_.try_push_n(cqes);
  if (!pushed.ok() || *pushed == 0) return pushed;
  KDN_RETURN_IF_ERROR(wake_if_waiting(&header()->cq_waiting, cq_.tail_word()));
  return pushed;
}

// ---- client --------------------------------------------------------------------------------------
Result<ClientSession> ClientSession::attach(ClientHandshake hs, uint64_t spin_ns, const MapOptions& arena_options,
                                            const MapOptions& staging_options) noexcept {
  ClientSession c;
  c.welcome_ = hs.welcome;
  Result<SessionLayout> layout = SessionLayout::compute(hs.welcome.ring_entries, hs.welcome.payload_bytes);
  if (!layout.ok()) return Status(Code::kProtocol, "welcome sizes out of range");
  c.layout_ = *layout;
  Result<SharedSegment> segment = SharedSegment::attach(std::move(hs.session_fd), c.layout_.total_bytes);
  if (!segment.ok()) return segment.status();
  c.segment_ = std::move(*segment);
  KDN_RETURN_IF_ERROR(check_session_header(*c.header(), c.layout_, hs.welcome.session_id));
  for (uint32_t i = 0; i < hs.welcome.num_regions; ++i) {
    const RegionRecord& r = hs.welcome.regions[i];
    MapOptions options = r.kind == uint32_t(RegionKind::kHostArena) ? arena_options : staging_options;
    options.read_only = r.access != uint32_t(RegionAccess::kReadWrite);
    Result<SharedSegment> mapped = SharedSegment::attach(std::move(hs.region_fds[i]), r.bytes, options);
    if (!mapped.ok()) return mapped.status();
    c.regions_[i].record = r;
    c.regions_[i].segment = std::move(*mapped);
  }
  c.num_regions_ = hs.welcome.num_regions;
  Result<EventDoorbell> bell = EventDoorbell::adopt(std::move(hs.doorbell_fd));
  if (!bell.ok()) return bell.status();
  c.doorbell_ = std::move(*bell);
  Result<RingProducer<Sqe>> sq = RingProducer<Sqe>::attach(
      at(c.segment_, c.layout_.sq_offset), c.layout_.cq_offset - c.layout_.sq_offset, c.layout_.ring_entries);
  if (!sq.ok()) return sq.status();
  Result<RingConsumer<Cqe>> cq = RingConsumer<Cqe>::attach(
      at(c.segment_, c.layout_.cq_offset), c.layout_.payload_offset - c.layout_.cq_offset, c.layout_.ring_entries);
  if (!cq.ok()) return cq.status();
  c.sq_ = *sq;
  c.cq_ = *cq;
  c.waiter_ = CompletionWaiter(c.cq_.peer_tail_word(), &c.header()->cq_waiting, spin_ns);
  return c;
}

Result<std::byte*> ClientSession::resolve(const SlotRef& ref, uint64_t bytes, RegionKind kind) const noexcept {
  for (uint32_t i = 0; i < num_regions_; ++i) {
    const ClientRegion& r = regions_[i];
    if (r.record.region_id != ref.region) continue;
    if (r.record.kind != uint32_t(kind)) return Status(Code::kProtocol, "slot reference into a region of another kind");
    if (r.record.generation != ref.generation)
      return Status(Code::kProtocol, "slot reference of a stale region generation");
    if (ref.offset > r.segment.size() || bytes > r.segment.size() - ref.offset)
      return Status(Code::kProtocol, "slot reference outside its region");
    return r.segment.data() + ref.offset;
  }
  return Status(Code::kProtocol, "slot reference into an unknown region");
}

const ClientRegion* ClientSession::region(RegionKind kind) const noexcept {
  for (uint32_t i = 0; i < num_regions_; ++i)
    if (regions_[i].record.kind == uint32_t(kind)) return &regions_[i];
  return nullptr;
}

Result<uint32_t> ClientSession::submit(std::span<const Sqe> sqes) noexcept {
  Result<uint32_t> pushed = sq_.try_push_n(sqes);
  if (!pushed.ok() || *pushed == 0) return pushed;
  KDN_RETURN_IF_ERROR(kick_if_sleeping(&header()->need_wakeup, doorbell_));
  return pushed;
}

Status ClientSession::wait_for_completion(uint64_t timeout_ns) noexcept {
  uint64_t start = now_ns();
  uint64_t deadline = timeout_ns > UINT64_MAX - start ? UINT64_MAX : start + timeout_ns;
  for (;;) {
    Result<uint32_t> ready = cq_.available();
    if (!ready.ok()) return ready.status();
    if (*ready > 0) return OkStatus();
    uint64_t now = now_ns();
    if (now >= deadline) return Status(Code::kTimeout, "no completion in time");
    // The tail we last saw equals our head (nothing ready): wait for it to move.
    Status s = waiter_.wait(cq_.consumed(), deadline == UINT64_MAX ? UINT64_MAX : deadline - now);
    if (!s.ok()) return s;
  }
}

}  // namespace kdn::ipc
