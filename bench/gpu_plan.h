// kdn-bench gpu, the parts with no CUDA in them: how big each measurement is, and the ratios
// and bars computed from the figures. Unit-tested on every machine (gpu_plan_test.cc).
//
// Sizes. Every bulk figure moves `bulk_chunks` whole chunks in one request (2 GiB of llama3-8b
// by default, 256 MiB with --quick); the baselines copy the same bytes. `reps` fresh sets of
// chunks per figure (a retrieve may promote a chunk, so a set is timed once per tier), the
// median is reported. The engine's cache is the decode step's KV (8 GiB, 2 GiB quick), and at
// least twice a bulk set. kdnd's host arena holds every set twice over (a write-through T1
// copy of chunks stored from the GPU may take room too); T0 holds the sets stored from the GPU
// and one more (chunks kdnd may promote into it on a retrieve from T1).
//
// Thread safety: pure functions.
#pragma once

#include "report.h"

#include <cstdint>

namespace kdn::bench {

struct GpuBenchSizes {
  bool quick = false;
  uint64_t bulk_mib = 0;         // 0: 2048 (256 quick)
  uint32_t reps = 0;             // 0: 3 (2 quick)
  uint64_t decode_mib = 0;       // 0: 8192 (2048 quick)
  uint32_t latency_samples = 0;  // 0: 64 (16 quick)
  uint32_t decode_steps = 0;     // 0: 30 (10 quick)
};

struct GpuPlan {
  uint64_t chunk_bytes = 0;
  uint32_t chunk_tokens = 0;
  uint32_t bulk_chunks = 0;  // chunks per request (at least 1)
  uint64_t bulk_bytes = 0;   // bulk_chunks * chunk_bytes: also the baselines' copy size
  uint32_t reps = 0;
  uint64_t engine_kv_bytes = 0;   // the engine's paged cache (the decode step reads all of it)
  uint64_t host_arena_bytes = 0;  // kdnd --host-arena-bytes
  uint64_t t0_bytes = 0;          // kdnd tier.gpu.bytes
  uint32_t latency_samples = 0;
  uint32_t decode_steps = 0;
};

GpuPlan plan_gpu_bench(const GpuBenchSizes& sizes, uint64_t chunk_bytes, uint32_t chunk_tokens) noexcept;

// From the figures in `r` (baselines.*, kdn.*): ratios.* and bars.* (a missing figure gives a
// null ratio and a bar whose pass is null).
//   ratios.t1_to_engine_vs_h2d   kdn.t1_to_engine_gbps / baselines.h2d_pinned_gbps   bar >= 0.85
//   ratios.t0_to_engine_vs_d2d   kdn.t0_to_engine_gbps / baselines.d2d_gbps          bar >= 0.7
//   ratios.engine_to_t0_vs_d2d   kdn.engine_to_t0_gbps / baselines.d2d_gbps
//   ratios.decode_to_engine_vs_d2d  kdn.decode_to_engine_gbps / baselines.d2d_gbps
//   ratios.peer_vs_d2d           kdn.peer_gbps / baselines.d2d_gbps
//   bars.decode_to_engine_gbps   kdn.decode_to_engine_gbps >= 100
//   bars.decode_step_slowdown    kdn.decode_step_slowdown <= 1.2
void add_gpu_ratios_and_bars(Report& r);

// Every figure key kdn-bench gpu reports; one that a failed phase never set becomes null with
// `<key>_reason` = reason, so a report always has the same keys.
void fill_missing_gpu_figures(Report& r, const char* reason);

}  // namespace kdn::bench
