// DeviceKv: the engine's paged KV cache in device memory, one allocation, exportable to kdnd.
//
//   ipc: cudaMalloc; kdnd opens it with cudaIpcGetMemHandle's bytes.
//   vmm: cuMemCreate (POSIX-fd handle type requested) + cuMemAddressReserve + cuMemMap +
//        cuMemSetAccess; exported once with cuMemExportToShareableHandle as a file descriptor.
// The driver calls are looked up with cudaGetDriverEntryPointByVersion, so the program has no
// link-time dependency on libcuda.
//
// Ownership: a DeviceKv owns the allocation and (vmm) the exported descriptor; destroying it
// unmaps and frees both. Callers unregister from kdnd first. Thread safety: none needed after
// create (every accessor is const).
#pragma once

#include <kdn/gpu_engine/engine_status.h>
#include <kdn/gpu_engine/paged_kv.h>

#include <cstdint>
#include <memory>

namespace kdn::gpu_engine {

class DeviceKv {
 public:
  // Allocates guard + shape.kv_bytes() + guard on `device` and writes nothing into it.
  static EngineStatus create(int device, AllocKind kind, const PagedKvShape& shape, std::unique_ptr<DeviceKv>* out);
  ~DeviceKv();
  DeviceKv(const DeviceKv&) = delete;
  DeviceKv& operator=(const DeviceKv&) = delete;

  int device() const noexcept { return device_; }
  AllocKind kind() const noexcept { return kind_; }
  const PagedKvShape& shape() const noexcept { return shape_; }
  uint64_t alloc_base() const noexcept { return alloc_base_; }
  uint64_t alloc_bytes() const noexcept { return alloc_bytes_; }
  // The first layer's first byte: the start of the range registered with kdnd.
  uint64_t kv_base() const noexcept { return alloc_base_ + kGuardBytes; }
  // Fills every field of a registration but engine_event (the caller's event).
  void describe(kdn_gpu_kv_desc* desc) const noexcept;

 private:
  DeviceKv() = default;
  EngineStatus allocate_ipc();
  EngineStatus allocate_vmm();

  int device_ = -1;
  AllocKind kind_ = AllocKind::kIpc;
  PagedKvShape shape_;
  uint8_t uuid_[16] = {};
  uint64_t alloc_base_ = 0, alloc_bytes_ = 0;
  uint8_t ipc_handle_[KDN_GPU_HANDLE_BYTES] = {};
  unsigned long long vmm_handle_ = 0;  // CUmemGenericAllocationHandle
  bool vmm_mapped_ = false;
  int vmm_fd_ = -1;
};

}  // namespace kdn::gpu_engine
