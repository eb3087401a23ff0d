// The wire form of an engine layout in the GPU requests (GPU_RETRIEVE, GPU_STORE,
// GPU_SEGMENT_RETRIEVE): a GpuLayoutRecord, the layers' K base addresses (then V's, with
// kGpuLayoutSplitV), then one slot per token. libkdn encodes it, kdnd decodes it here and checks
// it against the registration (sidecar/src/gpu/gpu_layout.h). docs/protocol.md section 14 gives
// every byte.
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

// A layout as decoded: the record and its arrays, copied out of the client's bytes.
struct GpuLayout {
  GpuLayoutRecord record{};
  std::vector<uint64_t> k_bases;  // engine addresses (K, or K|V when not split)
  std::vector<uint64_t> v_bases;  // split V only
  std::vector<int64_t> slots;     // record.tokens entries
};

// Reads a layout from `bytes` (the client's, already copied into the reader's memory). Checks
// the shape only (known flags, 1..4096 layers, the exact length); kInvalidArgument otherwise.
Result<GpuLayout> decode_gpu_layout(std::span<const std::byte> bytes) noexcept;

}  // namespace kdn::ipc
