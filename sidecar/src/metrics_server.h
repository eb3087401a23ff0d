// MetricsServer: kdnd's Prometheus endpoint (`metrics_listen = "127.0.0.1:9464"`, off by
// default). A small HTTP/1.x server on a thread of its own answers `GET /metrics` with the
// same exposition text as the metrics file and `kdnctl stats --prometheus`.
//
// The counters belong to the event loop, which is the only thread that reads them: a scrape
// asks the loop for a rendering through an eventfd the loop polls (`wake_fd()`), and the loop
// answers with `publish()` on its next turn (microseconds when busy, an epoll wake-up when
// idle). The rendering is a snapshot, shared read-only by every scrape that asked for it, so a
// scraper that reads slowly holds up no one. A scrape the loop does not answer within
// `kAnswerTimeout` gets 503, never a stale or half-built page.
//
// Anyone on the node can connect, so the server assumes a hostile peer: one thread polls every
// connection (none can block another), a request must arrive whole within `kReadTimeout` of
// the connection (a client trickling bytes is cut off, however steady), the answer must be
// taken within `kWriteTimeout`, a request is at most `kMaxRequestBytes`, and at most
// `kMaxConnections` connections are open at once — a new one then displaces the oldest that
// has not sent its request yet, so idle connections can neither lock out a real scrape nor
// spend the descriptors kdnd's engine sessions need.
//
// Only loopback addresses are served: the page names every namespace. A remote Prometheus
// scrapes through node_exporter's textfile collector (`metrics_file`) or a proxy on the node.
//
// Ownership: owns its thread, its sockets and its eventfds. Thread safety: `publish()`,
// `wake_fd()` and `consume_request()` from the loop; the rest from the thread that owns the
// server.
#pragma once

#include <kdn/common/status.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace kdn::sidecar {

// "host:port" or "[v6]:port" -> host and port; false with a sentence in *error otherwise.
// The host must be a loopback address (127.0.0.0/8, ::1 or "localhost").
bool parse_loopback_listen(const std::string& text, std::string* host, uint16_t* port, std::string* error);

// True if this kdnd serves metrics_listen (always: the server is kdnd's own).
bool metrics_server_available() noexcept;

class MetricsServer {
 public:
  static constexpr std::chrono::milliseconds kAnswerTimeout{2000};
  static constexpr std::chrono::milliseconds kReadTimeout{2000};
  static constexpr std::chrono::milliseconds kWriteTimeout{5000};
  static constexpr size_t kMaxRequestBytes = 4096;
  static constexpr size_t kMaxConnections = 16;

  // Binds `listen` ("127.0.0.1:PORT"; PORT 0 picks a free one, see port()) and starts serving.
  // Errors: a sentence naming the address and the cause in *error.
  static Result<std::unique_ptr<MetricsServer>> start(const std::string& listen, std::string* error) noexcept;
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  uint16_t port() const noexcept { return port_; }
  const std::string& host() const noexcept { return host_; }
  // Readable when a scrape waits for a rendering. The loop drains it (consume_request()).
  int wake_fd() const noexcept;
  // The loop: true (and the fd drained) if a scrape is waiting for publish().
  bool consume_request() noexcept;
  // The loop: hands the current rendering to every waiting scrape.
  void publish(std::string text);
  uint64_t scrapes() const noexcept;  // answered with 200

 private:
  struct Impl;
  MetricsServer() = default;

  std::unique_ptr<Impl> impl_;
  std::string host_;
  uint16_t port_ = 0;
};

}  // namespace kdn::sidecar
