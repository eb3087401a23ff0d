// Who may open, create and administer which namespace. Every answer comes from the
// configuration and the kernel's view of the peer (SO_PEERCRED, SO_PEERGROUPS), never from
// what a client asks for: a hello may ask for admin or for a new namespace, and gets it only
// where the configuration says this uid may.
//
//   open     root, a uid in the namespace's allow_uids, or a peer whose primary or
//            supplementary gid is in its allow_gids — and the namespace's token, if it has one
//   admin    a uid in the namespace's admin_uids or the daemon-wide admin_uids
//   create   allow_create_namespaces, and a uid in create_namespace_uids (root included);
//            the namespace then admits only its creator's uid (and root)
#pragma once

#include "session.h"

#include <kdn/common/status.h>
#include <kdn/sidecar/config.h>

#include <sys/types.h>

#include <string>
#include <vector>

namespace kdn::sidecar {

struct Peer {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<gid_t> groups;  // supplementary
};

// True if `policy` lets `peer` in by its uid or groups (tokens aside).
bool admits(const NamespaceConfig& policy, const Peer& peer) noexcept;
// KDN_ERR_PERMISSION (naming what is missing) unless `peer` may open `ns` with `token`.
Status may_open(const Namespace& ns, const Peer& peer, const char* token) noexcept;
bool is_admin(const Config& config, const Namespace& ns, const Peer& peer) noexcept;
// An admin of every namespace (the top-level admin_uids): the only one who sees the daemon-wide
// counters and other namespaces' series. A namespace's own admin_uids see that namespace's.
bool is_node_admin(const Config& config, const Peer& peer) noexcept;
// Whether `uid` is named in the namespace's own admin_uids.
bool administers(const Namespace& ns, uint32_t uid) noexcept;
// KDN_ERR_PERMISSION unless `peer` may ask for a namespace the configuration does not declare.
Status may_create_namespace(const Config& config, const Peer& peer) noexcept;
// The policy of a namespace `peer` creates: its uid only, the daemon's token and arena size.
NamespaceConfig client_namespace_policy(const Config& config, const std::string& name, const Peer& peer);

}  // namespace kdn::sidecar
