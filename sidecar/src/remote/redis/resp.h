// RESP2, the Redis wire protocol, as the remote tier's client speaks it: commands out, replies
// in, on a socket the event loop owns.
//
// Encoding: a command is an array of bulk strings. A large value need not be copied into the
// command: append_command_head() encodes every argument but a trailing payload of known length
// and ends with its "$N\r\n"; the caller sends the payload bytes and "\r\n" from where they lie.
//
// Parsing: Parser consumes bytes as they arrive, in any split, and stops at the end of each
// reply so the caller can hand the reply to its request before the next one begins. What it
// reads comes from the network, so it is untrusted:
//   1. every type byte, length and integer is checked; CR must be followed by LF; a line has
//      no bare CR or LF; a malformed stream is an error status, never an assert;
//   2. limits (Limits) bound nesting depth, array length, bulk size, line length, nodes and
//      bytes kept per reply; a length is never used to reserve memory before its bytes arrive;
//   3. after an error the parser stays failed until reset() (the connection is closed).
//
// Bulk payloads can bypass the reply: a BulkSink named for a reply is asked, for each bulk
// string as its header arrives, where its bytes go (a caller-provided destination of exactly
// that length, e.g. an arena slot, or nowhere). While such a bulk is being received,
// direct_space() names the rest of its destination so the caller may read() from the socket
// straight into it (commit_direct()), and no byte is copied twice.
//
// Ownership: the parser owns its Reply; a reply is valid from feed() returning kDone until
// next() or reset(). A sink's destination must stay valid until that reply is done or
// drop_sink() was called.
// Thread safety: none; one parser per connection, used by one thread.
#pragma once

#include <kdn/common/status.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kdn::sidecar::resp {

// ---- encoding ------------------------------------------------------------------------------

// Appends `argv` to `out` as one RESP command ("*N\r\n$len\r\narg\r\n...").
void append_command(std::string& out, std::span<const std::string_view> argv);
// Appends `argv` plus one more argument of `payload_bytes` bytes, up to and including that
// argument's "$N\r\n": the caller sends the payload and then kCrlf.
void append_command_head(std::string& out, std::span<const std::string_view> argv, uint64_t payload_bytes);
inline constexpr std::string_view kCrlf = "\r\n";

// ---- replies -------------------------------------------------------------------------------

enum class Type : uint8_t {
  kSimple,   // +OK
  kError,    // -ERR ...
  kInteger,  // :42
  kBulk,     // $3\r\nabc
  kNil,      // $-1 or *-1
  kArray,    // *N, followed by its N elements
};

// One value of a reply. A reply is its values in pre-order: an array's elements follow it, and
// `end` is the index just past its last descendant (index + 1 for anything but a non-empty
// array), so siblings are found without walking subtrees.
struct Node {
  Type type = Type::kNil;
  // Where a bulk's bytes went: kept in the reply's text, written to a sink's destination, or
  // discarded at the sink's request (or after drop_sink()).
  enum class Bulk : uint8_t { kKept, kSunk, kDiscarded } bulk = Bulk::kKept;
  uint32_t end = 0;
  int64_t value = 0;    // kInteger: the integer; kArray: element count; kBulk: byte length
  uint64_t offset = 0;  // kSimple, kError, kept kBulk: where its bytes start in the text
};

class Reply {
 public:
  bool empty() const noexcept { return nodes_.empty(); }
  const Node& root() const noexcept { return nodes_.front(); }
  std::span<const Node> nodes() const noexcept { return nodes_; }
  const Node& node(size_t i) const noexcept { return nodes_[i]; }
  // The bytes of a simple string, error or kept bulk ("" for anything else).
  std::string_view text(const Node& n) const noexcept;
  // Index of element `k` of the array at index `i`, or SIZE_MAX if there is none.
  size_t element(size_t i, size_t k) const noexcept;
  bool is_error() const noexcept { return !empty() && root().type == Type::kError; }
  // The root's text when it is a simple string or an error.
  std::string_view status_text() const noexcept { return empty() ? std::string_view() : text(root()); }

 private:
  friend class Parser;
  void clear() noexcept {
    nodes_.clear();
    text_.clear();
  }
  std::vector<Node> nodes_;
  std::string text_;
};

struct Limits {
  uint32_t max_depth = 8;                // arrays within arrays (CLUSTER SLOTS needs 3)
  uint64_t max_array = 1u << 20;         // elements of one array
  uint64_t max_bulk = 512ull << 20;      // bytes of one bulk string (Redis' proto-max-bulk-len)
  uint32_t max_line = 64u << 10;         // a simple string, error or header line
  uint64_t max_nodes = 1u << 22;         // values in one reply
  uint64_t max_kept_bytes = 1ull << 30;  // bytes one reply keeps in its text
};

// Where a bulk string goes instead of the reply. With a head, the bulk is split: its first
// head_bytes go to `head` and the rest to `data` (a value's header into a buffer of its own,
// its payload straight into an arena slot).
struct BulkDestination {
  std::byte* data = nullptr;  // the bulk's length (less head_bytes); null: keep it (or discard)
  bool discard = false;       // skip its bytes; the reply records only its length
  std::byte* head = nullptr;  // optional: where the first head_bytes go
  uint64_t head_bytes = 0;    // at most the bulk's length; data may be null only if equal
};

class BulkSink {
 public:
  virtual ~BulkSink() = default;
  // Called as the header of the reply's `index`-th bulk string (0-based, in pre-order) arrives,
  // with its length (≤ Limits::max_bulk).
  virtual BulkDestination bulk_destination(uint32_t index, uint64_t length) noexcept = 0;
};

enum class ParseState : uint8_t { kNeedMore, kDone, kError };

struct ParseResult {
  size_t consumed = 0;
  ParseState state = ParseState::kNeedMore;
};

class Parser {
 public:
  explicit Parser(const Limits& limits = {}) : limits_(limits) {}

  // Consumes bytes of the current reply from `in`, stopping at its end (kDone: the rest of
  // `in` belongs to later replies). `sink` (may be null) is asked about the reply's bulks.
  // After kDone, call next() before feeding the next reply; after kError, error() says why.
  ParseResult feed(std::span<const std::byte> in, BulkSink* sink) noexcept;
  ParseResult feed(std::string_view in, BulkSink* sink) noexcept {
    return feed(std::as_bytes(std::span<const char>(in.data(), in.size())), sink);
  }

  // While a bulk bound for a sink's destination is being received: the rest of its current
  // part, the head or the data (empty otherwise). The caller may fill a prefix of it itself and report with
  // commit_direct().
  std::span<std::byte> direct_space() noexcept;
  void commit_direct(size_t n) noexcept;
  // The rest of the current reply's sink-bound bulks are discarded: the sink's destinations
  // are not touched again (its request gave up).
  void drop_sink() noexcept;

  const Reply& reply() const noexcept { return reply_; }
  Status error() const noexcept { return error_; }
  bool idle() const noexcept { return phase_ == Phase::kLine && reply_.empty() && line_.empty(); }
  // Starts the next reply (keeps the capacity of the last one).
  void next() noexcept;
  // Forgets everything, errors included (a new connection).
  void reset() noexcept;

 private:
  enum class Phase : uint8_t { kLine, kBody, kBodyCrlf, kDone, kError };
  struct Frame {
    size_t node;
    int64_t remaining;
  };

  size_t take_line(std::span<const std::byte> in) noexcept;
  void handle_line(std::string_view line, BulkSink* sink) noexcept;
  void begin_bulk(int64_t length, BulkSink* sink) noexcept;
  void begin_array(int64_t count) noexcept;
  bool add_node(Type type, int64_t value) noexcept;
  bool keep_text(std::string_view bytes) noexcept;
  size_t take_body(std::span<const std::byte> in) noexcept;
  size_t take_crlf(std::span<const std::byte> in) noexcept;
  void advance_body(size_t n) noexcept;
  void element_done() noexcept;
  void fail(Code code, const char* what) noexcept;

  Limits limits_;
  Reply reply_;
  std::vector<Frame> stack_;
  std::string line_;  // a header line split across feeds
  Phase phase_ = Phase::kLine;
  Status error_;
  // The bulk being received.
  uint64_t remaining_ = 0;
  std::byte* dest_ = nullptr;        // its sink destination, at the next byte to write
  uint64_t part_left_ = 0;           // bytes left in dest_'s part (the head, or the data)
  std::byte* after_head_ = nullptr;  // a split bulk's data, once its head is full
  bool discard_ = false;
  bool sink_dropped_ = false;
  uint32_t bulk_index_ = 0;
  uint8_t crlf_seen_ = 0;
};

}  // namespace kdn::sidecar::resp
