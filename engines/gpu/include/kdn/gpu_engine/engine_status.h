// EngineStatus: kdn-gpu-engine's error value. A kdn_status code plus a message that names the
// failing call and, for CUDA, the driver's words ("cudaIpcGetMemHandle: invalid argument").
// Success holds an empty message and never allocates.
#pragma once

#include <kdn/kdn.h>

#include <string>
#include <utility>

namespace kdn::gpu_engine {

class [[nodiscard]] EngineStatus {
 public:
  EngineStatus() = default;
  EngineStatus(int code, std::string message) : code_(code), message_(std::move(message)) {}
  // A libkdn call's return value; ok for KDN_OK.
  static EngineStatus from_kdn(int rc, const char* call) {
    if (rc == KDN_OK) return {};
    return {rc, std::string(call) + ": " + kdn_strerror(rc)};
  }
  bool ok() const noexcept { return code_ == KDN_OK; }
  int code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }

 private:
  int code_ = KDN_OK;
  std::string message_;
};

}  // namespace kdn::gpu_engine
