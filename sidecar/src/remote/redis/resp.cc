#include "resp.h"

#include <algorithm>
#include <charconv>
#include <cstring>

namespace kdn::sidecar::resp {
namespace {

void append_bulk_header(std::string& out, char type, uint64_t n) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, n);
  out.push_back(type);
  out.append(buf, end);
  out.append(kCrlf);
}

void append_argv(std::string& out, std::span<const std::string_view> argv) {
  for (std::string_view arg : argv) {
    append_bulk_header(out, '$', arg.size());
    out.append(arg);
    out.append(kCrlf);
  }
}

// A RESP integer: an optional '-' and 1 to 19 digits, no overflow.
bool parse_int(std::string_view s, int64_t* out) noexcept {
  bool negative = !s.empty() && s.front() == '-';
  if (negative) s.remove_prefix(1);
  if (s.empty() || s.size() > 19) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v)) return false;
  }
  *out = negative ? -v : v;
  return true;
}

std::string_view as_chars(std::span<const std::byte> b) noexcept {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

}  // namespace

void append_command(std::string& out, std::span<const std::string_view> argv) {
  append_bulk_header(out, '*', argv.size());
  append_argv(out, argv);
}

void append_command_head(std::string& out, std::span<const std::string_view> argv, uint64_t payload_bytes) {
  append_bulk_header(out, '*', argv.size() + 1);
  append_argv(out, argv);
  append_bulk_header(out, '$', payload_bytes);
}

// ---- Reply ---------------------------------------------------------------------------------

std::string_view Reply::text(const Node& n) const noexcept {
  bool has_text =
      n.type == Type::kSimple || n.type == Type::kError || (n.type == Type::kBulk && n.bulk == Node::Bulk::kKept);
  if (!has_text) return {};
  uint64_t length = static_cast<uint64_t>(n.value);
  return std::string_view(text_).substr(n.offset, length);
}

size_t Reply::element(size_t i, size_t k) const noexcept {
  if (i >= nodes_.size() || nodes_[i].type != Type::kArray) return SIZE_MAX;
  if (k >= static_cast<uint64_t>(nodes_[i].value)) return SIZE_MAX;
  size_t at = i + 1;
  while (k-- > 0) at = nodes_[at].end;
  return at;
}

// ---- Parser --------------------------------------------------------------------------------

ParseResult Parser::feed(std::span<const std::byte> in, BulkSink* sink) noexcept {
  size_t pos = 0;
  while (phase_ != Phase::kDone && phase_ != Phase::kError && pos < in.size()) {
    std::span<const std::byte> rest = in.subspan(pos);
    switch (phase_) {
      case Phase::kLine: {
        size_t taken = take_line(rest);
        pos += taken;
        if (taken == 0) return {pos, ParseState::kError};
        if (phase_ == Phase::kLine && line_.size() >= 2 && line_.back() == '\n') {
          std::string_view line(line_.data(), line_.size() - 2);
          handle_line(line, sink);
          line_.clear();
        }
        break;
      }
      case Phase::kBody:
        pos += take_body(rest);
        break;
      case Phase::kBodyCrlf:
        pos += take_crlf(rest);
        break;
      default:
        break;
    }
  }
  if (phase_ == Phase::kError) return {pos, ParseState::kError};
  return {pos, phase_ == Phase::kDone ? ParseState::kDone : ParseState::kNeedMore};
}

// Copies header bytes up to and including the first LF into line_; returns how many bytes of
// `in` it used (0 only after an error).
size_t Parser::take_line(std::span<const std::byte> in) noexcept {
  std::string_view chars = as_chars(in);
  size_t lf = chars.find('\n');
  size_t take = lf == std::string_view::npos ? chars.size() : lf + 1;
  if (line_.size() + take > static_cast<size_t>(limits_.max_line) + 2) {
    fail(Code::kLimit, "RESP: line longer than the limit");
    return 0;
  }
  line_.append(chars.substr(0, take));
  if (lf == std::string_view::npos) return take;
  if (line_.size() < 2 || line_[line_.size() - 2] != '\r') {
    fail(Code::kProtocol, "RESP: LF without CR");
    return 0;
  }
  if (line_.find('\r') != line_.size() - 2) {
    fail(Code::kProtocol, "RESP: CR inside a line");
    return 0;
  }
  return take;
}

void Parser::handle_line(std::string_view line, BulkSink* sink) noexcept {
  if (line.empty()) return fail(Code::kProtocol, "RESP: empty line");
  char type = line.front();
  std::string_view rest = line.substr(1);
  int64_t n = 0;
  switch (type) {
    case '+':
    case '-':
      if (!add_node(type == '+' ? Type::kSimple : Type::kError, static_cast<int64_t>(rest.size()))) return;
      reply_.nodes_.back().offset = reply_.text_.size();
      if (!keep_text(rest)) return;
      return element_done();
    case ':':
      if (!parse_int(rest, &n)) return fail(Code::kProtocol, "RESP: bad integer");
      if (!add_node(Type::kInteger, n)) return;
      return element_done();
    case '$':
      if (!parse_int(rest, &n)) return fail(Code::kProtocol, "RESP: bad bulk length");
      return begin_bulk(n, sink);
    case '*':
      if (!parse_int(rest, &n)) return fail(Code::kProtocol, "RESP: bad array length");
      return begin_array(n);
    default:
      return fail(Code::kProtocol, "RESP: unknown type byte");
  }
}

void Parser::begin_bulk(int64_t length, BulkSink* sink) noexcept {
  if (length == -1) {
    if (add_node(Type::kNil, 0)) element_done();
    return;
  }
  if (length < 0) return fail(Code::kProtocol, "RESP: negative bulk length");
  if (static_cast<uint64_t>(length) > limits_.max_bulk) return fail(Code::kLimit, "RESP: bulk over the limit");
  if (!add_node(Type::kBulk, length)) return;
  Node& node = reply_.nodes_.back();
  BulkDestination d;
  if (sink != nullptr && !sink_dropped_) d = sink->bulk_destination(bulk_index_, static_cast<uint64_t>(length));
  ++bulk_index_;
  const uint64_t len = static_cast<uint64_t>(length);
  // A split destination whose data is missing though the head does not hold it all is our
  // own sink's mistake: the bulk is discarded rather than written past the head.
  const bool split = !d.discard && d.head != nullptr && d.head_bytes > 0;
  if (split && d.head_bytes < len && d.data == nullptr) d.discard = true;
  after_head_ = nullptr;
  if (d.discard) {
    dest_ = nullptr;
  } else if (split) {
    dest_ = d.head;
    part_left_ = std::min(d.head_bytes, len);
    after_head_ = d.head_bytes < len ? d.data : nullptr;
  } else {
    dest_ = d.data;
    part_left_ = len;
  }
  discard_ = d.discard || sink_dropped_;
  if (dest_ != nullptr) {
    node.bulk = Node::Bulk::kSunk;
  } else if (discard_) {
    node.bulk = Node::Bulk::kDiscarded;
  } else {
    node.offset = reply_.text_.size();
    if (reply_.text_.size() + static_cast<uint64_t>(length) > limits_.max_kept_bytes) {
      return fail(Code::kLimit, "RESP: reply over the kept-bytes limit");
    }
    // Reserve no more than a little ahead of the bytes that have arrived: the length is untrusted.
    reply_.text_.reserve(reply_.text_.size() + std::min<uint64_t>(length, 1u << 20));
  }
  remaining_ = static_cast<uint64_t>(length);
  phase_ = remaining_ == 0 ? Phase::kBodyCrlf : Phase::kBody;
  crlf_seen_ = 0;
}

void Parser::begin_array(int64_t count) noexcept {
  if (count == -1) {
    if (add_node(Type::kNil, 0)) element_done();
    return;
  }
  if (count < 0) return fail(Code::kProtocol, "RESP: negative array length");
  if (static_cast<uint64_t>(count) > limits_.max_array) return fail(Code::kLimit, "RESP: array over the limit");
  if (stack_.size() + 1 > limits_.max_depth) return fail(Code::kLimit, "RESP: arrays nested too deep");
  if (!add_node(Type::kArray, count)) return;
  if (count == 0) return element_done();
  stack_.push_back(Frame{reply_.nodes_.size() - 1, count});
}

bool Parser::add_node(Type type, int64_t value) noexcept {
  if (reply_.nodes_.size() >= limits_.max_nodes) {
    fail(Code::kLimit, "RESP: reply has too many values");
    return false;
  }
  Node n;
  n.type = type;
  n.value = value;
  n.end = static_cast<uint32_t>(reply_.nodes_.size() + 1);
  reply_.nodes_.push_back(n);
  return true;
}

bool Parser::keep_text(std::string_view bytes) noexcept {
  if (reply_.text_.size() + bytes.size() > limits_.max_kept_bytes) {
    fail(Code::kLimit, "RESP: reply over the kept-bytes limit");
    return false;
  }
  reply_.text_.append(bytes);
  return true;
}

size_t Parser::take_body(std::span<const std::byte> in) noexcept {
  size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, in.size()));
  if (dest_ != nullptr) {
    n = static_cast<size_t>(std::min<uint64_t>(n, part_left_));
    std::memcpy(dest_, in.data(), n);
    advance_body(n);
    return n;
  }
  if (!discard_) reply_.text_.append(as_chars(in.first(n)));
  remaining_ -= n;
  if (remaining_ == 0) phase_ = Phase::kBodyCrlf;
  return n;
}

// `n` bytes of a sunk bulk were written at dest_: moves on, from the head to the data when
// the head is full.
void Parser::advance_body(size_t n) noexcept {
  dest_ += n;
  part_left_ -= n;
  remaining_ -= n;
  if (part_left_ == 0 && remaining_ > 0) {
    dest_ = after_head_;
    part_left_ = remaining_;
    after_head_ = nullptr;
  }
  if (remaining_ == 0) phase_ = Phase::kBodyCrlf;
}

size_t Parser::take_crlf(std::span<const std::byte> in) noexcept {
  size_t pos = 0;
  while (crlf_seen_ < 2 && pos < in.size()) {
    char want = crlf_seen_ == 0 ? '\r' : '\n';
    if (static_cast<char>(in[pos]) != want) {
      fail(Code::kProtocol, "RESP: bulk not followed by CRLF");
      return pos;
    }
    ++crlf_seen_;
    ++pos;
  }
  if (crlf_seen_ == 2) {
    dest_ = nullptr;
    discard_ = false;
    element_done();
  }
  return pos;
}

void Parser::element_done() noexcept {
  while (!stack_.empty()) {
    Frame& f = stack_.back();
    if (--f.remaining > 0) {
      phase_ = Phase::kLine;
      return;
    }
    reply_.nodes_[f.node].end = static_cast<uint32_t>(reply_.nodes_.size());
    stack_.pop_back();
  }
  phase_ = Phase::kDone;
}

std::span<std::byte> Parser::direct_space() noexcept {
  if (phase_ != Phase::kBody || dest_ == nullptr) return {};
  return {dest_, static_cast<size_t>(std::min(remaining_, part_left_))};
}

void Parser::commit_direct(size_t n) noexcept {
  // Our invariant: the caller filled at most what direct_space() offered.
  if (dest_ == nullptr) return;
  advance_body(static_cast<size_t>(std::min({uint64_t{n}, remaining_, part_left_})));
}

void Parser::drop_sink() noexcept {
  sink_dropped_ = true;
  after_head_ = nullptr;
  if (dest_ != nullptr) {
    dest_ = nullptr;
    discard_ = true;
    if (!reply_.nodes_.empty()) {
      // The bulk being received: the last bulk added.
      for (size_t i = reply_.nodes_.size(); i-- > 0;) {
        if (reply_.nodes_[i].type == Type::kBulk) {
          reply_.nodes_[i].bulk = Node::Bulk::kDiscarded;
          break;
        }
      }
    }
  }
}

void Parser::next() noexcept {
  if (phase_ == Phase::kError) return;
  reply_.clear();
  stack_.clear();
  line_.clear();
  phase_ = Phase::kLine;
  remaining_ = 0;
  dest_ = nullptr;
  part_left_ = 0;
  after_head_ = nullptr;
  discard_ = false;
  sink_dropped_ = false;
  bulk_index_ = 0;
  crlf_seen_ = 0;
}

void Parser::reset() noexcept {
  phase_ = Phase::kLine;
  error_ = OkStatus();
  next();
}

void Parser::fail(Code code, const char* what) noexcept {
  phase_ = Phase::kError;
  error_ = Status(code, what);
}

}  // namespace kdn::sidecar::resp
