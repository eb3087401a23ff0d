// The documents the llama.cpp benches prefill: by default every license text Debian installs
// (base-files), a long real document on any machine.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kdn::bench {

inline std::vector<std::string> default_documents() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses", ec))
    if (e.is_regular_file() && !e.is_symlink()) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The files' texts, in order, separated by a blank line.
inline std::string read_documents(const std::vector<std::string>& paths) {
  std::string text;
  for (const std::string& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!text.empty()) text += "\n\n";
    text += ss.str();
  }
  return text;
}

}  // namespace kdn::bench
