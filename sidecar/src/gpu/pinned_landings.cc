#include "pinned_landings.h"

#include <algorithm>
#include <bit>
#include <new>

namespace kdn::sidecar::gpu {

namespace {
constexpr uint64_t kSmallestClass = 1ull << 20;
}

uint64_t PinnedLandings::size_class(uint64_t bytes) noexcept {
  if (bytes <= kSmallestClass) return kSmallestClass;
  if (bytes > (1ull << 62)) return 0;  // no such buffer: acquire refuses it
  return std::bit_ceil(bytes);
}

std::shared_ptr<PinnedLandings> PinnedLandings::create(PinSeam seam, uint64_t keep_bytes) {
  return std::shared_ptr<PinnedLandings>(new PinnedLandings(seam, keep_bytes));
}

PinnedLandings::~PinnedLandings() {
  // Every Landing holds the pool, so none is out: only idle buffers are left.
  kdn::MutexLock lock(mu_);
  for (AlignedBuffer& b : idle_) seam_.unpin(b.data());
}

Result<PinnedLandings::Landing> PinnedLandings::acquire(uint64_t bytes) {
  const uint64_t want = size_class(bytes);
  if (want == 0) return Status(Code::kInvalidArgument, "a landing larger than any buffer");
  Landing l;
  {
    kdn::MutexLock lock(mu_);
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it)
      if (it->size() >= want && (best == idle_.end() || it->size() < best->size())) best = it;
    if (best != idle_.end()) {
      l.buf_ = std::move(*best);
      idle_.erase(best);
      stats_.idle_bytes -= l.buf_.size();
      ++stats_.reused;
      l.pool_ = shared_from_this();
      return l;
    }
  }
  AlignedBuffer fresh(want);
  if (fresh.data() == nullptr) return Status(Code::kNoMemory, "a pinned landing buffer");
  KDN_RETURN_IF_ERROR(seam_.pin(fresh.data(), fresh.size()));
  l.buf_ = std::move(fresh);
  l.pool_ = shared_from_this();
  kdn::MutexLock lock(mu_);
  ++stats_.pinned;
  return l;
}

void PinnedLandings::take_back(AlignedBuffer buf) noexcept {
  kdn::MutexLock lock(mu_);
  if (stats_.idle_bytes + buf.size() <= keep_bytes_) {
    try {
      idle_.push_back(std::move(buf));
      stats_.idle_bytes += idle_.back().size();
      return;
    } catch (const std::bad_alloc&) {
      // no room in the list: unpinned below
    }
  }
  seam_.unpin(buf.data());
  ++stats_.unpinned;
}

LandingStats PinnedLandings::stats() const {
  kdn::MutexLock lock(mu_);
  return stats_;
}

PinnedLandings::Landing& PinnedLandings::Landing::operator=(Landing&& o) noexcept {
  if (this != &o) {
    give_back();
    buf_ = std::move(o.buf_);
    pool_ = std::move(o.pool_);
  }
  return *this;
}

void PinnedLandings::Landing::give_back() noexcept {
  if (!pool_ || buf_.data() == nullptr) return;
  pool_->take_back(std::move(buf_));
  buf_.reset();
  pool_.reset();
}

}  // namespace kdn::sidecar::gpu
