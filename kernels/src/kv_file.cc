// Canonical KV chunk files (STEM.kv + STEM.json); see kdn/kernels/kv_file.h and docs/kernels.md.
#include <kdn/kernels/kv_file.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace kdn::kernels {
namespace {

constexpr const char* kFormat = "kdn-kv-chunk";
constexpr int kVersion = 1;
constexpr size_t kMaxJsonBytes = 64 * 1024;

Status corrupt(const char* what) { return Status(Code::kCorrupt, what); }

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      return "f32";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
  }
  return "?";
}

bool dtype_from_name(const std::string& s, DType* out) {
  for (DType t : {DType::kF16, DType::kBF16, DType::kF32, DType::kFP8E4M3}) {
    if (s == dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

Status read_small_file(const std::string& path, std::string* out) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno("open kv json", errno);
  char buf[4096];
  Status st;
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) st = Status::from_errno("read kv json", errno);
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > kMaxJsonBytes) {
      st = corrupt("kv json: larger than 64 KiB");
      break;
    }
  }
  close(fd);
  return st;
}

Status write_all(const std::string& path, const void* data, size_t bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::from_errno("open kv file for writing", errno);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return Status::from_errno("write kv file", err);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return close(fd) == 0 ? OkStatus() : Status::from_errno("close kv file", errno);
}

// Fills info from the parsed sidecar; every field is checked for type and range.
Status parse_info(const nlohmann::json& j, KvFileInfo* info) {
  if (!j.is_object()) return corrupt("kv json: not an object");
  if (j.value("format", std::string()) != kFormat) return corrupt("kv json: format is not kdn-kv-chunk");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int64_t>() != kVersion) {
    return Status(Code::kVersion, "kv json: unsupported version");
  }
  uint32_t* dims[] = {&info->geo.layers, &info->geo.kv_heads, &info->geo.head_dim, &info->geo.tokens};
  const char* names[] = {"layers", "kv_heads", "head_dim", "tokens"};
  for (int i = 0; i < 4; ++i) {
    const auto it = j.find(names[i]);
    if (it == j.end() || !it->is_number_unsigned() || it->get<uint64_t>() > UINT32_MAX) {
      return corrupt("kv json: geometry field missing or not an unsigned integer");
    }
    *dims[i] = static_cast<uint32_t>(it->get<uint64_t>());
  }
  if (!j.contains("dtype") || !j["dtype"].is_string() ||
      !dtype_from_name(j["dtype"].get<std::string>(), &info->geo.dtype)) {
    return corrupt("kv json: unknown dtype");
  }
  if (j.contains("model") && j["model"].is_string()) info->model = j["model"].get<std::string>();
  if (j.contains("first_position") && j["first_position"].is_number_integer()) {
    info->first_position = j["first_position"].get<int64_t>();
  }
  const Status st = validate_geometry(info->geo);
  return st.ok() ? OkStatus() : corrupt("kv json: geometry out of range");
}

}  // namespace

Result<KvFileInfo> read_kv_file_info(const std::string& json_path) noexcept {
  try {
    if (!ends_with(json_path, ".json")) return Status(Code::kInvalidArgument, "kv json: path must end in .json");
    std::string text;
    KDN_RETURN_IF_ERROR(read_small_file(json_path, &text));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return corrupt("kv json: not valid JSON");
    KvFileInfo info;
    KDN_RETURN_IF_ERROR(parse_info(j, &info));
    info.json_path = json_path;
    info.kv_path = json_path.substr(0, json_path.size() - 5) + ".kv";
    struct stat sb;
    if (stat(info.kv_path.c_str(), &sb) != 0) return Status::from_errno("stat kv file", errno);
    if (static_cast<uint64_t>(sb.st_size) != chunk_bytes(info.geo))
      return corrupt("kv file: size differs from the json geometry");
    return info;
  } catch (...) {
    return Status(Code::kNoMemory, "kv json: allocation failed");
  }
}

Status read_kv_file(const KvFileInfo& info, void* buf, size_t cap) noexcept {
  const uint64_t bytes = chunk_bytes(info.geo);
  if (buf == nullptr || cap < bytes) return Status(Code::kInvalidArgument, "read_kv_file: buffer too small");
  const int fd = open(info.kv_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno("open kv file", errno);
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = pread(fd, static_cast<char*>(buf) + done, bytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      close(fd);
      return err ? Status::from_errno("read kv file", err) : corrupt("kv file: shorter than its json says");
    }
    done += static_cast<uint64_t>(n);
  }
  close(fd);
  return OkStatus();
}

Status write_kv_file(const std::string& stem, const ChunkGeometry& geo, const void* chunk, const std::string& model,
                     int64_t first_position) noexcept {
  try {
    KDN_RETURN_IF_ERROR(validate_geometry(geo));
    if (chunk == nullptr) return Status(Code::kInvalidArgument, "write_kv_file: null chunk");
    nlohmann::json j = {{"format", kFormat},
                        {"version", kVersion},
                        {"layers", geo.layers},
                        {"kv_heads", geo.kv_heads},
                        {"head_dim", geo.head_dim},
                        {"tokens", geo.tokens},
                        {"dtype", dtype_name(geo.dtype)},
                        {"model", model},
                        {"first_position", first_position}};
    KDN_RETURN_IF_ERROR(write_all(stem + ".kv", chunk, chunk_bytes(geo)));
    const std::string text = j.dump(2) + "\n";
    return write_all(stem + ".json", text.data(), text.size());
  } catch (...) {
    return Status(Code::kNoMemory, "write_kv_file: allocation failed");
  }
}

Result<std::vector<KvFileInfo>> list_kv_dir(const std::string& dir, size_t* skipped) noexcept {
  try {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return Status::from_errno("open kv dir", errno);
    std::vector<std::string> jsons;
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (ends_with(name, ".json")) jsons.push_back(dir + "/" + name);
    }
    closedir(d);
    std::sort(jsons.begin(), jsons.end());
    std::vector<KvFileInfo> out;
    size_t bad = 0;
    for (const std::string& path : jsons) {
      Result<KvFileInfo> info = read_kv_file_info(path);
      if (info.ok()) {
        out.push_back(std::move(*info));
      } else {
        ++bad;
      }
    }
    if (skipped) *skipped = bad;
    return out;
  } catch (...) {
    return Status(Code::kNoMemory, "list_kv_dir: allocation failed");
  }
}

}  // namespace kdn::kernels
