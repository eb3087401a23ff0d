// MemoryReleaser: a thread that destroys mappings too large to destroy on the event loop.
//
// Closing a session's staging area is the last reference to a memfd that may hold gigabytes of
// pages the client wrote: munmap and close free them one by one, seconds for a 4 GiB area, and
// on the event loop every other session would wait that long for an answer. The loop hands
// such objects over instead (release(), O(1)) and this thread drops them.
//
// Ownership: release() takes a reference; the object dies here when it was the last one.
// Nothing handed over may touch the loop's state in its destructor. Thread safety: release()
// from any thread; the destructor (from the owner) drops what is still queued, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace kdn::sidecar {

class MemoryReleaser {
 public:
  MemoryReleaser() = default;
  ~MemoryReleaser();
  MemoryReleaser(const MemoryReleaser&) = delete;
  MemoryReleaser& operator=(const MemoryReleaser&) = delete;

  // Drops `object` on the releaser's thread (started on first use). If the thread or the queue
  // cannot be had (out of memory), drops it here: slower, never lost.
  void release(std::shared_ptr<void> object) noexcept;
  // Objects handed over and not yet dropped (tests, stats).
  size_t pending() const;

 private:
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<void>> queue_;  // GUARDED_BY(mu_)
  size_t dropping_ = 0;                      // GUARDED_BY(mu_): taken off the queue, not yet dropped
  bool stopping_ = false;                    // GUARDED_BY(mu_)
  std::thread thread_;                       // started by the first release()
};

}  // namespace kdn::sidecar
