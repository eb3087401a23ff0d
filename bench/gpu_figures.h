// kdn-bench gpu's measurements that are plain CUDA in the bench process: the copy baselines
// (what the hardware does with cudaMemcpyAsync, the bounds kdnd's figures are ratios of) and
// the synthetic decode step. No CUDA types here.
//
// Thread safety: each function uses streams and events of its own; time_decode_steps may run
// while another thread drives kdnd's copies into the same device.
#pragma once

#include <kdn/gpu_engine/engine_status.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kdn::bench {

struct CopyBaselines {
  double h2d_pinned_gbps = 0;  // pinned host -> device
  double d2h_pinned_gbps = 0;  // device -> pinned host
  double d2d_gbps = 0;         // device -> device (bytes copied, not bytes moved)
};

// cudaMemcpyAsync of `bytes` in each direction, `reps` times, timed with CUDA events; medians.
// Allocates (and frees) bytes of pinned host memory and 2 x bytes on `device`.
gpu_engine::EngineStatus measure_copy_baselines(int device, uint64_t bytes, uint32_t reps, CopyBaselines* out);

// `steps` decode steps on a stream of their own: each reads [p, p + bytes) of `device` once
// (a memory-bound kernel), timed with CUDA events; the times in microseconds. Every wait is
// bounded by timeout_ms.
gpu_engine::EngineStatus time_decode_steps(int device, const void* p, uint64_t bytes, uint32_t steps,
                                           uint32_t timeout_ms, std::vector<double>* us);

// The device's name ("NVIDIA H100 80GB HBM3"), or "" if it cannot be read.
std::string device_name(int device);

}  // namespace kdn::bench
