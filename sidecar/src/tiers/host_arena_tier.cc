#include "tiers/host_arena_tier.h"

#include <kdn/common/mutex.h>
#include <kdn/kernels/stream_copy.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <optional>
#include <thread>

namespace kdn::sidecar {
namespace {

void copy_chunk(std::byte* dst, const std::byte* src, uint64_t bytes) {
  if (dst == src) return;  // written in place already (a GPU store copies straight into the slot)
  // Streaming stores: the destination is not read again soon by this thread, and they avoid
  // the read-for-ownership traffic that halves a large copy's bandwidth.
  kernels::detail::copy_bytes(dst, src, bytes, bytes >= (1u << 20));
  kernels::detail::streaming_fence();
}

}  // namespace

// The copy workers: dedicated threads, not a oneTBB arena, because TBB caps its worker
// threads at the core count minus one for the whole process (one worker on a 2-core node),
// and a copy worker that waits behind that cap holds a store's completion hostage. Jobs are
// few and large (one per chunk), so a mutex-protected queue costs nothing measurable.
struct HostArenaTier::Workers {
  struct Job {
    std::byte* dst;
    const std::byte* src;
    uint64_t bytes;
    TransferId id;
    std::function<void()> task;  // instead of a copy: work with no completion
  };

  Workers(uint32_t threads, int wake_fd) : wake(wake_fd) {
    for (uint32_t i = 0; i < (threads < 1 ? 1 : threads); ++i) pool.emplace_back([this] { run(); });
  }
  ~Workers() {
    {
      kdn::MutexLock lock(mu);
      stopping = true;  // the queue is drained first: run() returns only when it is empty
    }
    cv.notify_all();
    for (std::thread& t : pool) t.join();
  }

  void post(const Job& j) {
    {
      kdn::MutexLock lock(mu);
      jobs.push_back(j);
    }
    cv.notify_one();
  }

  bool pop_done(TierCompletion* out) {
    kdn::MutexLock lock(mu);
    if (done.empty()) return false;
    *out = done.front();
    done.pop_front();
    return true;
  }

  void run() {
    for (;;) {
      Job j;
      {
        kdn::MutexLock lock(mu);
        while (!stopping && jobs.empty()) lock.wait(cv);
        if (jobs.empty()) return;
        j = jobs.front();
        jobs.pop_front();
      }
      if (j.task) {
        j.task();
        continue;
      }
      copy_chunk(j.dst, j.src, j.bytes);
      {
        kdn::MutexLock lock(mu);
        done.push_back({j.id, OkStatus()});
      }
      const uint64_t one = 1;
      (void)!::write(wake, &one, sizeof one);  // after the push: a woken reaper finds it
    }
  }

  int wake;
  kdn::Mutex mu;
  std::condition_variable cv;
  std::deque<Job> jobs GUARDED_BY(mu);
  std::deque<TierCompletion> done GUARDED_BY(mu);
  bool stopping GUARDED_BY(mu) = false;
  std::vector<std::thread> pool;
};

Result<std::unique_ptr<HostArenaTier>> HostArenaTier::create(ipc::SharedSegment arena,
                                                             const HostArenaOptions& options) noexcept {
  if (!arena.valid()) return Status(Code::kInvalidArgument, "host tier without an arena");
  ipc::UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return Status::from_errno("eventfd for the host tier", errno);
  try {
    return std::unique_ptr<HostArenaTier>(new HostArenaTier(std::move(arena), options, std::move(wake)));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "host tier allocation failed");
  }
}

HostArenaTier::HostArenaTier(ipc::SharedSegment arena, const HostArenaOptions& options, ipc::UniqueFd wake)
    : arena_(std::move(arena)),
      alloc_(arena_.size(), options.slab_bytes),
      options_(options),
      wake_(std::move(wake)),
      workers_(std::make_unique<Workers>(options.copy_threads, wake_.get())) {}

// Copies in flight write into arena_ and read client memory the caller still maps: the
// workers finish every queued job before they exit, and they exit before arena_ unmaps.
HostArenaTier::~HostArenaTier() { workers_.reset(); }

Result<uint16_t> HostArenaTier::slot_class(uint64_t bytes) noexcept {
  std::optional<uint16_t> cls;
  try {
    cls = alloc_.class_for(bytes);  // a new class allocates its bookkeeping
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "slot class bookkeeping");
  }
  if (!cls) return Status(Code::kInvalidArgument, "chunk larger than the host arena");
  return *cls;
}

Result<Placement> HostArenaTier::allocate(uint64_t bytes) noexcept {
  auto cls = slot_class(bytes);
  if (!cls.ok()) return cls.status();
  std::optional<uint64_t> off;
  try {
    off = alloc_.alloc(*cls);  // a fresh slab allocates its free list
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "slab bookkeeping");
  }
  if (!off) return Status(Code::kNoSpace, "host arena has no free slot of this size");
  return Placement{*off, alloc_.slot_bytes(*cls), *cls};
}

void HostArenaTier::free(const Placement& p) noexcept { alloc_.free(p.slot_class, p.offset); }

Status HostArenaTier::submit(const Transfer& t) noexcept {
  if (!t.placement.valid() || t.bytes > t.placement.bytes || t.host == nullptr || t.placement.offset > arena_.size() ||
      t.bytes > arena_.size() - t.placement.offset) {
    return Status(Code::kInvalidArgument, "host transfer outside its placement");
  }
  std::byte* slot = address(t.placement);
  std::byte* dst = t.direction == Transfer::Direction::kWrite ? slot : t.host;
  const std::byte* src = t.direction == Transfer::Direction::kWrite ? t.host : slot;
  try {
    if (t.bytes <= options_.inline_bytes) {
      inline_done_.reserve(inline_done_.size() + 1);  // may throw: before the copy, not after
      copy_chunk(dst, src, t.bytes);
      inline_done_.push_back({t.id, OkStatus()});
      // The wake fd stays the one signal of a ready completion, so a loop about to sleep
      // never misses one that finished on its own thread.
      const uint64_t one = 1;
      (void)!::write(wake_.get(), &one, sizeof one);
    } else {
      workers_->post({dst, src, t.bytes, t.id, {}});
    }
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "copy queue allocation failed");
  }
  ++submitted_;
  return OkStatus();
}

Status HostArenaTier::run_task(std::function<void()> task) noexcept {
  try {
    workers_->post({nullptr, nullptr, 0, 0, std::move(task)});
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "copy queue allocation failed");
  }
  return OkStatus();
}

size_t HostArenaTier::reap(std::span<TierCompletion> out) noexcept {
  size_t n = 0;
  while (n < out.size() && !inline_done_.empty()) {
    out[n++] = inline_done_.back();
    inline_done_.pop_back();
  }
  if (submitted_ - reaped_ > 0) {
    uint64_t counter;
    (void)!::read(wake_.get(), &counter, sizeof counter);  // reset before popping: a later push rewakes
    TierCompletion c;
    while (n < out.size() && workers_->pop_done(&c)) out[n++] = c;
  }
  reaped_ += n;
  return n;
}

}  // namespace kdn::sidecar
