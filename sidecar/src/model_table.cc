#include "model_table.h"

namespace kdn::sidecar {

Result<uint32_t> ModelTable::acquire(const ModelInfo& m, uint32_t holder) {
  auto known = by_fingerprint_.find(m.fingerprint);
  if (holder == kNoHolder) {
    if (known == by_fingerprint_.end()) return take_slot(m);
    Slot& s = slots_[known->second];
    ++s.refs;
    return make_id(known->second, s.generation);
  }
  auto& mine = held_[holder];  // may throw: nothing has changed yet
  const bool holds = known != by_fingerprint_.end() && mine.count(known->second) != 0;
  if (!holds && mine.size() >= per_holder_) {
    if (mine.empty()) held_.erase(holder);
    return Status(Code::kLimit, "this uid's sessions hold max_models_per_uid models");
  }
  uint32_t slot = 0;
  if (known != by_fingerprint_.end()) {
    slot = known->second;
    ++slots_[slot].refs;
  } else {
    Result<uint32_t> taken = take_slot(m);
    if (!taken.ok()) {
      if (mine.empty()) held_.erase(holder);
      return taken.status();
    }
    slot = (*taken & 0xFFFF) - 1;
  }
  try {
    ++mine[slot];
  } catch (const std::bad_alloc&) {
    release(make_id(slot, slots_[slot].generation));
    return Status(Code::kNoMemory, "model table");
  }
  return make_id(slot, slots_[slot].generation);
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

void ModelTable::drop_hold(uint32_t holder, uint32_t slot) noexcept {
  auto it = held_.find(holder);
  if (it == held_.end()) return;
  auto ref = it->second.find(slot);
  if (ref == it->second.end()) return;
  if (--ref->second == 0) it->second.erase(ref);
  if (it->second.empty()) held_.erase(it);
}

uint32_t ModelTable::held_by(uint32_t holder) const noexcept {
  auto it = held_.find(holder);
  return it == held_.end() ? 0 : uint32_t(it->second.size());
}

const ModelTable::Slot* ModelTable::slot_of(uint32_t id) const noexcept {
  const uint32_t slot = (id & 0xFFFF) - 1, generation = id >> 16;
  if ((id & 0xFFFF) == 0 || slot >= slots_.size()) return nullptr;
  const Slot& s = slots_[slot];
  return s.refs > 0 && s.generation == generation ? &s : nullptr;
}

void ModelTable::release(uint32_t id, uint32_t holder) noexcept {
  const Slot* cs = slot_of(id);
  if (cs == nullptr) return;
  const uint32_t slot = (id & 0xFFFF) - 1;
  if (holder != kNoHolder) drop_hold(holder, slot);
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
