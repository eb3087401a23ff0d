// Session: the daemon's state for one connected client. Namespace: one tenant's memory,
// chunks and policy.
//
// A session owns its shared-memory session (rings, payload, doorbell), its staging area, its
// socket (whose hang-up is how the daemon learns that the client died, SIGKILL included),
// the leases and reservations it holds, and its requests in flight. When it ends, its leases
// are released and its reservations aborted at once; requests with transfers still reading
// its staging area keep the session (closed, no longer polled) until those land, so no copy
// ever reads memory kdnd has unmapped.
//
// Everything here is owned by the daemon's event loop thread.
#pragma once

#include "tiers/host_arena_tier.h"
#include "staging.h"
#include "tier.h"
#include "tiered_store.h"

#include <kdn/common/model.h>
#include <kdn/ipc/fd.h>
#include <kdn/ipc/session.h>
#include <kdn/sidecar/config.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kdn::sidecar {

struct NamespaceCounters {
  uint64_t protocol_errors = 0, limit_errors = 0, expired_reservations = 0;
  uint64_t yielded_reservations = 0;  // given up to a writer holding fewer reserved bytes
};

struct Namespace {
  std::string name;
  NamespaceConfig policy;   // who may open it, who is admin, its limits
  std::string token;        // "" = none required
  bool configured = false;  // declared in the configuration (never released)
  uint32_t region_id = 0;   // its arena's region, and the generation of that memory
  uint32_t region_generation = 0;
  std::unique_ptr<HostArenaTier> host;  // T1: every namespace's; engines map its arena
  std::unique_ptr<TieredStore> store;
  // The tiers below T1 by TierId (T2, T3; the tier factory opens them for namespaces declared
  // in the configuration), null where absent. Declared after the store, so they go first: T3's
  // destructor fails the probes in flight, whose answers the store owns.
  std::array<std::unique_ptr<Tier>, kTierCount> lower;
  uint32_t sessions = 0;                   // open sessions
  uint32_t attached = 0;                   // Session objects, closed ones whose copies are in flight too
  uint64_t staging_bytes = 0;              // of its sessions
  uint64_t empty_since_ns = 0;             // when its last session ended (client-created namespaces)
  std::atomic<uint64_t> prefault_left{0};  // arena bytes the Prefaulter has still to fault in
  NamespaceCounters counters;
  // Sessions that may hold open reservations here (the request handler keeps it; a session is
  // in it from its first RESERVE until it ends): the writers fair room-making chooses among.
  std::unordered_set<struct Session*> writers;

  // The namespace's tier `t` (the host's or one below it), or null.
  Tier* tier(TierId t) const noexcept { return t == TierId::kHost ? host.get() : lower[tier_index(t)].get(); }
  // Visits the tiers below the host that the namespace has.
  template <class F>
  void for_each_lower(F visit) const {
    for (const std::unique_ptr<Tier>& t : lower)
      if (t) visit(*t);
  }
};

struct LeaseHold {
  Entry* entry = nullptr;
  uint32_t count = 0;  // leases of this chunk this session received and has not released
  uint64_t bytes = 0;  // the chunk's, counted once in Session::leased_bytes
};

struct Reservation {
  Entry* entry = nullptr;
  uint64_t staging_offset = 0;
  uint64_t deadline_ns = 0;
};

struct Op;

struct Session {
  uint64_t id = 0;
  ipc::UniqueFd sock;
  ipc::DaemonSession shm;
  StagingArea staging;
  uint32_t staging_region = 0;  // region id of the staging area (generation 1)
  Namespace* ns = nullptr;
  bool admin = false;
  bool node_admin = false;   // admin of every namespace: daemon-wide counters (access.h)
  bool closed = false;       // the client is gone; kept only until its transfers land
  bool ring_broken = false;  // the client corrupted its completion ring: to be closed
  uint32_t pid = 0, uid = 0, gid = 0;
  uint64_t next_handle = 1;  // lease and reservation ids; never reused within a session

  std::unordered_map<uint64_t, LeaseHold> leases;          // lease id -> hold
  uint64_t leased_bytes = 0;                               // of the chunks in leases (max_lease_bytes)
  bool held_many_leases = false;                           // the heap is trimmed after it ends
  std::unordered_map<const Entry*, uint64_t> lease_ids;    // entry -> its lease id
  std::unordered_map<uint64_t, Reservation> reservations;  // reservation id -> slot
  std::deque<uint64_t> reservation_order;                  // ids, oldest first (for expiry)
  uint64_t reserved_bytes = 0;                             // of the chunks in reservations
  std::vector<uint32_t> models;                            // model ids registered (bounded)

  uint32_t ops_in_flight = 0;      // requests started and not completed
  uint64_t records_in_flight = 0;  // their input records (bounds the memory they may hold)
  std::deque<ipc::Cqe> backlog;    // completions that did not fit the CQ yet
  uint64_t requests = 0, protocol_errors = 0;
};

}  // namespace kdn::sidecar
