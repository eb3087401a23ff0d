#include <kdn/common/model_presets.h>

#include <algorithm>
#include <cstring>

namespace kdn {
namespace {

constexpr ModelPreset kPresets[] = {
    {"llama3-8b", 32, 8, 128, 500000.0, KDN_ROPE_SCALING_LLAMA3, {8.0f, 1.0f, 4.0f, 8192.0f}},
    {"smollm2-135m", 30, 3, 64, 100000.0, KDN_ROPE_SCALING_NONE, {0, 0, 0, 0}},
};

}  // namespace

std::span<const ModelPreset> model_presets() noexcept { return kPresets; }

const ModelPreset* find_model_preset(std::string_view name) noexcept {
  for (const ModelPreset& p : kPresets)
    if (p.name == name) return &p;
  return nullptr;
}

kdn_model_desc shaped_desc(uint32_t layers, uint32_t kv_heads, uint32_t head_dim, uint32_t chunk_tokens,
                           std::string_view desc_name) noexcept {
  const ModelPreset shape{"", layers, kv_heads, head_dim, 10000.0, KDN_ROPE_SCALING_NONE, {0, 0, 0, 0}};
  kdn_model_desc d = preset_desc(shape, desc_name);
  d.chunk_tokens = chunk_tokens;
  return d;
}

kdn_model_desc preset_desc(const ModelPreset& p, std::string_view desc_name) noexcept {
  kdn_model_desc d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.num_layers = p.layers;
  d.num_kv_heads = p.kv_heads;
  d.head_dim = p.head_dim;
  d.dtype = KDN_DTYPE_F16;
  d.rope_style = KDN_ROPE_NEOX;
  d.rope_theta = p.rope_theta;
  d.rope_scaling = p.rope_scaling;
  std::memcpy(d.rope_scaling_params, p.rope_scaling_params, sizeof d.rope_scaling_params);
  d.tp_size = 1;
  std::memcpy(d.name, desc_name.data(), std::min(desc_name.size(), sizeof d.name - 1));
  return d;
}

}  // namespace kdn
