// SlabAllocator: O(1) allocation of fixed-size slots inside one arena, by size class.
//
// The arena (a byte range [0, arena_bytes)) is cut into equal slabs (default 64 MiB). A size
// class is one slot size; a slab belongs to one class while it holds any live slot and goes
// back to the free-slab pool when its last slot is freed, so memory moves between models as
// their working sets change. Slots larger than a slab take a run of contiguous slabs (found by
// a scan over the slab table, which only happens when such a class needs a fresh span).
//
// Pure bookkeeping on offsets: it never touches the arena's memory. Not thread-safe: the
// daemon's event loop owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace kdn::sidecar {

class SlabAllocator {
 public:
  static constexpr uint64_t kSlotAlign = 4096;

  // arena_bytes is truncated to a whole number of slabs; slab_bytes is rounded up to
  // kSlotAlign. At least one slab must fit, else capacity() is 0 and every alloc fails.
  SlabAllocator(uint64_t arena_bytes, uint64_t slab_bytes);

  // The class id for slots of `bytes` (created on first use), or nullopt if a slot of that
  // size can never fit the arena. At most 255 classes.
  std::optional<uint16_t> class_for(uint64_t bytes);

  // A free slot's offset, or nullopt if the class has no free slot and no slab can be taken.
  // May throw std::bad_alloc (a fresh slab's free list), and then changes nothing.
  std::optional<uint64_t> alloc(uint16_t cls);
  // Returns a slot obtained from alloc(cls). Offsets not handed out are a caller bug.
  void free(uint16_t cls, uint64_t offset);
  // Recovery: gives the free slab `slab` (and, for a class larger than a slab, the slabs after
  // it) to class `cls` with the slots `used` (indexes within the slab; for a large class, {0})
  // taken, as if alloc() had handed them out. False, changing nothing, if a slab is not free
  // or an index is out of range.
  bool adopt_slab(uint16_t cls, uint32_t slab, std::span<const uint32_t> used);

  uint64_t capacity() const { return slab_bytes_ * slabs_.size(); }
  uint64_t slab_bytes() const { return slab_bytes_; }
  uint64_t slot_bytes(uint16_t cls) const { return classes_[cls].slot_bytes; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint32_t free_slabs() const { return free_slab_count_; }
  uint32_t class_count() const { return static_cast<uint32_t>(classes_.size()); }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Slab {
    uint16_t cls = 0;
    bool in_use = false;  // belongs to a class (or is a continuation of a large span)
    bool continuation = false;
    uint32_t used = 0;
    uint32_t prev = kNone, next = kNone;  // links in the class's partial list or the free list
    std::vector<uint32_t> free_slots;     // stack of free slot indexes within the slab
  };
  struct SizeClass {
    uint64_t slot_bytes = 0;
    uint32_t slots_per_slab = 0;  // 0 for a large class (one slot spans slabs_per_slot slabs)
    uint32_t slabs_per_slot = 1;
    uint32_t partial_head = kNone;  // slabs with at least one free slot
  };

  void list_push(uint32_t& head, uint32_t s);
  void list_remove(uint32_t& head, uint32_t s);
  std::optional<uint32_t> take_free_slab();
  std::optional<uint32_t> take_free_run(uint32_t n);
  std::optional<uint64_t> alloc_large(uint16_t cls);
  void release_slab(uint32_t s);

  uint64_t slab_bytes_;
  uint64_t used_bytes_ = 0;
  std::vector<Slab> slabs_;
  std::vector<SizeClass> classes_;
  uint32_t free_head_ = kNone;
  uint32_t free_slab_count_ = 0;
};

}  // namespace kdn::sidecar
