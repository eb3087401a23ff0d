// The wire form of an engine layout in the GPU requests (GPU_RETRIEVE, GPU_STORE,
// GPU_SEGMENT_RETRIEVE): a GpuLayoutRecord, the layers' K base addresses (then V's, with
// kGpuLayoutSplitV), then one slot per token. libkdn writes it; kdnd reads and checks it
// (sidecar/src/gpu/gpu_layout.h). docs/protocol.md section 14 gives every byte.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/protocol.h>
#include <kdn/kdn.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kdn::ipc {

// Bytes a layout of `layers` layers, split V or not, and `tokens` slots takes on the wire.
uint64_t gpu_layout_wire_bytes(uint32_t layers, bool split_v, uint64_t tokens) noexcept;

// The wire form of `abi` for `layers` layers and the given slots (one per token).
Result<std::vector<std::byte>> encode_gpu_layout(const kdn_engine_layout& abi, uint32_t layers,
                                                 std::span<const int64_t> slots) noexcept;

}  // namespace kdn::ipc
