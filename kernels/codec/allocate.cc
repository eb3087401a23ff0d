// Per-layer bit widths from measured sensitivities (kvc1_allocate_bits).
#include <kdn/kernels/codec.h>

#include <cmath>

namespace kdn::kernels {
namespace {

// One (layer, plane) slot: its sensitivity and the width it has so far.
struct SlotRef {
  const double* sensitivity;
  uint8_t* bits;
};

SlotRef slot(std::span<const double> k, std::span<const double> v, std::span<uint8_t> kb, std::span<uint8_t> vb,
             size_t i) {
  return i < k.size() ? SlotRef{&k[i], &kb[i]} : SlotRef{&v[i - k.size()], &vb[i - k.size()]};
}

bool sensitivities_valid(std::span<const double> s) {
  for (double x : s)
    if (!std::isfinite(x) || x < 0) return false;
  return true;
}

}  // namespace

double kvc1_modelled_cost(double sensitivity, uint32_t probe_bits, uint32_t bits) noexcept {
  return std::ldexp(sensitivity, 2 * (static_cast<int>(probe_bits) - static_cast<int>(bits)));
}

Status kvc1_allocate_bits(std::span<const double> k_sensitivity, std::span<const double> v_sensitivity,
                          uint32_t probe_bits, double mean_bits, uint32_t min_bits, uint32_t max_bits,
                          std::span<uint8_t> k_bits, std::span<uint8_t> v_bits) noexcept {
  const size_t layers = k_sensitivity.size();
  if (layers == 0 || v_sensitivity.size() != layers || k_bits.size() != layers || v_bits.size() != layers)
    return Status(Code::kInvalidArgument, "bit allocation: one sensitivity and one width per layer and plane");
  if (!sensitivities_valid(k_sensitivity) || !sensitivities_valid(v_sensitivity))
    return Status(Code::kInvalidArgument, "bit allocation: sensitivities must be finite and >= 0");
  if (probe_bits < 1 || probe_bits > 8 || min_bits < 1 || max_bits > 8 || !(mean_bits >= min_bits) ||
      !(mean_bits <= max_bits))
    return Status(Code::kInvalidArgument, "bit allocation: needs 1 <= min <= mean <= max <= 8 and probe 1..8");
  const size_t slots = 2 * layers;
  // The bits above min_bits to hand out; never more than the mean allows.
  uint64_t spare = static_cast<uint64_t>(std::floor(mean_bits * static_cast<double>(slots) + 1e-9)) - min_bits * slots;
  for (size_t i = 0; i < slots; ++i)
    *slot(k_sensitivity, v_sensitivity, k_bits, v_bits, i).bits = static_cast<uint8_t>(min_bits);
  for (; spare > 0; --spare) {
    size_t best = slots;
    double best_gain = -1;
    uint8_t best_bits = 0;
    for (size_t i = 0; i < slots; ++i) {
      const SlotRef s = slot(k_sensitivity, v_sensitivity, k_bits, v_bits, i);
      if (*s.bits >= max_bits) continue;
      const double gain = kvc1_modelled_cost(*s.sensitivity, probe_bits, *s.bits) -
                          kvc1_modelled_cost(*s.sensitivity, probe_bits, *s.bits + 1u);
      if (gain > best_gain || (gain == best_gain && *s.bits < best_bits))
        best = i, best_gain = gain, best_bits = *s.bits;
    }
    if (best == slots) break;  // every slot at max_bits
    ++*slot(k_sensitivity, v_sensitivity, k_bits, v_bits, best).bits;
  }
  return OkStatus();
}

}  // namespace kdn::kernels
