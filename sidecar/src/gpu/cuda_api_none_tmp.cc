// cuda_api.h without CUDA: available() is false and every call is unsupported.
#include "cuda_api.h"

#include <sys/eventfd.h>
#include <unistd.h>

namespace kdn::sidecar::gpu {
namespace {
Status none() { return Status(Code::kUnsupported, "built without the GPU tier"); }
}  // namespace

bool available() noexcept { return false; }
std::vector<DeviceInfo> devices() noexcept { return {}; }
Result<int> device_by_uuid(const uint8_t*) noexcept { return Status(Code::kNotFound, "no device"); }
bool can_access_peer(int, int) noexcept { return false; }
Status enable_peer_access(int, int) noexcept { return none(); }
Status host_register(void*, size_t) noexcept { return none(); }
void host_unregister(void*) noexcept {}
Result<DeviceRegion> region_create(int, uint64_t) noexcept { return none(); }
void region_destroy(DeviceRegion&) noexcept {}
Result<void*> open_ipc_memory(int, const IpcHandle&) noexcept { return none(); }
void close_ipc_memory(int, void*) noexcept {}
Result<void*> import_vmm_memory(int, int, uint64_t) noexcept { return none(); }
void unmap_vmm_memory(void*, uint64_t) noexcept {}
Result<void*> stream_create(int, bool) noexcept { return none(); }
void stream_destroy(void*) noexcept {}
Result<void*> ipc_event_create(int, IpcHandle*) noexcept { return none(); }
Result<void*> ipc_event_open(int, const IpcHandle&) noexcept { return none(); }
void event_destroy(void*) noexcept {}
Status event_record(void*, void*) noexcept { return none(); }
Status stream_wait_event(void*, void*) noexcept { return none(); }
Status copy_async(void*, const void*, size_t, void*) noexcept { return none(); }
Status stream_sync(void*) noexcept { return none(); }
CompletionQueue::CompletionQueue() noexcept : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
CompletionQueue::~CompletionQueue() {
  if (fd_ >= 0) ::close(fd_);
}
size_t CompletionQueue::drain(std::vector<Done>* out) noexcept {
  uint64_t n;
  (void)!::read(fd_, &n, sizeof n);
  std::lock_guard<std::mutex> lock(mu_);
  const size_t k = ready_.size();
  try {
    out->insert(out->end(), ready_.begin(), ready_.end());
  } catch (...) {
    return 0;
  }
  ready_.clear();
  return k;
}
void CompletionQueue::push(Done d) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      ready_.push_back(d);
    } catch (...) {
      return;
    }
  }
  const uint64_t one = 1;
  (void)!::write(fd_, &one, sizeof one);
}
Status notify_after(void*, CompletionQueue*, uint64_t) noexcept { return none(); }
const char* last_error() noexcept { return "no CUDA in this build"; }

}  // namespace kdn::sidecar::gpu
