// What cuda_api.cc and cuda_driver.cc share in a CUDA build: CUDA runtime and driver errors as
// kdn::Status, and the checks every call starts with. Not for use outside src/gpu.
#pragma once

#include <cuda.h>  // types and enums only: no driver function is linked (cuda_driver.cc)
#include <cuda_runtime_api.h>
#include <kdn/common/status.h>

namespace kdn::sidecar::gpu::detail {

// "call: name (description)" as a string that lives as long as the process, so a Status may
// point at it. One string per distinct (call, error) pair: the set is finite, so is the memory.
// Falls back to `call` itself if the string cannot be made.
const char* error_message(const char* call, const char* name, const char* description) noexcept;

// A failed runtime call as a Status (code by error class, message naming the call and the
// CUDA error). Clears this thread's last error, which the Status now carries.
Status cuda_status(const char* call, cudaError_t err) noexcept;
// A failed driver call the same way (names from cuGetErrorName when the driver has it).
Status driver_status(const char* call, CUresult err) noexcept;

// kUnsupported unless available().
Status require_device() noexcept;
// require_device(), then makes `device` this thread's device and its primary context current
// (cudaSetDevice + cudaFree(0)), which driver calls need.
Status use_device(int device) noexcept;

}  // namespace kdn::sidecar::gpu::detail
