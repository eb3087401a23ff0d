#include "gpu_registry.h"

#include <algorithm>

namespace kdn::sidecar::gpu {

GpuRegistry::GpuRegistry(uint32_t max_per_session, Closer close)
    : max_per_session_(max_per_session), close_(std::move(close)) {}

GpuRegistry::~GpuRegistry() {
  for (auto& [session, regs] : sessions_)
    for (auto& r : regs)
      if (r) close_(*r);
  for (auto& r : retired_) close_(*r);
}

Result<Registration*> GpuRegistry::add(uint64_t session, Registration r) {
  auto& regs = sessions_[session];
  auto free_slot = std::find(regs.begin(), regs.end(), nullptr);
  if (free_slot == regs.end() && regs.size() >= max_per_session_)
    return Status(Code::kLimit, "more GPU registrations than tier.gpu.max_registrations");
  if (free_slot == regs.end()) free_slot = regs.insert(regs.end(), nullptr);
  r.id = uint32_t(free_slot - regs.begin()) + 1;
  r.generation = next_generation_++;
  if (next_generation_ == 0) next_generation_ = 1;  // 2^32 registrations later: 0 stays invalid
  r.session = session;
  r.in_flight = 0;
  r.retired = false;
  *free_slot = std::make_unique<Registration>(std::move(r));
  ++live_;
  return free_slot->get();
}

Result<Registration*> GpuRegistry::find(uint64_t session, uint32_t id, uint32_t generation) noexcept {
  auto it = sessions_.find(session);
  if (it == sessions_.end() || id == 0 || id > it->second.size() || !it->second[id - 1])
    return Status(Code::kNotFound, "no such GPU registration (unregistered, or of another connection)");
  Registration* r = it->second[id - 1].get();
  if (r->generation != generation) return Status(Code::kNotFound, "stale GPU registration (its generation changed)");
  return r;
}

void GpuRegistry::retire(std::unique_ptr<Registration> r) noexcept {
  r->retired = true;
  --live_;
  if (r->in_flight == 0) {
    close_(*r);
    ++closed_;
    return;
  }
  try {
    retired_.push_back(std::move(r));
  } catch (const std::bad_alloc&) {
    // Cannot keep it for later: the copies in flight must not lose their memory, so the
    // mapping stays open for kdnd's lifetime (a leak, never a fault).
    (void)r.release();
  }
}

Status GpuRegistry::unregister(uint64_t session, uint32_t id, uint32_t generation) noexcept {
  auto r = find(session, id, generation);
  if (!r.ok()) return r.status();
  auto& slot = sessions_[session][id - 1];
  retire(std::move(slot));
  return OkStatus();
}

void GpuRegistry::drop_session(uint64_t session) noexcept {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  for (auto& r : it->second)
    if (r) retire(std::move(r));
  sessions_.erase(it);
}

void GpuRegistry::end_copy(Registration* r) noexcept {
  if (r->in_flight > 0) --r->in_flight;
  if (!r->retired || r->in_flight > 0) return;
  auto it = std::find_if(retired_.begin(), retired_.end(), [&](const auto& p) { return p.get() == r; });
  if (it == retired_.end()) return;
  close_(**it);
  ++closed_;
  retired_.erase(it);
}

}  // namespace kdn::sidecar::gpu
