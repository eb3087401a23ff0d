#include "model_table.h"

#include "guaranteed_share.h"

#include <algorithm>

namespace kdn::sidecar {

Result<uint32_t> ModelTable::acquire(const ModelInfo& m, uint32_t holder, uint32_t group) {
  auto known = by_fingerprint_.find(m.fingerprint);
  const bool is_known = known != by_fingerprint_.end();
  if (holder != kNoHolder) {
    auto mine = held_.find(holder);
    const bool holds = is_known && mine != held_.end() && mine->second.count(known->second) != 0;
    const size_t n = mine == held_.end() ? 0 : mine->second.size();
    if (!holds && n >= per_holder_) return Status(Code::kLimit, "this uid's sessions hold max_models_per_uid models");
  }
  uint32_t slot = 0;
  if (is_known) {
    slot = known->second;
    if (group != kNoHolder && !group_holds(group, slot)) KDN_RETURN_IF_ERROR(group_may_take_slot(group));
    ++slots_[slot].refs;
  } else {
    KDN_RETURN_IF_ERROR(group_may_take_slot(group));
    Result<uint32_t> taken = take_slot(m);
    if (!taken.ok()) return taken.status();
    slot = (*taken & 0xFFFF) - 1;
  }
  const uint32_t id = make_id(slot, slots_[slot].generation);
  Status held = hold(held_, holder, slot);
  if (held.ok()) {
    held = hold(group_held_, group, slot);
    if (!held.ok()) drop_hold(held_, holder, slot);
  }
  if (!held.ok()) {
    release(id);
    return held;
  }
  return id;
}

// One more reference of `who` to `slot` (none for kNoHolder).
Status ModelTable::hold(Holds& holds, uint32_t who, uint32_t slot) {
  if (who == kNoHolder) return OkStatus();
  try {
    ++holds[who][slot];
  } catch (const std::bad_alloc&) {
    auto it = holds.find(who);
    if (it != holds.end() && it->second.empty()) holds.erase(it);
    return Status(Code::kNoMemory, "model table");
  }
  return OkStatus();
}

void ModelTable::open_group(uint32_t group) { groups_.insert(group); }

void ModelTable::close_group(uint32_t group) noexcept {
  groups_.erase(group);
  group_held_.erase(group);
}

uint32_t ModelTable::reserved_per_group() const noexcept {
  if (groups_.empty()) return 0;
  const uint32_t even = uint32_t(capacity_ / groups_.size());
  return reserved_per_group_ < even ? reserved_per_group_ : even;
}

// Whether a model new to `group` may count for it (see the header): always within its own
// guarantee; past it, only if the slots the open groups hold, each shared one counted for every
// group holding it, still leave what the other open groups are owed.
Status ModelTable::group_may_take_slot(uint32_t group) const {
  const uint32_t reserved = reserved_per_group();
  if (reserved == 0) return OkStatus();
  const uint32_t mine = groups_.count(group) != 0 ? held_by_group(group) : reserved;
  uint64_t charged = 0, owed = 0;
  for (uint32_t g : groups_) {
    const uint32_t n = held_by_group(g);
    charged += n;
    if (g != group) owed += still_owed(n, reserved);
  }
  if (!share_allows_one_more(mine, reserved, std::max<uint64_t>(charged, live_), owed, capacity_))
    return Status(Code::kLimit,
                  "the free model slots are other namespaces' guaranteed share (models_reserved_per_namespace)");
  return OkStatus();
}

bool ModelTable::group_holds(uint32_t group, uint32_t slot) const noexcept {
  auto it = group_held_.find(group);
  return it != group_held_.end() && it->second.count(slot) != 0;
}

// A new slot for `m` with one reference.
Result<uint32_t> ModelTable::take_slot(const ModelInfo& m) {
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (slots_.size() < capacity_) {
    slots_.emplace_back();
    slot = uint32_t(slots_.size() - 1);
  } else {
    return Status(Code::kLimit, "model table full (max_models_total)");
  }
  Slot& s = slots_[slot];
  s.info = m;
  s.refs = 1;
  s.generation = (s.generation + 1) & 0xFFFF;
  if (s.generation == 0) s.generation = 1;  // id 0-generation is never handed out
  by_fingerprint_.emplace(m.fingerprint, slot);
  ++live_;
  return make_id(slot, s.generation);
}

void ModelTable::drop_hold(Holds& holds, uint32_t who, uint32_t slot) noexcept {
  auto it = holds.find(who);
  if (it == holds.end()) return;
  auto ref = it->second.find(slot);
  if (ref == it->second.end()) return;
  if (--ref->second == 0) it->second.erase(ref);
  if (it->second.empty()) holds.erase(it);
}

uint32_t ModelTable::held_by(uint32_t holder) const noexcept {
  auto it = held_.find(holder);
  return it == held_.end() ? 0 : uint32_t(it->second.size());
}

uint32_t ModelTable::held_by_group(uint32_t group) const noexcept {
  auto it = group_held_.find(group);
  return it == group_held_.end() ? 0 : uint32_t(it->second.size());
}

const ModelTable::Slot* ModelTable::slot_of(uint32_t id) const noexcept {
  const uint32_t slot = (id & 0xFFFF) - 1, generation = id >> 16;
  if ((id & 0xFFFF) == 0 || slot >= slots_.size()) return nullptr;
  const Slot& s = slots_[slot];
  return s.refs > 0 && s.generation == generation ? &s : nullptr;
}

void ModelTable::release(uint32_t id, uint32_t holder, uint32_t group) noexcept {
  const Slot* cs = slot_of(id);
  if (cs == nullptr) return;
  const uint32_t slot = (id & 0xFFFF) - 1;
  drop_hold(held_, holder, slot);
  drop_hold(group_held_, group, slot);
  Slot& s = slots_[slot];
  if (--s.refs > 0) return;
  by_fingerprint_.erase(s.info.fingerprint);
  --live_;
  try {
    free_.push_back(slot);
  } catch (const std::bad_alloc&) {
    // The slot stays unused until the table is rebuilt: a lost slot, never a wrong model.
  }
}

const ModelInfo* ModelTable::get(uint32_t id) const noexcept {
  const Slot* s = slot_of(id);
  return s ? &s->info : nullptr;
}

uint32_t ModelTable::id_of(const kdn_key& fingerprint) const noexcept {
  auto it = by_fingerprint_.find(fingerprint);
  return it == by_fingerprint_.end() ? 0 : make_id(it->second, slots_[it->second].generation);
}

}  // namespace kdn::sidecar
