#include "memory_releaser.h"

#include <pthread.h>

namespace kdn::sidecar {

MemoryReleaser::~MemoryReleaser() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  queue_.clear();  // the thread never started, or stopped: drop the rest here
}

void MemoryReleaser::release(std::shared_ptr<void> object) noexcept {
  if (!object) return;
  try {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { run(); });
      (void)pthread_setname_np(thread_.native_handle(), "kdnd-release");
    }
    queue_.push_back(std::move(object));
  } catch (...) {
    object.reset();  // no thread or no room in the queue: drop it on the caller's thread
    return;
  }
  cv_.notify_one();
}

size_t MemoryReleaser::pending() const {
  std::lock_guard lock(mu_);
  return queue_.size() + dropping_;
}

void MemoryReleaser::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::shared_ptr<void> next = std::move(queue_.front());
    queue_.pop_front();
    ++dropping_;
    lock.unlock();
    next.reset();  // munmap, close: the slow part, outside the lock
    lock.lock();
    --dropping_;
  }
}

}  // namespace kdn::sidecar
