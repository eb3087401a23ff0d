// The driver half of cuda_api.h: device descriptions and VMM import. No driver function is
// linked: each is looked up once through the runtime (cudaGetDriverEntryPointByVersion), so
// kdnd has no NEEDED entry on libcuda.so.1 and starts where no driver is installed.
// Also the test-only exports of cuda_api_testing.h, which need the same table.
#include <unistd.h>

#include <cstring>

#include "cuda_api.h"
#include "cuda_api_testing.h"

#if KDN_GPU_WITH_CUDA
#include "cuda_internal.h"
#endif

namespace kdn::sidecar::gpu {

#if KDN_GPU_WITH_CUDA

using detail::cuda_status;
using detail::driver_status;
using detail::use_device;

namespace {

// The ABI version the signatures below are asked for: every one is unchanged since CUDA 10.2,
// and 12.0 is the oldest driver a CUDA 12 or 13 runtime runs on.
constexpr unsigned kDriverAbi = 12000;

struct DriverApi {
  Status status;  // not ok: the driver lacks an entry point, and nothing below is set
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) get_granularity = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
};

template <class Fn>
Status resolve(const char* symbol, Fn* out) noexcept {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &p, kDriverAbi, cudaEnableDefault, &found);
  if (err != cudaSuccess) return cuda_status("cudaGetDriverEntryPointByVersion", err);
  if (found != cudaDriverEntryPointSuccess || p == nullptr) {
    return Status(Code::kUnsupported,
                  detail::error_message(symbol, "not found", "the driver is older than the CUDA 12.0 ABI"));
  }
  *out = reinterpret_cast<Fn>(p);
  return OkStatus();
}

DriverApi load_driver() noexcept {
  DriverApi d;
  Status st = resolve("cuGetErrorName", &d.get_error_name);
  if (st.ok()) st = resolve("cuDeviceGet", &d.device_get);
  if (st.ok()) st = resolve("cuDeviceGetAttribute", &d.device_get_attribute);
  if (st.ok()) st = resolve("cuMemGetAllocationGranularity", &d.get_granularity);
  if (st.ok()) st = resolve("cuMemImportFromShareableHandle", &d.import_handle);
  if (st.ok()) st = resolve("cuMemExportToShareableHandle", &d.export_handle);
  if (st.ok()) st = resolve("cuMemCreate", &d.create);
  if (st.ok()) st = resolve("cuMemRelease", &d.release);
  if (st.ok()) st = resolve("cuMemAddressReserve", &d.address_reserve);
  if (st.ok()) st = resolve("cuMemAddressFree", &d.address_free);
  if (st.ok()) st = resolve("cuMemMap", &d.map);
  if (st.ok()) st = resolve("cuMemUnmap", &d.unmap);
  if (st.ok()) st = resolve("cuMemSetAccess", &d.set_access);
  if (!st.ok()) return DriverApi{st};
  return d;
}

// Looked up on first use, after require_device() (the runtime must have found the driver).
const DriverApi& driver() noexcept {
  static const DriverApi api = load_driver();
  return api;
}

CUmemAllocationProp vmm_props(int device) noexcept {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

Status vmm_granularity(const DriverApi& d, int device, size_t* out) noexcept {
  const CUmemAllocationProp prop = vmm_props(device);
  KDN_RETURN_IF_ERROR(
      driver_status("cuMemGetAllocationGranularity", d.get_granularity(out, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)));
  if (*out == 0) return Status(Code::kInternal, "cuMemGetAllocationGranularity: zero granularity");
  return OkStatus();
}

// Reserves `bytes` of address space, maps `h` there and grants `device` read-write access;
// leaves nothing behind on failure. The handle stays the caller's.
Status map_read_write(const DriverApi& d, int device, CUmemGenericAllocationHandle h, size_t bytes, size_t align,
                      CUdeviceptr* out) noexcept {
  CUdeviceptr va = 0;
  KDN_RETURN_IF_ERROR(driver_status("cuMemAddressReserve", d.address_reserve(&va, bytes, align, 0, 0)));
  Status st = driver_status("cuMemMap", d.map(va, bytes, 0, h, 0));
  if (st.ok()) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    st = driver_status("cuMemSetAccess", d.set_access(va, bytes, &access, 1));
    if (!st.ok()) d.unmap(va, bytes);
  }
  if (!st.ok()) {
    d.address_free(va, bytes);
    return st;
  }
  *out = va;
  return OkStatus();
}

// A current context for driver calls that name no device (this thread's device's primary one).
bool any_context() noexcept {
  if (cudaFree(nullptr) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

bool device_attribute(const DriverApi& d, int ordinal, CUdevice_attribute attr) noexcept {
  CUdevice dev = 0;
  int value = 0;
  return d.device_get(&dev, ordinal) == CUDA_SUCCESS && d.device_get_attribute(&value, attr, dev) == CUDA_SUCCESS &&
         value != 0;
}

bool describe(int ordinal, DeviceInfo* info) noexcept {
  cudaDeviceProp prop = {};
  if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  info->ordinal = ordinal;
  const size_t name_len = strnlen(prop.name, sizeof info->name - 1);  // names longer than 95 are cut
  std::memcpy(info->name, prop.name, name_len);
  info->name[name_len] = '\0';
  static_assert(sizeof prop.uuid.bytes == sizeof info->uuid);
  std::memcpy(info->uuid, prop.uuid.bytes, sizeof info->uuid);
  info->pci_domain = prop.pciDomainID;
  info->pci_bus = prop.pciBusID;
  info->pci_device = prop.pciDeviceID;
  info->memory_bytes = prop.totalGlobalMem;
  info->sm_major = prop.major;
  info->sm_minor = prop.minor;
  const DriverApi& d = driver();
  if (d.status.ok()) {
    info->vmm_supported = device_attribute(d, ordinal, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
    info->posix_fd_handles =
        device_attribute(d, ordinal, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
  }
  return true;
}

}  // namespace

namespace detail {

Status driver_status(const char* call, CUresult err) noexcept {
  if (err == CUDA_SUCCESS) return OkStatus();
  const char* name = "CUresult";
  const DriverApi& d = driver();
  if (!d.status.ok() || d.get_error_name(err, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  const char* what = error_message(call, name, "driver API");
  switch (err) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return Status(Code::kNoMemory, what);
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED:
      return Status(Code::kUnsupported, what);
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE:
      return Status(Code::kInvalidArgument, what);
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
      return Status(Code::kUnavailable, what);
    default:
      return Status(Code::kInternal, what);
  }
}

}  // namespace detail

std::vector<DeviceInfo> devices() noexcept {
  std::vector<DeviceInfo> out;
  int n = 0;
  if (!available() || cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) return out;
  try {
    out.reserve(static_cast<size_t>(n));
  } catch (...) {
    return out;
  }
  for (int i = 0; i < n; ++i) {
    DeviceInfo info;
    if (describe(i, &info)) out.push_back(info);  // reserved: cannot throw
  }
  return out;
}

Result<int> device_by_uuid(const uint8_t uuid[16]) noexcept {
  if (uuid == nullptr) return Status(Code::kInvalidArgument, "device_by_uuid: null uuid");
  KDN_RETURN_IF_ERROR(detail::require_device());
  for (const DeviceInfo& d : devices()) {
    if (std::memcmp(d.uuid, uuid, sizeof d.uuid) == 0) return d.ordinal;
  }
  return Status(Code::kNotFound, "device_by_uuid: no visible device has this uuid");
}

Result<void*> import_vmm_memory(int device, int fd, uint64_t bytes) noexcept {
  if (fd < 0 || bytes == 0) return Status(Code::kInvalidArgument, "import_vmm_memory: bad fd or zero bytes");
  KDN_RETURN_IF_ERROR(use_device(device));
  const DriverApi& d = driver();
  KDN_RETURN_IF_ERROR(d.status);
  size_t granularity = 0;
  KDN_RETURN_IF_ERROR(vmm_granularity(d, device, &granularity));
  if (bytes % granularity != 0) {
    return Status(Code::kInvalidArgument, "import_vmm_memory: bytes is not a multiple of the allocation granularity");
  }
  CUmemGenericAllocationHandle h = 0;
  KDN_RETURN_IF_ERROR(driver_status("cuMemImportFromShareableHandle",
                                    d.import_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
  CUdeviceptr va = 0;
  const Status st = map_read_write(d, device, h, bytes, granularity, &va);
  d.release(h);  // a mapping holds its own reference: unmapping frees the memory
  if (!st.ok()) return st;
  return reinterpret_cast<void*>(static_cast<uintptr_t>(va));
}

// Errors here (a range never mapped, a driver gone) leave nothing to undo and are not reported.
void unmap_vmm_memory(void* base, uint64_t bytes) noexcept {
  if (base == nullptr || bytes == 0 || !available() || !any_context()) return;
  const DriverApi& d = driver();
  if (!d.status.ok()) return;
  const auto va = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(base));
  d.unmap(va, bytes);
  d.address_free(va, bytes);
}

// ---- test-only exports (cuda_api_testing.h) ------------------------------------------------------

namespace testing {

Result<void*> ipc_alloc(int device, uint64_t bytes, IpcHandle* handle) noexcept {
  if (handle == nullptr || bytes == 0) return Status(Code::kInvalidArgument, "ipc_alloc: null handle or zero bytes");
  KDN_RETURN_IF_ERROR(use_device(device));
  void* p = nullptr;
  KDN_RETURN_IF_ERROR(cuda_status("cudaMalloc", cudaMalloc(&p, bytes)));
  cudaIpcMemHandle_t h;
  const Status st = cuda_status("cudaIpcGetMemHandle", cudaIpcGetMemHandle(&h, p));
  if (!st.ok()) {
    cudaFree(p);
    return st;
  }
  std::memcpy(handle->bytes, &h, sizeof h);
  return p;
}

void ipc_free(int device, void* p) noexcept {
  if (p != nullptr && available() && cudaSetDevice(device) == cudaSuccess) cudaFree(p);
}

Result<VmmAllocation> vmm_alloc_export(int device, uint64_t bytes) noexcept {
  if (bytes == 0) return Status(Code::kInvalidArgument, "vmm_alloc_export: zero bytes");
  KDN_RETURN_IF_ERROR(use_device(device));
  const DriverApi& d = driver();
  KDN_RETURN_IF_ERROR(d.status);
  size_t granularity = 0;
  KDN_RETURN_IF_ERROR(vmm_granularity(d, device, &granularity));
  VmmAllocation a;
  a.device = device;
  a.bytes = (bytes + granularity - 1) / granularity * granularity;
  const CUmemAllocationProp prop = vmm_props(device);
  CUmemGenericAllocationHandle h = 0;
  KDN_RETURN_IF_ERROR(driver_status("cuMemCreate", d.create(&h, a.bytes, &prop, 0)));
  a.handle = h;
  CUdeviceptr va = 0;
  Status st = map_read_write(d, device, h, a.bytes, granularity, &va);
  if (st.ok()) {
    a.base = reinterpret_cast<void*>(static_cast<uintptr_t>(va));
    st = driver_status("cuMemExportToShareableHandle",
                       d.export_handle(&a.fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  }
  if (!st.ok()) {
    a.fd = -1;
    vmm_free(a);
    return st;
  }
  return a;
}

void vmm_free(VmmAllocation& a) noexcept {
  if (a.fd >= 0) ::close(a.fd);
  if (available() && any_context() && driver().status.ok()) {
    const DriverApi& d = driver();
    const auto va = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(a.base));
    if (a.base != nullptr) {
      d.unmap(va, a.bytes);
      d.address_free(va, a.bytes);
    }
    if (a.handle != 0) d.release(a.handle);
  }
  a = VmmAllocation{};
}

}  // namespace testing

#else  // !KDN_GPU_WITH_CUDA

namespace {
constexpr Status kNoCuda(Code::kUnsupported, "kdn was built without CUDA (KDN_WITH_CUDA=OFF)");
}  // namespace

std::vector<DeviceInfo> devices() noexcept { return {}; }
Result<int> device_by_uuid(const uint8_t*) noexcept { return kNoCuda; }
Result<void*> import_vmm_memory(int, int, uint64_t) noexcept { return kNoCuda; }
void unmap_vmm_memory(void*, uint64_t) noexcept {}

namespace testing {
Result<void*> ipc_alloc(int, uint64_t, IpcHandle*) noexcept { return kNoCuda; }
void ipc_free(int, void*) noexcept {}
Result<VmmAllocation> vmm_alloc_export(int, uint64_t) noexcept { return kNoCuda; }
void vmm_free(VmmAllocation& a) noexcept { a = VmmAllocation{}; }
}  // namespace testing

#endif  // KDN_GPU_WITH_CUDA

}  // namespace kdn::sidecar::gpu
