#include "redis_cluster.h"

#include <gtest/gtest.h>

namespace kdn::sidecar {
namespace {

TEST(RedisCluster, Crc16ReferenceVector) {
  EXPECT_EQ(crc16_xmodem("123456789"), 0x31C3);
  EXPECT_EQ(crc16_xmodem(""), 0);
}

TEST(RedisCluster, KeySlotsAndHashTags) {
  // Values from the cluster specification and redis-cli CLUSTER KEYSLOT.
  EXPECT_EQ(key_slot("123456789"), 0x31C3 % 16384);
  EXPECT_EQ(key_slot("foo"), 12182);
  EXPECT_EQ(key_slot("bar"), 5061);
  EXPECT_EQ(key_slot("somekey"), 11058);
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("user1000"));
  EXPECT_EQ(key_slot("{user1000}.followers"), key_slot("{user1000}.following"));
  // Only the first '{' counts, up to the first '}' after it.
  EXPECT_EQ(key_slot("foo{{bar}}zap"), key_slot("{bar"));
  EXPECT_EQ(key_slot("foo{bar}{zap}"), key_slot("bar"));
  // An empty tag hashes the whole key.
  EXPECT_EQ(key_slot("foo{}{bar}"), crc16_xmodem("foo{}{bar}") % 16384);
  EXPECT_EQ(key_slot("foo{bar"), crc16_xmodem("foo{bar") % 16384);
}

TEST(RedisCluster, ParsesRedirects) {
  auto moved = parse_redirect("MOVED 3999 127.0.0.1:6381");
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved->kind, Redirect::Kind::kMoved);
  EXPECT_EQ(moved->slot, 3999);
  EXPECT_EQ(moved->node, (NodeAddress{"127.0.0.1", 6381}));
  auto ask = parse_redirect("ASK 16383 ::1:7000");
  ASSERT_TRUE(ask);
  EXPECT_EQ(ask->kind, Redirect::Kind::kAsk);
  EXPECT_EQ(ask->node, (NodeAddress{"::1", 7000}));
  for (const char* bad : {"ERR unknown", "MOVED", "MOVED 3999", "MOVED x 1.2.3.4:5", "MOVED 16384 a:1", "MOVED 1 a:0",
                          "MOVED 1 a:70000", "MOVED 1 :5", "ASK 1 a"}) {
    EXPECT_FALSE(parse_redirect(bad)) << bad;
  }
}

resp::Parser parsed(std::string_view text) {
  resp::Parser p;
  EXPECT_EQ(p.feed(text, nullptr).state, resp::ParseState::kDone) << p.error().what();
  return p;
}

TEST(RedisCluster, SlotMapFromClusterSlots) {
  resp::Parser p = parsed(
      "*3\r\n"
      "*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:30001\r\n$2\r\nid\r\n*3\r\n$9\r\n127.0.0.1\r\n:30004\r\n$"
      "2\r\nid\r\n"
      "*3\r\n:5461\r\n:10922\r\n*4\r\n$0\r\n\r\n:30002\r\n$2\r\nid\r\n*0\r\n"
      "*3\r\n:10923\r\n:16000\r\n*2\r\n$9\r\n127.0.0.1\r\n:30003\r\n");
  Result<SlotMap> m = SlotMap::from_cluster_slots(p.reply(), NodeAddress{"10.0.0.9", 30002});
  ASSERT_TRUE(m.ok()) << m.status().what();
  ASSERT_EQ(m->masters().size(), 3u);
  EXPECT_EQ(m->masters()[m->owner(0)], (NodeAddress{"127.0.0.1", 30001}));
  EXPECT_EQ(m->masters()[m->owner(5461)], (NodeAddress{"10.0.0.9", 30002}));
  EXPECT_EQ(m->masters()[m->owner(16000)], (NodeAddress{"127.0.0.1", 30003}));
  EXPECT_EQ(m->owner(16001), SlotMap::kNoOwner);
  EXPECT_EQ(m->uncovered(), 16384u - 16001u);
  m->assign(16001, NodeAddress{"127.0.0.1", 30001});
  EXPECT_EQ(m->owner(16001), m->owner(0));
  m->assign(1, NodeAddress{"127.0.0.1", 30009});
  EXPECT_EQ(m->masters().size(), 4u);
}

TEST(RedisCluster, RefusesMalformedClusterSlots) {
  NodeAddress seed{"127.0.0.1", 1};
  for (const char* bad :
       {":1\r\n", "*1\r\n:1\r\n", "*1\r\n*2\r\n:0\r\n:1\r\n", "*1\r\n*3\r\n:5\r\n:1\r\n*2\r\n$1\r\na\r\n:1\r\n",
        "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\na\r\n:1\r\n", "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\na\r\n:0\r\n",
        "*1\r\n*3\r\n:0\r\n:1\r\n*1\r\n$1\r\na\r\n"}) {
    resp::Parser p = parsed(bad);
    EXPECT_EQ(SlotMap::from_cluster_slots(p.reply(), seed).status().code(), Code::kProtocol) << bad;
  }
  resp::Parser e = parsed("-ERR This instance has cluster support disabled\r\n");
  EXPECT_EQ(SlotMap::from_cluster_slots(e.reply(), seed).status().code(), Code::kUnavailable);
  SlotMap single = SlotMap::single(seed);
  EXPECT_EQ(single.uncovered(), 0u);
  EXPECT_EQ(single.owner(16383), 0);
}

}  // namespace
}  // namespace kdn::sidecar
