// CUDA runtime and driver errors as EngineStatus (private to engines/gpu).
#pragma once

#include <kdn/gpu_engine/engine_status.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

namespace kdn::gpu_engine {

inline EngineStatus cuda_status(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return {};
  return {e == cudaErrorMemoryAllocation ? KDN_ERR_NO_MEMORY : KDN_ERR_IO,
          std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
}

// The driver's name for a CUresult (cuGetErrorName through the entry point table).
std::string driver_error_name(CUresult r);

inline EngineStatus driver_status(CUresult r, const char* call) {
  if (r == CUDA_SUCCESS) return {};
  return {r == CUDA_ERROR_OUT_OF_MEMORY ? KDN_ERR_NO_MEMORY : KDN_ERR_IO,
          std::string(call) + ": " + driver_error_name(r)};
}

}  // namespace kdn::gpu_engine

#define KDN_CUDA_TRY(call)                                                                                       \
  do {                                                                                                           \
    if (auto kdn_cuda_st = ::kdn::gpu_engine::cuda_status((call), #call); !kdn_cuda_st.ok()) return kdn_cuda_st; \
  } while (0)
