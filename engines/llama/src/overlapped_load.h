// Overlapped load: cached KV copied into llama.cpp's cache tensors on a worker thread while the
// suffix prefill already runs, layer by layer (private to kdn_llama_core).
//
// A hit's load has two parts. The cells (positions, sequence) are placed synchronously, as
// before; the KV bytes of every range llama.cpp's state reader asked for are handed to this
// class instead of being copied. Its worker copies them (checked finite, as a synchronous load
// does) in layer order, K and V of layer 0 first, while the compute thread starts the suffix.
//
// The compute thread never reads a range before it is copied. llama.cpp's eval callback
// (llama_context_params::cb_eval) is asked about every graph node before the scheduler
// computes it:
//   - a view of a cache tensor whose copy is not done ends the range the scheduler computes
//     (views compute nothing), and the callback after that range waits for the copy, so the
//     nodes that read through the view run only afterwards;
//   - any other node reading a cache tensor whose copy is not done (directly or through a view
//     the previous rule did not catch) waits before its range is computed.
// Layer L's copy therefore only has to finish before layer L's attention, and the compute of
// layers 0..L-1 hides it. With nothing pending the callback answers at once and the graph is
// computed as one range, as without a callback.
//
// A non-finite element makes finish() fail with kCorrupt; the engine then drops the prefill it
// computed on top of the bad bytes and prefills the whole prompt.
#pragma once

#include "kv_restore.h"

#include <kdn/common/mutex.h>
#include <kdn/common/status.h>
#include <kdn/llama/state_blob.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

struct ggml_tensor;

namespace kdn::llama {

class OverlappedLoad {
 public:
  OverlappedLoad() = default;
  ~OverlappedLoad();  // waits for a pending copy, then stops the worker
  OverlappedLoad(const OverlappedLoad&) = delete;
  OverlappedLoad& operator=(const OverlappedLoad&) = delete;

  // Where the next load's copies are gathered (restore_seq_pieces' `deferred`); emptied by
  // finish(), its capacity kept across requests.
  std::vector<KvCopy>& staging() noexcept { return copies_; }
  // Starts copying the staged copies (whose sources must stay valid until finish()). The
  // worker thread starts on first use. Errors: kNoMemory, kInternal (no thread); nothing is
  // pending then and the staged copies are dropped.
  Status start(KvType type) noexcept;
  bool pending() const noexcept { return pending_.load(std::memory_order_acquire); }
  // Waits for the copy to end; ok, or kCorrupt if it met a non-finite element. Nothing is
  // pending afterwards. Ok when nothing was pending.
  Status finish() noexcept;

  // Of the last finished load: seconds the worker spent copying, and seconds the compute
  // thread waited for it.
  double copy_s() const noexcept { return copy_s_; }
  double waited_s() const noexcept { return static_cast<double>(waited_ns_) * 1e-9; }

  // llama.cpp's cb_eval, with user data `this` (ggml_backend_sched_eval_callback).
  static bool eval_callback(ggml_tensor* t, bool ask, void* self) noexcept;

  // Tests: the worker sleeps this long before each tensor's copy, so that the compute thread
  // catches up with it and has to wait at every layer.
  void set_test_delay_us(uint32_t us) noexcept { test_delay_us_ = us; }

 private:
  struct Group {
    const ggml_tensor* base = nullptr;  // the cache tensor
    int64_t layer = 0;                  // from its name (cache_k_l<N>), else its order of arrival
    uint32_t arrival = 0;
    std::vector<uint32_t> copies;  // indices into copies_, in arrival order
  };

  bool ask(ggml_tensor* t) noexcept;
  void after(ggml_tensor* t) noexcept;
  // The group of `base` whose copy is not done yet, or -1.
  int32_t undone_group(const ggml_tensor* base) const noexcept;
  void wait_group(int32_t g) noexcept;
  void worker() noexcept;
  void run_copies() noexcept;

  KvType type_ = KvType::kF16;
  std::vector<KvCopy> copies_;
  std::vector<Group> groups_;                                   // in copy order: by layer, K before V
  std::vector<std::pair<const ggml_tensor*, int32_t>> lookup_;  // base -> group, sorted by base
  std::atomic<bool> pending_{false};
  std::atomic<bool> failed_{false};
  // Groups [0, groups_done_) are copied (or abandoned after a failure); the worker
  // release-stores it after each group, the compute thread acquire-loads it.
  std::atomic<uint32_t> groups_done_{0};
  uint32_t test_delay_us_ = 0;
  double copy_s_ = 0;
  uint64_t waited_ns_ = 0;

  kdn::Mutex mu_;
  std::condition_variable cv_;
  bool job_ GUARDED_BY(mu_) = false;  // a copy is posted and not yet finished
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kdn::llama
