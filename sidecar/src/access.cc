#include "access.h"

#include <kdn/ipc/handshake.h>

#include <algorithm>

namespace kdn::sidecar {
namespace {

bool listed(const std::vector<uint32_t>& ids, uint32_t id) noexcept {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

bool admits(const NamespaceConfig& policy, const Peer& peer) noexcept {
  bool allowed = peer.uid == 0 || listed(policy.allow_uids, peer.uid) || listed(policy.allow_gids, peer.gid);
  for (gid_t g : peer.groups) allowed |= listed(policy.allow_gids, g);
  return allowed;
}

Status may_open(const Namespace& ns, const Peer& peer, const char* token) noexcept {
  if (!admits(ns.policy, peer)) return Status(Code::kPermission, "this uid and its groups may not open the namespace");
  if (!ns.token.empty() && !ipc::token_equals(token, ns.token.c_str()))
    return Status(Code::kPermission, "wrong or missing token for the namespace");
  return OkStatus();
}

bool is_admin(const Config& config, const Namespace& ns, const Peer& peer) noexcept {
  return listed(ns.policy.admin_uids, peer.uid) || listed(config.admin_uids, peer.uid);
}

bool is_node_admin(const Config& config, const Peer& peer) noexcept { return listed(config.admin_uids, peer.uid); }

bool administers(const Namespace& ns, uint32_t uid) noexcept { return listed(ns.policy.admin_uids, uid); }

Status may_create_namespace(const Config& config, const Peer& peer) noexcept {
  if (!config.allow_create_namespaces) return Status(Code::kPermission, "this kdnd creates no namespaces for clients");
  if (peer.uid != 0 && !listed(config.create_namespace_uids, peer.uid))
    return Status(Code::kPermission, "this uid may not create namespaces (create_namespace_uids)");
  return OkStatus();
}

NamespaceConfig client_namespace_policy(const Config& config, const std::string& name, const Peer& peer) {
  NamespaceConfig nc;
  nc.name = name;
  nc.allow_uids = {peer.uid};
  nc.max_bytes = config.host.bytes;
  return nc;
}

}  // namespace kdn::sidecar
