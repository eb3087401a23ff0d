// Test-only: what an engine process does to export its KV memory, so that gpu_api_test can play
// the engine in a child process without calling CUDA itself. kdnd never calls these. In a
// build without CUDA, or without a device, each returns kUnsupported.
#pragma once

#include "cuda_api.h"

namespace kdn::sidecar::gpu::testing {

// cudaMalloc of `bytes` on `device` and its legacy IPC handle (cudaIpcGetMemHandle).
Result<void*> ipc_alloc(int device, uint64_t bytes, IpcHandle* handle) noexcept;
void ipc_free(int device, void* p) noexcept;

// A VMM allocation as an engine's allocator makes it: cuMemCreate with the POSIX-fd handle type,
// mapped read-write for `device` in this process, exported with cuMemExportToShareableHandle.
// `bytes` is the requested size rounded up to the allocation granularity. The fd is owned here
// (vmm_free closes it).
struct VmmAllocation {
  int device = -1;
  void* base = nullptr;
  uint64_t bytes = 0;
  int fd = -1;
  uint64_t handle = 0;  // CUmemGenericAllocationHandle
};
Result<VmmAllocation> vmm_alloc_export(int device, uint64_t bytes) noexcept;
void vmm_free(VmmAllocation& a) noexcept;

}  // namespace kdn::sidecar::gpu::testing
