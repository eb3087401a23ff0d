#include "gpu_plan.h"

#include <algorithm>
#include <string>

namespace kdn::bench {

GpuPlan plan_gpu_bench(const GpuBenchSizes& s, uint64_t chunk_bytes, uint32_t chunk_tokens) noexcept {
  constexpr uint64_t kMiB = 1ull << 20;
  GpuPlan p;
  p.chunk_bytes = std::max<uint64_t>(1, chunk_bytes);
  p.chunk_tokens = chunk_tokens;
  const uint64_t bulk = (s.bulk_mib ? s.bulk_mib : s.quick ? 256 : 2048) * kMiB;
  p.bulk_chunks = uint32_t(std::clamp<uint64_t>(bulk / p.chunk_bytes, 1, 1u << 16));
  p.bulk_bytes = p.bulk_chunks * p.chunk_bytes;
  p.reps = s.reps ? s.reps : s.quick ? 2 : 3;
  const uint64_t decode = (s.decode_mib ? s.decode_mib : s.quick ? 2048 : 8192) * kMiB;
  p.engine_kv_bytes = std::max(decode, 2 * p.bulk_bytes);
  p.host_arena_bytes = 2 * uint64_t(p.reps) * p.bulk_bytes + 1024 * kMiB;
  p.t0_bytes = uint64_t(p.reps + 1) * p.bulk_bytes + 512 * kMiB;
  p.latency_samples = s.latency_samples ? s.latency_samples : s.quick ? 16 : 64;
  p.decode_steps = s.decode_steps ? s.decode_steps : s.quick ? 10 : 30;
  return p;
}

void add_gpu_ratios_and_bars(Report& r) {
  const auto d2d = r.number("baselines.d2d_gbps");
  r.set("ratios.t1_to_engine_vs_h2d", ratio(r.number("kdn.t1_to_engine_gbps"), r.number("baselines.h2d_pinned_gbps")));
  r.set("ratios.t0_to_engine_vs_d2d", ratio(r.number("kdn.t0_to_engine_gbps"), d2d));
  r.set("ratios.engine_to_t0_vs_d2d", ratio(r.number("kdn.engine_to_t0_gbps"), d2d));
  r.set("ratios.decode_to_engine_vs_d2d", ratio(r.number("kdn.decode_to_engine_gbps"), d2d));
  r.set("ratios.peer_vs_d2d", ratio(r.number("kdn.peer_gbps"), d2d));
  r.set_bar("bars.t1_to_engine_vs_h2d", r.number("ratios.t1_to_engine_vs_h2d"), BarOp::kAtLeast, 0.85);
  r.set_bar("bars.t0_to_engine_vs_d2d", r.number("ratios.t0_to_engine_vs_d2d"), BarOp::kAtLeast, 0.7);
  r.set_bar("bars.decode_to_engine_gbps", r.number("kdn.decode_to_engine_gbps"), BarOp::kAtLeast, 100.0);
  r.set_bar("bars.decode_step_slowdown", r.number("kdn.decode_step_slowdown"), BarOp::kAtMost, 1.2);
}

void fill_missing_gpu_figures(Report& r, const char* reason) {
  static const char* const kFigures[] = {"baselines.h2d_pinned_gbps", "baselines.d2h_pinned_gbps",
                                         "baselines.d2d_gbps",        "kdn.t1_to_engine_gbps",
                                         "kdn.t0_to_engine_gbps",     "kdn.engine_to_t0_gbps",
                                         "kdn.decode_to_engine_gbps", "kdn.retrieve_latency_us",
                                         "kdn.decode_step_slowdown",  "kdn.peer_gbps"};
  for (const char* key : kFigures) {
    if (r.find(key)) continue;
    r.set_null(key);
    r.set(std::string(key) + "_reason", reason);
  }
}

}  // namespace kdn::bench
