#include "metrics_server.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/fd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <string_view>
#include <thread>
#include <vector>

namespace kdn::sidecar {

bool parse_loopback_listen(const std::string& text, std::string* host, uint16_t* port, std::string* error) {
  std::string h, p;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      *error = "'" + text + "' is not [ADDRESS]:PORT";
      return false;
    }
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos || text.find(':') != colon) {
      *error = "'" + text + "' is not HOST:PORT (write an IPv6 address as [::1]:PORT)";
      return false;
    }
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos || std::stoul(p) > 65535) {
    *error = "'" + text + "': the port must be a number from 0 to 65535";
    return false;
  }
  in_addr a4{};
  in6_addr a6{};
  const bool loopback = h == "localhost" ||
                        (inet_pton(AF_INET, h.c_str(), &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127) ||
                        (inet_pton(AF_INET6, h.c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6));
  if (!loopback) {
    *error = "'" + text +
             "': only a loopback address (127.0.0.1, [::1], localhost) is served, since the page names "
             "every namespace; scrape from another host through metrics_file and node_exporter";
    return false;
  }
  *host = h;
  *port = uint16_t(std::stoul(p));
  return true;
}

bool metrics_server_available() noexcept { return true; }

namespace {

constexpr uint64_t ns_of(std::chrono::milliseconds ms) { return uint64_t(ms.count()) * 1'000'000; }

// One client connection, from accept to close. Server thread only.
struct Connection {
  enum class State : uint8_t { kReading, kWaiting, kWriting, kDone };
  ipc::UniqueFd fd;
  State state = State::kReading;
  uint64_t accepted_ns = 0;
  uint64_t deadline_ns = 0;  // of the current state
  uint64_t wants = 0;        // kWaiting: the rendering it waits for
  bool head_only = false;    // HEAD: the headers without the body
  std::string in;            // the request so far
  std::string head;          // status line and headers
  std::shared_ptr<const std::string> body;
  size_t sent = 0;  // of head, then body
};

void signal_fd(int fd) {
  const uint64_t one = 1;
  (void)!::write(fd, &one, sizeof one);
}

bool drain_fd(int fd) {
  uint64_t n = 0;
  return ::read(fd, &n, sizeof n) == sizeof n && n > 0;
}

// The request's method and path ("GET", "/metrics"), or false if the first line is not
// "METHOD SP PATH SP HTTP/x.y".
bool parse_request_line(std::string_view request, std::string_view* method, std::string_view* path) {
  const std::string_view line = request.substr(0, request.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.substr(sp2 + 1).rfind("HTTP/1.", 0) != 0) return false;
  *method = line.substr(0, sp1);
  *path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  *path = path->substr(0, path->find('?'));
  return true;
}

// A short answer of the server's own (a scrape gets the loop's shared rendering instead).
std::shared_ptr<const std::string> short_body(const char* s) { return std::make_shared<const std::string>(s); }

}  // namespace

struct MetricsServer::Impl {
  ipc::UniqueFd listen;     // non-blocking
  ipc::UniqueFd wake;       // server -> loop: a scrape waits for a rendering
  ipc::UniqueFd published;  // loop -> server: a rendering is there
  ipc::UniqueFd stop;       // owner -> server: end
  std::mutex mu;
  uint64_t wanted = 0;                      // GUARDED_BY(mu): renderings asked for by scrapes
  uint64_t answered = 0;                    // GUARDED_BY(mu): ... and published
  std::shared_ptr<const std::string> page;  // GUARDED_BY(mu): the newest rendering
  // Relaxed: a statistic; nothing is ordered by it.
  std::atomic<uint64_t> scrapes{0};
  std::vector<Connection> conns;  // server thread only
  std::thread thread;

  void run();
  void accept_new(uint64_t now);
  void read_request(Connection& c, uint64_t now);
  void route(Connection& c, uint64_t now);
  void respond(Connection& c, uint64_t now, const char* status, std::shared_ptr<const std::string> body,
               const char* type = "text/plain; charset=utf-8");
  void write_some(Connection& c);
  void serve_published(uint64_t now);
  void expire(uint64_t now);
  int poll_timeout_ms(uint64_t now) const;
};

void MetricsServer::Impl::respond(Connection& c, uint64_t now, const char* status,
                                  std::shared_ptr<const std::string> body, const char* type) {
  c.head = std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + type +
           "\r\nContent-Length: " + std::to_string(body->size()) + "\r\nConnection: close\r\n\r\n";
  c.body = c.head_only ? nullptr : std::move(body);
  c.sent = 0;
  c.state = Connection::State::kWriting;
  c.deadline_ns = now + ns_of(kWriteTimeout);
  write_some(c);
}

void MetricsServer::Impl::route(Connection& c, uint64_t now) {
  std::string_view method, path;
  if (!parse_request_line(c.in, &method, &path))
    return respond(c, now, "400 Bad Request", short_body("not an HTTP/1.x request\n"));
  c.head_only = method == "HEAD";
  if (method != "GET" && !c.head_only)
    return respond(c, now, "405 Method Not Allowed", short_body("only GET and HEAD\n"));
  if (path == "/") return respond(c, now, "200 OK", short_body("kdnd: metrics at /metrics (Prometheus text format)\n"));
  if (path != "/metrics") return respond(c, now, "404 Not Found", short_body("not found: try /metrics\n"));
  {
    std::lock_guard lock(mu);
    c.wants = ++wanted;
  }
  c.state = Connection::State::kWaiting;
  c.deadline_ns = now + ns_of(kAnswerTimeout);
  signal_fd(wake.get());
}

void MetricsServer::Impl::read_request(Connection& c, uint64_t now) {
  char buf[kMaxRequestBytes];
  const ssize_t n = ::recv(c.fd.get(), buf, kMaxRequestBytes - c.in.size(), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    c.state = Connection::State::kDone;
    return;
  }
  c.in.append(buf, size_t(n));
  if (c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos) return route(c, now);
  if (c.in.size() >= kMaxRequestBytes)
    respond(c, now, "431 Request Header Fields Too Large", short_body("a request is at most 4 KiB\n"));
}

void MetricsServer::Impl::write_some(Connection& c) {
  iovec iov[2];
  int n = 0;
  if (c.sent < c.head.size()) iov[n++] = {c.head.data() + c.sent, c.head.size() - c.sent};
  const size_t body_sent = c.sent > c.head.size() ? c.sent - c.head.size() : 0;
  if (c.body && body_sent < c.body->size())
    iov[n++] = {const_cast<char*>(c.body->data()) + body_sent, c.body->size() - body_sent};
  if (n == 0) {
    c.state = Connection::State::kDone;
    return;
  }
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = size_t(n);
  const ssize_t w = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (w < 0) {
    c.state = Connection::State::kDone;
    return;
  }
  c.sent += size_t(w);
  if (c.sent == c.head.size() + (c.body ? c.body->size() : 0)) c.state = Connection::State::kDone;
}

void MetricsServer::Impl::serve_published(uint64_t now) {
  uint64_t done = 0;
  std::shared_ptr<const std::string> latest;
  {
    std::lock_guard lock(mu);
    done = answered;
    latest = page;
  }
  for (Connection& c : conns) {
    if (c.state != Connection::State::kWaiting || c.wants > done || !latest) continue;
    scrapes.fetch_add(1, std::memory_order_relaxed);
    respond(c, now, "200 OK", latest, "text/plain; version=0.0.4; charset=utf-8");
  }
}

// At the cap, a new connection takes the place of the oldest one still sending its request:
// real scrapes send theirs at once, so only a stalling client loses its place.
void MetricsServer::Impl::accept_new(uint64_t now) {
  for (;;) {
    ipc::UniqueFd fd(::accept4(listen.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) return;  // EAGAIN, or a connection that died meanwhile, or out of descriptors
    if (conns.size() >= kMaxConnections) {
      Connection* oldest = nullptr;
      for (Connection& c : conns)
        if (c.state == Connection::State::kReading && (!oldest || c.accepted_ns < oldest->accepted_ns)) oldest = &c;
      if (!oldest) continue;  // every place serves a request: this one is closed
      conns.erase(conns.begin() + (oldest - conns.data()));
    }
    Connection c;
    c.fd = std::move(fd);
    c.accepted_ns = now;
    c.deadline_ns = now + ns_of(kReadTimeout);
    try {
      conns.push_back(std::move(c));
    } catch (const std::bad_alloc&) {  // closed, as at the cap
    }
  }
}

void MetricsServer::Impl::expire(uint64_t now) {
  for (Connection& c : conns) {
    if (c.state == Connection::State::kDone || now < c.deadline_ns) continue;
    if (c.state == Connection::State::kWaiting)
      respond(c, now, "503 Service Unavailable", short_body("kdnd's event loop did not answer within 2 s\n"));
    else
      c.state = Connection::State::kDone;  // a request or an answer that did not move in time
  }
}

int MetricsServer::Impl::poll_timeout_ms(uint64_t now) const {
  uint64_t next = UINT64_MAX;
  for (const Connection& c : conns) next = std::min(next, c.deadline_ns);
  if (next == UINT64_MAX) return -1;
  return next <= now ? 0 : int((next - now + 999'999) / 1'000'000);
}

void MetricsServer::Impl::run() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({stop.get(), POLLIN, 0});
    fds.push_back({published.get(), POLLIN, 0});
    fds.push_back({listen.get(), POLLIN, 0});
    for (const Connection& c : conns) {
      const short ev = c.state == Connection::State::kReading   ? POLLIN
                       : c.state == Connection::State::kWriting ? POLLOUT
                                                                : 0;  // waiting: only a hang-up
      fds.push_back({c.fd.get(), ev, 0});
    }
    const int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(now_ns()));
    if (rc < 0 && errno != EINTR) return;
    const uint64_t now = now_ns();
    if (fds[0].revents) return;
    if (fds[1].revents && drain_fd(published.get())) serve_published(now);
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = conns[i];
      const short re = fds[3 + i].revents;
      if (re == 0) continue;
      if (c.state == Connection::State::kReading)
        read_request(c, now);
      else if (c.state == Connection::State::kWriting)
        write_some(c);
      else if (re & (POLLHUP | POLLERR))
        c.state = Connection::State::kDone;  // gone while it waited
    }
    expire(now);
    std::erase_if(conns, [](const Connection& c) { return c.state == Connection::State::kDone; });
    if (fds[2].revents) accept_new(now);
  }
}

namespace {

// Binds and listens on the first address of host:port that takes it; errno's sentence if none.
Result<ipc::UniqueFd> listen_on(const std::string& host, uint16_t port, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    *why = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    return Status(Code::kUnavailable, "metrics_listen: cannot resolve");
  }
  *why = "no address";
  ipc::UniqueFd bound;
  for (addrinfo* a = res; a != nullptr && !bound; a = a->ai_next) {
    ipc::UniqueFd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    int one = 1;
    // SO_REUSEADDR only (no SO_REUSEPORT): a second kdnd on the same port must fail to
    // start, not share the scrapes with the first.
    if (s) (void)setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (!s || ::bind(s.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(s.get(), 64) != 0) {
      *why = std::strerror(errno);
      if (errno == EADDRINUSE) *why += " (another process listens on this port)";
      continue;
    }
    bound = std::move(s);
  }
  freeaddrinfo(res);
  if (!bound) return Status(Code::kUnavailable, "metrics_listen: cannot listen");
  return bound;
}

uint16_t bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

}  // namespace

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& listen, std::string* error) noexcept {
  std::string host;
  uint16_t port = 0;
  if (!parse_loopback_listen(listen, &host, &port, error)) {
    *error = "metrics_listen = " + *error;
    return Status(Code::kInvalidArgument, "metrics_listen: not a loopback HOST:PORT");
  }
  std::unique_ptr<MetricsServer> s(new (std::nothrow) MetricsServer());
  if (!s) return Status(Code::kNoMemory, "metrics server");
  try {
    s->impl_ = std::make_unique<Impl>();
    s->host_ = host;
    Impl& m = *s->impl_;
    m.wake.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    m.published.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    m.stop.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!m.wake || !m.published || !m.stop) return Status::from_errno("metrics_listen: eventfd", errno);
    std::string why;
    auto l = listen_on(host, port, &why);
    if (!l.ok()) {
      *error = "metrics_listen = '" + listen + "': cannot listen on " + host + ":" + std::to_string(port) + ": " + why;
      return l.status();
    }
    m.listen = std::move(*l);
    s->port_ = bound_port(m.listen.get());
    m.conns.reserve(kMaxConnections);
    m.thread = std::thread([&m] { m.run(); });
    (void)pthread_setname_np(m.thread.native_handle(), "kdnd-metrics");
  } catch (const std::exception& e) {
    *error = std::string("metrics_listen: ") + e.what();
    return Status(Code::kNoMemory, "metrics server");
  }
  return s;
}

MetricsServer::~MetricsServer() {
  if (!impl_) return;
  if (impl_->stop) signal_fd(impl_->stop.get());
  if (impl_->thread.joinable()) impl_->thread.join();
}

int MetricsServer::wake_fd() const noexcept { return impl_->wake.get(); }

bool MetricsServer::consume_request() noexcept { return drain_fd(impl_->wake.get()); }

void MetricsServer::publish(std::string text) {
  auto page = std::make_shared<const std::string>(std::move(text));
  {
    std::lock_guard lock(impl_->mu);
    impl_->page = std::move(page);
    impl_->answered = impl_->wanted;
  }
  signal_fd(impl_->published.get());
}

uint64_t MetricsServer::scrapes() const noexcept { return impl_->scrapes.load(std::memory_order_relaxed); }

}  // namespace kdn::sidecar
