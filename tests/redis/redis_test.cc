// The Redis client (sidecar/src/remote/redis/redis_conn.h) against real servers: a standalone redis-server
// (AUTH, Unix socket, a stopped server, a killed one) and a Redis Cluster of 3 masters with a
// replica each (multi-MiB values over every master, pipelined; MOVED from a stale map; ASK
// during a slot migration; a master killed and its replica promoted). Skipped where Debian's
// redis-server is not installed.
#include "cluster_suite.h"
#include "redis_conn.h"
#include "redis_servers.h"

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace kdn::sidecar {
namespace {

using namespace std::chrono_literals;
using testing::RedisServers;

constexpr size_t kMiB = 1 << 20;

RedisClock::time_point now() { return RedisClock::now(); }

// The owner's event loop: the client's fd in an epoll set, poll() on readiness or deadline.
class Loop {
 public:
  explicit Loop(RedisCluster& c) : client_(c), ep_(epoll_create1(EPOLL_CLOEXEC)) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd(), &ev);
  }
  ~Loop() { close(ep_); }
  // Runs until `done` or `limit` passes; false on the latter.
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
    auto until = now() + limit;
    while (!done()) {
      auto t = now();
      if (t >= until) return false;
      auto wait = std::min<RedisClock::duration>(client_.next_deadline() - t, 20ms);
      int ms = static_cast<int>(std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
      epoll_event ev;
      epoll_wait(ep_, &ev, 1, ms);
      client_.poll(now());
    }
    return true;
  }

 private:
  RedisCluster& client_;
  int ep_;
};

// Bytes of value `key`, `size` long: the same for the same key and size, different across keys.
std::string value_for(std::string_view key, size_t size) {
  std::string v(size, '\0');
  uint64_t x = std::hash<std::string_view>()(key) | 1;
  for (size_t i = 0; i < size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, size - i));
  }
  return v;
}

// A bulk reply of exactly the expected length goes into `dest`; any other is discarded.
class SlotSink final : public resp::BulkSink {
 public:
  SlotSink(std::string* dest) : dest_(dest) {}
  resp::BulkDestination bulk_destination(uint32_t, uint64_t length) noexcept override {
    if (length != dest_->size()) return {nullptr, true};
    return {reinterpret_cast<std::byte*>(dest_->data()), false};
  }

 private:
  std::string* dest_;
};

// One request and what became of it.
struct Op {
  RedisRequest req;
  bool finished = false;
  Status status;
  resp::Type type = resp::Type::kNil;
  resp::Node::Bulk bulk = resp::Node::Bulk::kKept;
  std::string text;   // simple string, error, or kept bulk
  int64_t value = 0;  // an integer reply; a bulk's length
  RedisClock::time_point finished_at{};
  std::string dest;  // a sink's destination
  std::unique_ptr<SlotSink> sink;

  Op(std::vector<std::string_view> argv, std::chrono::milliseconds timeout) {
    resp::append_command(req.command, argv);
    init(timeout);
  }
  void init(std::chrono::milliseconds timeout) {
    req.deadline = now() + timeout;
    req.done = [this](RedisRequest&, Status s, const resp::Reply* r) {
      finished = true;
      finished_at = now();
      status = s;
      if (r != nullptr) {
        type = r->root().type;
        bulk = r->root().bulk;
        text = std::string(r->text(r->root()));
        value = r->root().value;
      }
    };
  }
  bool ok_reply() const { return finished && status.ok() && type != resp::Type::kError; }
};

std::unique_ptr<Op> set_op(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) {
  auto op = std::make_unique<Op>(std::vector<std::string_view>{}, timeout);
  op->req.command.clear();
  std::vector<std::string_view> argv = {"SET", key};
  resp::append_command_head(op->req.command, argv, value.size());
  op->req.payload_follows = true;
  op->req.payload = std::as_bytes(std::span<const char>(value.data(), value.size()));
  return op;
}

// GET into a sink destination of `size` bytes (0: the value stays in the reply).
std::unique_ptr<Op> get_op(const std::string& key, size_t size, std::chrono::milliseconds timeout) {
  auto op = std::make_unique<Op>(std::vector<std::string_view>{"GET", key}, timeout);
  if (size > 0) {
    op->dest.assign(size, '\0');
    op->sink = std::make_unique<SlotSink>(&op->dest);
    op->req.sink = op->sink.get();
  }
  return op;
}

bool all_finished(const std::vector<std::unique_ptr<Op>>& ops) {
  for (const auto& op : ops) {
    if (!op->finished) return false;
  }
  return true;
}

std::unique_ptr<RedisCluster> make_client(RedisClusterOptions o) {
  Result<std::unique_ptr<RedisCluster>> c = RedisCluster::create(std::move(o));
  EXPECT_TRUE(c.ok()) << c.status().what();
  return c.ok() ? std::move(c).value() : nullptr;
}

RedisClusterOptions standalone_options(int port) {
  RedisClusterOptions o;
  o.cluster = false;
  o.seeds = {NodeAddress{"127.0.0.1", static_cast<uint16_t>(port)}};
  o.conn.backoff_min = 20ms;
  o.conn.backoff_max = 200ms;
  return o;
}

#define SKIP_WITHOUT_REDIS()                                        \
  do {                                                              \
    if (std::string why = testing::redis_missing(); !why.empty()) { \
      KDN_SKIP_OR_FAIL("REDIS", why);                               \
    }                                                               \
  } while (0)

// ---- standalone ----------------------------------------------------------------------------

TEST(RedisStandalone, AuthSetGetAndUnixSocket) {
  SKIP_WITHOUT_REDIS();
  std::string why;
  auto server = RedisServers::standalone(
      {"--requirepass", "s3cret", "--unixsocket", "{dir}/redis.sock", "--unixsocketperm", "700"}, &why);
  ASSERT_TRUE(server) << why;
  int port = server->servers()[0].port;
  std::string value = value_for("auth-key", 3 * kMiB + 5);

  RedisClusterOptions o = standalone_options(port);
  o.conn.password = "s3cret";
  auto client = make_client(o);
  Loop loop(*client);
  auto set = set_op("auth-key", value, 5000ms);
  auto get = get_op("auth-key", value.size(), 5000ms);
  client->submit(&set->req, "auth-key", now());
  client->submit(&get->req, "auth-key", now());
  ASSERT_TRUE(loop.run_until([&] { return get->finished; }, 10s));
  EXPECT_TRUE(set->ok_reply()) << set->status.what() << " " << set->text;
  ASSERT_TRUE(get->ok_reply()) << get->status.what() << " " << get->text;
  EXPECT_EQ(get->bulk, resp::Node::Bulk::kSunk);
  EXPECT_TRUE(get->dest == value);

  // A wrong password fails the request with kPermission, not a hang.
  RedisClusterOptions bad = standalone_options(port);
  bad.conn.password = "wrong";
  auto refused = make_client(bad);
  Loop refused_loop(*refused);
  auto denied = get_op("auth-key", 0, 5000ms);
  refused->submit(&denied->req, "auth-key", now());
  ASSERT_TRUE(refused_loop.run_until([&] { return denied->finished; }, 6s));
  EXPECT_EQ(denied->status.code(), Code::kPermission) << denied->status.what();

  // The same value over the Unix socket, kept in the reply this time.
  RedisClusterOptions unix_opts = standalone_options(port);
  unix_opts.unix_path = server->dir() + "/redis.sock";
  unix_opts.conn.password = "s3cret";
  auto local = make_client(unix_opts);
  Loop local_loop(*local);
  auto kept = get_op("auth-key", 0, 5000ms);
  local->submit(&kept->req, "auth-key", now());
  ASSERT_TRUE(local_loop.run_until([&] { return kept->finished; }, 6s));
  ASSERT_TRUE(kept->ok_reply()) << kept->status.what();
  EXPECT_EQ(kept->bulk, resp::Node::Bulk::kKept);
  EXPECT_TRUE(kept->text == value);
}

TEST(RedisStandalone, StoppedServerTimesOutWithinTheDeadline) {
  SKIP_WITHOUT_REDIS();
  std::string why;
  auto server = RedisServers::standalone({}, &why);
  ASSERT_TRUE(server) << why;
  auto& proc = server->servers()[0];
  auto client = make_client(standalone_options(proc.port));
  Loop loop(*client);
  auto ping = std::make_unique<Op>(std::vector<std::string_view>{"PING"}, 2000ms);
  client->submit(&ping->req, "", now());
  ASSERT_TRUE(loop.run_until([&] { return ping->finished; }, 3s));
  ASSERT_TRUE(ping->ok_reply());

  proc.pause(true);
  std::vector<std::unique_ptr<Op>> ops;
  for (int i = 0; i < 8; ++i) ops.push_back(get_op("k" + std::to_string(i), i % 2 ? 1024 : 0, 300ms));
  auto start = now();
  for (auto& op : ops) client->submit(&op->req, "", now());
  ASSERT_TRUE(loop.run_until([&] { return all_finished(ops); }, 3s));
  for (auto& op : ops) {
    EXPECT_EQ(op->status.code(), Code::kTimeout) << op->status.what();
    EXPECT_LE(op->finished_at - start, 300ms + 150ms);
    EXPECT_GE(op->finished_at - start, 290ms);
  }

  // Resumed, it answers again (after the client's backoff).
  proc.pause(false);
  bool answered = false;
  for (int attempt = 0; attempt < 50 && !answered; ++attempt) {
    auto p = std::make_unique<Op>(std::vector<std::string_view>{"PING"}, 500ms);
    client->submit(&p->req, "", now());
    ASSERT_TRUE(loop.run_until([&] { return p->finished; }, 2s));
    answered = p->ok_reply();
    if (!answered) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(answered);

  // Killed, requests fail at once or at their deadline; none hangs.
  proc.kill9();
  for (int i = 0; i < 3; ++i) {
    auto p = std::make_unique<Op>(std::vector<std::string_view>{"PING"}, 500ms);
    auto t0 = now();
    client->submit(&p->req, "", now());
    ASSERT_TRUE(loop.run_until([&] { return p->finished; }, 2s));
    EXPECT_FALSE(p->status.ok());
    EXPECT_LE(p->finished_at - t0, 500ms + 150ms);
  }
}

TEST(RedisStandalone, BadConfigurationFailsClearlyAndQuickly) {
  SKIP_WITHOUT_REDIS();
  std::string why;
  auto server = RedisServers::standalone({}, &why);
  ASSERT_TRUE(server) << why;
  // Cluster mode against a plain server: CLUSTER SLOTS is refused, the request fails at once.
  RedisClusterOptions o = standalone_options(server->servers()[0].port);
  o.cluster = true;
  auto plain = make_client(o);
  Loop plain_loop(*plain);
  auto get = get_op("k", 0, 2000ms);
  auto t0 = now();
  plain->submit(&get->req, "k", now());
  ASSERT_TRUE(plain_loop.run_until([&] { return get->finished; }, 3s));
  EXPECT_EQ(get->status.code(), Code::kUnavailable) << get->status.what();
  EXPECT_LT(get->finished_at - t0, 1000ms);
  EXPECT_STREQ(plain->refresh_status().what(), "redis: CLUSTER SLOTS refused (not a cluster node?)");

  // An unreachable seed: the request ends at its deadline, not later.
  int dead_port = server->servers()[0].port;
  server->servers()[0].kill9();
  RedisClusterOptions d = standalone_options(dead_port);
  d.cluster = true;
  auto nobody = make_client(d);
  Loop nobody_loop(*nobody);
  auto lost = get_op("k", 0, 300ms);
  t0 = now();
  nobody->submit(&lost->req, "k", now());
  ASSERT_TRUE(nobody_loop.run_until([&] { return lost->finished; }, 2s));
  EXPECT_EQ(lost->status.code(), Code::kTimeout) << lost->status.what();
  EXPECT_LE(lost->finished_at - t0, 300ms + 150ms);
  EXPECT_FALSE(nobody->refresh_status().ok());
}

// ---- cluster -------------------------------------------------------------------------------

class RedisClusterTest : public testing::ClusterSuite<RedisClusterTest> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_REDIS();
    ASSERT_TRUE(servers_) << why_;
    RedisClusterOptions o;
    o.seeds = {NodeAddress{"127.0.0.1", static_cast<uint16_t>(servers_->servers()[0].port)}};
    o.pool_size = 2;
    o.conn.backoff_min = 20ms;
    o.conn.backoff_max = 200ms;
    client_ = make_client(o);
    ASSERT_TRUE(client_);
    loop_ = std::make_unique<Loop>(*client_);
  }
  void TearDown() override {
    loop_.reset();
    client_.reset();
  }

  // SETs every key (pipelined) and waits for them.
  void set_all(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
    std::vector<std::unique_ptr<Op>> ops;
    for (size_t i = 0; i < keys.size(); ++i) {
      ops.push_back(set_op(keys[i], values[i], 20000ms));
      client_->submit(&ops.back()->req, keys[i], now());
    }
    ASSERT_TRUE(loop_->run_until([&] { return all_finished(ops); }, 30s));
    for (auto& op : ops) ASSERT_TRUE(op->ok_reply()) << op->status.what() << " " << op->text;
  }
  // GETs every key (pipelined, into sinks) and checks each value byte for byte.
  void get_all(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
    std::vector<std::unique_ptr<Op>> ops;
    for (size_t i = 0; i < keys.size(); ++i) {
      ops.push_back(get_op(keys[i], i % 8 == 7 ? 0 : values[i].size(), 20000ms));
      client_->submit(&ops.back()->req, keys[i], now());
    }
    ASSERT_TRUE(loop_->run_until([&] { return all_finished(ops); }, 30s));
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE(ops[i]->ok_reply()) << keys[i] << ": " << ops[i]->status.what() << " " << ops[i]->text;
      const std::string& got = ops[i]->req.sink ? ops[i]->dest : ops[i]->text;
      EXPECT_EQ(ops[i]->bulk, ops[i]->req.sink ? resp::Node::Bulk::kSunk : resp::Node::Bulk::kKept);
      EXPECT_TRUE(got == values[i]) << keys[i] << " differs";
    }
  }
  int owner_port(const std::string& key) const {
    const SlotMap* m = client_->slot_map();
    return m->masters()[m->owner(key_slot(key))].port;
  }

  std::unique_ptr<RedisCluster> client_;
  std::unique_ptr<Loop> loop_;
};

TEST_F(RedisClusterTest, PipelinedMultiMiBValuesOverEveryMaster) {
  std::vector<std::string> keys, values;
  for (int i = 0; i < 48; ++i) {
    keys.push_back("kdn:chunk:" + std::to_string(i));
    values.push_back(value_for(keys.back(), (1 + i % 4) * kMiB - (i % 3) * 977));
  }
  set_all(keys, values);
  std::set<int> masters;
  for (const std::string& k : keys) masters.insert(owner_port(k));
  EXPECT_EQ(masters.size(), 3u);
  get_all(keys, values);
  EXPECT_EQ(client_->redirects(), 0u);

  // A missing key is a nil reply, and a wrong-size value never touches the destination.
  auto missing = get_op("kdn:chunk:absent", 100, 2000ms);
  auto wrong = get_op(keys[0], values[0].size() - 1, 2000ms);
  client_->submit(&missing->req, "kdn:chunk:absent", now());
  client_->submit(&wrong->req, keys[0], now());
  ASSERT_TRUE(loop_->run_until([&] { return missing->finished && wrong->finished; }, 3s));
  EXPECT_TRUE(missing->ok_reply());
  EXPECT_EQ(missing->type, resp::Type::kNil);
  EXPECT_EQ(wrong->bulk, resp::Node::Bulk::kDiscarded);
  EXPECT_EQ(wrong->dest, std::string(values[0].size() - 1, '\0'));
}

TEST_F(RedisClusterTest, FollowsMovedFromAStaleMap) {
  std::vector<std::string> keys, values;
  for (int i = 0; i < 24; ++i) {
    keys.push_back("kdn:moved:" + std::to_string(i));
    values.push_back(value_for(keys.back(), 4096 + i));
  }
  set_all(keys, values);
  // Pretend every slot is on one master: requests for the others go to the wrong node.
  SlotMap good = *client_->slot_map();
  client_->replace_slot_map(SlotMap::single(good.masters()[0]));
  uint64_t refreshes = client_->refreshes();
  get_all(keys, values);
  EXPECT_GT(client_->redirects(), 0u);
  // A refresh restores the whole map.
  ASSERT_TRUE(loop_->run_until(
      [&] { return client_->refreshes() > refreshes && client_->slot_map()->masters().size() == 3; }, 3s));
  for (const std::string& k : keys) EXPECT_EQ(owner_port(k), good.masters()[good.owner(key_slot(k))].port);
}

TEST_F(RedisClusterTest, FollowsAskDuringASlotMigration) {
  // Warm up the slot map.
  std::vector<std::string> warm = {"kdn:ask:warm"};
  set_all(warm, {std::string("x")});
  const std::string key = "kdn:ask:{migrating}";
  uint16_t slot = key_slot(key);
  int source = owner_port(key);
  int target = 0;
  for (const NodeAddress& m : client_->slot_map()->masters()) {
    if (m.port != source) target = m.port;
  }
  auto id = [&](int port) {
    std::string s = servers_->cli(port, "CLUSTER MYID");
    return s.substr(0, s.find_first_of("\r\n"));
  };
  std::string source_id = id(source), target_id = id(target);
  ASSERT_NE(servers_->cli(target, "CLUSTER SETSLOT " + std::to_string(slot) + " IMPORTING " + source_id).find("OK"),
            std::string::npos);
  ASSERT_NE(servers_->cli(source, "CLUSTER SETSLOT " + std::to_string(slot) + " MIGRATING " + target_id).find("OK"),
            std::string::npos);
  // The key is not on the source, so the source answers ASK; the client asks the target.
  std::string value = value_for(key, 2 * kMiB);
  set_all({key}, {value});
  uint64_t redirects = client_->redirects();
  EXPECT_GT(redirects, 0u);
  get_all({key}, {value});
  EXPECT_GT(client_->redirects(), redirects);
  // ASK never changes the map.
  EXPECT_EQ(owner_port(key), source);
  // Finish the migration so the cluster stays consistent for the fixture's teardown.
  servers_->cli(target, "CLUSTER SETSLOT " + std::to_string(slot) + " NODE " + target_id);
  servers_->cli(source, "CLUSTER SETSLOT " + std::to_string(slot) + " NODE " + target_id);
}

TEST_F(RedisClusterTest, MasterKilledReplicaTakesOver) {
  std::vector<std::string> keys, values;
  for (int i = 0; i < 24; ++i) {
    keys.push_back("kdn:failover:" + std::to_string(i));
    values.push_back(value_for(keys.back(), kMiB + i));
  }
  set_all(keys, values);
  const int victim = owner_port(keys[0]);
  // The victim's replica has every write before the kill (WAIT, routed to the victim).
  auto wait = std::make_unique<Op>(std::vector<std::string_view>{"WAIT", "1", "5000"}, 6000ms);
  client_->submit(&wait->req, keys[0], now());
  ASSERT_TRUE(loop_->run_until([&] { return wait->finished; }, 7s));
  ASSERT_TRUE(wait->ok_reply()) << wait->status.what() << " " << wait->text;
  ASSERT_EQ(wait->type, resp::Type::kInteger);
  ASSERT_GE(wait->value, 1) << "the victim's replica did not acknowledge the writes";

  // Requests in flight when the master dies end within their deadline: the right bytes, or
  // an error; never wrong bytes, never a hang.
  std::vector<std::unique_ptr<Op>> ops;
  auto start = now();
  for (size_t i = 0; i < keys.size(); ++i) {
    ops.push_back(get_op(keys[i], values[i].size(), 800ms));
    client_->submit(&ops.back()->req, keys[i], now());
  }
  servers_->by_port(victim)->kill9();
  ASSERT_TRUE(loop_->run_until([&] { return all_finished(ops); }, 3s));
  size_t failed = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_LE(ops[i]->finished_at - start, 800ms + 200ms) << keys[i];
    if (ops[i]->ok_reply()) {
      EXPECT_TRUE(ops[i]->dest == values[i]) << keys[i];
    } else {
      ++failed;
    }
  }
  std::printf("in flight at the kill: %zu of %zu failed\n", failed, keys.size());

  // Within ~10 s the replica is master and every key answers again with its bytes.
  auto until = now() + 15s;
  bool recovered = false;
  while (!recovered && now() < until) {
    std::vector<std::unique_ptr<Op>> retry;
    for (size_t i = 0; i < keys.size(); ++i) {
      retry.push_back(get_op(keys[i], values[i].size(), 500ms));
      client_->submit(&retry.back()->req, keys[i], now());
    }
    ASSERT_TRUE(loop_->run_until([&] { return all_finished(retry); }, 2s));
    recovered = true;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!retry[i]->ok_reply()) {
        recovered = false;
      } else {
        ASSERT_EQ(retry[i]->type, resp::Type::kBulk) << keys[i] << ": lost in the failover";
        ASSERT_TRUE(retry[i]->dest == values[i]) << keys[i] << ": wrong bytes after failover";
      }
    }
    if (!recovered) loop_->run_until([] { return false; }, 200ms);
  }
  std::printf("recovered after %.1f s\n", std::chrono::duration<double>(now() - start).count());
  EXPECT_TRUE(recovered);
  EXPECT_NE(owner_port(keys[0]), victim);
}

}  // namespace
}  // namespace kdn::sidecar
