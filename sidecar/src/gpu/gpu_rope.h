// Segment retrieves on the GPU (GPU_SEGMENT_RETRIEVE, docs/gpu.md): which leased chunks are
// copied, and the RoPE tables their K is re-rotated with on the device.
//
// Plain C++ (no CUDA): GpuService stages the table built here into the device metadata area
// with the request's layout, and launches rope_scatter with row `row[i]` of it for chunk i.
// Not thread-safe; values only.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/protocol.h>
#include <kdn/kdn.h>
#include <kdn/kernels/rope.h>

#include <cstdint>
#include <span>
#include <vector>

namespace kdn::sidecar::gpu {

// Which chunks a segment retrieve copies, given which were cached (leased): per segment, the
// cached chunks before its first miss, as kdn_segment_retrieve_to does on the host. A record
// without kGpuSegmentStart continues the segment of the record before it (the first record of a
// request continues a segment whose earlier chunks the client already loaded whole).
std::vector<uint8_t> leading_chunks(std::span<const ipc::GpuSegmentChunkRecord> recs, std::span<const uint8_t> cached);

// Where the chunks of one batch go and how their K moves: chunk i of the batch starts at
// first_token[i] of the layout's slots and is rotated by row row[i] of `table` (-1: delta 0, a
// plain scatter). `table` holds one row of rotary_dim floats (cosines, then sines) per distinct
// nonzero delta.
struct SegmentPlacement {
  std::vector<int64_t> first_token;
  std::vector<int32_t> row;
  std::vector<float> table;
  kernels::RopeStyle style = kernels::RopeStyle::kNeox;
  uint32_t rotary_dim = 0;
  uint32_t rows() const noexcept { return rotary_dim ? uint32_t(table.size() / rotary_dim) : 0; }
};

// The distinct nonzero deltas of `deltas` in order of first use, and each delta's row in them
// (-1 for delta 0).
struct RopeRows {
  std::vector<int64_t> distinct;
  std::vector<int32_t> row;
};
RopeRows group_deltas(std::span<const int64_t> deltas);

// The placement of the copied chunks `recs` for a model: kUnsupported if a delta is nonzero and
// the model has no RoPE (as on the host), kInvalidArgument for a delta past KDN_MAX_POSITION.
// No table is built when every delta is 0.
Result<SegmentPlacement> place_segment_chunks(const kdn_model_desc& model,
                                              std::span<const ipc::GpuSegmentChunkRecord> recs);

}  // namespace kdn::sidecar::gpu
