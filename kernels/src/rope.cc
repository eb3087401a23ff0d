// Host-side RoPE parameters: inv_freq for every scaling the engines use, and cos/sin tables.
#include <kdn/kernels/rope.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kdn::kernels {
namespace {

Status invalid(const char* what) { return Status(Code::kInvalidArgument, what); }

bool positive_finite(double x) { return std::isfinite(x) && x > 0.0; }

// theta^(-2i/R): the unscaled inverse frequency of pair i.
double base_inv_freq(double theta, uint32_t rotary_dim, uint32_t i) {
  return 1.0 / std::pow(theta, (2.0 * i) / rotary_dim);
}

// Llama-3: pairs with short wavelengths keep their frequency, long ones are divided by the
// factor, and the band between is interpolated smoothly.
double llama3_inv_freq(double inv, const float* p) {
  const double factor = p[0], low = p[1], high = p[2], orig = p[3];
  const double low_wavelen = orig / low;
  const double high_wavelen = orig / high;
  const double wavelen = 2.0 * std::numbers::pi / inv;
  if (wavelen < high_wavelen) return inv;
  if (wavelen > low_wavelen) return inv / factor;
  const double smooth = high == low ? 0.0 : (orig / wavelen - low) / (high - low);
  return (1.0 - smooth) * inv / factor + smooth * inv;
}

// YaRN: dimension index at which `rotations` full turns fit in the original context.
double yarn_correction_dim(double rotations, double dim, double theta, double orig) {
  return dim * std::log(orig / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
}

// YaRN: blend of interpolated (inv / factor) and extrapolated (inv) frequencies by a linear ramp
// over the pair index between the beta_fast and beta_slow correction dimensions.
void yarn_inv_freq(const RopeConfig& cfg, uint32_t rotary_dim, float* out) {
  const double factor = cfg.scaling_params[0];
  const double orig = cfg.scaling_params[1];
  const double beta_fast = cfg.scaling_params[2] > 0 ? cfg.scaling_params[2] : 32.0;
  const double beta_slow = cfg.scaling_params[3] > 0 ? cfg.scaling_params[3] : 1.0;
  const double dim = rotary_dim;
  double low = std::floor(yarn_correction_dim(beta_fast, dim, cfg.theta, orig));
  double high = std::ceil(yarn_correction_dim(beta_slow, dim, cfg.theta, orig));
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // keep the ramp's slope finite
  for (uint32_t i = 0; i < rotary_dim / 2; ++i) {
    const double extrapolated = base_inv_freq(cfg.theta, rotary_dim, i);
    const double interpolated = extrapolated / factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double mask = 1.0 - ramp;  // 1: keep the original frequency
    out[i] = static_cast<float>(interpolated * (1.0 - mask) + extrapolated * mask);
  }
}

Status validate_scaling(const RopeConfig& cfg) {
  const float* p = cfg.scaling_params;
  switch (cfg.scaling) {
    case RopeScaling::kNone:
      return OkStatus();
    case RopeScaling::kLinear:
      return positive_finite(p[0]) ? OkStatus() : invalid("rope: linear factor must be > 0");
    case RopeScaling::kLlama3:
      if (!positive_finite(p[0]) || !positive_finite(p[1]) || !positive_finite(p[2]) || !positive_finite(p[3]) ||
          p[2] < p[1]) {
        return invalid("rope: llama3 needs factor, low <= high freq factors, original_max_position > 0");
      }
      return OkStatus();
    case RopeScaling::kYarn:
      if (!positive_finite(p[0]) || !positive_finite(p[1]) || !(p[2] >= 0) || !(p[3] >= 0) || !std::isfinite(p[2]) ||
          !std::isfinite(p[3])) {
        return invalid("rope: yarn needs factor and original_max_position > 0");
      }
      return OkStatus();
  }
  return invalid("rope: unknown scaling");
}

}  // namespace

uint32_t rotary_dim_of(const RopeConfig& cfg) noexcept { return cfg.rotary_dim ? cfg.rotary_dim : cfg.head_dim; }

Status validate_rope(const RopeConfig& cfg) noexcept {
  if (cfg.style != RopeStyle::kNeox && cfg.style != RopeStyle::kGptj) return invalid("rope: unknown style");
  const uint32_t r = rotary_dim_of(cfg);
  if (cfg.head_dim == 0 || r == 0 || r > cfg.head_dim || (r % 2) != 0) {
    return invalid("rope: rotary_dim must be even and in (0, head_dim]");
  }
  if (!positive_finite(cfg.theta) || cfg.theta <= 1.0) return invalid("rope: theta must be > 1");
  return validate_scaling(cfg);
}

Status rope_config_from_desc(const kdn_model_desc& d, RopeConfig* out) noexcept {
  if (out == nullptr) return invalid("rope: null output");
  if (d.rope_style == KDN_ROPE_NONE) return Status(Code::kUnsupported, "rope: the model has no RoPE");
  if (d.rope_style != KDN_ROPE_NEOX && d.rope_style != KDN_ROPE_GPTJ) return invalid("rope: unknown style");
  if (d.rope_scaling > KDN_ROPE_SCALING_YARN) return invalid("rope: unknown scaling");
  RopeConfig cfg;
  cfg.style = static_cast<RopeStyle>(d.rope_style);
  cfg.head_dim = d.head_dim;
  cfg.rotary_dim = d.rotary_dim;
  cfg.theta = d.rope_theta;
  cfg.scaling = static_cast<RopeScaling>(d.rope_scaling);
  for (int i = 0; i < 4; ++i) cfg.scaling_params[i] = d.rope_scaling_params[i];
  KDN_RETURN_IF_ERROR(validate_rope(cfg));
  *out = cfg;
  return OkStatus();
}

double yarn_mscale(double factor) noexcept { return factor <= 1.0 ? 1.0 : 0.1 * std::log(factor) + 1.0; }

Status compute_inv_freq(const RopeConfig& cfg, float* inv_freq, size_t n) noexcept {
  KDN_RETURN_IF_ERROR(validate_rope(cfg));
  const uint32_t r = rotary_dim_of(cfg);
  if (inv_freq == nullptr || n < r / 2) return invalid("rope: inv_freq needs rotary_dim / 2 entries");
  if (cfg.scaling == RopeScaling::kYarn) {
    yarn_inv_freq(cfg, r, inv_freq);
    return OkStatus();
  }
  for (uint32_t i = 0; i < r / 2; ++i) {
    double inv = base_inv_freq(cfg.theta, r, i);
    if (cfg.scaling == RopeScaling::kLinear) inv /= cfg.scaling_params[0];
    if (cfg.scaling == RopeScaling::kLlama3) inv = llama3_inv_freq(inv, cfg.scaling_params);
    inv_freq[i] = static_cast<float>(inv);
  }
  return OkStatus();
}

size_t rope_table_floats(uint32_t rows, uint32_t rotary_dim) noexcept { return size_t{rows} * rotary_dim; }

Status build_rope_table(const float* inv_freq, uint32_t rotary_dim, const int64_t* deltas, uint32_t n_deltas,
                        float* out, size_t out_floats) noexcept {
  constexpr int64_t kMaxDelta = int64_t{1} << 40;
  if (inv_freq == nullptr || deltas == nullptr || out == nullptr) return invalid("rope table: null pointer");
  if (rotary_dim == 0 || (rotary_dim % 2) != 0) return invalid("rope table: rotary_dim must be even, > 0");
  if (n_deltas == 0 || out_floats < rope_table_floats(n_deltas, rotary_dim)) {
    return invalid("rope table: output too small");
  }
  const uint32_t half = rotary_dim / 2;
  for (uint32_t r = 0; r < n_deltas; ++r) {
    if (deltas[r] > kMaxDelta || deltas[r] < -kMaxDelta) return invalid("rope table: |delta| > 2^40");
    float* row = out + size_t{r} * rotary_dim;
    for (uint32_t i = 0; i < half; ++i) {
      const double phi = static_cast<double>(deltas[r]) * static_cast<double>(inv_freq[i]);
      row[i] = static_cast<float>(std::cos(phi));
      row[half + i] = static_cast<float>(std::sin(phi));
    }
  }
  return OkStatus();
}

}  // namespace kdn::kernels
