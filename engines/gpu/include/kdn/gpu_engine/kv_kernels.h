// The engine's kernels over its paged KV cache: fill with the pattern, verify every byte, and
// a memory-bound read standing in for a decode step. Launchers take a POD view and an opaque
// stream (a cudaStream_t), enqueue, and return; they never allocate or synchronize.
#pragma once

#include <kdn/gpu_engine/engine_status.h>
#include <kdn/gpu_engine/paged_kv.h>

#include <cstdint>

namespace kdn::gpu_engine {

struct PagedKvView {
  uint8_t* alloc = nullptr;  // the allocation's first byte (device)
  uint64_t alloc_bytes = 0;  // guard + kv + guard (and rounding)
  PagedKvShape shape;        // the KV tensors start at alloc + kGuardBytes
  uint64_t seed = 0;
  const int32_t* owners = nullptr;  // device: shape.slots() entries, token of each slot or -1
};

// Writes expected_element(...) into every element and guard_byte(...) into both guards.
EngineStatus launch_fill(const PagedKvView& view, void* stream);
// Adds to *mismatches (device memory, zeroed by the caller) the elements that differ from
// what launch_fill writes plus the guard bytes that changed.
EngineStatus launch_verify(const PagedKvView& view, unsigned long long* mismatches, void* stream);
// Reads `bytes` (a multiple of 16) at `p` once, as an attention decode step reads the KV it
// attends over; `sink` (device, one word) is written only on an impossible sum.
EngineStatus launch_read_all(const void* p, uint64_t bytes, unsigned long long* sink, void* stream);

}  // namespace kdn::gpu_engine
