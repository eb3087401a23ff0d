#include "blob_pipeline.h"

#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

namespace kdn::llama {
namespace {

Status run_sequential(uint32_t n, std::vector<uint8_t>& buffer, const BlobBuilder& build,
                      const BlobConsumer& consume) noexcept {
  for (uint32_t i = 0; i < n; ++i) {
    KDN_RETURN_IF_ERROR(build(i, buffer));
    KDN_RETURN_IF_ERROR(consume(i, buffer));
  }
  return OkStatus();
}

// Hand-over state of the two buffers, guarded by `mu`.
struct Handover {
  std::mutex mu;
  std::condition_variable cv;
  bool full[2] = {false, false};  // built and not yet consumed
  Status built[2];                // the builder's result for the blob in each buffer
  bool stop = false;              // the consumer gave up: the builder must not go on
};

void builder_loop(uint32_t n, std::vector<uint8_t> (&buffers)[2], const BlobBuilder& build, Handover& h) {
  for (uint32_t i = 0; i < n; ++i) {
    const int b = i & 1;
    {
      std::unique_lock<std::mutex> lock(h.mu);
      h.cv.wait(lock, [&] { return h.stop || !h.full[b]; });
      if (h.stop) return;
    }
    const Status st = build(i, buffers[b]);
    {
      std::lock_guard<std::mutex> lock(h.mu);
      h.built[b] = st;
      h.full[b] = true;
    }
    h.cv.notify_all();
    if (!st.ok()) return;
  }
}

Status consumer_loop(uint32_t n, std::vector<uint8_t> (&buffers)[2], const BlobConsumer& consume, Handover& h) {
  Status result;
  for (uint32_t i = 0; i < n && result.ok(); ++i) {
    const int b = i & 1;
    {
      std::unique_lock<std::mutex> lock(h.mu);
      h.cv.wait(lock, [&] { return h.full[b]; });
      result = h.built[b];
    }
    if (result.ok()) result = consume(i, buffers[b]);
    {
      std::lock_guard<std::mutex> lock(h.mu);
      h.full[b] = false;
    }
    h.cv.notify_all();
  }
  return result;
}

}  // namespace

Status run_blob_pipeline(uint32_t n, std::vector<uint8_t> (&buffers)[2], const BlobBuilder& build,
                         const BlobConsumer& consume) noexcept {
  if (n <= 1) return run_sequential(n, buffers[0], build, consume);
  Handover h;
  std::thread builder;
  try {
    builder = std::thread(builder_loop, n, std::ref(buffers), std::cref(build), std::ref(h));
  } catch (const std::system_error&) {
    return run_sequential(n, buffers[0], build, consume);
  }
  const Status result = consumer_loop(n, buffers, consume, h);
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.stop = true;
  }
  h.cv.notify_all();
  builder.join();
  return result;
}

}  // namespace kdn::llama
