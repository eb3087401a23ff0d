#include "cuda_driver.h"

#include "client.h"

#include <dlfcn.h>

#include <mutex>

namespace kdn::python {
namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
constexpr int kPointerMemoryType = 2;         // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerDeviceOrdinal = 9;      // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kPointerLegacyIpcCapable = 10;  // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
constexpr unsigned kMemoryTypeDevice = 2;     // CU_MEMORYTYPE_DEVICE

struct Driver {
  std::string error;  // empty once every symbol resolved and cuInit succeeded
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*address_range)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*pointer_attribute)(void*, int, CUdeviceptr) = nullptr;
  CUresult (*ipc_handle)(void*, CUdeviceptr) = nullptr;
  CUresult (*device_get)(int*, int) = nullptr;
  CUresult (*device_uuid)(void*, int) = nullptr;
  CUresult (*wait_value)(void*, CUdeviceptr, unsigned, unsigned) = nullptr;
};

template <class F>
bool resolve(void* lib, const char* name, F* out, std::string* error) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (!*out) *error = std::string("libcuda.so.1 lacks ") + name;
  return *out != nullptr;
}

Driver open_driver() {
  Driver d;
  // Never closed: the driver lives as long as the process, as torch's does.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    d.error = "no CUDA driver (libcuda.so.1) on this machine";
    return d;
  }
  std::string e;
  if (!resolve(lib, "cuInit", &d.init, &e) || !resolve(lib, "cuGetErrorName", &d.get_error_name, &e) ||
      !resolve(lib, "cuMemGetAddressRange_v2", &d.address_range, &e) ||
      !resolve(lib, "cuPointerGetAttribute", &d.pointer_attribute, &e) ||
      !resolve(lib, "cuIpcGetMemHandle", &d.ipc_handle, &e) || !resolve(lib, "cuDeviceGet", &d.device_get, &e) ||
      !resolve(lib, "cuDeviceGetUuid_v2", &d.device_uuid, &e) ||
      !resolve(lib, "cuStreamWaitValue32_v2", &d.wait_value, &e)) {
    d.error = e;
    return d;
  }
  if (CUresult rc = d.init(0); rc != 0)
    d.error = "cuInit failed (CUresult " + std::to_string(rc) + "): no usable device";
  return d;
}

const Driver& driver() {
  static std::once_flag once;
  static Driver d;
  std::call_once(once, [] { d = open_driver(); });
  if (!d.error.empty()) throw Error(KDN_ERR_UNSUPPORTED, d.error);
  return d;
}

void check_cu(const Driver& d, CUresult rc, const char* what, int code = KDN_ERR_INTERNAL) {
  if (rc == 0) return;
  const char* name = nullptr;
  if (d.get_error_name(rc, &name) != 0 || !name) name = "unknown CUresult";
  throw Error(code, std::string(what) + ": " + name);
}

}  // namespace

bool cuda_driver_available(std::string* why) {
  try {
    (void)driver();
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

CudaAllocation cuda_allocation_of(uint64_t address) {
  const Driver& d = driver();
  unsigned type = 0;
  if (d.pointer_attribute(&type, kPointerMemoryType, address) != 0 || type != kMemoryTypeDevice)
    throw Error(KDN_ERR_INVALID_ARGUMENT, "the address is not CUDA device memory");
  CudaAllocation a;
  check_cu(d, d.pointer_attribute(&a.device, kPointerDeviceOrdinal, address), "cuPointerGetAttribute(DEVICE_ORDINAL)");
  CUdeviceptr base = 0;
  size_t bytes = 0;
  check_cu(d, d.address_range(&base, &bytes, address), "cuMemGetAddressRange", KDN_ERR_INVALID_ARGUMENT);
  a.base = base;
  a.bytes = bytes;
  return a;
}

std::string cuda_ipc_mem_handle(uint64_t allocation_base) {
  const Driver& d = driver();
  int capable = 0;
  if (d.pointer_attribute(&capable, kPointerLegacyIpcCapable, allocation_base) != 0 || !capable)
    throw Error(KDN_ERR_UNSUPPORTED,
                "the KV cache's allocation cannot be exported by CUDA IPC (cuMemCreate memory, e.g. "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)");
  char handle[64];
  check_cu(d, d.ipc_handle(handle, allocation_base), "cuIpcGetMemHandle", KDN_ERR_UNSUPPORTED);
  return std::string(handle, sizeof handle);
}

std::string cuda_device_uuid(int device) {
  const Driver& d = driver();
  int dev = 0;
  check_cu(d, d.device_get(&dev, device), "cuDeviceGet", KDN_ERR_INVALID_ARGUMENT);
  char uuid[16];
  check_cu(d, d.device_uuid(uuid, dev), "cuDeviceGetUuid");
  return std::string(uuid, sizeof uuid);
}

}  // namespace kdn::python

namespace kdn::python {

void cuda_stream_wait_value(uint64_t stream, uint64_t address, uint32_t value) {
  const Driver& d = driver();
  constexpr unsigned kWaitGeq = 0;  // CU_STREAM_WAIT_VALUE_GEQ
  check_cu(d, d.wait_value(reinterpret_cast<void*>(stream), address, value, kWaitGeq), "cuStreamWaitValue32");
}

}  // namespace kdn::python
