// libFuzzer harness for the RESP2 parser the remote tier reads Redis replies with.
//
// Input: byte 0 seeds the split pattern and byte 1 picks the bulk routing; the rest is a stream
// of replies as a (hostile) server would send it. Bulks are routed to a sink the way a
// connection routes them (kept in the reply, sunk into buffers, or discarded). The stream is
// parsed twice: once fed whole, once in pieces whose sizes follow the seed, with sunk bulks
// partly filled by direct reads. Both parses must see the same replies, value for value and
// byte for byte, and end in the same state: the same error, or the same unfinished tail.
// Small limits make every limit reachable.
#include "resp.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace kdn::sidecar::resp;

void require(bool ok) {
  if (!ok) std::abort();
}

Limits fuzz_limits() {
  Limits l;
  l.max_depth = 6;
  l.max_array = 1000;
  l.max_bulk = 1 << 16;
  l.max_line = 256;
  l.max_nodes = 5000;
  l.max_kept_bytes = 1 << 17;
  return l;
}

// Routes bulk `index` by `mode`: 0 keep all, 1 sink all, 2 alternate sink/keep, 3 alternate
// sink/discard, 4 sink all split (a head of 1 to 5 bytes in one buffer, the rest in another).
// Sunk bytes land in buffers it owns, keyed by index.
class RoutingSink : public BulkSink {
 public:
  explicit RoutingSink(uint8_t mode) : mode_(mode % 5) {}
  BulkDestination bulk_destination(uint32_t index, uint64_t length) noexcept override {
    bool odd = index % 2 == 1;
    if (mode_ == 0 || (mode_ == 2 && odd)) return {};
    if (mode_ == 3 && odd) return {nullptr, true};
    if (buffers.size() <= index) buffers.resize(index + 1);
    if (heads.size() <= index) heads.resize(index + 1);
    if (mode_ == 4) {
      const uint64_t head = std::min<uint64_t>(length, 1 + index % 5);
      heads[index].assign(head, '\xBB');
      buffers[index].assign(length - head, '\xAA');
      return {buffers[index].empty() ? nullptr : reinterpret_cast<std::byte*>(buffers[index].data()), false,
              reinterpret_cast<std::byte*>(heads[index].data()), head};
    }
    heads[index].clear();
    buffers[index].assign(length, '\xAA');
    return {reinterpret_cast<std::byte*>(buffers[index].data()), false};
  }
  std::vector<std::string> buffers;
  std::vector<std::string> heads;  // mode 4: each bulk's first bytes

 private:
  uint8_t mode_;
};

// A reply as text; bulks come from the reply or the sink, wherever they went.
std::string describe(const Reply& r, const RoutingSink* sink) {
  std::string s;
  uint32_t bulk = 0;
  for (const Node& n : r.nodes()) {
    s += std::to_string(static_cast<int>(n.type)) + ":" + std::to_string(n.value) + ":" + std::to_string(n.end) + "=";
    if (n.type == Type::kBulk) {
      if (n.bulk == Node::Bulk::kKept) s += r.text(n);
      if (n.bulk == Node::Bulk::kSunk) s += sink->heads.at(bulk) + sink->buffers.at(bulk);
      if (n.bulk == Node::Bulk::kDiscarded) s += "<discarded>";
      ++bulk;
    } else {
      s += r.text(n);
    }
    s += ';';
  }
  return s;
}

struct Transcript {
  std::vector<std::string> replies;
  std::string end;  // "error: ..." or "idle" or "partial"
};

Transcript parse_whole(std::string_view in, uint8_t mode) {
  Parser p(fuzz_limits());
  RoutingSink sink(mode);
  Transcript t;
  while (true) {
    ParseResult r = p.feed(in, &sink);
    in.remove_prefix(r.consumed);
    if (r.state == ParseState::kError) {
      t.end = std::string("error: ") + p.error().what();
      return t;
    }
    if (r.state == ParseState::kNeedMore) {
      require(in.empty());
      t.end = p.idle() ? "idle" : "partial";
      return t;
    }
    t.replies.push_back(describe(p.reply(), &sink));
    p.next();
    sink.buffers.clear();
    sink.heads.clear();
    if (in.empty()) {
      t.end = "idle";
      return t;
    }
  }
}

Transcript parse_split(std::string_view in, uint8_t seed, uint8_t mode) {
  Parser p(fuzz_limits());
  RoutingSink sink(mode);
  Transcript t;
  uint32_t state = seed * 2654435761u + 1;
  while (true) {
    state = state * 1103515245u + 12345u;
    size_t piece = 1 + (state >> 16) % 17;
    std::span<std::byte> direct = p.direct_space();
    if (!direct.empty() && (state & 1)) {
      // Fill the destination ourselves, as a connection reading the socket would.
      size_t n = std::min({direct.size(), piece, in.size()});
      std::memcpy(direct.data(), in.data(), n);
      p.commit_direct(n);
      in.remove_prefix(n);
      if (in.empty()) {
        t.end = p.idle() ? "idle" : "partial";
        return t;
      }
      continue;
    }
    ParseResult r = p.feed(in.substr(0, piece), &sink);
    require(r.consumed <= std::min(piece, in.size()));
    in.remove_prefix(r.consumed);
    if (r.state == ParseState::kError) {
      t.end = std::string("error: ") + p.error().what();
      return t;
    }
    if (r.state == ParseState::kDone) {
      t.replies.push_back(describe(p.reply(), &sink));
      p.next();
      sink.buffers.clear();
      sink.heads.clear();
    }
    if (in.empty()) {
      t.end = p.idle() ? "idle" : "partial";
      return t;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  uint8_t seed = data[0], mode = data[1];
  std::string_view stream(reinterpret_cast<const char*>(data + 2), size - 2);
  Transcript whole = parse_whole(stream, mode);
  Transcript split = parse_split(stream, seed, mode);
  require(whole.replies == split.replies);
  require(whole.end == split.end);
  return 0;
}
