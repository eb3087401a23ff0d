// The engine's one llama.cpp eval callback (llama_context_params::cb_eval), shared by what
// needs it (private to kdn_llama_core):
//   - the overlapped load (overlapped_load.h), which makes nodes wait for their cached KV;
//   - the blend's partial decodes, which stop a graph early: right after the first node (the
//     decode then only places its tokens' cells: the blend fills them with cached KV), or right
//     after layer L's K and V were written into the cache (the HKVD check pass: fresh K and V
//     of layers 0..L, nothing computed past them).
// llama.cpp computes a graph range by range; returning false after a range ends the graph's
// computation (one split on a CPU backend) while llama_decode still reports success, with the
// cells of the batch placed. Nothing past the stop is written into the cache.
#pragma once

#include <cstdint>

struct ggml_tensor;

namespace kdn::llama {

class OverlappedLoad;

class EvalHooks {
 public:
  void set_overlap(OverlappedLoad* overlap) noexcept { overlap_ = overlap; }
  // Every later graph stops after layer `layer`'s cache writes (-1: after its first node),
  // until disarm().
  void stop_after_layer(int32_t layer) noexcept;
  void disarm() noexcept { armed_ = false; }
  bool armed() const noexcept { return armed_; }
  // Graphs stopped since the last arming (tests: a stop that never fired is a bug).
  uint32_t stops() const noexcept { return stops_; }

  // The callback; user data: the EvalHooks.
  static bool callback(ggml_tensor* t, bool ask, void* self) noexcept;

 private:
  bool ask(const ggml_tensor* t) noexcept;
  bool after(const ggml_tensor* t) noexcept;  // false: stop the graph here

  OverlappedLoad* overlap_ = nullptr;
  bool armed_ = false;
  int32_t layer_ = -1;
  uint32_t writes_ = 0;  // cache writes of layer_ seen in the current graph
  bool first_ = true;    // the next node asked about is the graph's first
  uint32_t stops_ = 0;
};

}  // namespace kdn::llama
