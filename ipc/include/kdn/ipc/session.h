// Both ends of one session's shared memory, assembled from the primitives: the session
// segment, its two rings, the payload area and the doorbells.
//
// DaemonSession (kdnd): creates the segment (sealed), the eventfd, and consumes SQEs /
// produces CQEs. ClientSession (libkdn): maps what the welcome delivered, produces SQEs /
// consumes CQEs, and sleeps on the CQ tail when there is nothing to do.
//
// Both are move-only and single-threaded (one thread drives a session at a time). A ring
// error (KDN_ERR_PROTOCOL) means the peer corrupted shared memory: the daemon drops the
// session; the client reports the connection as broken.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/doorbell.h>
#include <kdn/ipc/handshake.h>
#include <kdn/ipc/payload.h>
#include <kdn/ipc/protocol.h>
#include <kdn/ipc/ring.h>
#include <kdn/ipc/segment.h>

#include <array>
#include <cstdint>
#include <span>

namespace kdn::ipc {

class DaemonSession {
 public:
  DaemonSession() noexcept = default;

  // Creates and initializes the session segment and the doorbell eventfd.
  static Result<DaemonSession> create(const SessionLayout& layout, uint64_t session_id,
                                      const SegmentOptions& options = {}) noexcept;

  // Pops up to out.size() SQEs (private copies). Check each with check_sqe before use.
  Result<uint32_t> poll(std::span<Sqe> out) noexcept { return sq_.try_pop_n(out); }
  // SQEs waiting right now (for the re-check before sleeping).
  Result<uint32_t> pending() noexcept { return sq_.available(); }
  // Publishes CQEs, then futex-wakes the client if it sleeps. Returns how many fit (the CQ
  // has room for every in-flight SQE of a well-behaved client; a client that overfills it
  // gets the rest later).
  Result<uint32_t> complete(std::span<const Cqe> cqes) noexcept;
  // Announces / withdraws the daemon's sleep on this session (see doorbell.h).
  void set_sleeping(bool sleeping) noexcept { set_need_wakeup(&header()->need_wakeup, sleeping); }

  SessionHeader* header() const noexcept { return reinterpret_cast<SessionHeader*>(segment_.data()); }
  const PayloadArea& payload() const noexcept { return payload_; }
  const EventDoorbell& doorbell() const noexcept { return doorbell_; }
  const SharedSegment& segment() const noexcept { return segment_; }
  const SessionLayout& layout() const noexcept { return layout_; }
  uint64_t id() const noexcept { return id_; }

 private:
  SharedSegment segment_;
  EventDoorbell doorbell_;
  RingConsumer<Sqe> sq_;
  RingProducer<Cqe> cq_;
  PayloadArea payload_;
  SessionLayout layout_{};
  uint64_t id_ = 0;
};

// A region as the client maps it: read-only for RegionAccess::kRead (a namespace's arena),
// read-write for kReadWrite (the session's own staging area).
struct ClientRegion {
  RegionRecord record{};
  SharedSegment segment;
};

class ClientSession {
 public:
  ClientSession() noexcept = default;

  // Maps the session segment and every region, checks the header against the welcome, and
  // adopts the doorbell. Consumes the handshake's fds. `arena_options` apply to host-arena
  // regions (read_only is forced by the region's access), `staging_options` to staging.
  static Result<ClientSession> attach(ClientHandshake handshake, uint64_t spin_ns = kDefaultSpinNs,
                                      const MapOptions& arena_options = {},
                                      const MapOptions& staging_options = {}) noexcept;

  // Publishes as many SQEs as fit, then rings the doorbell if the daemon sleeps. Returns how
  // many were published (0 when the SQ is full).
  Result<uint32_t> submit(std::span<const Sqe> sqes) noexcept;
  // Rings the doorbell whether or not the daemon sleeps (tools and tests that change the
  // rings by hand; submit() rings only when needed).
  Status ring_doorbell() const noexcept { return doorbell_.ring(); }
  // Pops up to out.size() CQEs (private copies).
  Result<uint32_t> reap(std::span<Cqe> out) noexcept { return cq_.try_pop_n(out); }
  // Waits until at least one CQE is ready: OK, or KDN_ERR_TIMEOUT, or a ring error.
  Status wait_for_completion(uint64_t timeout_ns) noexcept;

  std::byte* payload() const noexcept { return segment_.data() + layout_.payload_offset; }
  uint32_t payload_bytes() const noexcept { return layout_.payload_bytes; }
  uint32_t ring_entries() const noexcept { return layout_.ring_entries; }
  const WelcomeMsg& welcome() const noexcept { return welcome_; }
  // True while the daemon announces that it sleeps (its next request is a wake-up); a hint
  // for tools that measure latency, never for correctness.
  bool daemon_sleeping() const noexcept {
    return std::atomic_ref<uint32_t>(header()->need_wakeup).load(std::memory_order_relaxed) != 0;
  }

  // The bytes [ref.offset, ref.offset + bytes) of a region of `kind` this session maps.
  // KDN_ERR_PROTOCOL for an unknown region, another kind, a stale generation or a range
  // outside the region: the daemon handed out a reference it should not have.
  Result<std::byte*> resolve(const SlotRef& ref, uint64_t bytes, RegionKind kind) const noexcept;
  // The first region of `kind`, or null.
  const ClientRegion* region(RegionKind kind) const noexcept;

 private:
  SessionHeader* header() const noexcept { return reinterpret_cast<SessionHeader*>(segment_.data()); }

  WelcomeMsg welcome_{};
  SessionLayout layout_{};
  SharedSegment segment_;
  std::array<ClientRegion, kMaxWelcomeRegions> regions_;
  uint32_t num_regions_ = 0;
  EventDoorbell doorbell_;
  RingProducer<Sqe> sq_;
  RingConsumer<Cqe> cq_;
  CompletionWaiter waiter_;
};

}  // namespace kdn::ipc
