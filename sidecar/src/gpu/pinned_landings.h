// PinnedLandings: page-locked host buffers that device-to-host copies land in, kept and reused
// from one GPU_STORE to the next. Page-locking (cudaHostRegister) costs a system call and page
// table work per page, too much to pay on every store's path; the pool pays it once per buffer.
//
// A buffer comes back to the pool when its last holder lets go, which may be a worker thread (a
// T0 encode job keeps its store's landing alive until it validated the blob), so the pool is
// shared by its holders and locked. Buffers are sized in powers of two from 1 MiB, so a store
// reuses the buffer of a store of about its size. At most `keep_bytes` of idle buffers stay
// pinned; one handed back past that is unpinned and freed. Registration goes through a seam, so
// the CPU tests count what would be pinned and unpinned.
#pragma once

#include "aligned_buffer.h"

#include <kdn/common/mutex.h>
#include <kdn/common/status.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kdn::sidecar::gpu {

struct PinSeam {
  Status (*pin)(void* p, size_t bytes) noexcept;
  void (*unpin)(void* p) noexcept;
};

struct LandingStats {
  uint64_t pinned = 0;      // buffers page-locked (each once, however often it was reused)
  uint64_t reused = 0;      // acquisitions served by an idle buffer
  uint64_t unpinned = 0;    // buffers given back past keep_bytes, or at the end
  uint64_t idle_bytes = 0;  // what is pinned and unused now
};

class PinnedLandings : public std::enable_shared_from_this<PinnedLandings> {
 public:
  // The buffer a holder has; returns to the pool when destroyed.
  class Landing {
   public:
    Landing() = default;
    Landing(Landing&&) noexcept = default;
    Landing& operator=(Landing&& o) noexcept;
    ~Landing() { give_back(); }
    std::byte* data() const noexcept { return buf_.data(); }
    uint64_t size() const noexcept { return buf_.size(); }

   private:
    friend class PinnedLandings;
    void give_back() noexcept;
    AlignedBuffer buf_;
    std::shared_ptr<PinnedLandings> pool_;
  };

  static std::shared_ptr<PinnedLandings> create(PinSeam seam, uint64_t keep_bytes);
  ~PinnedLandings();

  // A pinned buffer of at least `bytes`: an idle one if one is large enough (the smallest such),
  // else a new one. kNoMemory or the seam's error when none can be had: the caller takes the
  // path that needs no landing.
  Result<Landing> acquire(uint64_t bytes);
  LandingStats stats() const;

  static uint64_t size_class(uint64_t bytes) noexcept;

 private:
  PinnedLandings(PinSeam seam, uint64_t keep_bytes) : seam_(seam), keep_bytes_(keep_bytes) {}
  void take_back(AlignedBuffer buf) noexcept;

  const PinSeam seam_;
  const uint64_t keep_bytes_;
  mutable kdn::Mutex mu_;
  std::vector<AlignedBuffer> idle_ GUARDED_BY(mu_);
  LandingStats stats_ GUARDED_BY(mu_);
};

}  // namespace kdn::sidecar::gpu
