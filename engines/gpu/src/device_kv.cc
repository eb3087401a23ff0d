#include <kdn/gpu_engine/device_kv.h>

#include "cuda_check.h"

#include <unistd.h>

#include <cstring>
#include <mutex>

namespace kdn::gpu_engine {
namespace {

// The driver calls VMM needs, resolved once from the runtime's entry point table (the ABI of
// CUDA 12.0, which every newer driver keeps serving).
struct DriverCalls {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  EngineStatus status;
};

template <class Fn>
EngineStatus resolve(const char* symbol, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess) return cuda_status(e, "cudaGetDriverEntryPointByVersion");
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return {KDN_ERR_UNSUPPORTED, std::string("the CUDA driver has no ") + symbol};
  }
  *out = reinterpret_cast<Fn>(fn);
  return {};
}

const DriverCalls& driver() {
  static DriverCalls calls;
  static std::once_flag once;
  std::call_once(once, [] {
    EngineStatus st;
    auto need = [&](const char* symbol, auto* out) {
      if (st.ok()) st = resolve(symbol, out);
    };
    need("cuGetErrorName", &calls.get_error_name);
    need("cuDeviceGetAttribute", &calls.device_attribute);
    need("cuMemGetAllocationGranularity", &calls.granularity);
    need("cuMemCreate", &calls.create);
    need("cuMemRelease", &calls.release);
    need("cuMemAddressReserve", &calls.reserve);
    need("cuMemAddressFree", &calls.address_free);
    need("cuMemMap", &calls.map);
    need("cuMemUnmap", &calls.unmap);
    need("cuMemSetAccess", &calls.set_access);
    need("cuMemExportToShareableHandle", &calls.export_handle);
    calls.status = st;
  });
  return calls;
}

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

std::string driver_error_name(CUresult r) {
  const DriverCalls& d = driver();
  const char* name = nullptr;
  if (d.get_error_name && d.get_error_name(r, &name) == CUDA_SUCCESS && name) return name;
  return "CUresult " + std::to_string(int(r));
}

EngineStatus DeviceKv::create(int device, AllocKind kind, const PagedKvShape& shape, std::unique_ptr<DeviceKv>* out) {
  if (shape.kv_bytes() == 0) return {KDN_ERR_INVALID_ARGUMENT, "empty KV cache shape"};
  std::unique_ptr<DeviceKv> kv(new DeviceKv());
  kv->device_ = device;
  kv->kind_ = kind;
  kv->shape_ = shape;
  KDN_CUDA_TRY(cudaSetDevice(device));
  cudaDeviceProp prop{};
  KDN_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  static_assert(sizeof(prop.uuid.bytes) == sizeof(kv->uuid_));
  std::memcpy(kv->uuid_, prop.uuid.bytes, sizeof(kv->uuid_));
  EngineStatus st = kind == AllocKind::kIpc ? kv->allocate_ipc() : kv->allocate_vmm();
  if (!st.ok()) return st;
  *out = std::move(kv);
  return {};
}

EngineStatus DeviceKv::allocate_ipc() {
  alloc_bytes_ = 2 * kGuardBytes + shape_.kv_bytes();
  void* p = nullptr;
  KDN_CUDA_TRY(cudaMalloc(&p, alloc_bytes_));
  alloc_base_ = reinterpret_cast<uint64_t>(p);
  cudaIpcMemHandle_t handle;
  static_assert(sizeof(handle) == KDN_GPU_HANDLE_BYTES);
  KDN_CUDA_TRY(cudaIpcGetMemHandle(&handle, p));
  std::memcpy(ipc_handle_, &handle, sizeof(handle));
  return {};
}

EngineStatus DeviceKv::allocate_vmm() {
  const DriverCalls& d = driver();
  if (!d.status.ok()) return d.status;
  int vmm = 0, fd_ok = 0;
  if (auto st =
          driver_status(d.device_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device_),
                        "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
      !st.ok())
    return st;
  if (auto st = driver_status(
          d.device_attribute(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device_),
          "cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)");
      !st.ok())
    return st;
  if (!vmm || !fd_ok) return {KDN_ERR_UNSUPPORTED, "this device has no VMM with POSIX file descriptor handles"};

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  if (auto st = driver_status(d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                              "cuMemGetAllocationGranularity");
      !st.ok())
    return st;
  if (granularity == 0) return {KDN_ERR_INTERNAL, "cuMemGetAllocationGranularity: zero granularity"};
  alloc_bytes_ = round_up(2 * kGuardBytes + shape_.kv_bytes(), granularity);

  CUmemGenericAllocationHandle handle = 0;
  if (auto st = driver_status(d.create(&handle, alloc_bytes_, &prop, 0), "cuMemCreate"); !st.ok()) return st;
  vmm_handle_ = handle;
  CUdeviceptr va = 0;
  if (auto st = driver_status(d.reserve(&va, alloc_bytes_, granularity, 0, 0), "cuMemAddressReserve"); !st.ok())
    return st;
  alloc_base_ = va;
  if (auto st = driver_status(d.map(va, alloc_bytes_, 0, handle, 0), "cuMemMap"); !st.ok()) return st;
  vmm_mapped_ = true;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (auto st = driver_status(d.set_access(va, alloc_bytes_, &access, 1), "cuMemSetAccess"); !st.ok()) return st;
  int fd = -1;
  if (auto st = driver_status(d.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                              "cuMemExportToShareableHandle");
      !st.ok())
    return st;
  vmm_fd_ = fd;
  return {};
}

DeviceKv::~DeviceKv() {
  if (device_ >= 0) (void)cudaSetDevice(device_);
  if (kind_ == AllocKind::kIpc) {
    if (alloc_base_) (void)cudaFree(reinterpret_cast<void*>(alloc_base_));
    return;
  }
  // VMM: the exported fd keeps the memory alive in whoever imported it; ours goes here.
  const DriverCalls& d = driver();
  if (vmm_fd_ >= 0) ::close(vmm_fd_);
  if (!d.status.ok()) return;
  if (vmm_mapped_) (void)d.unmap(alloc_base_, alloc_bytes_);
  if (alloc_base_) (void)d.address_free(alloc_base_, alloc_bytes_);
  if (vmm_handle_) (void)d.release(vmm_handle_);
}

void DeviceKv::describe(kdn_gpu_kv_desc* desc) const noexcept {
  std::memset(desc, 0, sizeof(*desc));
  desc->struct_size = sizeof(*desc);
  desc->kind = uint32_t(kind_);
  std::memcpy(desc->device_uuid, uuid_, sizeof(uuid_));
  desc->engine_base = kv_base();
  desc->bytes = shape_.kv_bytes();
  desc->alloc_offset = kv_base() - alloc_base_;
  desc->alloc_bytes = alloc_bytes_;
  if (kind_ == AllocKind::kIpc) std::memcpy(desc->ipc_handle, ipc_handle_, sizeof(ipc_handle_));
  desc->vmm_fd = kind_ == AllocKind::kVmm ? vmm_fd_ : -1;
}

}  // namespace kdn::gpu_engine
