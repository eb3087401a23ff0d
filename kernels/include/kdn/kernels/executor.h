// Where a kernel op runs: on the CPU (oneTBB over the index space) or on a CUDA stream.
//
// No CUDA types appear here: the stream is an opaque pointer (a cudaStream_t, nullptr for the
// legacy default stream). CUDA ops are asynchronous: they return once enqueued; the caller
// synchronizes the stream. In a build without CUDA (KDN_WITH_CUDA off) every CUDA op returns
// kUnsupported; cuda_device_count() tells whether a device is present at all.
#pragma once

#include <cstdint>

namespace kdn::kernels {

struct Executor {
  enum class Kind : uint32_t { kCpu = 0, kCuda = 1 };

  Kind kind = Kind::kCpu;
  int cpu_threads = 0;          // CPU: 0 = every oneTBB worker, 1 = calling thread only, n = at most n
  void* cuda_stream = nullptr;  // CUDA: cudaStream_t

  static Executor cpu(int threads = 0) noexcept {
    Executor e;
    e.cpu_threads = threads;
    return e;
  }
  static Executor cuda(void* stream) noexcept {
    Executor e;
    e.kind = Kind::kCuda;
    e.cuda_stream = stream;
    return e;
  }
};

// True if this build includes the CUDA kernels.
bool cuda_built() noexcept;
// Number of usable CUDA devices (0 without CUDA, without a driver, or without a device).
int cuda_device_count() noexcept;

}  // namespace kdn::kernels
