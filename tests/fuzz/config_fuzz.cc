// libFuzzer harness for kdnd's configuration: any bytes as a TOML file (through a memfd, as
// `kdnd --config` reads it) and as `--set KEY=VALUE` flags. Every input must be accepted or
// refused with a message; an accepted configuration must print back (to_toml) into one that
// loads again and validates the same way.
#include <kdn/sidecar/config.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

// A path that reads back `text` (a memfd: no files left behind, nothing shared between runs).
std::string as_file(int& fd, const std::string& text) {
  fd = ::memfd_create("kdn-config-fuzz", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  if (!text.empty() && ::write(fd, text.data(), text.size()) != ssize_t(text.size())) std::abort();
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kdn::sidecar::Config;
  const std::string text(reinterpret_cast<const char*>(data), size);
  int fd = -1;
  const std::string path = as_file(fd, text);
  Config c;
  std::string error;
  const bool loaded = c.load_toml(path, &error).ok();
  ::close(fd);
  if (!loaded) require(!error.empty());  // every refusal says why
  // Every line as a flag: KEY=VALUE.
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) {
      std::string e;
      if (!c.set(line.substr(0, eq), line.substr(eq + 1), &e).ok()) require(!e.empty());
    }
    start = end + 1;
  }
  c.fill_defaults();
  std::string verr;
  if (!c.validate(&verr).ok()) return 0;
  // What validates prints as TOML that loads back to a configuration that validates too.
  Config again;
  int fd2 = -1;
  const std::string printed = c.to_toml();
  const std::string path2 = as_file(fd2, printed);
  std::string e2;
  const bool reloaded = again.load_toml(path2, &e2).ok();
  ::close(fd2);
  require(reloaded);
  again.fill_defaults();
  require(again.validate().ok());
  require(again.to_toml() == printed);
  return 0;
}
