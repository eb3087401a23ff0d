// ModelTable: the models sessions have registered, shared by equal descriptors.
//
// A model id names one registration slot and its generation: id = slot + 1 + generation << 16.
// A slot is freed when the last session that registered its model ends, and its next use
// gets a new generation, so an id is never reused for another model. Capacity is
// `max_models_total` slots; a full table is KDN_ERR_LIMIT, and churn frees slots.
//
// Each reference has a holder (the uid of the session that registered it), and a holder may
// hold at most `per_holder` distinct models (`max_models_per_uid`): one tenant's sessions can
// then fill only their share of the table, not lock every other tenant's new model out.
//
// Each reference also has a group (the namespace of that session). Every open group is
// guaranteed min(`reserved_per_group`, capacity / open groups) models
// (`models_reserved_per_namespace`): a group past its own guarantee takes a new slot only if
// the free slots left still cover what the other groups have not used of theirs, so the uids
// of one namespace together cannot lock another namespace's new model out either. A model
// several groups share counts in full for each of them, and a group past its guarantee is
// charged for it as for a new slot (the check runs on joining a model another group holds,
// too): the slot outlives any one group's hold, so counting it once, or in fractions, would
// let a group hold past its share on another's slot and leave that other group, once it lets
// go, owed a slot the table no longer has. Charged this way, the slots the open groups hold
// plus what they are still owed never exceed the capacity, whatever they release later.
//
// Not thread-safe: the event loop owns it.
#pragma once

#include <kdn/common/model.h>
#include <kdn/common/status.h>

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kdn::sidecar {

class ModelTable {
 public:
  static constexpr uint32_t kMaxSlots = 1u << 16;
  static constexpr uint32_t kNoHolder = UINT32_MAX;  // a reference no share applies to
  explicit ModelTable(uint32_t capacity, uint32_t per_holder = UINT32_MAX, uint32_t reserved_per_group = 0)
      : capacity_(capacity < kMaxSlots ? capacity : kMaxSlots),
        per_holder_(per_holder),
        reserved_per_group_(reserved_per_group) {}

  // A group (a namespace) is owed its guarantee from open_group to close_group, whether its
  // sessions hold models or not. open_group may throw std::bad_alloc (the group is then not open).
  void open_group(uint32_t group);
  void close_group(uint32_t group) noexcept;

  // The id of `m`, registering it if new; one more reference of `holder` and `group` either
  // way. KDN_ERR_LIMIT when the table is full, `holder` holds `per_holder` other models, or a
  // new model of `group` would take a slot other groups are still guaranteed.
  Result<uint32_t> acquire(const ModelInfo& m, uint32_t holder = kNoHolder, uint32_t group = kNoHolder);
  // Drops one reference of a live id that `holder` and `group` acquired (a session that
  // registered it ended).
  void release(uint32_t id, uint32_t holder = kNoHolder, uint32_t group = kNoHolder) noexcept;
  // Distinct models `holder` holds references to.
  uint32_t held_by(uint32_t holder) const noexcept;
  // Distinct models the sessions of `group` hold references to.
  uint32_t held_by_group(uint32_t group) const noexcept;
  // The models each open group is guaranteed now.
  uint32_t reserved_per_group() const noexcept;
  // The live model of `id`, or null for an unknown or stale id.
  const ModelInfo* get(uint32_t id) const noexcept;
  // The live id whose model has this fingerprint, or 0.
  uint32_t id_of(const kdn_key& fingerprint) const noexcept;
  uint32_t live() const noexcept { return live_; }

 private:
  struct Slot {
    ModelInfo info{};
    uint32_t refs = 0;
    uint32_t generation = 0;
  };
  static uint32_t make_id(uint32_t slot, uint32_t generation) noexcept { return (slot + 1) | (generation << 16); }
  const Slot* slot_of(uint32_t id) const noexcept;
  using Holds = std::unordered_map<uint32_t, std::unordered_map<uint32_t, uint32_t>>;  // who -> slot -> references
  Result<uint32_t> take_slot(const ModelInfo& m);
  Status group_may_take_slot(uint32_t group) const;
  bool group_holds(uint32_t group, uint32_t slot) const noexcept;
  Status hold(Holds& holds, uint32_t who, uint32_t slot);
  static void drop_hold(Holds& holds, uint32_t who, uint32_t slot) noexcept;

  uint32_t capacity_;
  uint32_t per_holder_;
  uint32_t reserved_per_group_;
  Holds held_;                           // by holder (uid)
  Holds group_held_;                     // by group (namespace)
  std::unordered_set<uint32_t> groups_;  // open groups
  uint32_t live_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;                                     // slots with refs == 0
  std::unordered_map<kdn_key, uint32_t, KeyHash> by_fingerprint_;  // live slots
};

}  // namespace kdn::sidecar
