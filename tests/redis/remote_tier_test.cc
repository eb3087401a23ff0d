// RemoteTier (sidecar/src/remote/remote_tier.h), T3, against real redis-server processes: chunks of
// 64 KiB to 6 MiB written and read back byte for byte over every master of a 3+3 cluster and by
// a second tier standing for another node; values damaged, replaced by another model's, moved
// under another key, deleted or of another type are kCorrupt; probes find exactly the stored
// keys; -OOM is kNoSpace and FLUSHALL a miss (standalone); a killed master fails the
// transfers in flight within their deadline, never with wrong bytes. KVC1 over the wire: every
// codec round-trips (lossless bit-exact, int8 and kivi4 bit-exact against the codec's own
// decode of the stored encoding), a reader of any codec reads every codec, chunks go raw when
// their model is unknown or the encoders are busy, and a damaged encoding or a lossless one
// that decodes to other bytes is a counted miss. Without a server: stale placements are
// refused and an unreachable store fails reads within the deadline. Skipped where Debian's
// redis-server is not installed.
#include "remote_tier.h"
#include "cluster_suite.h"
#include "redis_servers.h"

#include <kdn/common/model_presets.h>
#include <kdn/kernels/codec.h>
#include <kdn/kernels/synthetic.h>

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace kdn::sidecar {
namespace {

using namespace std::chrono_literals;
using testing::RedisServers;

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;
constexpr kdn_key kModel{0x1234567890abcdefull, 0x0fedcba987654321ull};
constexpr kdn_key kOtherModel{0x1111, 0x2222};

RedisClock::time_point now() { return RedisClock::now(); }

#define SKIP_WITHOUT_REDIS()                                        \
  do {                                                              \
    if (std::string why = testing::redis_missing(); !why.empty()) { \
      KDN_SKIP_OR_FAIL("REDIS", why);                               \
    }                                                               \
  } while (0)

kdn_key key_for(uint64_t i) { return kdn_key{i * 0x9E3779B97F4A7C15ull + 1, 0xabcdef0000000000ull + i}; }

// `size` bytes that differ from chunk to chunk.
std::vector<std::byte> chunk_bytes(uint64_t seed, size_t size) {
  std::vector<std::byte> v(size);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
  for (size_t i = 0; i < size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, size - i));
  }
  return v;
}

// The daemon's loop in miniature: the tier's client fd and wake fd in one epoll set; service()
// when either is ready or a deadline passed; every completion reaped and recorded.
class Driver {
 public:
  explicit Driver(RemoteTier& tier) : tier_(tier), ep_(epoll_create1(EPOLL_CLOEXEC)) {
    for (int fd : {tier.poll_fd(), tier.wake_fd()}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
    }
  }
  ~Driver() { close(ep_); }

  struct Done {
    Status status;
    RedisClock::time_point at;
  };

  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
    const auto until = now() + limit;
    for (;;) {
      reap_all();
      if (done()) return true;
      const auto t = now();
      if (t >= until) return false;
      auto wait = std::min<RedisClock::duration>(tier_.next_deadline() - t, 20ms);
      int ms = static_cast<int>(std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
      epoll_event ev[4];
      epoll_wait(ep_, ev, 4, ms);
      tier_.service(now());
    }
  }
  bool wait_all(const std::vector<TransferId>& ids, std::chrono::milliseconds limit) {
    return run_until(
        [&] { return std::all_of(ids.begin(), ids.end(), [&](TransferId id) { return done_.count(id) > 0; }); }, limit);
  }
  const Done& done(TransferId id) const { return done_.at(id); }
  size_t completions() const { return done_.size(); }

 private:
  void reap_all() {
    TierCompletion c[16];
    size_t n;
    while ((n = tier_.reap(c)) > 0) {
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(done_.count(c[i].id), 0u) << "transfer " << c[i].id << " completed twice";
        done_[c[i].id] = Done{c[i].status, now()};
      }
    }
  }

  RemoteTier& tier_;
  int ep_;
  std::map<TransferId, Done> done_;
};

// A chunk of the test and where it went.
struct Chunk {
  kdn_key key{};
  kdn_key fingerprint = kModel;
  std::vector<std::byte> bytes;
  Placement placement;
};

TransferId g_next_id = 1;

TransferId submit(RemoteTier& tier, Transfer::Direction dir, const Placement& p, std::byte* host, uint64_t bytes,
                  const ChunkIdentity& chunk = {}) {
  Transfer t;
  t.direction = dir;
  t.placement = p;
  t.host = host;
  t.bytes = bytes;
  t.id = g_next_id++;
  t.chunk = chunk;
  Status st = tier.submit(t);
  EXPECT_TRUE(st.ok()) << st.what();
  return t.id;
}

TransferId write_chunk(RemoteTier& tier, Chunk& c) {
  return submit(tier, Transfer::Direction::kWrite, c.placement, c.bytes.data(), c.bytes.size(),
                ChunkIdentity{c.key, c.fingerprint});
}

TransferId read_chunk(RemoteTier& tier, const Placement& p, std::vector<std::byte>& into) {
  return submit(tier, Transfer::Direction::kRead, p, into.data(), into.size());
}

std::unique_ptr<RemoteTier> make_tier(RemoteTierOptions o) {
  Result<std::unique_ptr<RemoteTier>> t = RemoteTier::create(std::move(o));
  EXPECT_TRUE(t.ok()) << t.status().what();
  return t.ok() ? std::move(t).value() : nullptr;
}

RemoteTierOptions tier_options(int port, bool cluster, std::chrono::milliseconds timeout) {
  RemoteTierOptions o;
  o.redis.seeds = {NodeAddress{"127.0.0.1", static_cast<uint16_t>(port)}};
  o.redis.cluster = cluster;
  o.redis.pool_size = 2;
  o.redis.conn.backoff_min = 20ms;
  o.redis.conn.backoff_max = 200ms;
  o.name_space = "default";
  o.timeout = timeout;
  return o;
}

// Writes `chunks` (allocating their placements) and expects every write to succeed.
void store_all(RemoteTier& tier, Driver& d, std::vector<Chunk>& chunks) {
  std::vector<TransferId> ids;
  for (Chunk& c : chunks) {
    Result<Placement> p = tier.allocate(c.bytes.size());
    ASSERT_TRUE(p.ok()) << p.status().what();
    c.placement = *p;
    ids.push_back(write_chunk(tier, c));
  }
  ASSERT_TRUE(d.wait_all(ids, 30s));
  for (TransferId id : ids) ASSERT_TRUE(d.done(id).status.ok()) << d.done(id).status.what();
}

// Reads every chunk back (pipelined) and expects its bytes.
void expect_all(RemoteTier& tier, Driver& d, const std::vector<Chunk>& chunks, const std::vector<Placement>& at) {
  std::vector<std::vector<std::byte>> got;
  std::vector<TransferId> ids;
  got.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    got.emplace_back(chunks[i].bytes.size(), std::byte{0x5A});
    ids.push_back(read_chunk(tier, at[i], got.back()));
  }
  ASSERT_TRUE(d.wait_all(ids, 30s));
  for (size_t i = 0; i < chunks.size(); ++i) {
    ASSERT_TRUE(d.done(ids[i]).status.ok()) << i << ": " << d.done(ids[i]).status.what();
    EXPECT_TRUE(got[i] == chunks[i].bytes) << "chunk " << i << " differs";
  }
}

// Placements of another node for `chunks`, found by name.
std::vector<Placement> adopt_all(RemoteTier& tier, const std::vector<Chunk>& chunks) {
  std::vector<Placement> adopted;
  for (const Chunk& c : chunks) {
    Result<Placement> p = tier.adopt(ChunkIdentity{c.key, c.fingerprint}, c.bytes.size());
    EXPECT_TRUE(p.ok()) << p.status().what();
    if (p.ok()) adopted.push_back(*p);
  }
  return adopted;
}

// A plain client for what the tests do behind the tier's back (raw SET, DEL, FLUSHALL).
class RawClient {
 public:
  explicit RawClient(RedisClusterOptions o) {
    auto c = RedisCluster::create(std::move(o));
    EXPECT_TRUE(c.ok());
    client_ = std::move(c).value();
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    epoll_ctl(ep_, EPOLL_CTL_ADD, client_->fd(), &ev);
  }
  ~RawClient() {
    client_.reset();
    close(ep_);
  }
  struct Answer {
    Status status;
    resp::Type type = resp::Type::kNil;
    std::string text;
    int64_t value = 0;
  };
  // One command, routed by `key`, optionally followed by a payload argument.
  Answer run(std::vector<std::string_view> argv, std::string_view key, std::span<const std::byte> payload = {},
             bool with_payload = false) {
    RedisRequest r;
    if (with_payload) {
      resp::append_command_head(r.command, argv, payload.size());
      r.payload_follows = true;
      r.payload = payload;
    } else {
      resp::append_command(r.command, argv);
    }
    r.deadline = now() + 5s;
    bool finished = false;
    Answer a;
    r.done = [&](RedisRequest&, Status s, const resp::Reply* reply) {
      finished = true;
      a.status = s;
      if (reply != nullptr) {
        a.type = reply->root().type;
        a.text = std::string(reply->text(reply->root()));
        a.value = reply->root().value;
      }
    };
    client_->submit(&r, key, now());
    const auto until = now() + 6s;
    while (!finished && now() < until) {
      epoll_event ev;
      epoll_wait(ep_, &ev, 1, 20);
      client_->poll(now());
    }
    EXPECT_TRUE(finished);
    return a;
  }
  void set(const std::string& key, std::span<const std::byte> value) {
    Answer a = run({"SET", key}, key, value, true);
    EXPECT_TRUE(a.status.ok() && a.text == "OK") << a.status.what() << " " << a.text;
  }

 private:
  std::unique_ptr<RedisCluster> client_;
  int ep_ = -1;
};

// A value as a writer of `fingerprint` would make it for `key`.
std::vector<std::byte> make_value(const kdn_key& key, const kdn_key& fingerprint,
                                  const std::vector<std::byte>& payload) {
  std::vector<std::byte> v(remote::kHeaderBytes + payload.size());
  remote::ValueHeader h;
  h.key = key;
  h.fingerprint = fingerprint;
  h.raw_bytes = h.stored_bytes = payload.size();
  h.payload_crc = remote::crc32c(payload.data(), payload.size());
  h.name_space = "default";
  remote::encode_header(h, v.data());
  std::memcpy(v.data() + remote::kHeaderBytes, payload.data(), payload.size());
  return v;
}

// A small model (512 KiB fp16 chunks) for the codec tests: learn_model() gives its geometry.
ModelInfo codec_model() {
  kdn_model_desc d = shaped_desc(4, 2, 64, 256, "remote-codec-test");
  Result<ModelInfo> m = ModelInfo::from_desc(d);
  EXPECT_TRUE(m.ok());
  return *m;
}

// Synthetic KV (outlier channels, token-wise locality): it compresses as real KV does.
std::vector<std::byte> kv_chunk(const ModelInfo& m, uint64_t seed) {
  std::vector<std::byte> v(m.chunk_bytes);
  kernels::SyntheticKvParams p;
  p.seed = seed;
  EXPECT_TRUE(kernels::fill_synthetic_kv(v.data(), kernels::kvc1_geometry(m), p).ok());
  return v;
}

// `n` chunks of `m`, keys and contents numbered from `first`.
std::vector<Chunk> kv_chunks(const ModelInfo& m, size_t n, uint64_t first) {
  std::vector<Chunk> chunks(n);
  for (size_t i = 0; i < n; ++i) {
    chunks[i].key = key_for(first + i);
    chunks[i].fingerprint = m.fingerprint;
    chunks[i].bytes = kv_chunk(m, first + i);
  }
  return chunks;
}

std::vector<std::byte> to_bytes(const std::string& s) {
  const auto* b = reinterpret_cast<const std::byte*>(s.data());
  return std::vector<std::byte>(b, b + s.size());
}

// The header of a stored value.
remote::ValueHeader header_of(const std::vector<std::byte>& value) {
  remote::ValueHeader h;
  EXPECT_GE(value.size(), remote::kHeaderBytes);
  if (value.size() < remote::kHeaderBytes) return h;
  Status st =
      remote::decode_header(std::span<const std::byte, remote::kHeaderBytes>(value.data(), remote::kHeaderBytes), &h);
  EXPECT_TRUE(st.ok()) << st.what();
  return h;
}

// What the codec's own decoder makes of a stored value's KVC1 payload.
std::vector<std::byte> reference_decode(const std::vector<std::byte>& value, const ModelInfo& m) {
  std::vector<std::byte> out(m.chunk_bytes);
  const auto* blob = reinterpret_cast<const uint8_t*>(value.data() + remote::kHeaderBytes);
  Status st = kernels::kvc1_decode(blob, value.size() - remote::kHeaderBytes, kernels::kvc1_geometry(m), m.fingerprint,
                                   out.data(), out.size());
  EXPECT_TRUE(st.ok()) << st.what();
  return out;
}

// The same value with its header changed by `edit` and sealed again.
std::vector<std::byte> reheader(std::vector<std::byte> value, const std::function<void(remote::ValueHeader&)>& edit) {
  remote::ValueHeader h = header_of(value);
  edit(h);
  remote::encode_header(h, value.data());
  return value;
}

// ---- without a server ----------------------------------------------------------------------------

TEST(RemoteTierLocal, PlacementsAreCheckedHandles) {
  RemoteTierOptions o = tier_options(1, false, 300ms);
  o.capacity_bytes = 1 * kMiB;
  auto tier = make_tier(o);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->id(), TierId::kRemote);
  EXPECT_EQ(tier->slot_class(0).status().code(), Code::kInvalidArgument);
  Result<Placement> a = tier->allocate(512 * kKiB);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(tier->used_bytes(), 512 * kKiB);
  EXPECT_EQ(tier->allocate(600 * kKiB).status().code(), Code::kNoSpace);
  std::vector<std::byte> buf(512 * kKiB);
  Transfer t;
  t.placement = *a;
  t.host = buf.data();
  t.bytes = buf.size();
  t.direction = Transfer::Direction::kRead;
  EXPECT_EQ(tier->submit(t).code(), Code::kInvalidArgument);  // nothing stored yet
  const Placement stale = *a;
  tier->free(*a);
  EXPECT_EQ(tier->used_bytes(), 0u);
  Result<Placement> b = tier->allocate(512 * kKiB);  // the same slot, a new generation
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->offset, stale.offset);
  t.placement = stale;
  t.direction = Transfer::Direction::kWrite;
  EXPECT_EQ(tier->submit(t).code(), Code::kInvalidArgument);
  EXPECT_EQ(tier->in_flight(), 0u);

  RemoteTierOptions bad = tier_options(1, false, 300ms);
  bad.name_space = "{tag}";
  EXPECT_EQ(RemoteTier::create(bad).status().code(), Code::kInvalidArgument);
  bad.name_space = "default";
  bad.codec = remote::RemoteCodec(9);
  EXPECT_EQ(RemoteTier::create(bad).status().code(), Code::kInvalidArgument);
  bad.codec = remote::RemoteCodec::kKivi4;
  EXPECT_TRUE(RemoteTier::create(bad).ok());
}

TEST(RemoteTierLocal, UnreachableStoreFailsWithinTheDeadline) {
  auto tier = make_tier(tier_options(1, false, 300ms));  // nothing listens on port 1
  ASSERT_TRUE(tier);
  Driver d(*tier);
  Result<Placement> p = tier->adopt(ChunkIdentity{key_for(1), kModel}, 64 * kKiB);
  ASSERT_TRUE(p.ok());
  std::vector<std::byte> buf(64 * kKiB);
  std::vector<TransferId> ids;
  const auto start = now();
  for (int i = 0; i < 4; ++i) ids.push_back(read_chunk(*tier, *p, buf));
  ASSERT_TRUE(d.wait_all(ids, 2s));
  for (TransferId id : ids) {
    EXPECT_EQ(d.done(id).status.code(), Code::kIo) << d.done(id).status.what();
    EXPECT_LE(d.done(id).at - start, 300ms + 150ms);
  }
  EXPECT_EQ(tier->in_flight(), 0u);
  // The wake fd is readable exactly while completions wait.
  pollfd pfd{tier->wake_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 0), 0);
  ids = {read_chunk(*tier, *p, buf)};
  const auto until = now() + 2s;
  while (poll(&pfd, 1, 0) == 0 && now() < until) {
    tier->service(now());
    usleep(1000);
  }
  ASSERT_EQ(poll(&pfd, 1, 0), 1);
  TierCompletion c[4];
  EXPECT_EQ(tier->reap(c), 1u);
  EXPECT_EQ(c[0].id, ids[0]);
  EXPECT_EQ(poll(&pfd, 1, 0), 0);
}

// ---- a 3+3 cluster ---------------------------------------------------------------------------------

class RemoteTierCluster : public testing::ClusterSuite<RemoteTierCluster> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_REDIS();
    ASSERT_TRUE(servers_) << why_;
    tier_ = make_tier(tier_options(seed_port(), true, 5000ms));
    ASSERT_TRUE(tier_);
    driver_ = std::make_unique<Driver>(*tier_);
    RedisClusterOptions raw = tier_options(seed_port(), true, 5000ms).redis;
    raw_ = std::make_unique<RawClient>(raw);
  }
  void TearDown() override {
    driver_.reset();
    tier_.reset();
    raw_.reset();
  }
  static int seed_port() { return servers_->servers()[0].port; }
  // A tier of another node writing with `codec`, told `model`'s geometry when given. (A long
  // timeout: encodes in sanitizer builds are many times slower.)
  static std::unique_ptr<RemoteTier> codec_tier(remote::RemoteCodec codec, const ModelInfo* model,
                                                uint32_t encode_queue = 4) {
    RemoteTierOptions o = tier_options(seed_port(), true, 30000ms);
    o.codec = codec;
    o.encode_queue = encode_queue;
    auto t = make_tier(o);
    if (t && model != nullptr) t->learn_model(*model);
    return t;
  }
  std::vector<std::byte> stored_value(const std::string& key) {
    RawClient::Answer a = raw_->run({"GET", key}, key);
    EXPECT_EQ(a.type, resp::Type::kBulk) << key;
    return to_bytes(a.text);
  }
  int owner_port(const std::string& key) const {
    const SlotMap* m = tier_->client().slot_map();
    return m->masters()[m->owner(key_slot(key))].port;
  }

  std::unique_ptr<RemoteTier> tier_;
  std::unique_ptr<Driver> driver_;
  std::unique_ptr<RawClient> raw_;
};

TEST_F(RemoteTierCluster, RoundTripOverEveryMasterAndFromAnotherNode) {
  const size_t sizes[] = {64 * kKiB, 256 * kKiB + 4 * kKiB, 1 * kMiB, 2 * kMiB + 12 * kKiB, 6 * kMiB};
  std::vector<Chunk> chunks(24);
  uint64_t total = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].key = key_for(100 + i);
    chunks[i].bytes = chunk_bytes(100 + i, sizes[i % 5]);
    total += chunks[i].bytes.size();
  }
  store_all(*tier_, *driver_, chunks);
  EXPECT_EQ(tier_->used_bytes(), total);
  EXPECT_EQ(tier_->counters().writes, chunks.size());
  std::set<int> masters;
  std::vector<Placement> at;
  for (const Chunk& c : chunks) {
    masters.insert(owner_port(tier_->key_of(c.placement)));
    at.push_back(c.placement);
  }
  EXPECT_EQ(masters.size(), 3u);
  expect_all(*tier_, *driver_, chunks, at);
  EXPECT_EQ(tier_->counters().read_bytes, total);

  // Another node (its own tier and connections) finds them by name and reads the same bytes.
  auto node_b = make_tier(tier_options(seed_port(), true, 5000ms));
  ASSERT_TRUE(node_b);
  Driver db(*node_b);
  expect_all(*node_b, db, chunks, adopt_all(*node_b, chunks));

  for (const Chunk& c : chunks) tier_->free(c.placement);
  EXPECT_EQ(tier_->used_bytes(), 0u);
  EXPECT_EQ(tier_->in_flight(), 0u);
}

TEST_F(RemoteTierCluster, DamagedForeignMissingAndMistypedValuesAreCorrupt) {
  std::vector<Chunk> chunks(8);
  for (size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].key = key_for(200 + i);
    chunks[i].bytes = chunk_bytes(200 + i, 64 * kKiB);
  }
  store_all(*tier_, *driver_, chunks);
  std::vector<std::string> keys;
  for (const Chunk& c : chunks) keys.push_back(tier_->key_of(c.placement));

  // 0: garbage of the value's exact length; 1: a short value.
  raw_->set(keys[0], chunk_bytes(999, remote::kHeaderBytes + 64 * kKiB));
  raw_->set(keys[1], chunk_bytes(998, 10));
  // 2: another model's value under this key (a colliding or stale name), well sealed.
  raw_->set(keys[2], make_value(chunks[2].key, kOtherModel, chunks[2].bytes));
  // 3: chunk 4's value moved under chunk 3's name.
  raw_->set(keys[3], make_value(chunks[4].key, kModel, chunks[4].bytes));
  // 4: one payload byte changed in place.
  {
    const size_t at = remote::kHeaderBytes + 100;
    const char changed = static_cast<char>(static_cast<unsigned char>(chunks[4].bytes[100]) ^ 0x55);
    RawClient::Answer a = raw_->run({"SETRANGE", keys[4], std::to_string(at), std::string_view(&changed, 1)}, keys[4]);
    ASSERT_TRUE(a.status.ok() && a.type == resp::Type::kInteger) << a.text;
  }
  // 5: deleted; 6: a list now.
  ASSERT_EQ(raw_->run({"DEL", keys[5]}, keys[5]).value, 1);
  ASSERT_EQ(raw_->run({"DEL", keys[6]}, keys[6]).value, 1);
  ASSERT_EQ(raw_->run({"LPUSH", keys[6], "x"}, keys[6]).value, 1);

  std::vector<std::vector<std::byte>> got(chunks.size(), std::vector<std::byte>(64 * kKiB));
  std::vector<TransferId> ids;
  for (size_t i = 0; i < chunks.size(); ++i) ids.push_back(read_chunk(*tier_, chunks[i].placement, got[i]));
  ASSERT_TRUE(driver_->wait_all(ids, 10s));
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(driver_->done(ids[i]).status.code(), Code::kCorrupt) << i << ": " << driver_->done(ids[i]).status.what();
  }
  // 7 was left alone.
  EXPECT_TRUE(driver_->done(ids[7]).status.ok()) << driver_->done(ids[7]).status.what();
  EXPECT_TRUE(got[7] == chunks[7].bytes);
  const RemoteCounters& c = tier_->counters();
  EXPECT_EQ(c.bad_header, 1u);
  EXPECT_EQ(c.bad_length, 1u);
  EXPECT_EQ(c.foreign, 2u);
  EXPECT_EQ(c.crc_mismatch, 1u);
  EXPECT_EQ(c.missing, 1u);
  EXPECT_EQ(c.wrong_type, 1u);
  EXPECT_STREQ(driver_->done(ids[2]).status.what(), "remote value belongs to another model");
  EXPECT_STREQ(driver_->done(ids[3]).status.what(), "remote value belongs to another chunk key");

  // Another namespace never sees these names: the same chunk there is a miss.
  RemoteTierOptions other = tier_options(seed_port(), true, 5000ms);
  other.name_space = "tenant";
  auto tenant = make_tier(other);
  ASSERT_TRUE(tenant);
  Driver dt(*tenant);
  Result<Placement> p = tenant->adopt(ChunkIdentity{chunks[7].key, kModel}, 64 * kKiB);
  ASSERT_TRUE(p.ok());
  EXPECT_NE(tenant->key_of(*p), keys[7]);
  std::vector<std::byte> buf(64 * kKiB);
  TransferId id = read_chunk(*tenant, *p, buf);
  ASSERT_TRUE(dt.wait_all({id}, 5s));
  EXPECT_EQ(dt.done(id).status.code(), Code::kCorrupt);
  EXPECT_EQ(tenant->counters().missing, 1u);

  // discard() deletes the value: found again by name, it is gone.
  tier_->discard(chunks[7].placement);
  ASSERT_TRUE(driver_->run_until([&] { return raw_->run({"EXISTS", keys[7]}, keys[7]).value == 0; }, 5s));
}

TEST_F(RemoteTierCluster, ProbeFindsExactlyTheStoredKeys) {
  std::vector<Chunk> chunks(20);
  for (size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].key = key_for(300 + 2 * i);  // odd keys are never written
    chunks[i].bytes = chunk_bytes(300 + i, 4 * kKiB);
  }
  store_all(*tier_, *driver_, chunks);
  std::vector<ChunkIdentity> asked;
  std::vector<uint8_t> expected;
  for (size_t i = 0; i < 40; ++i) {
    asked.push_back(ChunkIdentity{key_for(300 + i), kModel});
    expected.push_back(i % 2 == 0 ? 1 : 0);
  }
  asked.push_back(ChunkIdentity{chunks[0].key, kOtherModel});  // another model's name
  expected.push_back(0);
  std::vector<uint8_t> exists;
  const TransferId id = g_next_id++;
  ASSERT_TRUE(tier_->probe(id, asked, &exists).ok());
  ASSERT_TRUE(driver_->wait_all({id}, 5s));
  EXPECT_TRUE(driver_->done(id).status.ok()) << driver_->done(id).status.what();
  EXPECT_EQ(exists, expected);
  EXPECT_EQ(tier_->counters().probe_hits, 20u);

  // A deleted value is gone from the next probe; an empty probe completes at once.
  raw_->run({"DEL", tier_->key_of(chunks[3].placement)}, tier_->key_of(chunks[3].placement));
  expected[6] = 0;
  const TransferId again = g_next_id++;
  ASSERT_TRUE(tier_->probe(again, asked, &exists).ok());
  const TransferId empty = g_next_id++;
  std::vector<uint8_t> none;
  ASSERT_TRUE(tier_->probe(empty, {}, &none).ok());
  ASSERT_TRUE(driver_->wait_all({again, empty}, 5s));
  EXPECT_EQ(exists, expected);
  EXPECT_TRUE(driver_->done(empty).status.ok());
  std::vector<ChunkIdentity> too_many(5000, asked[0]);
  EXPECT_EQ(tier_->probe(g_next_id++, too_many, &none).code(), Code::kInvalidArgument);
  EXPECT_EQ(tier_->in_flight(), 0u);
}

// ---- KVC1 over the wire -----------------------------------------------------------------------------

TEST_F(RemoteTierCluster, EveryCodecRoundTripsAndEveryReaderDecodesIt) {
  const ModelInfo m = codec_model();
  using remote::RemoteCodec;
  // Other nodes: one reading with codec none, one with kivi4 (a reader decodes per the value).
  auto plain = codec_tier(RemoteCodec::kNone, nullptr);
  auto kivi = codec_tier(RemoteCodec::kKivi4, nullptr);
  ASSERT_TRUE(plain && kivi);
  Driver dp(*plain), dk(*kivi);
  for (RemoteCodec codec : {RemoteCodec::kNone, RemoteCodec::kLossless, RemoteCodec::kInt8, RemoteCodec::kKivi4}) {
    SCOPED_TRACE(remote::remote_codec_name(codec));
    auto writer = codec_tier(codec, &m);
    ASSERT_TRUE(writer);
    Driver dw(*writer);
    std::vector<Chunk> chunks = kv_chunks(m, 4, 700 + 10 * uint64_t(codec));
    store_all(*writer, dw, chunks);
    const RemoteCounters w = writer->counters();
    if (codec == RemoteCodec::kNone) {
      EXPECT_EQ(w.encoded_writes, 0u);
      EXPECT_EQ(w.stored_bytes_written, w.write_bytes);
    } else {
      EXPECT_EQ(w.encoded_writes, chunks.size()) << "synthetic KV compresses";
      EXPECT_LT(w.stored_bytes_written, w.write_bytes);
    }
    EXPECT_EQ(w.raw_writes, 0u);
    std::printf("%-8s %zu chunks of %llu bytes stored in %llu (ratio %.2f)\n", remote::remote_codec_name(codec),
                chunks.size(), static_cast<unsigned long long>(m.chunk_bytes),
                static_cast<unsigned long long>(w.stored_bytes_written / chunks.size()),
                double(w.write_bytes) / double(w.stored_bytes_written));

    // What a read must give: the chunk itself for none and lossless; for int8 and kivi4 exactly
    // what the codec's own decoder makes of the stored encoding (within the codec's error).
    std::vector<Chunk> expected = chunks;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const std::vector<std::byte> value = stored_value(writer->key_of(chunks[i].placement));
      EXPECT_EQ(header_of(value).codec, codec);
      if (codec == RemoteCodec::kNone) continue;
      expected[i].bytes = reference_decode(value, m);
      const double error =
          kernels::kvc1_quality(kernels::kvc1_geometry(m), chunks[i].bytes.data(), expected[i].bytes.data(), 1)
              .rel_frobenius_error;
      if (codec == RemoteCodec::kLossless)
        EXPECT_TRUE(expected[i].bytes == chunks[i].bytes);
      else
        EXPECT_LT(error, codec == RemoteCodec::kInt8 ? 0.02 : 0.15);
    }
    std::vector<Placement> at;
    for (const Chunk& c : chunks) at.push_back(c.placement);
    expect_all(*writer, dw, expected, at);
    for (auto [reader, driver] : {std::pair<RemoteTier*, Driver*>{plain.get(), &dp}, {kivi.get(), &dk}}) {
      const uint64_t decoded_before = reader->counters().decoded_reads;
      const std::vector<Placement> adopted = adopt_all(*reader, chunks);
      expect_all(*reader, *driver, expected, adopted);
      EXPECT_EQ(reader->counters().decoded_reads - decoded_before, codec == RemoteCodec::kNone ? 0u : chunks.size());
      for (const Placement& p : adopted) reader->free(p);
    }
    EXPECT_EQ(writer->counters().decoded_reads, codec == RemoteCodec::kNone ? 0u : chunks.size());
  }
  EXPECT_EQ(plain->counters().decode_errors + kivi->counters().decode_errors, 0u);
}

TEST_F(RemoteTierCluster, ChunksGoRawWhenTheModelIsUnknownOrTheEncodersAreBusy) {
  const ModelInfo m = codec_model();
  auto unknown = codec_tier(remote::RemoteCodec::kKivi4, nullptr);                 // never told the model
  auto busy = codec_tier(remote::RemoteCodec::kLossless, &m, /*encode_queue=*/0);  // no encoder free
  ASSERT_TRUE(unknown && busy);
  uint64_t first = 800;
  for (RemoteTier* tier : {unknown.get(), busy.get()}) {
    Driver d(*tier);
    std::vector<Chunk> chunks = kv_chunks(m, 2, first);
    first += chunks.size();
    store_all(*tier, d, chunks);
    EXPECT_EQ(tier->counters().raw_writes, chunks.size());
    EXPECT_EQ(tier->counters().encoded_writes, 0u);
    EXPECT_EQ(tier->counters().stored_bytes_written, tier->counters().write_bytes);
    std::vector<Placement> at;
    for (const Chunk& c : chunks) {
      EXPECT_EQ(header_of(stored_value(tier->key_of(c.placement))).codec, remote::RemoteCodec::kNone);
      at.push_back(c.placement);
    }
    expect_all(*tier, d, chunks, at);
    EXPECT_EQ(tier->counters().decoded_reads, 0u);
  }
}

TEST_F(RemoteTierCluster, DamagedEncodingsAreCountedMisses) {
  const ModelInfo m = codec_model();
  auto tier = codec_tier(remote::RemoteCodec::kLossless, &m, 8);
  ASSERT_TRUE(tier);
  Driver d(*tier);
  std::vector<Chunk> chunks = kv_chunks(m, 6, 900);
  store_all(*tier, d, chunks);
  ASSERT_EQ(tier->counters().encoded_writes, chunks.size());
  std::vector<std::string> keys;
  std::vector<std::vector<std::byte>> values;
  for (const Chunk& c : chunks) {
    keys.push_back(tier->key_of(c.placement));
    values.push_back(stored_value(keys.back()));
  }
  // 0: one byte of the encoding flipped in place, nothing else fixed.
  {
    const size_t at = remote::kHeaderBytes + 1000;
    const char changed = static_cast<char>(static_cast<unsigned char>(values[0][at]) ^ 0x08);
    RawClient::Answer a = raw_->run({"SETRANGE", keys[0], std::to_string(at), std::string_view(&changed, 1)}, keys[0]);
    ASSERT_TRUE(a.status.ok() && a.type == resp::Type::kInteger) << a.text;
  }
  // 1: a header that says lossless, well sealed, whose encoding decodes to other bytes than its
  // raw hash names.
  raw_->set(keys[1], reheader(values[1], [](remote::ValueHeader& h) { h.raw_hash.lo ^= 1; }));
  // 2: a lossless encoding under a header that says int8.
  raw_->set(keys[2], reheader(values[2], [](remote::ValueHeader& h) {
              h.codec = remote::RemoteCodec::kInt8;
              h.raw_hash = kdn_key{};
            }));
  // 3: garbage of an encoding's size, its CRC sealed in the header: not KVC1.
  {
    std::vector<std::byte> v = values[3];
    const std::vector<std::byte> junk = chunk_bytes(3, v.size() - remote::kHeaderBytes);
    std::memcpy(v.data() + remote::kHeaderBytes, junk.data(), junk.size());
    raw_->set(keys[3],
              reheader(v, [&](remote::ValueHeader& h) { h.payload_crc = remote::crc32c(junk.data(), junk.size()); }));
  }
  // 4: longer than the chunk itself: refused from its length, never held in memory.
  raw_->set(keys[4], chunk_bytes(4, remote::kHeaderBytes + m.chunk_bytes + 4096));

  std::vector<std::vector<std::byte>> got(chunks.size(), std::vector<std::byte>(m.chunk_bytes));
  std::vector<TransferId> ids;
  for (size_t i = 0; i < chunks.size(); ++i) ids.push_back(read_chunk(*tier, chunks[i].placement, got[i]));
  ASSERT_TRUE(d.wait_all(ids, 10s));
  for (size_t i = 0; i < 5; ++i)
    EXPECT_EQ(d.done(ids[i]).status.code(), Code::kCorrupt) << i << ": " << d.done(ids[i]).status.what();
  EXPECT_STREQ(d.done(ids[0]).status.what(), "remote value: payload CRC mismatch");
  EXPECT_STREQ(d.done(ids[1]).status.what(), "a losslessly compressed chunk decoded to other bytes");
  EXPECT_STREQ(d.done(ids[2]).status.what(), "a compressed chunk is in another codec than recorded");
  EXPECT_STREQ(d.done(ids[3]).status.what(), "a compressed chunk is not a valid KVC1 blob");
  // 5 was left alone.
  ASSERT_TRUE(d.done(ids[5]).status.ok()) << d.done(ids[5]).status.what();
  EXPECT_TRUE(got[5] == chunks[5].bytes);
  const RemoteCounters& c = tier->counters();
  EXPECT_EQ(c.crc_mismatch, 1u);
  EXPECT_EQ(c.decode_errors, 3u);
  EXPECT_EQ(c.bad_length, 1u);
  EXPECT_EQ(c.decoded_reads, 1u);
  EXPECT_EQ(c.reads, 1u);
}

TEST_F(RemoteTierCluster, DestroyingTheTierWhileWorkersRunLeavesHostMemoryAlone) {
  const ModelInfo m = codec_model();
  std::vector<Chunk> chunks = kv_chunks(m, 8, 1000);
  {
    auto writer = codec_tier(remote::RemoteCodec::kKivi4, &m, 8);
    ASSERT_TRUE(writer);
    Driver d(*writer);
    store_all(*writer, d, chunks);
  }
  // Reads whose decodes and writes whose encodes are queued or running when the tier goes.
  auto tier = codec_tier(remote::RemoteCodec::kKivi4, &m, 8);
  ASSERT_TRUE(tier);
  auto d = std::make_unique<Driver>(*tier);
  std::vector<std::vector<std::byte>> got(chunks.size(), std::vector<std::byte>(m.chunk_bytes, std::byte{0x5A}));
  std::vector<Chunk> rewrites = chunks;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Result<Placement> p = tier->adopt(ChunkIdentity{chunks[i].key, chunks[i].fingerprint}, m.chunk_bytes);
    ASSERT_TRUE(p.ok());
    read_chunk(*tier, *p, got[i]);
    Result<Placement> w = tier->allocate(m.chunk_bytes);
    ASSERT_TRUE(w.ok());
    rewrites[i].key = key_for(1100 + i);
    rewrites[i].placement = *w;
    write_chunk(*tier, rewrites[i]);
  }
  ASSERT_TRUE(d->run_until([&] { return d->completions() > 0; }, 10s));
  d.reset();
  tier.reset();
  const std::vector<std::vector<std::byte>> after = got;
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(after == got) << "host memory changed after the tier was destroyed";
}

// ---- standalone: -OOM and FLUSHALL -----------------------------------------------------------------

TEST(RemoteTierStandalone, OutOfMemoryIsNoSpaceAndFlushallIsAMiss) {
  SKIP_WITHOUT_REDIS();
  std::string why;
  auto server = RedisServers::standalone({"--maxmemory", "6mb", "--maxmemory-policy", "noeviction"}, &why);
  ASSERT_TRUE(server) << why;
  const int port = server->servers()[0].port;
  auto tier = make_tier(tier_options(port, false, 5000ms));
  ASSERT_TRUE(tier);
  Driver d(*tier);
  std::vector<Chunk> chunks(12);
  std::vector<TransferId> ids;
  for (size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].key = key_for(400 + i);
    chunks[i].bytes = chunk_bytes(400 + i, 1 * kMiB);
    Result<Placement> p = tier->allocate(kMiB);
    ASSERT_TRUE(p.ok());
    chunks[i].placement = *p;
    ids.push_back(write_chunk(*tier, chunks[i]));
  }
  ASSERT_TRUE(d.wait_all(ids, 20s));
  std::vector<Chunk> stored;
  size_t no_space = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Status& st = d.done(ids[i]).status;
    if (st.ok()) {
      stored.push_back(chunks[i]);
    } else {
      EXPECT_EQ(st.code(), Code::kNoSpace) << st.what();
      ++no_space;
    }
  }
  EXPECT_GT(no_space, 0u);
  EXPECT_EQ(tier->counters().no_space, no_space);
  // What did fit reads back; what did not was never stored (a read is refused before it starts).
  std::vector<Placement> at;
  for (const Chunk& c : stored) at.push_back(c.placement);
  expect_all(*tier, d, stored, at);
  std::vector<std::byte> buf(kMiB);
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!d.done(ids[i]).status.ok()) {
      Transfer t;
      t.placement = chunks[i].placement;
      t.host = buf.data();
      t.bytes = buf.size();
      EXPECT_EQ(tier->submit(t).code(), Code::kInvalidArgument);
    }
  }

  // FLUSHALL behind the tier's back: every read is a miss, none an error of the engine's.
  RedisClusterOptions raw = tier_options(port, false, 5000ms).redis;
  RawClient(raw).run({"FLUSHALL"}, "");
  ids.clear();
  std::vector<std::vector<std::byte>> got(stored.size(), std::vector<std::byte>(kMiB));
  for (size_t i = 0; i < stored.size(); ++i) ids.push_back(read_chunk(*tier, stored[i].placement, got[i]));
  ASSERT_TRUE(d.wait_all(ids, 10s));
  for (TransferId id : ids) EXPECT_EQ(d.done(id).status.code(), Code::kCorrupt) << d.done(id).status.what();
  EXPECT_EQ(tier->counters().missing, stored.size());
}

// ---- a killed master -------------------------------------------------------------------------------

TEST(RemoteTierFailover, KilledMasterFailsTransfersInFlightWithinTheDeadline) {
  SKIP_WITHOUT_REDIS();
  std::string why;
  auto servers = RedisServers::cluster(3, 0, &why);
  ASSERT_TRUE(servers) << why;
  constexpr auto kTimeout = 800ms;
  auto tier = make_tier(tier_options(servers->servers()[0].port, true, kTimeout));
  ASSERT_TRUE(tier);
  Driver d(*tier);
  std::vector<Chunk> chunks(24);
  for (size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].key = key_for(500 + i);
    chunks[i].bytes = chunk_bytes(500 + i, 512 * kKiB);
  }
  store_all(*tier, d, chunks);
  const SlotMap* map = tier->client().slot_map();
  auto owner = [&](const Chunk& c) { return map->masters()[map->owner(key_slot(tier->key_of(c.placement)))].port; };
  const int victim = owner(chunks[0]);
  std::vector<bool> on_victim;
  for (const Chunk& c : chunks) on_victim.push_back(owner(c) == victim);

  // Reads and writes in flight when the master dies: each ends within its deadline, with the
  // right bytes or an error, never wrong bytes.
  std::vector<std::vector<std::byte>> got(chunks.size(), std::vector<std::byte>(512 * kKiB));
  std::vector<TransferId> reads, writes;
  const auto start = now();
  for (size_t i = 0; i < chunks.size(); ++i) reads.push_back(read_chunk(*tier, chunks[i].placement, got[i]));
  for (size_t i = 0; i < 6; ++i) writes.push_back(write_chunk(*tier, chunks[i]));
  servers->by_port(victim)->kill9();
  ASSERT_TRUE(d.wait_all(reads, 3s));
  ASSERT_TRUE(d.wait_all(writes, 3s));
  size_t failed = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Driver::Done& r = d.done(reads[i]);
    EXPECT_LE(r.at - start, kTimeout + 300ms) << i;
    if (r.status.ok()) {
      EXPECT_TRUE(got[i] == chunks[i].bytes) << "chunk " << i << ": wrong bytes";
    } else {
      EXPECT_EQ(r.status.code(), Code::kIo) << r.status.what();
      ++failed;
    }
  }
  for (TransferId id : writes) {
    EXPECT_LE(d.done(id).at - start, kTimeout + 300ms);
    EXPECT_TRUE(d.done(id).status.ok() || d.done(id).status.code() == Code::kIo) << d.done(id).status.what();
  }
  const size_t victims = size_t(std::count(on_victim.begin(), on_victim.end(), true));
  std::printf("in flight at the kill: %zu of %zu reads failed (%zu on the dead master)\n", failed, chunks.size(),
              victims);

  // Afterwards, reads of the dead master's chunks fail within the deadline; the others give
  // their bytes or (once the cluster marks itself down) fail; no read hangs or lies.
  reads.clear();
  for (auto& g : got) std::fill(g.begin(), g.end(), std::byte{0});
  const auto later = now();
  for (size_t i = 0; i < chunks.size(); ++i) reads.push_back(read_chunk(*tier, chunks[i].placement, got[i]));
  ASSERT_TRUE(d.wait_all(reads, 3s));
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Driver::Done& r = d.done(reads[i]);
    EXPECT_LE(r.at - later, kTimeout + 300ms) << i;
    if (on_victim[i]) {
      EXPECT_EQ(r.status.code(), Code::kIo) << i << ": " << r.status.what();
    }
    if (r.status.ok()) {
      EXPECT_TRUE(got[i] == chunks[i].bytes) << "chunk " << i << ": wrong bytes";
    }
  }
  EXPECT_EQ(tier->in_flight(), 0u);
}

}  // namespace
}  // namespace kdn::sidecar
