// RedisCluster (redis_conn.h): routing, redirects, slot map refreshes and the epoll set.
#include "redis_conn.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace kdn::sidecar {

struct RedisCluster::Member {
  std::unique_ptr<RedisConn> conn;
  // What the epoll set holds for it.
  int fd = -1;
  uint64_t generation = 0;
  uint32_t events = 0;
};

Result<std::unique_ptr<RedisCluster>> RedisCluster::create(RedisClusterOptions options) noexcept {
  if (options.seeds.empty()) return Status(Code::kInvalidArgument, "redis: no seed node");
  if (options.pool_size == 0) return Status(Code::kInvalidArgument, "redis: pool size must be at least 1");
  if (options.cluster && !options.unix_path.empty()) {
    return Status(Code::kInvalidArgument, "redis: a Unix socket is for a standalone server");
  }
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) return Status::from_errno("epoll_create1", errno);
  return std::unique_ptr<RedisCluster>(new RedisCluster(std::move(options), ep));
}

RedisCluster::RedisCluster(RedisClusterOptions options, int epoll_fd)
    : options_(std::move(options)), epoll_fd_(epoll_fd) {
  if (!options_.cluster) map_ = SlotMap::single(options_.seeds.front());
  resp::append_command(refresh_request_.command, std::vector<std::string_view>{"CLUSTER", "SLOTS"});
}

RedisCluster::~RedisCluster() {
  closing_ = true;
  pools_.clear();  // every request in flight completes with kUnavailable
  release_parked(now_, Status(Code::kUnavailable, "redis client closed"));
  close(epoll_fd_);
}

// ---- routing -------------------------------------------------------------------------------

void RedisCluster::submit(RedisRequest* r, std::string_view key, RedisClock::time_point now) noexcept {
  now_ = now;
  if (closing_) return finish(*r, Status(Code::kUnavailable, "redis client closed"), nullptr);
  r->slot = key_slot(key);
  r->redirects = 0;
  r->asking = false;
  route(r, now);
  maybe_refresh(now);
  sync_epoll();
}

void RedisCluster::route(RedisRequest* r, RedisClock::time_point now) noexcept {
  if (!map_) {
    parked_.push_back(r);
    want_refresh();
    return;
  }
  uint16_t owner = map_->owner(r->slot);
  if (owner == SlotMap::kNoOwner) {
    want_refresh();
    return finish(*r, Status(Code::kUnavailable, "redis: no node serves the key's slot"), nullptr);
  }
  send_to(map_->masters()[owner], r, now);
}

void RedisCluster::send_to(const NodeAddress& node, RedisRequest* r, RedisClock::time_point now) noexcept {
  Pool& pool = pool_for(node);
  Member* best = pool.members.front().get();
  for (auto& m : pool.members) {
    if (m->conn->queued() < best->conn->queued()) best = m.get();
  }
  best->conn->submit(r, now);
}

RedisCluster::Pool& RedisCluster::pool_for(const NodeAddress& node) {
  for (auto& p : pools_) {
    if (p->node == node) return *p;
  }
  auto pool = std::make_unique<Pool>();
  pool->node = node;
  RedisEndpoint endpoint{node, options_.cluster ? std::string() : options_.unix_path};
  for (uint32_t i = 0; i < options_.pool_size; ++i) {
    auto m = std::make_unique<Member>();
    m->conn = std::make_unique<RedisConn>(endpoint, options_.conn, static_cast<ReplyHandler*>(this));
    pool->members.push_back(std::move(m));
  }
  pools_.push_back(std::move(pool));
  return *pools_.back();
}

// ---- completions and redirects -------------------------------------------------------------

void RedisCluster::on_reply(RedisRequest& r, Status status, const resp::Reply* reply) noexcept {
  if (&r == &refresh_request_) return refresh_done(status, reply);
  if (closing_) return finish(r, status, reply);
  if (!status.ok()) {
    // A node that fails or stalls may have lost its slots to a replica.
    if (options_.cluster && status.code() != Code::kPermission) want_refresh();
    return finish(r, status, nullptr);
  }
  if (options_.cluster && reply->is_error() && follow_redirect(r, *reply)) return;
  finish(r, status, reply);
}

// True if `reply` was a redirect and `r` went on (or failed for too many redirects).
bool RedisCluster::follow_redirect(RedisRequest& r, const resp::Reply& reply) noexcept {
  std::optional<Redirect> to = parse_redirect(reply.status_text());
  if (!to) return false;
  if (r.redirects >= options_.max_redirects) {
    finish(r, Status(Code::kUnavailable, "redis: too many redirects"), nullptr);
    return true;
  }
  ++r.redirects;
  ++redirects_;
  if (to->kind == Redirect::Kind::kMoved) {
    map_->assign(to->slot, to->node);
    want_refresh();
  }
  r.asking = to->kind == Redirect::Kind::kAsk;
  send_to(to->node, &r, now_);
  return true;
}

void RedisCluster::finish(RedisRequest& r, Status status, const resp::Reply* reply) noexcept {
  if (r.done) r.done(r, status, status.ok() ? reply : nullptr);
}

// ---- the slot map --------------------------------------------------------------------------

void RedisCluster::replace_slot_map(SlotMap map) noexcept { map_ = std::move(map); }

// Asks one node for CLUSTER SLOTS if a refresh is wanted and none ran within the interval.
// Nodes are tried in turn, starting after the last that failed, skipping any backing off.
void RedisCluster::maybe_refresh(RedisClock::time_point now) noexcept {
  if (!options_.cluster || refresh_in_flight_ || !refresh_wanted_) return;
  if (refreshes_ > 0 && now < last_refresh_ + options_.refresh_interval) return;
  std::vector<NodeAddress> candidates = options_.seeds;
  if (map_) candidates.insert(candidates.begin(), map_->masters().begin(), map_->masters().end());
  const NodeAddress* target = &candidates[refresh_rotation_ % candidates.size()];
  for (size_t k = 0; k < candidates.size(); ++k) {
    const NodeAddress& c = candidates[(refresh_rotation_ + k) % candidates.size()];
    if (pool_for(c).members.front()->conn->state() != RedisConn::State::kBackoff) {
      target = &c;
      refresh_rotation_ += k;
      break;
    }
  }
  refresh_wanted_ = false;
  refresh_in_flight_ = true;
  last_refresh_ = now;
  refresh_target_ = *target;
  refresh_request_.deadline = now + options_.refresh_timeout;
  refresh_request_.asking = false;
  send_to(refresh_target_, &refresh_request_, now);
}

void RedisCluster::refresh_done(Status status, const resp::Reply* reply) noexcept {
  refresh_in_flight_ = false;
  ++refreshes_;
  if (closing_) return;
  Result<SlotMap> map = status.ok() ? SlotMap::from_cluster_slots(*reply, refresh_target_) : Result<SlotMap>(status);
  if (!map.ok()) {
    // A node that answered and refused is a configuration error: requests waiting for the
    // first map fail now. One that did not answer is tried again (another node, after the
    // interval) while they wait for their deadline.
    bool answered = status.ok();
    refresh_status_ = answered && map.status().code() == Code::kUnavailable
                          ? Status(Code::kUnavailable, "redis: CLUSTER SLOTS refused (not a cluster node?)")
                          : map.status();
    ++refresh_rotation_;
    want_refresh();
    if (!map_ && answered) release_parked(now_, refresh_status_);
    return;
  }
  refresh_status_ = OkStatus();
  map_ = std::move(map).value();
  release_parked(now_, OkStatus());
}

// Routes the requests that waited for a slot map, or fails them with `failure`.
void RedisCluster::release_parked(RedisClock::time_point now, Status failure) noexcept {
  std::deque<RedisRequest*> parked;
  parked.swap(parked_);
  for (RedisRequest* r : parked) {
    if (failure.ok()) {
      route(r, now);
    } else {
      finish(*r, failure, nullptr);
    }
  }
}

void RedisCluster::expire_parked(RedisClock::time_point now) noexcept {
  std::vector<RedisRequest*> expired;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if ((*it)->deadline <= now) {
      expired.push_back(*it);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  for (RedisRequest* r : expired) finish(*r, Status(Code::kTimeout, "redis: no slot map before the deadline"), nullptr);
}

// ---- the event loop ------------------------------------------------------------------------

void RedisCluster::poll(RedisClock::time_point now) noexcept {
  now_ = now;
  epoll_event events[64];
  int n = epoll_wait(epoll_fd_, events, 64, 0);
  for (int i = 0; i < n; ++i) {
    auto* m = static_cast<Member*>(events[i].data.ptr);
    uint32_t ev = events[i].events;
    if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)) m->conn->on_writable(now);
    if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) m->conn->on_readable(now);
  }
  for (auto& p : pools_) {
    for (auto& m : p->members) m->conn->on_timer(now);
  }
  expire_parked(now);
  maybe_refresh(now);
  sync_epoll();
}

RedisClock::time_point RedisCluster::next_deadline() const noexcept {
  RedisClock::time_point t = RedisClock::time_point::max();
  for (const auto& p : pools_) {
    for (const auto& m : p->members) t = std::min(t, m->conn->next_deadline());
  }
  for (const RedisRequest* r : parked_) t = std::min(t, r->deadline);
  if (refresh_wanted_ && !refresh_in_flight_) t = std::min(t, last_refresh_ + options_.refresh_interval);
  return t;
}

// Brings the epoll set in line with each connection's socket and wanted events. A closed
// socket left the set by itself; a new one (even under a reused number) is added.
void RedisCluster::sync_epoll() noexcept {
  for (auto& p : pools_) {
    for (auto& m : p->members) {
      int fd = m->conn->fd();
      uint32_t events = m->conn->events();
      if (fd < 0) {
        m->fd = -1;
        continue;
      }
      bool fresh = fd != m->fd || m->conn->socket_generation() != m->generation;
      if (!fresh && events == m->events) continue;
      epoll_event ev{};
      ev.events = events;
      ev.data.ptr = m.get();
      if (fresh) {
        if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0 && errno == EEXIST)
          epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
      } else {
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
      }
      m->fd = fd;
      m->generation = m->conn->socket_generation();
      m->events = events;
    }
  }
}

}  // namespace kdn::sidecar
