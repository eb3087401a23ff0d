// GpuService's private parts, shared by gpu_service.cc and gpu_service_codec.cc (T0 holding
// KVC1 blobs). Included by those two files only.
#pragma once

#include "cuda_api.h"
#include "gpu_blend.h"
#include "gpu_service.h"
#include "t0_codec.h"
#include "t0_device_encode.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace kdn::sidecar::gpu {

// What a batch does with T0 blobs. A retrieve decodes groups of T0 hits (each group's chunks in
// decoded[group_end[g-1], group_end[g])); each group's device result word is copied to the
// pinned metadata area at host_words + 4 g and checked when the batch lands. A fill copies one
// blob into its fresh T0 slot (key pinned until it lands).
struct CodedBatch {
  std::vector<T0Key> decoded;
  std::vector<uint32_t> group_end;
  const uint32_t* host_words = nullptr;  // in the device's pinned metadata ring (a second allocation)
  int64_t faulty_group = -1;             // a group the decoder refused on the host (a corrupt host copy)
  std::vector<T0Key> faulty;             // keys of failed groups: dropped from T0 once unpinned
  bool fill = false;
  bool fill_failed = false;  // the fill's copy could not be queued whole
};

struct GpuService::Device {
  DeviceInfo info;
  void* stream = nullptr;
  DeviceRegion t0;  // bytes 0: no T0 on this device
  std::unique_ptr<T0Index> t0_index;
  DeviceRegion scratch;  // [0, bounce) bounce chunk, [bounce, end) device metadata
  uint64_t bounce_bytes = 0;
  std::byte* host_meta = nullptr;  // pinned; mirrors the device metadata area
  bool host_meta_pinned = false;
  std::unique_ptr<FifoRing> meta;
  std::vector<uint8_t> peer_enabled;   // by device: 0 unknown, 1 enabled, 2 refused
  std::unique_ptr<T0BlobStore> blobs;  // tier.gpu.codec: host copies of the blobs in T0
};

struct GpuService::Batch {
  uint64_t token = 0;
  int device = -1;
  Registration* reg = nullptr;
  Namespace* ns = nullptr;
  bool uses_meta = false;
  std::vector<Entry*> leased;                   // retrieve: one lease each, released on landing
  std::vector<std::pair<int, T0Key>> t0_pins;   // slots read by the batch
  std::vector<std::pair<int, T0Key>> t0_fresh;  // slots written by the batch: published on success
  uint64_t op_token = 0;                        // store: the request to wake
  std::unique_ptr<CodedBatch> coded;            // tier.gpu.codec: decodes and T0 fills
  std::shared_ptr<StoreEncodes> encodes;        // store: the device's T0 encodes landing on the host
  std::unique_ptr<BlendPlan> blend;             // GPU_BLEND_SELECT: what the answer is checked against
  const std::byte* blend_result = nullptr;      // its answer, in the batch's pinned metadata tail
  std::vector<uint64_t> waiters;                // GPU_CHECK requests woken when it lands
  bool inject_failure = false;                  // KDN_TEST_GPU_FAIL_RETRIEVE: lands as failed
};

}  // namespace kdn::sidecar::gpu
