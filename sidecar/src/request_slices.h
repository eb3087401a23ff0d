// How the request handler walks a request's records: in batches copied in from the payload
// area, yielding at the slice deadline, with vectors grown before any change they must be
// able to roll back. Private to the request handler's files.
#pragma once

#include "request_handler.h"

#include <kdn/common/clock.h>

#include <algorithm>
#include <vector>

namespace kdn::sidecar {

constexpr uint32_t kBatch = 64;  // records copied in per step of a loop
constexpr uint32_t kDisk = tier_index(TierId::kDisk);
constexpr uint32_t kRemote = tier_index(TierId::kRemote);

inline bool past(uint64_t deadline_ns) { return now_ns() >= deadline_ns; }

// Room for `more` elements, growing geometrically: reserving exactly size + n on every call
// would copy the vector each time (quadratic in a 65,536-record request). Called before a
// change the request must be able to roll back, so a failed allocation changes nothing.
template <class T>
void make_room(std::vector<T>& v, size_t more) {
  if (v.capacity() - v.size() >= more) return;
  v.reserve(std::max(v.size() + more, 2 * v.capacity() + 16));
}

// Visits items from the last to the first, resuming at op.settled, until all are visited
// (true) or the deadline passes (false: step again). A chain's chunks are visited tail first,
// so the head of every prefix ends up the most recently used and eviction shortens documents
// from their ends, leaving usable prefixes.
template <class T, class F>
bool settle_backwards(Op& op, const std::vector<T>& items, uint64_t deadline_ns, F visit) {
  while (op.settled < items.size()) {
    visit(items[items.size() - 1 - op.settled]);
    if (++op.settled % kBatch == 0 && op.settled < items.size() && past(deadline_ns)) return false;
  }
  return true;
}

// When a request waiting for room in a full tier gives up: the first wait sets the deadline.
inline bool room_wait_over(Op& op, uint64_t now, uint32_t room_wait_ms) {
  if (op.room_deadline_ns == 0) op.room_deadline_ns = now + uint64_t(room_wait_ms) * 1'000'000;
  return now >= op.room_deadline_ns;
}

}  // namespace kdn::sidecar
