// DiskRing: one io_uring for one disk directory's slab files, as liburing's authors use it.
//
//   - payload transfers in flight are capped at the queue depth; small metadata writes (slot
//     headers, slab table blocks: one block) and fdatasyncs have as many slots again, so a
//     chunk's header never takes a payload's place. The SQ has room for both, so getting an SQE
//     never fails; requests beyond a cap wait in a FIFO and go out as others complete;
//   - -EAGAIN and -EINTR are resubmitted; a short read or write continues where it stopped; a
//     read that meets the end of the file ends with -ENODATA; every CQE is seen exactly once;
//   - the files are registered (IOSQE_FIXED_FILE) and so are the buffers the tier gives
//     (READ_FIXED / WRITE_FIXED); a request whose buffer lies outside them runs unregistered,
//     and one that crosses two registered pieces (or is over 1 GiB) goes in parts;
//   - completions signal an eventfd (io_uring_register_eventfd) that sits in kdnd's epoll set.
//
// Submission is deferred: submit() prepares SQEs and flush() hands them to the kernel in one
// io_uring_enter, so a burst of requests from one loop iteration costs one system call.
//
// Every completion goes through DiskIo::completed() first (the fault seam).
//
// Ownership: the caller owns each IoRequest (and its buffer) until its callback ran. The ring
// owns its io_uring; destroying it with requests in flight waits for them.
// Thread safety: one thread (the event loop; at start-up and shutdown, the thread doing them).
#pragma once

#include "disk/disk_io.h"

#include <kdn/common/status.h>

#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace kdn::sidecar {

struct IoRequest {
  IoKind kind = IoKind::kRead;
  uint32_t file = 0;         // index among the ring's registered files
  uint64_t offset = 0;       // file offset (block-aligned for O_DIRECT)
  std::byte* buf = nullptr;  // block-aligned
  uint64_t bytes = 0;        // block multiple; 0 for kSync
  uint64_t owner = 0;        // the caller's, untouched
  // Filled in by the ring.
  uint64_t done = 0;         // bytes transferred so far
  int32_t result = 0;        // on completion: 0, or -errno (-ENODATA: end of file on a read)
  uint32_t retries = 0;      // -EAGAIN / -EINTR resubmissions
  uint32_t short_count = 0;  // short transfers continued
  uint32_t segment = 0;      // bytes of the part in flight (internal)
};

struct RingCounters {
  uint64_t submitted = 0, completed = 0, retries = 0, short_transfers = 0, fixed = 0, unfixed = 0;
  uint64_t queued_max = 0;  // the most requests ever waiting behind the cap
};

class DiskRing {
 public:
  // `files`: fds to register, in index order. `wake_fd`: an eventfd completions signal (-1:
  // none). `device`: this ring's directory index (for DiskIo::completed).
  static Result<std::unique_ptr<DiskRing>> create(uint32_t depth, std::span<const int> files, int wake_fd, DiskIo& io,
                                                  uint32_t device) noexcept;
  ~DiskRing();
  DiskRing(const DiskRing&) = delete;
  DiskRing& operator=(const DiskRing&) = delete;

  // Registers `pieces` as fixed buffers (each at most 1 GiB). Non-ok (typically ENOMEM under
  // RLIMIT_MEMLOCK, EPERM) leaves the ring unregistered and fully usable.
  Status register_buffers(std::span<const iovec> pieces) noexcept;
  bool buffers_registered() const noexcept { return !regions_.empty(); }

  // Queues a request; it completes through the `done` callback of a later reap(). Never fails.
  void submit(IoRequest* r) noexcept;
  // Hands prepared SQEs to the kernel. Non-ok only for a ring the kernel refuses outright.
  Status flush() noexcept;
  // Takes every ready completion, resubmitting what must continue, and calls done(request)
  // for each request that finished; returns how many finished. Never blocks.
  size_t reap(const std::function<void(IoRequest*)>& done) noexcept;
  // Blocks until at least one completion is ready (start-up and shutdown only).
  Status wait() noexcept;

  uint32_t in_flight() const noexcept { return in_flight_; }  // in the kernel or prepared
  uint32_t payloads_in_flight() const noexcept { return payloads_; }
  size_t queued() const noexcept { return waiting_.size() + waiting_meta_.size(); }  // behind a cap
  uint32_t depth() const noexcept { return depth_; }
  const RingCounters& counters() const noexcept { return counters_; }

 private:
  DiskRing(DiskIo& io, uint32_t device) : io_(io), device_(device) {}
  void prepare(IoRequest* r) noexcept;
  // Applies one CQE's result to its request; true when the request finished.
  bool settle(IoRequest* r, int32_t res) noexcept;
  static bool is_metadata(const IoRequest* r) noexcept;
  void start_waiting() noexcept;

  struct Region {
    const std::byte* base;
    uint64_t bytes;
    int index;
  };
  io_uring ring_{};
  bool ring_ok_ = false;
  DiskIo& io_;
  uint32_t device_;
  uint32_t depth_ = 0;
  uint32_t in_flight_ = 0;
  uint32_t payloads_ = 0;                // of in_flight_, payload transfers (capped at depth_)
  uint32_t prepared_ = 0;                // SQEs not yet handed to the kernel
  std::deque<IoRequest*> waiting_;       // payloads behind the cap
  std::deque<IoRequest*> waiting_meta_;  // metadata behind its cap
  std::vector<Region> regions_;
  RingCounters counters_;
};

}  // namespace kdn::sidecar
