// GpuRequest: what a GPU_RETRIEVE or GPU_STORE holds while it is served (kept by its Op).
//
// It owns the chunks it has taken until it hands them on: the leases of a retrieve until a
// batch takes them over, the reservations of a store until they are committed. Destroying it
// (the request failed, or its session ended) releases what it still holds — for a store only
// once no GPU copy can still write into those slots, which the request guarantees by waiting
// for its batch's token before it can end.
//
// Not thread-safe: the event loop owns it.
#pragma once

#include "gpu_layout.h"
#include "gpu_registry.h"
#include "gpu_rope.h"

#include "tiered_store.h"

#include <kdn/ipc/ops.h>

#include <vector>

namespace kdn::sidecar::gpu {

// What a segment request (GPU_SEGMENT_RETRIEVE, GPU_BLEND_SELECT) works on once leased: the
// chunks copied or compared, their records, one byte per key sent (used or not), the
// registration and the chunks' placement.
struct SegmentWork {
  std::vector<Entry*> chunks;
  std::vector<ipc::GpuSegmentChunkRecord> recs;
  std::vector<uint8_t> copied;
  Registration* reg = nullptr;
  SegmentPlacement placement;
};

struct GpuRequest {
  enum class Phase : uint8_t { kCollect, kCopying, kCommitting, kSettling };

  TieredStore* store = nullptr;
  ipc::GpuRegistrationRef ref;
  CheckedLayout layout;
  Phase phase = Phase::kCollect;
  std::vector<Entry*> leased;                              // retrieve: chunks leased for the copies, not yet handed on
  std::vector<Entry*> reserved;                            // store: reservations whose slots kdnd fills
  std::vector<uint32_t> position;                          // store: each reservation's chunk index in the layout;
                                                           // segment retrieve: each lease's key index
  std::vector<ipc::GpuSegmentChunkRecord> segment_chunks;  // segment retrieve: one per key
  std::vector<kdn_key> committed;                          // store: settled tail first at the end
  uint32_t cached = 0;                                     // store: chunks already cached or being stored by another
  ipc::GpuBlendSelectOp::Result blend;                     // blend selection: what its answer reports
  bool gpu_failed = false;

  GpuRequest() = default;
  GpuRequest(const GpuRequest&) = delete;
  GpuRequest& operator=(const GpuRequest&) = delete;
  ~GpuRequest() { release(); }

  // Gives back what it holds (leases unpinned, reservations aborted).
  void release() noexcept {
    if (store == nullptr) return;
    for (Entry* e : leased) store->unpin(e);
    leased.clear();
    for (Entry* e : reserved) store->abort(e);
    reserved.clear();
    position.clear();
  }
};

}  // namespace kdn::sidecar::gpu
