// The reference models kdn's benchmarks and tests are sized by: the KV geometry and RoPE of
// real checkpoints, by short name. Only what a kdn_model_desc describes is here; weights and
// tokenizers are the engines' business.
#pragma once

#include <kdn/kdn.h>

#include <cstdint>
#include <span>
#include <string_view>

namespace kdn {

struct ModelPreset {
  std::string_view name;  // "llama3-8b", "smollm2-135m"
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  double rope_theta;
  uint32_t rope_scaling;         // kdn_rope_scaling
  float rope_scaling_params[4];  // as kdn_model_desc::rope_scaling_params
};

// llama3-8b (Llama 3.1 8B: 32 layers, 8 KV heads of 128, llama3 RoPE scaling) and
// smollm2-135m (SmolLM2-135M: 30 layers, 3 KV heads of 64).
std::span<const ModelPreset> model_presets() noexcept;

// The preset called `name`, or null.
const ModelPreset* find_model_preset(std::string_view name) noexcept;

// A descriptor for preset `p`: fp16, NeoX RoPE over the whole head, one TP rank, the default
// chunk size, `desc_name` as its identity (truncated to fit). Callers change fields after.
kdn_model_desc preset_desc(const ModelPreset& p, std::string_view desc_name) noexcept;

// A descriptor of the given shape: fp16, NeoX RoPE (theta 10000, no scaling), one TP rank,
// `chunk_tokens` a chunk, `desc_name` as its identity. The small models tests and benchmarks
// use (2 layers x 2 KV heads x 64 dims x 64 tokens: 64 KiB chunks).
kdn_model_desc shaped_desc(uint32_t layers, uint32_t kv_heads, uint32_t head_dim, uint32_t chunk_tokens,
                           std::string_view desc_name) noexcept;

}  // namespace kdn
