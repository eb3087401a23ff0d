#include "prefault.h"

#include <kdn/common/clock.h>

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

namespace kdn::sidecar {
namespace {

constexpr uint64_t kStepBytes = 64ull << 20;  // one madvise: a stop waits for at most this
constexpr uint64_t kLogEveryNs = 1'000'000'000;

// Faults [p, p + n) in. MADV_POPULATE_WRITE (Linux 5.14) allocates the pages without touching
// their contents; older kernels get a read of one byte per page, which allocates shmem pages too.
void populate(std::byte* p, uint64_t n) noexcept {
  if (::madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
  static const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  volatile const std::byte* v = p;
  for (uint64_t i = 0; i < n; i += page) (void)v[i];
}

}  // namespace

void Prefaulter::start(std::vector<Target> targets) {
  stop();
  stop_.store(false, std::memory_order_relaxed);
  targets_ = std::move(targets);
  if (targets_.empty()) return;
  thread_ = std::thread([this] { run(); });
}

void Prefaulter::stop() noexcept {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

void Prefaulter::run() {
  for (Target& t : targets_) {
    const uint64_t t0 = now_ns();
    uint64_t last_log = t0;
    spdlog::info("namespace '{}': pre-faulting its host arena ({} MiB) in the background", t.name, t.bytes >> 20);
    uint64_t done = 0;
    while (done < t.bytes) {
      if (stop_.load(std::memory_order_relaxed)) return;
      const uint64_t n = std::min(kStepBytes, t.bytes - done);
      populate(t.base + done, n);
      done += n;
      t.left->store(t.bytes - done, std::memory_order_relaxed);
      const uint64_t now = now_ns();
      if (now - last_log >= kLogEveryNs && done < t.bytes) {
        last_log = now;
        spdlog::info("namespace '{}': pre-faulted {} of {} MiB ({}%)", t.name, done >> 20, t.bytes >> 20,
                     done * 100 / t.bytes);
      }
    }
    spdlog::info("namespace '{}': host arena pre-faulted ({} MiB in {:.1f} s)", t.name, t.bytes >> 20,
                 double(now_ns() - t0) / 1e9);
  }
}

}  // namespace kdn::sidecar
