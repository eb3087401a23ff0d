// GpuLayout: a GPU request's engine layout, read from the wire and checked against the
// registration it names before kdnd touches a byte of engine memory.
//
// A hostile client chooses every number here. ipc::decode_gpu_layout() copies the record and
// its arrays out of the client's bytes once; check_and_translate() computes, for every plane and layer,
// the lowest and highest byte any token of the request can reach (all slots of the mapping,
// every head and channel, in 128-bit arithmetic) and refuses the layout (kInvalidArgument naming
// the field) unless that range lies inside [engine_base, engine_base + bytes). Only then are the
// engine's addresses rewritten to kdnd's mapping of the same bytes, so a layout that passes can
// only ever make kdnd write inside the registration.
//
// Pure and CPU-only; not thread-safe (plain values).
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/gpu_layout.h>
#include <kdn/ipc/protocol.h>
#include <kdn/kernels/layout.h>

#include <cstdint>
#include <span>
#include <vector>

namespace kdn::sidecar::gpu {

using ipc::GpuLayout;

// The registered range, in the engine's addresses, and where kdnd maps it.
struct RegisteredRange {
  uint64_t engine_base = 0;
  uint64_t bytes = 0;
  uint64_t mapping_base = 0;  // kdnd's address of engine_base
};

// A layout checked against a range: the view to hand the kernels (its layer_base and
// slot_mapping still point at host arrays in this struct; kdnd copies them to device memory
// and repoints the view) and the translated bases.
struct CheckedLayout {
  kernels::EngineView view{};           // validated against the model's geometry
  std::vector<void*> k_bases, v_bases;  // kdnd's addresses
  std::vector<int64_t> slots;
  int64_t max_slot = -1;  // highest slot the mapping names (-1: none)
};

// Checks `layout` for a request of `chunks` chunks of `geo` (tokens = chunk tokens) against
// `range`. kInvalidArgument names the first field at fault.
Result<CheckedLayout> check_and_translate(const GpuLayout& layout, const kernels::ChunkGeometry& geo, uint32_t chunks,
                                          const RegisteredRange& range) noexcept;

// Both directions of the wire form, for tests: libkdn's encoder and kdnd's decoder.
using ipc::decode_gpu_layout;
using ipc::encode_gpu_layout;

}  // namespace kdn::sidecar::gpu
