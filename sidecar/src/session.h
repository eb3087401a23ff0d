// Session: the daemon's state for one connected client, and Namespace: one tenant's arena
// and chunk index.
//
// A session owns its shared-memory session (rings, payload, doorbell), its socket (whose
// hang-up is how the daemon learns that the client died, SIGKILL included), and the leases
// and reservations it holds. Dropping a session releases all of them, so a dead client never
// pins memory. Everything here is owned by the daemon's event loop thread.
#pragma once

#include "chunk_store.h"

#include <kdn/common/model.h>
#include <kdn/ipc/fd.h>
#include <kdn/ipc/segment.h>
#include <kdn/ipc/session.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace kdn::sidecar {

struct Namespace {
  std::string name;
  ipc::SharedSegment arena;  // memfd shared with every client of the namespace
  ChunkStore store;
  uint32_t sessions = 0;

  Namespace(std::string n, ipc::SharedSegment a, uint64_t slab_bytes, EvictionKind ev)
      : name(std::move(n)), arena(std::move(a)), store(arena.size(), slab_bytes, ev) {}
};

struct Session {
  uint64_t id = 0;
  ipc::UniqueFd sock;
  ipc::DaemonSession shm;
  Namespace* ns = nullptr;
  bool admin = false;
  uint32_t pid = 0, uid = 0;
  uint64_t next_handle = 1;  // lease and reservation ids; never reused within a session
  std::unordered_map<uint64_t, ChunkEntry*> leases;
  std::unordered_map<uint64_t, ChunkEntry*> reservations;
  std::vector<uint32_t> models;     // model ids this session registered (bounded)
  std::deque<ipc::Cqe> backlog;     // completions that did not fit the CQ yet
  uint64_t requests = 0, protocol_errors = 0;

  // Releases every lease and aborts every reservation (client gone or disconnecting).
  void drop_holdings();
};

}  // namespace kdn::sidecar
