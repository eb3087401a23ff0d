#include "kv_cells.h"

// llama.cpp's internal headers (src/): the KV cache class and its cells.
#include <llama-kv-cache.h>
#include <llama-kv-cells.h>

#include <ggml-backend.h>
#include <ggml.h>
#include <llama.h>

namespace kdn::llama {
namespace {

llama_kv_cache* plain_cache(llama_context* ctx) { return dynamic_cast<llama_kv_cache*>(llama_get_memory(ctx)); }

bool host_f16(const ggml_tensor* t) {
  return t != nullptr && t->data != nullptr && t->type == GGML_TYPE_F16 && t->buffer != nullptr &&
         ggml_backend_buffer_is_host(t->buffer);
}

}  // namespace

Status kv_tensors(llama_context* ctx, uint32_t n_layer, KvTensors* out) noexcept {
  llama_kv_cache* kv = plain_cache(ctx);
  if (kv == nullptr || kv->get_n_stream() != 1) return Status(Code::kUnsupported, "not one plain unified KV cache");
  try {
    const std::vector<uint32_t> ids = kv->get_layer_ids();
    if (ids.size() != n_layer) return Status(Code::kUnsupported, "KV cache layers differ from the model's");
    // get_v builds a view of the V tensor; its view_src is the tensor itself. A context that
    // holds only tensor headers (no_alloc) is enough.
    ggml_init_params ip{4 * ggml_tensor_overhead(), nullptr, true};
    out->k.assign(n_layer, nullptr);
    out->v.assign(n_layer, nullptr);
    out->cells = kv->get_size();
    llama_kv_cache::slot_info si;
    si.s0 = 0;
    si.s1 = 0;
    for (uint32_t l = 0; l < n_layer; ++l) {
      if (ids[l] != l) return Status(Code::kUnsupported, "KV cache layer ids are not 0 .. n_layer - 1");
      ggml_tensor* k = kv->get_k_storage(int32_t(l));
      ggml_context* g = ggml_init(ip);
      if (g == nullptr) return Status(Code::kNoMemory, "ggml_init");
      ggml_tensor* view = kv->get_v(g, int32_t(l), kv->get_size(), si);
      ggml_tensor* v = view != nullptr && view->view_src != nullptr ? view->view_src : view;
      ggml_free(g);
      if (!host_f16(k) || !host_f16(v))
        return Status(Code::kUnsupported, "KV cache tensors are not f16 in host memory");
      out->k[l] = static_cast<uint8_t*>(k->data);
      out->v[l] = static_cast<uint8_t*>(v->data);
    }
  } catch (...) {
    return Status(Code::kInternal, "reading the KV cache's tensors failed");
  }
  return OkStatus();
}

Status seq_cells(llama_context* ctx, int32_t seq, uint32_t n, std::vector<int64_t>* out) noexcept {
  llama_kv_cache* kv = plain_cache(ctx);
  if (kv == nullptr) return Status(Code::kUnsupported, "not a plain KV cache");
  try {
    out->assign(n, -1);
    const llama_kv_cells& cells = kv->get_cells(seq);
    for (uint32_t i = 0; i < cells.size(); ++i) {
      if (cells.is_empty(i) || !cells.seq_has(i, seq)) continue;
      const llama_pos p = cells.pos_get(i);
      if (p < 0 || static_cast<uint32_t>(p) >= n) continue;
      if ((*out)[p] != -1) return Status(Code::kCorrupt, "two cells hold one position");
      (*out)[p] = i;
    }
  } catch (...) {
    return Status(Code::kInternal, "reading the KV cells failed");
  }
  for (int64_t c : *out)
    if (c < 0) return Status(Code::kCorrupt, "a position of the sequence has no cell");
  return OkStatus();
}

}  // namespace kdn::llama
