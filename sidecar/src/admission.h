// Shares of the daemon-wide tables that connections and sessions take, so that no tenant can
// fill one for every other.
//
// * Pending handshakes (accepted, hello not yet read) belong to a uid: kdnd cannot know the
//   namespace before the hello. When the table is full, a uid holding fewer than the uid that
//   holds the most takes the oldest of that uid's slots (its connection is refused with
//   KDN_ERR_BUSY): many uids' silent connections cannot keep out one more uid's engine.
// * Sessions belong to a namespace: each namespace is guaranteed
//   min(sessions_reserved_per_namespace, max_sessions / namespaces) sessions, so the free
//   sessions other namespaces have not used of their guarantee are not handed to a namespace
//   already past its own (the arithmetic is guaranteed_share.h's, shared with the model table).
//
// * Room in a full arena belongs to the writers evenly: when a reservation finds no room (every
//   chunk in the arena leased or reserved), the session of the namespace holding the most
//   reserved bytes gives up its oldest reservations, while it would still hold more than the
//   session asking, until the bytes given up make room (RequestHandler::reserve_fairly bounds
//   them by a slab's). A client that reserves the whole arena, or re-reserves whatever expires,
//   can then keep out no other writer.
//
// Pure functions over the daemon's tables; the event loop owns them. Not thread-safe.
#pragma once

#include "session.h"

#include <kdn/common/status.h>
#include <kdn/sidecar/config.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

namespace kdn::sidecar {

// The uid that should give up its oldest pending connection so that a connection of `uid` can
// wait too, or nullopt when the table's holders are already as even as one slot allows.
// `per_uid` counts the pending connections of each uid (absent: none).
std::optional<uint32_t> pending_to_give_way(const std::unordered_map<uint32_t, uint32_t>& per_uid, uint32_t uid);

// The sessions each namespace is guaranteed (see above) when `namespaces` exist.
uint32_t sessions_reserved(const Config& cfg, size_t namespaces);

// Whether one more session of `ns` fits beside `active` open sessions (KDN_ERR_LIMIT naming
// the key otherwise): under max_sessions, and leaving the other namespaces what is still owed
// of their guarantee unless `ns` is still within its own.
Status session_share_allows(const Config& cfg, const std::map<std::string, std::unique_ptr<Namespace>>& namespaces,
                            const Namespace& ns, size_t active);

// The writer of `ns` that should give up its oldest reservation so that `s` can reserve `bytes`
// more (see above), or null when `s` would then hold as much as any other writer.
Session* writer_to_give_way(const Namespace& ns, const Session& s, uint64_t bytes) noexcept;

}  // namespace kdn::sidecar
