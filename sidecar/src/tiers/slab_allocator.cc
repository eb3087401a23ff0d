#include "tiers/slab_allocator.h"

#include <cassert>

namespace kdn::sidecar {
namespace {
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

SlabAllocator::SlabAllocator(uint64_t arena_bytes, uint64_t slab_bytes)
    : slab_bytes_(round_up(slab_bytes ? slab_bytes : kSlotAlign, kSlotAlign)) {
  const uint64_t n = arena_bytes / slab_bytes_;
  slabs_.resize(n);
  // Push in reverse so low offsets are handed out first (nicer to read in kdnctl ls).
  for (uint64_t i = n; i-- > 0;) list_push(free_head_, static_cast<uint32_t>(i));
  free_slab_count_ = static_cast<uint32_t>(n);
}

std::optional<uint16_t> SlabAllocator::class_for(uint64_t bytes) {
  if (bytes == 0) return std::nullopt;
  const uint64_t slot = round_up(bytes, kSlotAlign);
  for (size_t i = 0; i < classes_.size(); ++i)
    if (classes_[i].slot_bytes == slot) return static_cast<uint16_t>(i);
  if (classes_.size() >= 255 || slot > capacity()) return std::nullopt;
  SizeClass c;
  c.slot_bytes = slot;
  if (slot <= slab_bytes_) {
    c.slots_per_slab = static_cast<uint32_t>(slab_bytes_ / slot);
  } else {
    c.slots_per_slab = 0;
    c.slabs_per_slot = static_cast<uint32_t>(round_up(slot, slab_bytes_) / slab_bytes_);
  }
  classes_.push_back(c);
  return static_cast<uint16_t>(classes_.size() - 1);
}

void SlabAllocator::list_push(uint32_t& head, uint32_t s) {
  slabs_[s].prev = kNone;
  slabs_[s].next = head;
  if (head != kNone) slabs_[head].prev = s;
  head = s;
}

void SlabAllocator::list_remove(uint32_t& head, uint32_t s) {
  Slab& sl = slabs_[s];
  if (sl.prev != kNone)
    slabs_[sl.prev].next = sl.next;
  else
    head = sl.next;
  if (sl.next != kNone) slabs_[sl.next].prev = sl.prev;
  sl.prev = sl.next = kNone;
}

std::optional<uint32_t> SlabAllocator::take_free_slab() {
  if (free_head_ == kNone) return std::nullopt;
  const uint32_t s = free_head_;
  list_remove(free_head_, s);
  --free_slab_count_;
  slabs_[s].in_use = true;
  return s;
}

std::optional<uint32_t> SlabAllocator::take_free_run(uint32_t n) {
  uint32_t run = 0;
  for (uint32_t i = 0; i < slabs_.size(); ++i) {
    run = slabs_[i].in_use ? 0 : run + 1;
    if (run < n) continue;
    const uint32_t first = i + 1 - n;
    for (uint32_t s = first; s <= i; ++s) {
      list_remove(free_head_, s);
      slabs_[s].in_use = true;
      slabs_[s].continuation = s != first;
    }
    free_slab_count_ -= n;
    return first;
  }
  return std::nullopt;
}

std::optional<uint64_t> SlabAllocator::alloc_large(uint16_t cls) {
  auto first = take_free_run(classes_[cls].slabs_per_slot);
  if (!first) return std::nullopt;
  slabs_[*first].cls = cls;
  slabs_[*first].used = 1;
  used_bytes_ += classes_[cls].slot_bytes;
  return uint64_t{*first} * slab_bytes_;
}

std::optional<uint64_t> SlabAllocator::alloc(uint16_t cls) {
  assert(cls < classes_.size());
  SizeClass& c = classes_[cls];
  if (c.slots_per_slab == 0) return alloc_large(cls);
  if (c.partial_head == kNone) {
    if (free_slab_count_ == 0) return std::nullopt;
    std::vector<uint32_t> slots(c.slots_per_slab);  // may throw: before anything changes
    for (uint32_t i = 0; i < c.slots_per_slab; ++i) slots[i] = c.slots_per_slab - 1 - i;
    auto s = take_free_slab();
    if (!s) return std::nullopt;
    Slab& sl = slabs_[*s];
    sl.cls = cls;
    sl.used = 0;
    sl.free_slots = std::move(slots);
    list_push(c.partial_head, *s);
  }
  const uint32_t s = c.partial_head;
  Slab& sl = slabs_[s];
  const uint32_t slot = sl.free_slots.back();
  sl.free_slots.pop_back();
  ++sl.used;
  if (sl.free_slots.empty()) list_remove(c.partial_head, s);
  used_bytes_ += c.slot_bytes;
  return uint64_t{s} * slab_bytes_ + uint64_t{slot} * c.slot_bytes;
}

bool SlabAllocator::adopt_slab(uint16_t cls, uint32_t slab, std::span<const uint32_t> used) {
  if (cls >= classes_.size() || used.empty()) return false;
  SizeClass& c = classes_[cls];
  const uint32_t n = c.slots_per_slab == 0 ? c.slabs_per_slot : 1;
  if (uint64_t{slab} + n > slabs_.size()) return false;
  for (uint32_t s = slab; s < slab + n; ++s)
    if (slabs_[s].in_use) return false;
  if (c.slots_per_slab == 0) {
    if (used.size() != 1 || used[0] != 0) return false;
  } else {
    for (uint32_t i : used)
      if (i >= c.slots_per_slab) return false;
  }
  for (uint32_t s = slab; s < slab + n; ++s) {
    list_remove(free_head_, s);
    slabs_[s].in_use = true;
    slabs_[s].continuation = s != slab;
  }
  free_slab_count_ -= n;
  Slab& sl = slabs_[slab];
  sl.cls = cls;
  if (c.slots_per_slab == 0) {
    sl.used = 1;
    used_bytes_ += c.slot_bytes;
    return true;
  }
  std::vector<bool> taken(c.slots_per_slab, false);
  for (uint32_t i : used) taken[i] = true;
  sl.free_slots.clear();
  sl.used = 0;
  for (uint32_t i = c.slots_per_slab; i-- > 0;) {  // descending: low slots are handed out first
    if (taken[i])
      ++sl.used;
    else
      sl.free_slots.push_back(i);
  }
  used_bytes_ += uint64_t{sl.used} * c.slot_bytes;
  if (!sl.free_slots.empty()) list_push(c.partial_head, slab);
  return true;
}

void SlabAllocator::release_slab(uint32_t s) {
  Slab& sl = slabs_[s];
  sl.in_use = false;
  sl.continuation = false;
  sl.used = 0;
  sl.free_slots.clear();
  sl.free_slots.shrink_to_fit();
  list_push(free_head_, s);
  ++free_slab_count_;
}

void SlabAllocator::free(uint16_t cls, uint64_t offset) {
  assert(cls < classes_.size());
  SizeClass& c = classes_[cls];
  const uint32_t s = static_cast<uint32_t>(offset / slab_bytes_);
  assert(s < slabs_.size() && slabs_[s].in_use && slabs_[s].cls == cls);
  used_bytes_ -= c.slot_bytes;
  if (c.slots_per_slab == 0) {
    for (uint32_t i = 0; i < c.slabs_per_slot; ++i) release_slab(s + i);
    return;
  }
  Slab& sl = slabs_[s];
  const bool was_full = sl.free_slots.empty();
  sl.free_slots.push_back(static_cast<uint32_t>((offset - uint64_t{s} * slab_bytes_) / c.slot_bytes));
  --sl.used;
  if (sl.used == 0) {
    if (!was_full) list_remove(c.partial_head, s);
    release_slab(s);
  } else if (was_full) {
    list_push(c.partial_head, s);
  }
}

}  // namespace kdn::sidecar
