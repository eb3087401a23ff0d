// The few CUDA driver calls the Python package needs to describe a torch CUDA tensor to kdnd:
// which allocation holds it (cuMemGetAddressRange), that allocation's IPC handle
// (cuIpcGetMemHandle) and the UUID of its device. libcuda.so.1 is opened at run time, so the
// package builds and imports on machines without CUDA; there every call throws
// Error(KDN_ERR_UNSUPPORTED). No CUDA header is included: the types are spelled out below.
//
// The calls run in the calling thread's current CUDA context: call them from the thread that
// made the tensor's device current (torch does on first use), as PyTorch itself requires.
// Thread safety: the library is opened once (std::call_once); the calls are the driver's.
#pragma once

#include <cstdint>
#include <string>

namespace kdn::python {

struct CudaAllocation {
  uint64_t base = 0;   // first byte of the allocation that holds the address
  uint64_t bytes = 0;  // its size
  int device = -1;     // ordinal of its device
};

// Whether libcuda.so.1 could be opened and initialized (the reason otherwise).
bool cuda_driver_available(std::string* why);
// The device allocation holding `address`; Error(KDN_ERR_INVALID_ARGUMENT) for an address
// that is not device memory.
CudaAllocation cuda_allocation_of(uint64_t address);
// The legacy IPC handle (64 bytes) of an allocation base; Error(KDN_ERR_UNSUPPORTED) for memory
// that cannot be exported that way (cuMemCreate memory, e.g. PyTorch's expandable segments).
std::string cuda_ipc_mem_handle(uint64_t allocation_base);
// cuDeviceGetUuid of a device ordinal (16 bytes).
std::string cuda_device_uuid(int device);

// Makes `stream` (a CUstream / cudaStream_t) wait until the 32-bit word at `address` (page-locked
// host memory, e.g. a pinned torch tensor) reaches `value` (wrapping compare, GEQ). The word is
// the engine's own: unlike an interprocess event it can always be released, also when the
// process that should have fired the event died.
void cuda_stream_wait_value(uint64_t stream, uint64_t address, uint32_t value);

}  // namespace kdn::python
