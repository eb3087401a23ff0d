#include "tiers/fault_tier.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

namespace kdn::sidecar {

Result<std::unique_ptr<FaultTier>> FaultTier::create(TierId id, uint64_t capacity_bytes, uint64_t slab_bytes) noexcept {
  ipc::UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return Status::from_errno("eventfd for the fault tier", errno);
  try {
    return std::unique_ptr<FaultTier>(new FaultTier(id, capacity_bytes, slab_bytes, std::move(wake)));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "fault tier allocation failed");
  }
}

FaultTier::FaultTier(TierId id, uint64_t capacity, uint64_t slab, ipc::UniqueFd wake)
    : id_(id), alloc_(capacity, slab), storage_(alloc_.capacity()), wake_(std::move(wake)) {}

Result<uint16_t> FaultTier::slot_class(uint64_t bytes) noexcept {
  std::optional<uint16_t> cls;
  try {
    cls = alloc_.class_for(bytes);  // a new class allocates its bookkeeping
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "slot class bookkeeping");
  }
  if (!cls) return Status(Code::kInvalidArgument, "chunk larger than the fault tier");
  return *cls;
}

Result<Placement> FaultTier::allocate(uint64_t bytes) noexcept {
  auto cls = slot_class(bytes);
  if (!cls.ok()) return cls.status();
  if (full) return Status(Code::kNoSpace, "fault tier told to be full");
  std::optional<uint64_t> off;
  try {
    off = alloc_.alloc(*cls);  // a fresh slab allocates its free list
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "slab bookkeeping");
  }
  if (!off) return Status(Code::kNoSpace, "fault tier has no free slot");
  return Placement{*off, alloc_.slot_bytes(*cls), *cls};
}

void FaultTier::free(const Placement& p) noexcept { alloc_.free(p.slot_class, p.offset); }

Status FaultTier::submit(const Transfer& t) noexcept {
  if (!t.placement.valid() || t.bytes > t.placement.bytes || t.host == nullptr)
    return Status(Code::kInvalidArgument, "fault tier transfer outside its placement");
  Pending p{t, OkStatus()};
  for (auto it = faults_.begin(); it != faults_.end(); ++it) {
    if (it->direction != t.direction) continue;
    p.status = it->status;
    faults_.erase(it);
    break;
  }
  (t.direction == Transfer::Direction::kRead ? reads_ : writes_)++;
  if (auto_complete) {
    finish(p);
  } else {
    held_.push_back(p);
  }
  return OkStatus();
}

void FaultTier::finish(const Pending& p) noexcept {
  const Transfer& t = p.transfer;
  if (p.status.ok()) {
    std::byte* slot = bytes_at(t.placement);
    if (t.direction == Transfer::Direction::kWrite)
      std::memcpy(slot, t.host, t.bytes);
    else
      std::memcpy(t.host, slot, t.bytes);
  }
  ready_.push_back({t.id, p.status});
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
}

size_t FaultTier::complete_next(size_t n) noexcept {
  size_t done = 0;
  while (done < n && !held_.empty()) {
    finish(held_.front());
    held_.pop_front();
    ++done;
  }
  return done;
}

size_t FaultTier::reap(std::span<TierCompletion> out) noexcept {
  uint64_t counter;
  (void)!::read(wake_.get(), &counter, sizeof counter);
  size_t n = 0;
  while (n < out.size() && !ready_.empty()) {
    out[n++] = ready_.front();
    ready_.pop_front();
  }
  if (!ready_.empty()) {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);  // more than fit: stay readable
  }
  return n;
}

}  // namespace kdn::sidecar
