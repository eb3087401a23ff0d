// Driving a CPU decode: opening and checking the blob, validating layers, and running
// (layer, plane, head) tasks on the calling thread or the oneTBB pool.
#pragma once

#include "decode_head.h"
#include "encoder.h"
#include "format.h"
#include "validate.h"

#include <kdn/common/status.h>
#include <kdn/kernels/codec.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <cstdint>

namespace kdn::kernels::kvc1 {

// The first error of a parallel phase.
struct FirstError {
  std::atomic<bool> set{false};
  Status status;

  void record(const Status& s) noexcept;
  // Relaxed: an early-out hint for tasks still running; correctness needs only the join.
  bool failed() const noexcept { return set.load(std::memory_order_relaxed); }
  // Call after the phase has joined.
  Status get() const noexcept { return failed() ? status : OkStatus(); }
};

// Runs task(i) -> Status for i in [0, n): on the calling thread when threads == 1, else on the
// oneTBB pool (threads == 0: every worker; n > 1: an arena of at most n threads). Stops
// starting new tasks once one has failed; the first failure lands in `err`.
template <class Task>
void run_tasks(uint32_t n, int threads, FirstError& err, Task&& task) {
  auto one = [&](uint32_t i) {
    if (err.failed()) return;
    Status s = task(i);
    if (!s.ok()) err.record(s);
  };
  if (threads == 1 || n <= 1) {
    for (uint32_t i = 0; i < n && !err.failed(); ++i) one(i);
    return;
  }
  auto all = [&] {
    tbb::parallel_for(tbb::blocked_range<uint32_t>(0, n), [&](const tbb::blocked_range<uint32_t>& r) {
      for (uint32_t i = r.begin(); i != r.end(); ++i) one(i);
    });
  };
  if (threads <= 0) {
    all();
  } else {
    tbb::task_arena arena(threads);
    arena.execute(all);
  }
}

// Header, geometry/fingerprint match and the layer range to decode.
Status open_for_decode(const uint8_t* blob, size_t len, const ChunkGeometry& expected, const kdn_key& fingerprint,
                       const DecodeOptions& opts, Header* h, LayerRange* layers) noexcept;

// kUnsupported for a blob that names a calibration: its transform planes decode only in
// kvc1_decode for now (docs/codec.md §10.6 plans the fused and GPU paths).
inline Status refuse_calibrated(const Header& h) noexcept {
  if (h.calibration_id.lo || h.calibration_id.hi)
    return Status(Code::kUnsupported, "KVC1 transform-coded blobs decode with kvc1_decode only");
  return OkStatus();
}

// validate_layer over the range (in parallel when opts allow).
Status validate_layers(const uint8_t* blob, const Header& h, const LayerRange& layers,
                       const DecodeOptions& opts) noexcept;

}  // namespace kdn::kernels::kvc1
