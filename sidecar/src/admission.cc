#include "admission.h"

#include "guaranteed_share.h"

#include <algorithm>

namespace kdn::sidecar {

namespace {

// The shape both tables share: of `holders` (the asker among them or not), the one of the most
// weight gives way if, after the asker holding `mine` takes `more`, the asker still holds less
// than it; otherwise the two would only trade one slot back and forth. holders.end() if none
// gives way (the asker is then as heavy as a slot allows, or heaviest itself).
template <class Holders, class Weight>
auto heaviest_to_give_way(const Holders& holders, Weight weight, uint64_t mine, uint64_t more) {
  auto heaviest = holders.end();
  for (auto it = holders.begin(); it != holders.end(); ++it)
    if (heaviest == holders.end() || weight(*it) > weight(*heaviest)) heaviest = it;
  if (heaviest == holders.end() || mine + more >= weight(*heaviest)) return holders.end();
  return heaviest;
}

}  // namespace

std::optional<uint32_t> pending_to_give_way(const std::unordered_map<uint32_t, uint32_t>& per_uid, uint32_t uid) {
  auto mine = per_uid.find(uid);
  auto giver = heaviest_to_give_way(
      per_uid, [](const auto& held) { return uint64_t(held.second); }, mine == per_uid.end() ? 0 : mine->second, 1);
  if (giver == per_uid.end()) return std::nullopt;
  return giver->first;
}

uint32_t sessions_reserved(const Config& cfg, size_t namespaces) {
  const uint64_t even = cfg.max_sessions / std::max<size_t>(namespaces, 1);
  return uint32_t(std::min<uint64_t>(cfg.sessions_reserved_per_namespace, even));
}

namespace {

// What `ns` may still claim of its guarantee (its own max_sessions caps it).
uint32_t owed_to(const Namespace& ns, uint32_t reserved) {
  const uint32_t cap = ns.policy.max_sessions ? std::min(reserved, ns.policy.max_sessions) : reserved;
  return uint32_t(still_owed(ns.sessions, cap));
}

}  // namespace

Status session_share_allows(const Config& cfg, const std::map<std::string, std::unique_ptr<Namespace>>& namespaces,
                            const Namespace& ns, size_t active) {
  if (active >= cfg.max_sessions) return Status(Code::kLimit, "max_sessions sessions are open");
  const uint32_t reserved = sessions_reserved(cfg, namespaces.size());
  uint64_t owed = 0;
  for (const auto& [name, other] : namespaces)
    if (other.get() != &ns) owed += owed_to(*other, reserved);
  if (!share_allows_one_more(ns.sessions, reserved, active, owed, cfg.max_sessions))
    return Status(Code::kLimit,
                  "the free sessions are other namespaces' guaranteed share (sessions_reserved_per_namespace)");
  return OkStatus();
}

Session* writer_to_give_way(const Namespace& ns, const Session& s, uint64_t bytes) noexcept {
  auto giver = heaviest_to_give_way(
      ns.writers, [](const Session* w) { return w->reserved_bytes; }, s.reserved_bytes, bytes);
  return giver == ns.writers.end() ? nullptr : *giver;
}

}  // namespace kdn::sidecar
