// Deterministic synthetic KV (see kdn/kernels/synthetic.h for the model).
#include <kdn/kernels/synthetic.h>

#include <cmath>
#include <numbers>

namespace kdn::kernels {
namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Independent stream per (seed, tag...): the same parameters always get the same numbers.
CounterRng stream_for(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return CounterRng(mix64(seed ^ mix64((a * 0x9e3779b97f4a7c15ull) ^ mix64((b + 0x632be59bd9b4e019ull) ^ mix64(c)))));
}

Status validate_params(const SyntheticKvParams& p) {
  const bool ok = p.k_scale > 0 && p.v_scale > 0 && p.outlier_fraction >= 0 && p.outlier_fraction <= 1 &&
                  p.outlier_gain >= 1 && p.token_correlation >= 0 && p.token_correlation < 1;
  return ok ? OkStatus() : Status(Code::kInvalidArgument, "synthetic kv: parameter out of range");
}

// K plane of one (layer, head): per-channel offset and scale, a few outlier channels, AR(1) in t.
void fill_k_head(void* chunk, const ChunkGeometry& g, const SyntheticKvParams& p, uint32_t l, uint32_t h) {
  const double rho = p.token_correlation, innovation = std::sqrt(1.0 - rho * rho);
  for (uint32_t c = 0; c < g.head_dim; ++c) {
    CounterRng rng = stream_for(p.seed, 1 + l, h, c);
    double sigma = p.k_scale * std::exp(0.5 * rng.next_normal());
    if (rng.next_unit() < p.outlier_fraction) sigma *= p.outlier_gain;
    const double mu = 0.5 * sigma * rng.next_normal();
    double a = rng.next_normal();
    for (uint32_t t = 0; t < g.tokens; ++t) {
      store_f32(chunk, chunk_offset(g, l, 0, t, h, c), g.dtype, static_cast<float>(mu + sigma * a), 1.0f);
      a = rho * a + innovation * rng.next_normal();
    }
  }
}

// V plane of one layer: per-token magnitude tau[t], an MA(1) process per (head, channel).
void fill_v_layer(void* chunk, const ChunkGeometry& g, const SyntheticKvParams& p, uint32_t l) {
  const double rho = p.token_correlation, innovation = std::sqrt(1.0 - rho * rho);
  CounterRng tau_rng = stream_for(p.seed, 0x10000 + l, 0, 0);
  for (uint32_t t = 0; t < g.tokens; ++t) {
    const double tau = p.v_scale * std::exp(0.3 * tau_rng.next_normal());
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      for (uint32_t c = 0; c < g.head_dim; ++c) {
        // Stateless MA(1) instead of AR(1): b(t) = rho * z(t) + innovation * z(t+1), z from a
        // per-(t, h, c) stream, so no per-channel state buffer is needed. Unit variance, lag-1
        // correlation rho * innovation.
        CounterRng prev = stream_for(p.seed, 0x20000 + l, h * 65536ull + c, t);
        CounterRng cur = stream_for(p.seed, 0x20000 + l, h * 65536ull + c, t + 1);
        const double b = rho * prev.next_normal() + innovation * cur.next_normal();
        store_f32(chunk, chunk_offset(g, l, 1, t, h, c), g.dtype, static_cast<float>(tau * b), 1.0f);
      }
    }
  }
}

}  // namespace

uint64_t CounterRng::next_u64() noexcept { return mix64(seed_ + (++counter_) * 0x9e3779b97f4a7c15ull); }

double CounterRng::next_unit() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double CounterRng::next_normal() noexcept {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = 1.0 - next_unit();  // (0, 1]: log is finite
  const double u2 = next_unit();
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(2.0 * std::numbers::pi * u2);
  has_spare_ = true;
  return r * std::cos(2.0 * std::numbers::pi * u2);
}

uint64_t CounterRng::next_below(uint64_t n) noexcept {
  // Lemire's multiply-shift; the tiny bias is irrelevant for test data.
  __extension__ using u128 = unsigned __int128;
  return static_cast<uint64_t>((static_cast<u128>(next_u64()) * n) >> 64);
}

Status fill_synthetic_kv(void* chunk, const ChunkGeometry& g, const SyntheticKvParams& p) noexcept {
  if (chunk == nullptr) return Status(Code::kInvalidArgument, "synthetic kv: null chunk");
  KDN_RETURN_IF_ERROR(validate_geometry(g));
  KDN_RETURN_IF_ERROR(validate_params(p));
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint32_t h = 0; h < g.kv_heads; ++h) fill_k_head(chunk, g, p, l, h);
    fill_v_layer(chunk, g, p, l);
  }
  return OkStatus();
}

}  // namespace kdn::kernels
