// Deterministic synthetic KV with the statistics that matter to copies, RoPE and codecs.
//
// Real K has a few outlier channels per head (KIVI/KVQuant observations): a handful of channels
// carry magnitudes 10-50x the rest, and every channel has its own offset and scale that stay
// stable across tokens. Values also drift smoothly along the sequence (token-wise locality). V
// has no channel outliers but per-token scale variation. The generator models exactly that:
//   K[l][t][h][c] = mu[l,h,c] + sigma[l,h,c] * a[l,h,c](t)          (outlier channels: big sigma)
//   V[l][t][h][c] = tau[l,t] * b[l,h,c](t)
// with a a unit-variance AR(1) process in t (lag-1 correlation rho = `token_correlation`) and b a
// unit-variance MA(1) process (lag-1 correlation rho * sqrt(1 - rho^2)), all drawn from a
// counter-based generator: the same (params, seed) gives the same bytes on every machine.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kernels/layout.h>

#include <cstdint>

namespace kdn::kernels {

struct SyntheticKvParams {
  uint64_t seed = 1;
  float k_scale = 1.0f;            // typical |K| channel sigma
  float v_scale = 0.5f;            // typical |V| magnitude
  float outlier_fraction = 0.03f;  // fraction of K channels (per head) that are outliers
  float outlier_gain = 20.0f;      // outlier sigma multiplier
  float token_correlation = 0.9f;  // AR(1) coefficient along tokens, in [0, 1)
};

// Fills a canonical chunk of geometry g (any dtype) at `chunk` (chunk_bytes(g) bytes).
Status fill_synthetic_kv(void* chunk, const ChunkGeometry& g, const SyntheticKvParams& p) noexcept;

// A counter-based random stream (SplitMix64 finalizer over seed and counter) for tests and benches.
class CounterRng {
 public:
  explicit CounterRng(uint64_t seed) noexcept : seed_(seed) {}
  uint64_t next_u64() noexcept;
  double next_unit() noexcept;               // [0, 1)
  double next_normal() noexcept;             // N(0, 1), Box-Muller
  uint64_t next_below(uint64_t n) noexcept;  // [0, n), n > 0

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace kdn::kernels
