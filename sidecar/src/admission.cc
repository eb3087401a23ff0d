#include "admission.h"

#include <algorithm>

namespace kdn::sidecar {

std::optional<uint32_t> pending_to_give_way(const std::unordered_map<uint32_t, uint32_t>& per_uid, uint32_t uid) {
  auto mine = per_uid.find(uid);
  const uint32_t held = mine == per_uid.end() ? 0 : mine->second;
  std::optional<uint32_t> heaviest;
  uint32_t most = 0;
  for (const auto& [other, n] : per_uid) {
    if (n > most) {
      most = n;
      heaviest = other;
    }
  }
  // Taking a slot must leave the newcomer's uid below the giver's, or the two would only swap
  // places connection after connection.
  if (!heaviest || held + 1 >= most) return std::nullopt;
  return heaviest;
}

uint32_t sessions_reserved(const Config& cfg, size_t namespaces) {
  const uint64_t even = cfg.max_sessions / std::max<size_t>(namespaces, 1);
  return uint32_t(std::min<uint64_t>(cfg.sessions_reserved_per_namespace, even));
}

namespace {

// What `ns` may still claim of its guarantee (its own max_sessions caps it).
uint32_t still_owed(const Namespace& ns, uint32_t reserved) {
  const uint32_t cap = ns.policy.max_sessions ? std::min(reserved, ns.policy.max_sessions) : reserved;
  return cap > ns.sessions ? cap - ns.sessions : 0;
}

}  // namespace

Status session_share_allows(const Config& cfg, const std::map<std::string, std::unique_ptr<Namespace>>& namespaces,
                            const Namespace& ns, size_t active) {
  if (active >= cfg.max_sessions) return Status(Code::kLimit, "max_sessions sessions are open");
  const uint32_t reserved = sessions_reserved(cfg, namespaces.size());
  if (ns.sessions < reserved) return OkStatus();  // within its guarantee: always room (see above)
  uint64_t owed = 0;
  for (const auto& [name, other] : namespaces)
    if (other.get() != &ns) owed += still_owed(*other, reserved);
  if (active + 1 + owed > cfg.max_sessions)
    return Status(Code::kLimit,
                  "the free sessions are other namespaces' guaranteed share (sessions_reserved_per_namespace)");
  return OkStatus();
}

Session* writer_to_give_way(const Namespace& ns, const Session& s, uint64_t bytes) noexcept {
  Session* heaviest = nullptr;
  for (Session* w : ns.writers)
    if (w != &s && (heaviest == nullptr || w->reserved_bytes > heaviest->reserved_bytes)) heaviest = w;
  // Taking must leave `s` below the giver, or two writers would only trade one slot back and forth.
  if (heaviest == nullptr || s.reserved_bytes + bytes >= heaviest->reserved_bytes) return nullptr;
  return heaviest;
}

}  // namespace kdn::sidecar
