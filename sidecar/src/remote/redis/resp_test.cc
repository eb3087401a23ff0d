#include "resp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace kdn::sidecar::resp {
namespace {

// A reply written back as text, so two parses compare with ==.
std::string describe(const Reply& r) {
  std::string s;
  for (const Node& n : r.nodes()) {
    switch (n.type) {
      case Type::kSimple:
        s += "+" + std::string(r.text(n));
        break;
      case Type::kError:
        s += "-" + std::string(r.text(n));
        break;
      case Type::kInteger:
        s += ":" + std::to_string(n.value);
        break;
      case Type::kNil:
        s += "nil";
        break;
      case Type::kArray:
        s += "*" + std::to_string(n.value) + "/" + std::to_string(n.end);
        break;
      case Type::kBulk:
        s += "$" + std::to_string(n.value) + (n.bulk == Node::Bulk::kKept ? "=" + std::string(r.text(n)) : "#");
        break;
    }
    s += ' ';
  }
  return s;
}

// Parses a stream of replies, `step` bytes at a time (0: all at once).
std::vector<std::string> parse_all(std::string_view stream, size_t step, Status* error = nullptr) {
  Parser p;
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < stream.size()) {
    size_t n = step == 0 ? stream.size() - pos : std::min(step, stream.size() - pos);
    std::string_view piece = stream.substr(pos, n);
    while (!piece.empty()) {
      ParseResult r = p.feed(piece, nullptr);
      piece.remove_prefix(r.consumed);
      if (r.state == ParseState::kError) {
        if (error) *error = p.error();
        return out;
      }
      if (r.state == ParseState::kDone) {
        out.push_back(describe(p.reply()));
        p.next();
      }
    }
    pos += n;
  }
  if (error) *error = p.idle() ? OkStatus() : Status(Code::kInProgress, "incomplete");
  return out;
}

constexpr std::string_view kStream =
    "+OK\r\n-MOVED 3999 127.0.0.1:6381\r\n:1000\r\n:-42\r\n$5\r\nhello\r\n$0\r\n\r\n$-1\r\n*-1\r\n*0\r\n"
    "*3\r\n*3\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:30001\r\n$4\r\nabcd\r\n*1\r\n*0\r\n$2\r\n\r\n\r\n"
    "*2\r\n$3\r\nfoo\r\n*2\r\n:1\r\n+x\r\n";

TEST(Resp, EncodesCommands) {
  std::string out;
  std::vector<std::string_view> argv = {"SET", "key", std::string_view("a\0b", 3)};
  append_command(out, argv);
  EXPECT_EQ(out, std::string("*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$3\r\na\0b\r\n", 31));
  out.clear();
  append_command_head(out, std::span(argv).first(2), 1048576);
  EXPECT_EQ(out, "*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$1048576\r\n");
}

TEST(Resp, ParsesEveryType) {
  Status st;
  std::vector<std::string> r = parse_all(kStream, 0, &st);
  ASSERT_TRUE(st.ok()) << st.what();
  std::vector<std::string> want = {"+OK ",
                                   "-MOVED 3999 127.0.0.1:6381 ",
                                   ":1000 ",
                                   ":-42 ",
                                   "$5=hello ",
                                   "$0= ",
                                   "nil ",
                                   "nil ",
                                   "*0/1 ",
                                   "*3/11 *3/8 :0 :5460 *3/8 $9=127.0.0.1 :30001 $4=abcd *1/10 *0/10 $2=\r\n ",
                                   "*2/5 $3=foo *2/5 :1 +x "};
  EXPECT_EQ(r, want);
}

TEST(Resp, EverySplitPointGivesTheSameReplies) {
  std::vector<std::string> whole = parse_all(kStream, 0);
  for (size_t step = 1; step < 8; ++step) EXPECT_EQ(parse_all(kStream, step), whole) << "step " << step;
  // Two pieces split at every position.
  for (size_t cut = 0; cut <= kStream.size(); ++cut) {
    Parser p;
    std::vector<std::string> got;
    for (std::string_view piece : {kStream.substr(0, cut), kStream.substr(cut)}) {
      while (!piece.empty()) {
        ParseResult r = p.feed(piece, nullptr);
        ASSERT_NE(r.state, ParseState::kError) << cut << ": " << p.error().what();
        piece.remove_prefix(r.consumed);
        if (r.state == ParseState::kDone) {
          got.push_back(describe(p.reply()));
          p.next();
        }
      }
    }
    EXPECT_EQ(got, whole) << "cut at " << cut;
  }
}

TEST(Resp, NavigatesArrays) {
  Parser p;
  ASSERT_EQ(p.feed("*3\r\n*2\r\n:1\r\n:2\r\n$1\r\nx\r\n:7\r\n", nullptr).state, ParseState::kDone);
  const Reply& r = p.reply();
  EXPECT_EQ(r.element(0, 0), 1u);
  EXPECT_EQ(r.element(0, 1), 4u);
  EXPECT_EQ(r.element(0, 2), 5u);
  EXPECT_EQ(r.element(0, 3), SIZE_MAX);
  EXPECT_EQ(r.element(1, 1), 3u);
  EXPECT_EQ(r.text(r.node(4)), "x");
  EXPECT_EQ(r.node(5).value, 7);
}

TEST(Resp, RefusesMalformedInput) {
  const char* bad[] = {"?x\r\n",      "+a\rb\r\n",      "+ok\n",   ":\r\n",  ":12a\r\n", ":99999999999999999999\r\n",
                       "$-2\r\n",     "$3\r\nabcX\r\n", "*-5\r\n", "$x\r\n", "\r\n",     "%1\r\n",
                       "$2\r\nab\n\r"};
  for (const char* b : bad) {
    Status st;
    parse_all(b, 0, &st);
    EXPECT_FALSE(st.ok()) << b;
    EXPECT_NE(st.code(), Code::kInProgress) << b;
  }
}

TEST(Resp, EnforcesLimits) {
  Limits l;
  l.max_depth = 2;
  l.max_array = 3;
  l.max_bulk = 4;
  l.max_line = 8;
  l.max_nodes = 5;
  l.max_kept_bytes = 6;
  const char* over[] = {
      "*1\r\n*1\r\n*1\r\n:1\r\n",          "*4\r\n", "$5\r\n", "+123456789\r\n", "*2\r\n*2\r\n:1\r\n:1\r\n*2\r\n:1\r\n",
      "*2\r\n$4\r\nabcd\r\n$4\r\nefgh\r\n"};
  for (const char* o : over) {
    Parser p(l);
    EXPECT_EQ(p.feed(o, nullptr).state, ParseState::kError) << o;
    EXPECT_EQ(p.error().code(), Code::kLimit) << o << ": " << p.error().what();
  }
  // A claimed length reserves nothing before its bytes arrive.
  Parser p;
  EXPECT_EQ(p.feed("$536870912\r\nab", nullptr).state, ParseState::kNeedMore);
}

TEST(Resp, ErrorIsStickyUntilReset) {
  Parser p;
  EXPECT_EQ(p.feed("!\r\n", nullptr).state, ParseState::kError);
  EXPECT_EQ(p.feed("+OK\r\n", nullptr).state, ParseState::kError);
  p.next();
  EXPECT_EQ(p.feed("+OK\r\n", nullptr).state, ParseState::kError);
  p.reset();
  EXPECT_EQ(p.feed("+OK\r\n", nullptr).state, ParseState::kDone);
}

// Sends bulks of at least `min` bytes to buffers it owns; discards those named in `discard`.
class BufferSink : public BulkSink {
 public:
  explicit BufferSink(uint64_t min) : min_(min) {}
  BulkDestination bulk_destination(uint32_t index, uint64_t length) noexcept override {
    if (index == discard_index) return {nullptr, true};
    if (length < min_) return {};
    buffers.emplace_back(length, '\0');
    indices.push_back(index);
    return {reinterpret_cast<std::byte*>(buffers.back().data()), false};
  }
  std::vector<std::string> buffers;
  std::vector<uint32_t> indices;
  uint32_t discard_index = UINT32_MAX;

 private:
  uint64_t min_;
};

TEST(Resp, BulksGoToTheSinkInAnySplit) {
  std::string big(100000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + 3);
  std::string stream = "*3\r\n$3\r\nabc\r\n$" + std::to_string(big.size()) + "\r\n" + big + "\r\n$5\r\nhello\r\n";
  for (size_t step : {size_t{1}, size_t{3}, size_t{4096}, stream.size()}) {
    Parser p;
    BufferSink sink(4);
    std::string_view in = stream;
    ParseResult r;
    while (!in.empty()) {
      r = p.feed(in.substr(0, step), &sink);
      ASSERT_NE(r.state, ParseState::kError) << p.error().what();
      in.remove_prefix(r.consumed);
    }
    ASSERT_EQ(r.state, ParseState::kDone);
    ASSERT_EQ(sink.buffers.size(), 2u);
    EXPECT_EQ(sink.buffers[0], big);
    EXPECT_EQ(sink.buffers[1], "hello");
    EXPECT_EQ(sink.indices, (std::vector<uint32_t>{1, 2}));
    EXPECT_EQ(describe(p.reply()), "*3/4 $3=abc $100000# $5# ");
  }
}

TEST(Resp, DirectReadsFillTheSinkDestination) {
  std::string payload(5000, 'q');
  std::string stream = "$5000\r\n" + payload + "\r\n";
  Parser p;
  BufferSink sink(1);
  ParseResult r = p.feed(std::string_view(stream).substr(0, 10), &sink);
  ASSERT_EQ(r.consumed, 10u);
  size_t pos = 10;
  // The reader fills the destination itself, in pieces, as it would from a socket.
  while (!p.direct_space().empty()) {
    std::span<std::byte> space = p.direct_space();
    size_t n = std::min<size_t>(space.size(), 777);
    std::memcpy(space.data(), stream.data() + pos, n);
    p.commit_direct(n);
    pos += n;
  }
  EXPECT_EQ(pos, 7u + 5000u);
  EXPECT_EQ(p.feed(std::string_view(stream).substr(pos), &sink).state, ParseState::kDone);
  EXPECT_EQ(sink.buffers.at(0), payload);
}

TEST(Resp, DroppedSinkIsNeverWrittenAgain) {
  std::string stream = "*2\r\n$4\r\nabcd\r\n$4\r\nefgh\r\n";
  Parser p;
  BufferSink sink(1);
  ASSERT_EQ(p.feed(std::string_view(stream).substr(0, 10), &sink).state, ParseState::kNeedMore);
  p.drop_sink();
  EXPECT_TRUE(p.direct_space().empty());
  ASSERT_EQ(p.feed(std::string_view(stream).substr(10), &sink).state, ParseState::kDone);
  ASSERT_EQ(sink.buffers.size(), 1u);
  EXPECT_EQ(sink.buffers[0], std::string("ab\0\0", 4));
  EXPECT_EQ(describe(p.reply()), "*2/3 $4# $4# ");
  EXPECT_EQ(p.reply().node(1).bulk, Node::Bulk::kDiscarded);
}

TEST(Resp, SinkMayDiscard) {
  Parser p;
  BufferSink sink(100);
  sink.discard_index = 0;
  ASSERT_EQ(p.feed("*2\r\n$3\r\nabc\r\n$2\r\nde\r\n", &sink).state, ParseState::kDone);
  EXPECT_EQ(describe(p.reply()), "*2/3 $3# $2=de ");
  EXPECT_EQ(p.reply().node(1).bulk, Node::Bulk::kDiscarded);
}

// A value's header into one buffer, its payload into another, in any split and by direct reads.
class SplitSink : public BulkSink {
 public:
  SplitSink(size_t head_bytes, size_t length)
      : head(head_bytes, '\0'), data(length - std::min(head_bytes, length), '\0') {}
  BulkDestination bulk_destination(uint32_t, uint64_t length) noexcept override {
    if (length != head.size() + data.size()) return {nullptr, true};
    return {data.empty() ? nullptr : reinterpret_cast<std::byte*>(data.data()), false,
            reinterpret_cast<std::byte*>(head.data()), head.size()};
  }
  std::string head, data;
};

TEST(Resp, SplitDestinationTakesTheHeadThenTheData) {
  std::string value(3000, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 13 + 1);
  const std::string stream = "$3000\r\n" + value + "\r\n";
  for (size_t head : {size_t{1}, size_t{192}, size_t{2999}, size_t{3000}}) {
    for (size_t step : {size_t{1}, size_t{7}, size_t{191}, stream.size()}) {
      for (bool direct : {false, true}) {
        Parser p;
        SplitSink sink(head, value.size());
        std::string_view in = stream;
        ParseResult r;
        while (!in.empty()) {
          std::span<std::byte> space = p.direct_space();
          if (direct && !space.empty()) {
            size_t n = std::min({space.size(), step, in.size()});
            std::memcpy(space.data(), in.data(), n);
            p.commit_direct(n);
            in.remove_prefix(n);
            continue;
          }
          r = p.feed(in.substr(0, step), &sink);
          ASSERT_NE(r.state, ParseState::kError) << p.error().what();
          in.remove_prefix(r.consumed);
        }
        ASSERT_EQ(r.state, ParseState::kDone) << head << " " << step << " " << direct;
        EXPECT_EQ(sink.head + sink.data, value) << head << " " << step << " " << direct;
        EXPECT_EQ(p.reply().root().bulk, Node::Bulk::kSunk);
      }
    }
  }
  // Data missing though the head is short: discarded, never written past the head.
  Parser p;
  std::string small(4, '\0');
  class Broken : public BulkSink {
   public:
    explicit Broken(std::string* h) : h_(h) {}
    BulkDestination bulk_destination(uint32_t, uint64_t) noexcept override {
      return {nullptr, false, reinterpret_cast<std::byte*>(h_->data()), h_->size()};
    }
    std::string* h_;
  } broken(&small);
  ASSERT_EQ(p.feed(stream, &broken).state, ParseState::kDone);
  EXPECT_EQ(p.reply().root().bulk, Node::Bulk::kDiscarded);
  EXPECT_EQ(small, std::string(4, '\0'));
}

}  // namespace
}  // namespace kdn::sidecar::resp
