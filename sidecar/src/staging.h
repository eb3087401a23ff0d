// StagingArea: one session's staging memory — a memfd only that session maps writable,
// where its reserved chunks are written before COMMIT copies them into the shared arena.
//
// Why a copy at all: a namespace's arena is shared by every session of the tenant, and a
// client that could write into it could change a chunk after it was committed (a buggy engine,
// or a session kdnd already closed that keeps its mapping). So clients map the arena
// read-only, kdnd sealed it against every other writer, and the only bytes a client writes
// are its own staging slots. A slot belongs to one reservation from RESERVE until its COMMIT
// copy lands (or ABORT); whatever the client writes there afterwards reaches no chunk.
//
// Slots are carved first-fit from 4 KiB pages, lowest offset first, so a session that stores
// chunk after chunk reuses the same (already faulted-in) pages. Pages are allocated by the
// kernel only when the client first writes them, and kdnd never touches a page it was not
// asked to copy: its mapping faults in (with the kernel's fault-around, 64 KiB at a time) only
// the slots a COMMIT reads. Populating the whole area ahead would let a client that asks for
// gigabytes and writes nothing make kdnd allocate them, and make its tear-down free them.
//
// Not thread-safe: the event loop owns it; the copy workers only read slot bytes.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/segment.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>

namespace kdn::sidecar {

class StagingArea {
 public:
  static constexpr uint64_t kAlign = 4096;

  StagingArea() = default;
  // Creates a memfd of `bytes` (a multiple of 4 KiB), sized and sealed against resizing.
  static Result<StagingArea> create(uint64_t bytes) noexcept;

  // A slot of `bytes` (rounded up to 4 KiB), or nullopt when no free range is large enough.
  // May throw std::bad_alloc, and then changes nothing.
  std::optional<uint64_t> allocate(uint64_t bytes);
  // Returns a slot obtained from allocate(); an offset that is not a live slot is ignored.
  // Never throws: the slot's bookkeeping node is reused for the free range.
  void free(uint64_t offset) noexcept;
  // Bytes of the live slot at `offset`, or 0.
  uint64_t slot_bytes(uint64_t offset) const noexcept;

  uint64_t capacity() const noexcept { return segment_ ? segment_->size() : 0; }
  uint64_t free_bytes() const noexcept { return free_bytes_; }
  bool valid() const noexcept { return segment_ && segment_->valid(); }
  const std::byte* at(uint64_t offset) const noexcept { return segment_->data() + offset; }
  int fd() const noexcept { return segment_->fd(); }

  // Hands over the memory (mapping and memfd) and leaves the area empty, so that the caller
  // can have it unmapped off the event loop (MemoryReleaser): freeing the pages of a large
  // area takes seconds.
  std::shared_ptr<void> take_memory() noexcept;

 private:
  static uint64_t round(uint64_t bytes) noexcept { return (bytes + kAlign - 1) / kAlign * kAlign; }
  std::shared_ptr<ipc::SharedSegment> segment_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length of each free range, coalesced
  std::map<uint64_t, uint64_t> live_;  // offset -> length of each slot handed out (same node type)
  uint64_t free_bytes_ = 0;
};

}  // namespace kdn::sidecar
