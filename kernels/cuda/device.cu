// Device memory and stream helpers (kdn/kernels/device.h) over the CUDA runtime.
#include <kdn/kernels/device.h>

#include "cuda_check.h"

namespace kdn::kernels {

using detail::as_stream;
using detail::cuda_status;

Status device_alloc(size_t bytes, void** out) noexcept {
  if (out == nullptr) return Status(Code::kInvalidArgument, "device_alloc: null output");
  *out = nullptr;
  return cuda_status(cudaMalloc(out, bytes));
}

void device_free(void* p) noexcept {
  if (p != nullptr) cudaFree(p);
}

Status copy_to_device(void* dst, const void* src, size_t bytes) noexcept {
  return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

Status copy_to_host(void* dst, const void* src, size_t bytes) noexcept {
  return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

Status copy_device_to_device(void* dst, const void* src, size_t bytes, void* stream) noexcept {
  return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
}

Status device_memset(void* dst, int value, size_t bytes) noexcept { return cuda_status(cudaMemset(dst, value, bytes)); }

Status stream_create(void** stream) noexcept {
  if (stream == nullptr) return Status(Code::kInvalidArgument, "stream_create: null output");
  cudaStream_t s = nullptr;
  const Status st = cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = s;
  return st;
}

void stream_destroy(void* stream) noexcept {
  if (stream != nullptr) cudaStreamDestroy(as_stream(stream));
}

Status stream_sync(void* stream) noexcept { return cuda_status(cudaStreamSynchronize(as_stream(stream))); }

Status time_on_stream(void* stream, Status (*enqueue)(void* ctx), void* ctx, float* ms) noexcept {
  if (enqueue == nullptr || ms == nullptr) return Status(Code::kInvalidArgument, "time_on_stream: null argument");
  cudaEvent_t start = nullptr, stop = nullptr;
  Status st = cuda_status(cudaEventCreate(&start));
  if (st.ok()) st = cuda_status(cudaEventCreate(&stop));
  if (st.ok()) st = cuda_status(cudaEventRecord(start, as_stream(stream)));
  if (st.ok()) st = enqueue(ctx);
  if (st.ok()) st = cuda_status(cudaEventRecord(stop, as_stream(stream)));
  if (st.ok()) st = cuda_status(cudaEventSynchronize(stop));
  if (st.ok()) st = cuda_status(cudaEventElapsedTime(ms, start, stop));
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  return st;
}

}  // namespace kdn::kernels
