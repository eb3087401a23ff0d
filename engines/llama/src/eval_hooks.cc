#include "eval_hooks.h"

#include "overlapped_load.h"

#include <ggml.h>

#include <charconv>
#include <cstring>
#include <string_view>

namespace kdn::llama {
namespace {

// The layer N of a write into llama.cpp's cache tensor "cache_k_lN" / "cache_v_lN", or -1.
int32_t cache_write_layer(const ggml_tensor* t) {
  if ((t->op != GGML_OP_SET_ROWS && t->op != GGML_OP_CPY) || t->view_src == nullptr) return -1;
  const ggml_tensor* base = t->view_src;
  const std::string_view name(base->name, strnlen(base->name, sizeof base->name));
  if (name.rfind("cache_", 0) != 0) return -1;
  const size_t at = name.rfind("_l");
  if (at == std::string_view::npos) return -1;
  int32_t layer = -1;
  const char* end = name.data() + name.size();
  const auto [p, ec] = std::from_chars(name.data() + at + 2, end, layer);
  return ec == std::errc() && p == end ? layer : -1;
}

}  // namespace

void EvalHooks::stop_after_layer(int32_t layer) noexcept {
  armed_ = true;
  layer_ = layer;
  writes_ = 0;
  first_ = true;
  stops_ = 0;
}

bool EvalHooks::ask(const ggml_tensor* t) noexcept {
  if (layer_ < 0) return first_;
  return cache_write_layer(t) == layer_;  // compute up to each write of the layer, then look
}

bool EvalHooks::after(const ggml_tensor* t) noexcept {
  bool stop = false;
  if (layer_ < 0) {
    stop = first_;
  } else if (cache_write_layer(t) == layer_) {
    stop = ++writes_ == 2;  // K, then V
  }
  first_ = false;
  if (!stop) return true;
  // The next graph (the next decode) starts over.
  writes_ = 0;
  first_ = true;
  ++stops_;
  return false;
}

bool EvalHooks::callback(ggml_tensor* t, bool ask, void* self) noexcept {
  auto* h = static_cast<EvalHooks*>(self);
  const bool overlap = h->overlap_ != nullptr ? OverlappedLoad::eval_callback(t, ask, h->overlap_) : !ask;
  if (!h->armed_) return overlap;
  if (ask) {
    const bool mine = h->ask(t);
    if (!mine) h->first_ = false;
    return overlap || mine;
  }
  return h->after(t) && overlap;
}

}  // namespace kdn::llama
