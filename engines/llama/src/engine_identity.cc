#include "engine_identity.h"

#include <llama.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef KDN_LLAMA_BUILD_ID
#error "KDN_LLAMA_BUILD_ID must name the llama.cpp build (set by engines/llama/CMakeLists.txt)"
#endif

namespace kdn::llama {
namespace {

// A GGUF metadata string, or "" if the key is absent.
std::string meta(const llama_model* model, const std::string& key) {
  char buf[256];
  const int32_t n = llama_model_meta_val_str(model, key.c_str(), buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, std::min<size_t>(n, sizeof buf - 1));
}

// The architecture-prefixed metadata key, e.g. "llama.rope.freq_base".
std::string arch_meta(const llama_model* model, const char* suffix) {
  return meta(model, meta(model, "general.architecture") + "." + suffix);
}

uint32_t meta_u32(const llama_model* model, const char* suffix, uint32_t fallback) {
  const std::string v = arch_meta(model, suffix);
  char* end = nullptr;
  const unsigned long x = std::strtoul(v.c_str(), &end, 10);
  return v.empty() || *end != '\0' || x > UINT32_MAX ? fallback : static_cast<uint32_t>(x);
}

double meta_f64(const llama_model* model, const char* suffix, double fallback) {
  const std::string v = arch_meta(model, suffix);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  return v.empty() || *end != '\0' ? fallback : x;
}

Result<KvGeometry> geometry_of(const llama_model* model, const EngineOptions& opts) {
  const int32_t n_layer = llama_model_n_layer(model);
  const int32_t n_head = llama_model_n_head(model);
  const int32_t n_head_kv = llama_model_n_head_kv(model);
  if (n_layer <= 0 || n_head <= 0 || n_head_kv <= 0)
    return Status(Code::kUnsupported, "model has no attention KV cache");
  const uint32_t fallback_dim = static_cast<uint32_t>(llama_model_n_embd(model) / n_head);
  const uint32_t k_dim = meta_u32(model, "attention.key_length", fallback_dim);
  const uint32_t v_dim = meta_u32(model, "attention.value_length", fallback_dim);
  if (k_dim != v_dim) return Status(Code::kUnsupported, "K and V head dims differ");
  KvGeometry g;
  g.n_layer = static_cast<uint32_t>(n_layer);
  g.n_kv_heads = static_cast<uint32_t>(n_head_kv);
  g.head_dim = k_dim;
  g.type = KvType::kF16;
  g.v_trans = !opts.flash_attn;
  g.n_stream = 1;
  g.chunk_tokens = opts.chunk_tokens;
  KDN_RETURN_IF_ERROR(validate_geometry(g));
  return g;
}

// RoPE as kdn describes it. llama.cpp runs llama-family models with NORM RoPE (pairs
// (2i, 2i+1)) on Q/K weights whose channels the GGUF converter permuted, so their cached K is
// in llama.cpp channel order: GPT-J pairing, k_channel_order = 1.
Status describe_rope(const llama_model* model, kdn_model_desc& d) {
  switch (llama_model_rope_type(model)) {
    case LLAMA_ROPE_TYPE_NONE:
      d.rope_style = KDN_ROPE_NONE;
      break;
    case LLAMA_ROPE_TYPE_NORM:
      d.rope_style = KDN_ROPE_GPTJ;
      d.k_channel_order = 1;
      break;
    case LLAMA_ROPE_TYPE_NEOX:
      d.rope_style = KDN_ROPE_NEOX;
      break;
    default:
      return Status(Code::kUnsupported, "multi-section RoPE models are not supported");
  }
  d.rotary_dim = meta_u32(model, "rope.dimension_count", d.head_dim);
  d.rope_theta = meta_f64(model, "rope.freq_base", 10000.0);
  const std::string scaling = arch_meta(model, "rope.scaling.type");
  if (scaling.empty() || scaling == "none") return OkStatus();
  d.rope_scaling = scaling == "linear" ? KDN_ROPE_SCALING_LINEAR
                   : scaling == "yarn" ? KDN_ROPE_SCALING_YARN
                                       : KDN_ROPE_SCALING_LLAMA3;
  d.rope_scaling_params[0] = static_cast<float>(meta_f64(model, "rope.scaling.factor", 1.0));
  return OkStatus();
}

// Everything besides the weights that changes the KV bytes an engine computes.
std::string engine_config(const KvGeometry& g) {
  std::string s = "build=" KDN_LLAMA_BUILD_ID;
  s += ";cpu=" + std::string(llama_print_system_info());
  s += ";k=f16;v=f16;v_trans=" + std::to_string(g.v_trans);
  s += ";n_stream=" + std::to_string(g.n_stream);
  s += ";layers=" + std::to_string(g.n_layer) + "x" + std::to_string(g.n_kv_heads) + "x" + std::to_string(g.head_dim);
  return s;
}

}  // namespace

Result<kdn_key> hash_file(const std::string& path) noexcept {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno("cannot open the model file", errno);
  XXH3_state_t st;
  XXH3_INITSTATE(&st);
  XXH3_128bits_reset(&st);
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return Status::from_errno("cannot read the model file", err);
    }
    if (n == 0) break;
    XXH3_128bits_update(&st, buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  const XXH128_hash_t h = XXH3_128bits_digest(&st);
  return kdn_key{h.low64, h.high64};
}

Result<EngineIdentity> make_identity(const llama_model* model, const EngineOptions& opts) noexcept {
  Result<KvGeometry> g = geometry_of(model, opts);
  if (!g.ok()) return g.status();
  Result<kdn_key> file_hash = hash_file(opts.model_path);
  if (!file_hash.ok()) return file_hash.status();

  EngineIdentity id;
  id.geometry = g.value();
  id.build_id = KDN_LLAMA_BUILD_ID;
  kdn_model_desc& d = id.desc;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.num_layers = g->n_layer;
  d.num_kv_heads = g->n_kv_heads;
  d.head_dim = g->head_dim;
  d.dtype = KDN_DTYPE_F16;
  d.chunk_tokens = g->chunk_tokens;
  KDN_RETURN_IF_ERROR(describe_rope(model, d));
  d.tp_size = 1;
  std::string name = meta(model, "general.name");
  if (name.empty()) name = "llama.cpp model";
  std::snprintf(d.name, sizeof d.name, "%s", name.c_str());

  const std::string config = engine_config(g.value());
  const XXH128_hash_t config_hash = XXH3_128bits(config.data(), config.size());
  const kdn_key config_key{config_hash.low64, config_hash.high64};
  std::memcpy(d.engine_salt, &file_hash.value(), sizeof(kdn_key));
  std::memcpy(d.engine_salt + sizeof(kdn_key), &config_key, sizeof(kdn_key));
  return id;
}

}  // namespace kdn::llama
