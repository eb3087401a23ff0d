// WorkerPool: the few threads a tier runs its codec and checksum jobs on (T2 and T3), and the
// queue that hands each job's operation back to the event loop.
//
// Dedicated threads rather than oneTBB's pool, for the reason the host tier's copy workers
// give: TBB caps a process at cores - 1 workers, one on a 2-core node, and a checksum waiting
// behind that cap holds a promotion hostage. Jobs are few and large.
//
// Two queues: quick jobs (a checksum, the decode a read waits for) run before bulk ones (an
// encode, a background re-encode), so a read never waits behind a backlog of encodes. A job's
// last act is done(item): the item joins the done queue and wake_fd is signalled, so a loop
// woken by the fd finds the item with take_done().
//
// Ownership: the pool owns its threads; jobs own nothing of the pool. Destruction drops the
// jobs not yet started and waits for the running ones: once it returns no job touches memory
// again. The done queue is dropped with it (the owner is going away too).
// Thread safety: post(), take_done() and idle() from the owner's loop thread; done() from jobs.
#pragma once

#include <unistd.h>

#include <kdn/common/mutex.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <new>
#include <thread>
#include <vector>

namespace kdn::sidecar {

template <class Item>
class WorkerPool {
 public:
  enum class Lane : uint8_t { kQuick, kBulk };

  // At least one thread. May throw std::system_error (no thread could be started).
  WorkerPool(uint32_t threads, int wake_fd) : wake_(wake_fd) {
    try {
      for (uint32_t i = 0; i < (threads < 1 ? 1 : threads); ++i) pool_.emplace_back([this] { run(); });
    } catch (...) {
      stop();  // the threads already started must not outlive a pool that was never made
      throw;
    }
  }
  ~WorkerPool() { stop(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // May throw std::bad_alloc (then the job was not queued).
  void post(std::function<void()> job, Lane lane = Lane::kBulk) {
    {
      kdn::MutexLock lock(mu_);
      done_.reserve(done_.size() + quick_.size() + bulk_.size() + running_ + 1);  // so done() never allocates
      (lane == Lane::kQuick ? quick_ : bulk_).push_back(std::move(job));
    }
    cv_.notify_one();
  }

  // A job's last act: hand its item back to the loop. The fd is signalled inside the lock, after
  // the push: a count the loop empties from the fd belongs to an item the next take_done()
  // returns, and an item take_done() returned has signalled already (emptying the fd after it
  // leaves no count behind of an item the loop holds).
  void done(Item* item) noexcept {
    kdn::MutexLock lock(mu_);
    done_.push_back(item);  // reserved by post(): never reallocates
    const uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
  }

  // The buffer handed in becomes the next done queue, so it is first grown to hold an item of
  // every job still queued or running: done() must not allocate. Where that fails nothing is
  // taken, and the items wait for the next call.
  void take_done(std::vector<Item*>& out) noexcept {
    out.clear();
    kdn::MutexLock lock(mu_);
    const size_t owed = quick_.size() + bulk_.size() + running_;
    if (out.capacity() < owed) {
      try {
        out.reserve(owed);
      } catch (const std::bad_alloc&) {
        return;
      }
    }
    out.swap(done_);
  }

  bool idle() noexcept {
    kdn::MutexLock lock(mu_);
    return quick_.empty() && bulk_.empty() && running_ == 0 && done_.empty();
  }

 private:
  void stop() noexcept {
    {
      kdn::MutexLock lock(mu_);
      stopping_ = true;
      quick_.clear();
      bulk_.clear();
    }
    cv_.notify_all();
    for (std::thread& t : pool_) t.join();
  }

  void run() {
    for (;;) {
      std::function<void()> job;
      {
        kdn::MutexLock lock(mu_);
        while (!stopping_ && quick_.empty() && bulk_.empty()) lock.wait(cv_);
        if (stopping_) return;
        std::deque<std::function<void()>>& q = quick_.empty() ? bulk_ : quick_;
        job = std::move(q.front());
        q.pop_front();
        ++running_;
      }
      job();
      kdn::MutexLock lock(mu_);
      --running_;
    }
  }

  int wake_;
  kdn::Mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> quick_ GUARDED_BY(mu_);
  std::deque<std::function<void()>> bulk_ GUARDED_BY(mu_);
  std::vector<Item*> done_ GUARDED_BY(mu_);
  uint32_t running_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> pool_;
};

}  // namespace kdn::sidecar
