#include "overlapped_load.h"

#include <kdn/common/clock.h>

#include <ggml.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <string_view>
#include <system_error>
#include <unordered_map>

namespace kdn::llama {
namespace {

// The N of a cache tensor named "cache_k_lN" / "cache_v_lN" (llama.cpp's names), or -1.
int64_t layer_of(const ggml_tensor* t) {
  const std::string_view name(t->name, strnlen(t->name, sizeof t->name));
  const size_t at = name.rfind("_l");
  if (at == std::string_view::npos) return -1;
  int64_t layer = -1;
  const char* end = name.data() + name.size();
  const auto [p, ec] = std::from_chars(name.data() + at + 2, end, layer);
  return ec == std::errc() && p == end ? layer : -1;
}

// Ops that compute nothing: the node only names (part of) another tensor's bytes.
bool is_pure_view(const ggml_tensor* t) {
  switch (t->op) {
    case GGML_OP_NONE:
    case GGML_OP_VIEW:
    case GGML_OP_RESHAPE:
    case GGML_OP_PERMUTE:
    case GGML_OP_TRANSPOSE:
      return true;
    default:
      return false;
  }
}

}  // namespace

OverlappedLoad::~OverlappedLoad() {
  (void)finish();
  {
    kdn::MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status OverlappedLoad::start(KvType type) noexcept {
  if (pending()) return Status(Code::kInternal, "a load is already being copied");
  if (copies_.empty()) return OkStatus();
  try {
    type_ = type;
    groups_.clear();
    std::unordered_map<const ggml_tensor*, uint32_t> index;
    for (uint32_t i = 0; i < copies_.size(); ++i) {
      const auto [it, added] = index.try_emplace(copies_[i].base, static_cast<uint32_t>(groups_.size()));
      if (added) {
        Group g;
        g.base = copies_[i].base;
        g.arrival = it->second;
        const int64_t layer = layer_of(g.base);
        g.layer = layer >= 0 ? layer : g.arrival;
        groups_.push_back(std::move(g));
      }
      groups_[it->second].copies.push_back(i);
    }
    // Layer order, K before V within a layer (llama.cpp reads every K range, then every V).
    std::stable_sort(groups_.begin(), groups_.end(), [](const Group& a, const Group& b) {
      return a.layer != b.layer ? a.layer < b.layer : a.arrival < b.arrival;
    });
    lookup_.clear();
    for (uint32_t g = 0; g < groups_.size(); ++g) lookup_.emplace_back(groups_[g].base, static_cast<int32_t>(g));
    std::sort(lookup_.begin(), lookup_.end());
    failed_.store(false, std::memory_order_relaxed);
    groups_done_.store(0, std::memory_order_relaxed);
    waited_ns_ = 0;
    copy_s_ = 0;
    kdn::MutexLock lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { worker(); });
    job_ = true;
  } catch (const std::bad_alloc&) {
    copies_.clear();
    return Status(Code::kNoMemory, "no memory for the overlapped load");
  } catch (const std::system_error&) {
    copies_.clear();
    return Status(Code::kInternal, "could not start the load thread");
  }
  pending_.store(true, std::memory_order_release);
  cv_.notify_all();
  return OkStatus();
}

Status OverlappedLoad::finish() noexcept {
  if (!pending_.load(std::memory_order_acquire)) {
    copies_.clear();
    return OkStatus();
  }
  {
    kdn::MutexLock lock(mu_);
    while (job_) lock.wait(cv_);
  }
  pending_.store(false, std::memory_order_release);
  copies_.clear();
  if (failed_.load(std::memory_order_acquire)) return Status(Code::kCorrupt, "chunk holds a non-finite value");
  return OkStatus();
}

void OverlappedLoad::worker() noexcept {
  for (;;) {
    {
      kdn::MutexLock lock(mu_);
      while (!job_ && !stop_) lock.wait(cv_);
      if (stop_ && !job_) return;
    }
    run_copies();
    kdn::MutexLock lock(mu_);
    job_ = false;
    cv_.notify_all();
  }
}

void OverlappedLoad::run_copies() noexcept {
  const uint64_t t0 = now_ns();
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    if (test_delay_us_ != 0) std::this_thread::sleep_for(std::chrono::microseconds(test_delay_us_));
    // After a failure the rest is abandoned: the prefill that reads it is thrown away.
    if (!failed_.load(std::memory_order_relaxed))
      for (uint32_t i : groups_[g].copies) {
        const KvCopy& c = copies_[i];
        if (!copy_finite(type_, c.dst, c.src, c.bytes)) {
          failed_.store(true, std::memory_order_release);
          break;
        }
      }
    groups_done_.store(g + 1, std::memory_order_release);
  }
  copy_s_ = static_cast<double>(now_ns() - t0) * 1e-9;
}

int32_t OverlappedLoad::undone_group(const ggml_tensor* base) const noexcept {
  const auto it = std::lower_bound(lookup_.begin(), lookup_.end(), base,
                                   [](const auto& e, const ggml_tensor* b) { return e.first < b; });
  if (it == lookup_.end() || it->first != base) return -1;
  return groups_done_.load(std::memory_order_acquire) > static_cast<uint32_t>(it->second) ? -1 : it->second;
}

void OverlappedLoad::wait_group(int32_t g) noexcept {
  const uint64_t t0 = now_ns();
  for (uint32_t spins = 0; groups_done_.load(std::memory_order_acquire) <= static_cast<uint32_t>(g); ++spins) {
    if (spins < 4096)
      cpu_relax();
    else
      std::this_thread::yield();
  }
  waited_ns_ += now_ns() - t0;
}

bool OverlappedLoad::ask(ggml_tensor* t) noexcept {
  if (groups_done_.load(std::memory_order_acquire) == groups_.size()) return false;
  // Storing the batch's own K or V into the cache writes the rows of the new cells, which the
  // copy never touches, and reads only its other sources (the destination is listed among the
  // sources too: src[2] of a set_rows, src[1] of a cpy).
  const bool writes_cache = t->op == GGML_OP_SET_ROWS || t->op == GGML_OP_CPY;
  const ggml_tensor* dst_base = writes_cache ? t->view_src : nullptr;
  if (t->view_src != nullptr) {
    const int32_t g = undone_group(t->view_src);
    if (g >= 0) {
      // A view computes nothing: end the range here and wait after it (after()), so the
      // layers before this one keep computing while the copy catches up.
      if (is_pure_view(t)) return true;
      if (!writes_cache) wait_group(g);  // any other op on the cache: only once its bytes are there
    }
  }
  for (const ggml_tensor* s : t->src) {
    if (s == nullptr) continue;
    const ggml_tensor* base = s->view_src != nullptr ? s->view_src : s;
    if (base == dst_base) continue;
    const int32_t g = undone_group(base);
    if (g >= 0) wait_group(g);
  }
  return false;
}

void OverlappedLoad::after(ggml_tensor* t) noexcept {
  if (t->view_src == nullptr) return;
  const int32_t g = undone_group(t->view_src);
  if (g >= 0) wait_group(g);
}

bool OverlappedLoad::eval_callback(ggml_tensor* t, bool ask, void* self) noexcept {
  auto* load = static_cast<OverlappedLoad*>(self);
  if (!load->pending_.load(std::memory_order_acquire)) return !ask;  // ask: not needed; after: go on
  if (ask) return load->ask(t);
  load->after(t);
  return true;
}

}  // namespace kdn::llama
