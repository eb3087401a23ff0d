#include "metrics_server.h"

#include <kdn/ipc/fd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#if KDN_HAVE_HTTPLIB
#include <httplib.h>
#endif

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
    *error = "'" + text + "': only a loopback address (127.0.0.1, [::1], localhost) is served, since the page names "
             "every namespace; scrape from another host through metrics_file and node_exporter";
    return false;
  }
  *host = h;
  *port = uint16_t(std::stoul(p));
  return true;
}

bool metrics_server_available() noexcept { return KDN_HAVE_HTTPLIB != 0; }

struct MetricsServer::Impl {
  ipc::UniqueFd wake;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t wanted = 0, answered = 0;  // renderings asked for by scrapes, and published
  std::string text;
  bool stopping = false;
  std::atomic<uint64_t> scrapes{0};
#if KDN_HAVE_HTTPLIB
  httplib::Server http;
  std::thread thread;
#endif
};

namespace {

// Why `host:port` cannot be bound (cpp-httplib says only that it failed).
std::string bind_error(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
  std::string why = "unknown cause";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    ipc::UniqueFd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s) {
      why = std::strerror(errno);
      continue;
    }
    int one = 1;
    (void)setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
      if (errno == EADDRINUSE) why += " (another process listens on this port)";
      continue;
    }
    if (::listen(s.get(), 16) != 0) why = std::strerror(errno);
  }
  freeaddrinfo(res);
  return why;
}

#if KDN_HAVE_HTTPLIB
// httplib's stop() does nothing until its thread has entered the accept loop, and the loop
// never ends after a stop it missed: a start-up error right after start() would leave kdnd's
// exit waiting forever on a thread still serving the port. So start() returns only once the
// thread serves (microseconds); false if it gave up first (the thread has then ended).
bool wait_until_serving(httplib::Server& http) {
  for (int i = 0; i < 5000 && !http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return http.is_running();
}
#endif

}  // namespace

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& listen, std::string* error) noexcept {
  std::string host;
  uint16_t port = 0;
  if (!parse_loopback_listen(listen, &host, &port, error)) {
    *error = "metrics_listen = " + *error;
    return Status(Code::kInvalidArgument, "metrics_listen: not a loopback HOST:PORT");
  }
#if !KDN_HAVE_HTTPLIB
  (void)port;
  *error = "metrics_listen = '" + listen +
           "': this kdnd was built without cpp-httplib (libcpp-httplib-dev); use metrics_file instead";
  return Status(Code::kUnsupported, "metrics_listen: built without cpp-httplib");
#else
  std::unique_ptr<MetricsServer> s(new (std::nothrow) MetricsServer());
  if (!s) return Status(Code::kNoMemory, "metrics server");
  try {
    s->impl_ = std::make_unique<Impl>();
    s->host_ = host;
    Impl& m = *s->impl_;
    m.wake.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!m.wake) return Status::from_errno("metrics_listen: eventfd", errno);
    m.http.new_task_queue = [] { return new httplib::ThreadPool(1); };  // scrapes are rare
    // Not httplib's default, which adds SO_REUSEPORT: a second kdnd on the same port must fail
    // to start, not share the scrapes with the first.
    m.http.set_socket_options([](int sock) {
      int one = 1;
      (void)setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    });
    m.http.set_read_timeout(5, 0);
    m.http.set_write_timeout(5, 0);
    m.http.set_payload_max_length(4096);
    MetricsServer* self = s.get();
    m.http.Get("/metrics", [self](const httplib::Request&, httplib::Response& res) {
      std::string text;
      if (!self->render(&text)) {
        res.status = 503;
        res.set_content("kdnd's event loop did not answer within 2 s\n", "text/plain; charset=utf-8");
        return;
      }
      self->impl_->scrapes.fetch_add(1, std::memory_order_relaxed);
      res.set_content(std::move(text), "text/plain; version=0.0.4; charset=utf-8");
    });
    m.http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("kdnd: metrics at /metrics (Prometheus text format)\n", "text/plain; charset=utf-8");
    });
    int bound = port;
    if (port == 0) bound = m.http.bind_to_any_port(host);
    else if (!m.http.bind_to_port(host, port)) bound = -1;
    if (bound <= 0) {
      *error = "metrics_listen = '" + listen + "': cannot listen on " + host + ":" + std::to_string(port) + ": " +
               bind_error(host, port);
      return Status(Code::kUnavailable, "metrics_listen: cannot listen");
    }
    s->port_ = uint16_t(bound);
    m.thread = std::thread([&m] { m.http.listen_after_bind(); });
    if (!wait_until_serving(m.http)) {
      *error = "metrics_listen = '" + listen + "': the server thread did not start";
      return Status(Code::kUnavailable, "metrics_listen: the server thread did not start");
    }
  } catch (const std::exception& e) {
    *error = std::string("metrics_listen: ") + e.what();
    return Status(Code::kNoMemory, "metrics server");
  }
  return s;
#endif
}

MetricsServer::~MetricsServer() {
  if (!impl_) return;
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
#if KDN_HAVE_HTTPLIB
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
#endif
}

int MetricsServer::wake_fd() const noexcept { return impl_->wake.get(); }

bool MetricsServer::consume_request() noexcept {
  uint64_t n = 0;
  return ::read(impl_->wake.get(), &n, sizeof n) == sizeof n && n > 0;
}

void MetricsServer::publish(std::string text) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->text = std::move(text);
    impl_->answered = impl_->wanted;
  }
  impl_->cv.notify_all();
}

uint64_t MetricsServer::scrapes() const noexcept { return impl_->scrapes.load(std::memory_order_relaxed); }

bool MetricsServer::render(std::string* text) {
  std::unique_lock lock(impl_->mu);
  const uint64_t mine = ++impl_->wanted;
  const uint64_t one = 1;
  (void)!::write(impl_->wake.get(), &one, sizeof one);
  if (!impl_->cv.wait_for(lock, kAnswerTimeout, [&] { return impl_->answered >= mine || impl_->stopping; }))
    return false;
  if (impl_->answered < mine) return false;
  *text = impl_->text;
  return true;
}

}  // namespace kdn::sidecar
