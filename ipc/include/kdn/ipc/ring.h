// Single-producer single-consumer rings over shared memory, between two processes that do
// not trust each other.
//
// Region layout (all offsets from the region start, which must be 64-byte aligned):
//
//     0     RingHeader.head   u32, written only by the consumer   (own 64-byte line)
//     64    RingHeader.tail   u32, written only by the producer   (own 64-byte line)
//     128   Entry[capacity]   capacity is a power of two
//
// head and tail are free-running u32 counters (they wrap at 2^32, not at capacity); entry i
// lives in slot i & (capacity - 1). The number of published, unconsumed entries is
// `tail - head` in u32 arithmetic, which is always in [0, capacity]:
//
//     empty:   head == tail                    full:   tail - head == capacity
//       head                                     head
//        v                                        v
//     [ . . . . . . . . ]                      [ E E E E E E E E ]
//        ^                                        ^
//       tail                                     tail  (same slot, one lap ahead)
//
//     partly full:  entries [head, tail) are readable by the consumer, slots [tail, head +
//     capacity) are writable by the producer.
//       head       tail
//        v          v
//     [ . . E E E E . . ]
//
// Untrusted peer. Each side keeps its own index in a PRIVATE member and only ever stores it
// to shared memory; it never reads its own index back (a hostile peer could have scribbled
// over it). The peer's index is read at most once per operation and checked:
//   - it must move only forward, and
//   - `tail - head` must stay within [0, capacity].
// A violation returns KDN_ERR_PROTOCOL, and the object stays broken from then on (every
// later call returns the same error), so the caller drops the session. No call loops, waits,
// asserts or touches memory outside the region whatever the peer writes. Entries are copied
// out of shared memory before the caller sees them; no reference into the ring escapes.
//
// The region must be zero-filled when both sides attach (a fresh memfd is). Thread safety:
// one thread per object at a time; the producer and the consumer may live in different
// processes (or threads) and run concurrently.
#pragma once

#include <kdn/common/status.h>

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

namespace kdn::ipc {

struct RingHeader {
  alignas(64) uint32_t head;  // consumer -> producer: entries below head are consumed
  uint8_t pad_head[60];
  alignas(64) uint32_t tail;  // producer -> consumer: entries below tail are published
  uint8_t pad_tail[60];
};
static_assert(sizeof(RingHeader) == 128);
static_assert(offsetof(RingHeader, head) == 0 && offsetof(RingHeader, tail) == 64);
static_assert(std::is_trivially_copyable_v<RingHeader> && std::is_standard_layout_v<RingHeader>);
// The shared words are accessed through std::atomic_ref, which must be lock-free for memory
// shared between processes (a lock would live in one process only).
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);
static_assert(alignof(uint32_t) == sizeof(uint32_t) && sizeof(uint32_t) <= 8);

constexpr uint32_t kMaxRingCapacity = 1u << 30;

// Bytes a ring of `capacity` entries of `entry_size` bytes occupies.
constexpr uint64_t ring_region_bytes(uint32_t capacity, size_t entry_size) noexcept {
  return sizeof(RingHeader) + static_cast<uint64_t>(capacity) * entry_size;
}

namespace ring_detail {
// Checks what attach() needs; shared by both ends.
Status check_region(const void* region, uint64_t region_bytes, uint32_t capacity, size_t entry_size,
                    size_t entry_align) noexcept;
inline Status peer_broke_ring() noexcept { return Status(Code::kProtocol, "ring peer published an impossible index"); }
}  // namespace ring_detail

template <class Entry>
class RingProducer {
  static_assert(std::is_trivially_copyable_v<Entry>, "entries are copied through shared memory");
  static_assert(alignof(Entry) <= 64);

 public:
  RingProducer() noexcept = default;

  // Attaches to a ring region of `region_bytes` holding `capacity` entries whose shared head
  // and tail both equal `start_index` (0 for a fresh, zero-filled region; other values let
  // tests cross the u32 wrap quickly). The memory must outlive the producer.
  static Result<RingProducer> attach(void* region, uint64_t region_bytes, uint32_t capacity,
                                     uint32_t start_index = 0) noexcept {
    KDN_RETURN_IF_ERROR(ring_detail::check_region(region, region_bytes, capacity, sizeof(Entry), alignof(Entry)));
    RingProducer p;
    p.header_ = static_cast<RingHeader*>(region);
    p.entries_ = reinterpret_cast<std::byte*>(region) + sizeof(RingHeader);
    p.capacity_ = capacity;
    p.tail_ = p.head_seen_ = start_index;
    return p;
  }

  // Pushes one entry: true if published, false if the ring is full, or an error if the
  // consumer corrupted the ring.
  Result<bool> try_push(const Entry& entry) noexcept {
    Result<uint32_t> n = try_push_n(std::span<const Entry>(&entry, 1));
    if (!n.ok()) return n.status();
    return *n == 1;
  }

  // Pushes as many of `entries` as fit (in order), publishing them with one index store.
  // Returns how many were pushed (0 when full).
  Result<uint32_t> try_push_n(std::span<const Entry> entries) noexcept {
    if (broken_) return ring_detail::peer_broke_ring();
    uint32_t want = entries.size() > capacity_ ? capacity_ : static_cast<uint32_t>(entries.size());
    if (free_known() < want) KDN_RETURN_IF_ERROR(refresh_head());
    uint32_t n = free_known() < want ? free_known() : want;
    for (uint32_t i = 0; i < n; ++i) std::memcpy(slot(tail_ + i), &entries[i], sizeof(Entry));
    if (n == 0) return n;
    tail_ += n;
    // SYNC POINT WRITE: release publishes the entry bytes written above before the new
    // tail; pairs with the consumer's acquire load of tail.
    std::atomic_ref<uint32_t>(header_->tail).store(tail_, std::memory_order_release);
    return n;
  }

  // Free slots right now (reads the consumer's index).
  Result<uint32_t> free_slots() noexcept {
    if (broken_) return ring_detail::peer_broke_ring();
    KDN_RETURN_IF_ERROR(refresh_head());
    return free_known();
  }

  uint32_t capacity() const noexcept { return capacity_; }
  // Entries published so far (the private tail).
  uint32_t published() const noexcept { return tail_; }
  bool broken() const noexcept { return broken_; }
  // The shared tail word, for futex wakeups of a consumer sleeping on it.
  uint32_t* tail_word() const noexcept { return &header_->tail; }

 private:
  uint32_t free_known() const noexcept { return capacity_ - (tail_ - head_seen_); }
  std::byte* slot(uint32_t index) const noexcept {
    return entries_ + static_cast<size_t>(index & (capacity_ - 1)) * sizeof(Entry);
  }
  Status refresh_head() noexcept {
    // SYNC POINT READ: acquire pairs with the consumer's release store of head, so the
    // consumer's copies out of the slots below head finished before we overwrite them.
    uint32_t head = std::atomic_ref<uint32_t>(header_->head).load(std::memory_order_acquire);
    // Valid iff head_seen_ <= head <= tail_ (in wrapping arithmetic).
    if (head - head_seen_ > tail_ - head_seen_) {
      broken_ = true;
      return ring_detail::peer_broke_ring();
    }
    head_seen_ = head;
    return OkStatus();
  }

  RingHeader* header_ = nullptr;
  std::byte* entries_ = nullptr;
  uint32_t capacity_ = 0;
  uint32_t tail_ = 0;       // private: the only source of truth for our own index
  uint32_t head_seen_ = 0;  // last validated consumer index
  bool broken_ = false;
};

template <class Entry>
class RingConsumer {
  static_assert(std::is_trivially_copyable_v<Entry>, "entries are copied through shared memory");
  static_assert(alignof(Entry) <= 64);

 public:
  RingConsumer() noexcept = default;

  // Attaches to a ring region; see RingProducer::attach.
  static Result<RingConsumer> attach(void* region, uint64_t region_bytes, uint32_t capacity,
                                     uint32_t start_index = 0) noexcept {
    KDN_RETURN_IF_ERROR(ring_detail::check_region(region, region_bytes, capacity, sizeof(Entry), alignof(Entry)));
    RingConsumer c;
    c.header_ = static_cast<RingHeader*>(region);
    c.entries_ = reinterpret_cast<std::byte*>(region) + sizeof(RingHeader);
    c.capacity_ = capacity;
    c.head_ = c.tail_seen_ = start_index;
    return c;
  }

  // Pops one entry into `out` (a private copy): true if popped, false if empty, or an error
  // if the producer corrupted the ring.
  Result<bool> try_pop(Entry& out) noexcept {
    Result<uint32_t> n = try_pop_n(std::span<Entry>(&out, 1));
    if (!n.ok()) return n.status();
    return *n == 1;
  }

  // Pops up to out.size() entries (in order), releasing their slots with one index store.
  Result<uint32_t> try_pop_n(std::span<Entry> out) noexcept {
    if (broken_) return ring_detail::peer_broke_ring();
    uint32_t want = out.size() > capacity_ ? capacity_ : static_cast<uint32_t>(out.size());
    if (available_known() < want) KDN_RETURN_IF_ERROR(refresh_tail());
    uint32_t n = available_known() < want ? available_known() : want;
    for (uint32_t i = 0; i < n; ++i) std::memcpy(&out[i], slot(head_ + i), sizeof(Entry));
    if (n == 0) return n;
    head_ += n;
    // SYNC POINT WRITE: release orders our copies out of the slots before the new head, so
    // the producer cannot overwrite a slot we are still reading; pairs with its acquire.
    std::atomic_ref<uint32_t>(header_->head).store(head_, std::memory_order_release);
    return n;
  }

  // Entries ready right now (reads the producer's index).
  Result<uint32_t> available() noexcept {
    if (broken_) return ring_detail::peer_broke_ring();
    KDN_RETURN_IF_ERROR(refresh_tail());
    return available_known();
  }

  uint32_t capacity() const noexcept { return capacity_; }
  // Entries consumed so far (the private head).
  uint32_t consumed() const noexcept { return head_; }
  bool broken() const noexcept { return broken_; }
  // The producer's shared tail word: a consumer futex-waits on it (see doorbell.h).
  const uint32_t* peer_tail_word() const noexcept { return &header_->tail; }

 private:
  uint32_t available_known() const noexcept { return tail_seen_ - head_; }
  const std::byte* slot(uint32_t index) const noexcept {
    return entries_ + static_cast<size_t>(index & (capacity_ - 1)) * sizeof(Entry);
  }
  Status refresh_tail() noexcept {
    // SYNC POINT READ: acquire pairs with the producer's release store of tail, so the
    // entry bytes below tail are visible before we copy them.
    uint32_t tail = std::atomic_ref<uint32_t>(header_->tail).load(std::memory_order_acquire);
    // Valid iff tail_seen_ <= tail <= head_ + capacity (in wrapping arithmetic).
    if (tail - tail_seen_ > capacity_ - (tail_seen_ - head_)) {
      broken_ = true;
      return ring_detail::peer_broke_ring();
    }
    tail_seen_ = tail;
    return OkStatus();
  }

  RingHeader* header_ = nullptr;
  const std::byte* entries_ = nullptr;
  uint32_t capacity_ = 0;
  uint32_t head_ = 0;       // private: the only source of truth for our own index
  uint32_t tail_seen_ = 0;  // last validated producer index
  bool broken_ = false;
};

}  // namespace kdn::ipc
