#include "redis_cluster.h"

#include <array>
#include <charconv>

namespace kdn::sidecar {
namespace {

constexpr std::array<uint16_t, 256> make_crc16_table() {
  std::array<uint16_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b) crc = static_cast<uint16_t>(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    t[i] = crc;
  }
  return t;
}
constexpr std::array<uint16_t, 256> kCrc16Table = make_crc16_table();

template <class Int>
bool parse_number(std::string_view s, Int* out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

uint16_t crc16_xmodem(std::string_view bytes) noexcept {
  uint16_t crc = 0;
  for (unsigned char c : bytes) crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ c) & 0xff]);
  return crc;
}

uint16_t key_slot(std::string_view key) noexcept {
  size_t open = key.find('{');
  if (open != std::string_view::npos) {
    size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<uint16_t>(crc16_xmodem(key) % kClusterSlots);
}

std::string NodeAddress::to_string() const { return host + ":" + std::to_string(port); }

std::optional<NodeAddress> parse_address(std::string_view text) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  NodeAddress a;
  a.host = std::string(text.substr(0, colon));
  if (!parse_number(text.substr(colon + 1), &a.port) || a.port == 0) return std::nullopt;
  return a;
}

std::optional<Redirect> parse_redirect(std::string_view error_text) {
  Redirect r;
  if (error_text.starts_with("MOVED ")) {
    r.kind = Redirect::Kind::kMoved;
    error_text.remove_prefix(6);
  } else if (error_text.starts_with("ASK ")) {
    r.kind = Redirect::Kind::kAsk;
    error_text.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  size_t space = error_text.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  if (!parse_number(error_text.substr(0, space), &r.slot) || r.slot >= kClusterSlots) return std::nullopt;
  std::optional<NodeAddress> node = parse_address(error_text.substr(space + 1));
  if (!node) return std::nullopt;
  r.node = std::move(*node);
  return r;
}

SlotMap SlotMap::single(NodeAddress node) {
  SlotMap m;
  m.masters_.push_back(std::move(node));
  m.owner_.assign(kClusterSlots, 0);
  return m;
}

Result<SlotMap> SlotMap::from_cluster_slots(const resp::Reply& reply, const NodeAddress& reached) {
  using resp::Type;
  if (reply.is_error()) return Status(Code::kUnavailable, "CLUSTER SLOTS answered an error");
  if (reply.empty() || reply.root().type != Type::kArray) return Status(Code::kProtocol, "CLUSTER SLOTS: not an array");
  SlotMap m;
  for (size_t k = 0; k < static_cast<size_t>(reply.root().value); ++k) {
    size_t range = reply.element(0, k);
    size_t start = reply.element(range, 0), end = reply.element(range, 1), master = reply.element(range, 2);
    if (master == SIZE_MAX || reply.node(start).type != Type::kInteger || reply.node(end).type != Type::kInteger) {
      return Status(Code::kProtocol, "CLUSTER SLOTS: malformed slot range");
    }
    int64_t first = reply.node(start).value, last = reply.node(end).value;
    if (first < 0 || last < first || last >= kClusterSlots)
      return Status(Code::kProtocol, "CLUSTER SLOTS: slot out of range");
    size_t host = reply.element(master, 0), port = reply.element(master, 1);
    if (port == SIZE_MAX || reply.node(port).type != Type::kInteger || reply.node(port).value <= 0 ||
        reply.node(port).value > UINT16_MAX) {
      return Status(Code::kProtocol, "CLUSTER SLOTS: malformed node");
    }
    NodeAddress node;
    if (reply.node(host).type == Type::kBulk) node.host = std::string(reply.text(reply.node(host)));
    if (node.host.empty() || node.host == "?") node.host = reached.host;
    node.port = static_cast<uint16_t>(reply.node(port).value);
    uint16_t index = m.index_of(node);
    for (int64_t s = first; s <= last; ++s) m.owner_[static_cast<size_t>(s)] = index;
  }
  return m;
}

uint32_t SlotMap::uncovered() const noexcept {
  uint32_t n = 0;
  for (uint16_t o : owner_) n += o == kNoOwner;
  return n;
}

void SlotMap::assign(uint16_t slot, const NodeAddress& node) { owner_[slot % kClusterSlots] = index_of(node); }

uint16_t SlotMap::index_of(const NodeAddress& node) {
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (masters_[i] == node) return static_cast<uint16_t>(i);
  }
  masters_.push_back(node);
  return static_cast<uint16_t>(masters_.size() - 1);
}

}  // namespace kdn::sidecar
