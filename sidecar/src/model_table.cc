#include "model_table.h"

namespace kdn::sidecar {

Result<uint32_t> ModelTable::acquire(const ModelInfo& m) {
  if (auto it = by_fingerprint_.find(m.fingerprint); it != by_fingerprint_.end()) {
    Slot& s = slots_[it->second];
    ++s.refs;
    return make_id(it->second, s.generation);
  }
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

const ModelTable::Slot* ModelTable::slot_of(uint32_t id) const noexcept {
  const uint32_t slot = (id & 0xFFFF) - 1, generation = id >> 16;
  if ((id & 0xFFFF) == 0 || slot >= slots_.size()) return nullptr;
  const Slot& s = slots_[slot];
  return s.refs > 0 && s.generation == generation ? &s : nullptr;
}

void ModelTable::release(uint32_t id) noexcept {
  const Slot* cs = slot_of(id);
  if (cs == nullptr) return;
  const uint32_t slot = (id & 0xFFFF) - 1;
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
