// RequestHandler: executes one checked SQE for one session and produces its CQE.
//
// Input records are copied out of the client's payload area into daemon-private scratch
// before use, and results are written back with bounds-checked copies (ipc/payload.h).
// Every failure becomes a CQE status; nothing a client sends can stop the daemon.
#pragma once

#include "session.h"

#include <kdn/common/model.h>
#include <kdn/ipc/protocol.h>

#include <vector>

namespace kdn::sidecar {

struct DaemonCounters {
  uint64_t sessions_total = 0, sessions_active = 0, protocol_errors = 0, requests = 0;
  uint64_t handshakes_refused = 0;
};

// The daemon-wide model table: ids are dense, stable for the daemon's lifetime, and shared by
// sessions that register equal descriptors.
class ModelTable {
 public:
  static constexpr uint32_t kMaxModels = 4096;
  Result<uint32_t> intern(const ModelInfo& m);
  const ModelInfo* get(uint32_t id) const { return id >= 1 && id <= models_.size() ? &models_[id - 1] : nullptr; }

 private:
  std::vector<ModelInfo> models_;
};

class RequestHandler {
 public:
  RequestHandler(ModelTable& models, DaemonCounters& counters);
  // Executes `sqe` (already popped) for `s` and returns its completion.
  ipc::Cqe handle(Session& s, const ipc::Sqe& sqe);

 private:
  using Cqe = ipc::Cqe;
  using Sqe = ipc::Sqe;
  Status ping(const Sqe& q, Cqe& c);
  Status register_model(Session& s, const Sqe& q, Cqe& c);
  Status lookup(Session& s, const Sqe& q, Cqe& c);
  Status reserve(Session& s, const Sqe& q, Cqe& c);
  Status commit_or_abort(Session& s, const Sqe& q, Cqe& c, bool commit);
  Status lease(Session& s, const Sqe& q, Cqe& c);
  Status release(Session& s, const Sqe& q, Cqe& c);
  Status stats(Session& s, const Sqe& q, Cqe& c);
  Status list(Session& s, const Sqe& q, Cqe& c);
  Status evict(Session& s, const Sqe& q, Cqe& c);
  Result<const ModelInfo*> model_of(const Session& s, const Sqe& q) const;
  Result<std::span<kdn_key>> keys_in(const Session& s, const Sqe& q);
  Result<std::span<uint64_t>> ids_in(const Session& s, const Sqe& q);

  ModelTable& models_;
  DaemonCounters& counters_;
  // Daemon-private scratch for copied-in records and outgoing records (max op size).
  std::vector<kdn_key> keys_;
  std::vector<uint64_t> ids_;
  std::vector<ipc::ReserveSlot> reserve_out_;
  std::vector<ipc::LeaseSlot> lease_out_;
  std::vector<ChunkEntry*> leased_;
  std::vector<ipc::ListEntry> list_out_;
};

}  // namespace kdn::sidecar
