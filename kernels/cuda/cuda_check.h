// CUDA error -> kdn::Status, shared by the .cu files of kdn_kernels.
#pragma once

#include <cuda_runtime.h>
#include <kdn/common/status.h>

namespace kdn::kernels::detail {

// cudaGetErrorName returns a static string, as Status requires.
inline Status cuda_status(cudaError_t err) {
  if (err == cudaSuccess) return OkStatus();
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
    return Status(Code::kUnavailable, cudaGetErrorName(err));
  if (err == cudaErrorMemoryAllocation) return Status(Code::kNoMemory, cudaGetErrorName(err));
  return Status(Code::kInternal, cudaGetErrorName(err));
}

// Status of the most recent launch on this thread.
inline Status launch_status() { return cuda_status(cudaGetLastError()); }

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace kdn::kernels::detail
