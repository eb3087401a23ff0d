// GpuRegistry: every session's registrations of engine GPU memory (GPU_REGISTER).
//
// A registration is named on the wire by {id, generation}: ids are small and reused within a
// session, generations are daemon-wide and never reused, so a request naming a registration
// that was unregistered (or one of a previous kdnd connection) is refused as stale, never served
// from memory that now belongs to someone else.
//
// Lifetime: unregister() and drop_session() retire a registration at once (no new request can
// name it) but its mappings are closed (the Closer runs) only when the copies in flight for it
// have landed (begin_copy / end_copy). Nothing here blocks: a dead engine's registrations are
// retired when its session ends and closed as soon as the GPU is done with them, so its
// restart never waits on kdnd.
//
// The CUDA handles inside a Registration are opaque pointers owned by the registry's Closer.
// Pure C++ (unit-tested on the CPU). Not thread-safe: the event loop owns it.
#pragma once

#include "cuda_api.h"

#include <kdn/common/status.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

namespace kdn::sidecar::gpu {

struct Registration {
  uint32_t id = 0;
  uint32_t generation = 0;
  uint64_t session = 0;
  uint32_t kind = 0;         // ipc::GpuMemoryKind
  int device = -1;           // kdnd's ordinal
  uint64_t engine_base = 0;  // engine address of the registered range
  uint64_t bytes = 0;
  uint64_t mapping_base = 0;   // kdnd's address of engine_base
  void* allocation = nullptr;  // kdnd's mapping of the whole allocation (what the Closer closes)
  uint64_t allocation_bytes = 0;
  IpcHandle memory_handle;       // kIpc: the handle opened (the mapping cache's key)
  void* engine_event = nullptr;  // opened engine event (GPU_STORE waits for it)
  void* done_event = nullptr;    // kdnd's event, recorded after each GPU_RETRIEVE
  IpcHandle done_handle;
  uint32_t in_flight = 0;  // copy batches that still touch the memory
  bool retired = false;    // unregistered or its session ended: no request may name it
};

class GpuRegistry {
 public:
  using Closer = std::function<void(Registration&)>;
  GpuRegistry(uint32_t max_per_session, Closer close);
  ~GpuRegistry();  // closes everything (the caller has drained the GPU first)

  // Takes `r` (its mappings opened by the caller) and names it. kLimit past max_per_session (the
  // caller then closes what it opened).
  Result<Registration*> add(uint64_t session, Registration r);
  // The live registration {id, generation} of `session`; kNotFound (stale or unknown) otherwise.
  Result<Registration*> find(uint64_t session, uint32_t id, uint32_t generation) noexcept;
  // Retires a registration: closed now if no copy is in flight, else once the last one lands.
  Status unregister(uint64_t session, uint32_t id, uint32_t generation) noexcept;
  // Retires every registration of a session that ended.
  void drop_session(uint64_t session) noexcept;

  void begin_copy(Registration* r) noexcept { ++r->in_flight; }
  // A batch that touched `r` landed; closes it if it was retired meanwhile.
  void end_copy(Registration* r) noexcept;

  size_t live() const noexcept { return live_; }
  size_t retired_open() const noexcept { return retired_.size(); }  // awaiting their copies
  uint64_t closed_total() const noexcept { return closed_; }

 private:
  void retire(std::unique_ptr<Registration> r) noexcept;

  uint32_t max_per_session_;
  Closer close_;
  uint32_t next_generation_ = 1;
  size_t live_ = 0;
  uint64_t closed_ = 0;
  // Per session: slot id - 1 -> registration (null: free id).
  std::unordered_map<uint64_t, std::vector<std::unique_ptr<Registration>>> sessions_;
  std::vector<std::unique_ptr<Registration>> retired_;  // retired with copies in flight
};

}  // namespace kdn::sidecar::gpu
