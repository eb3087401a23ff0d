#include "gpu_figures.h"

#include <kdn/common/median.h>
#include <kdn/gpu_engine/engine_session.h>
#include <kdn/gpu_engine/kv_kernels.h>

#include <cuda_runtime_api.h>

#include <string>

namespace kdn::bench {
namespace {

using gpu_engine::EngineStatus;

EngineStatus cuda(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return {};
  return {KDN_ERR_IO, std::string(call) + ": " + cudaGetErrorString(e)};
}
#define KDN_BENCH_CUDA(call)                                           \
  do {                                                                 \
    if (EngineStatus st_ = cuda((call), #call); !st_.ok()) return st_; \
  } while (0)

// Buffers and events of the baselines, freed on every path.
struct CopyResources {
  void* host = nullptr;
  void* a = nullptr;
  void* b = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~CopyResources() {
    if (stream) (void)gpu_engine::wait_stream(stream, 60000);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
    if (host) cudaFreeHost(host);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
  }
};

// GB/s of `reps` copies (median), each bracketed by events on `stream`.
EngineStatus time_copies(CopyResources& r, void* dst, const void* src, uint64_t bytes, uint32_t reps, double* gbps) {
  std::vector<double> rates;
  for (uint32_t i = 0; i < reps + 1; ++i) {  // the first one warms up (page tables, clocks)
    KDN_BENCH_CUDA(cudaEventRecord(r.start, r.stream));
    KDN_BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, r.stream));
    KDN_BENCH_CUDA(cudaEventRecord(r.stop, r.stream));
    if (auto st = gpu_engine::wait_stream(r.stream, 60000); !st.ok()) return st;
    float ms = 0;
    KDN_BENCH_CUDA(cudaEventElapsedTime(&ms, r.start, r.stop));
    if (i > 0 && ms > 0) rates.push_back(double(bytes) / (double(ms) * 1e6));
  }
  *gbps = median(rates);
  return {};
}

}  // namespace

EngineStatus measure_copy_baselines(int device, uint64_t bytes, uint32_t reps, CopyBaselines* out) {
  CopyResources r;
  KDN_BENCH_CUDA(cudaSetDevice(device));
  KDN_BENCH_CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  KDN_BENCH_CUDA(cudaEventCreate(&r.start));
  KDN_BENCH_CUDA(cudaEventCreate(&r.stop));
  KDN_BENCH_CUDA(cudaMallocHost(&r.host, bytes));
  KDN_BENCH_CUDA(cudaMalloc(&r.a, bytes));
  KDN_BENCH_CUDA(cudaMalloc(&r.b, bytes));
  KDN_BENCH_CUDA(cudaMemsetAsync(r.a, 0x3C, bytes, r.stream));
  KDN_BENCH_CUDA(cudaMemsetAsync(r.b, 0x3C, bytes, r.stream));
  if (auto st = time_copies(r, r.a, r.host, bytes, reps, &out->h2d_pinned_gbps); !st.ok()) return st;
  if (auto st = time_copies(r, r.host, r.a, bytes, reps, &out->d2h_pinned_gbps); !st.ok()) return st;
  return time_copies(r, r.b, r.a, bytes, reps, &out->d2d_gbps);
}

EngineStatus time_decode_steps(int device, const void* p, uint64_t bytes, uint32_t steps, uint32_t timeout_ms,
                               std::vector<double>* us) {
  CopyResources r;  // its stream and events only
  unsigned long long* sink = nullptr;
  KDN_BENCH_CUDA(cudaSetDevice(device));
  KDN_BENCH_CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  KDN_BENCH_CUDA(cudaEventCreate(&r.start));
  KDN_BENCH_CUDA(cudaEventCreate(&r.stop));
  KDN_BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&sink), sizeof(*sink)));
  r.a = sink;
  bytes -= bytes % 16;
  for (uint32_t i = 0; i < steps + 1; ++i) {
    KDN_BENCH_CUDA(cudaEventRecord(r.start, r.stream));
    if (auto st = gpu_engine::launch_read_all(p, bytes, sink, r.stream); !st.ok()) return st;
    KDN_BENCH_CUDA(cudaEventRecord(r.stop, r.stream));
    if (auto st = gpu_engine::wait_stream(r.stream, timeout_ms); !st.ok()) return st;
    float ms = 0;
    KDN_BENCH_CUDA(cudaEventElapsedTime(&ms, r.start, r.stop));
    if (i > 0) us->push_back(double(ms) * 1e3);
  }
  return {};
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

}  // namespace kdn::bench
