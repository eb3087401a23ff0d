// kdn-llama processes sharing KV through a real kdnd: a process reuses another's chunks for
// every hit length and answers exactly as without a cache; with kdnd down, or with garbage
// chunks stored under the prompt's keys by a faulty engine, it falls back to a full prefill
// with the same answer. In RAG mode a process reuses the passages another one stored, in
// another order.
#include "llama_test_util.h"

#include <kdn/llama/kdn_chunk_cache.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace kdn::llama {
namespace {

using Json = nlohmann::json;
using testing::kTestChunk;
using testing::read_document;

constexpr const char* kQuestionA = "What is this document about?";
constexpr const char* kQuestionB = "Who may copy it?";

// Runs a command line, returns its stdout (and fails the test on a non-zero exit).
std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  EXPECT_EQ(status, 0) << cmd;
  return out;
}

class CrossProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kdn-llama-xproc-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    socket_ = (dir_ / "kdnd.sock").string();
    start_kdnd();
  }
  void TearDown() override {
    stop_kdnd();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void start_kdnd() {
    kdnd_ = fork();
    ASSERT_GE(kdnd_, 0);
    if (kdnd_ == 0) {
      const std::string log = (dir_ / "kdnd.log").string();
      freopen(log.c_str(), "w", stdout);
      freopen(log.c_str(), "w", stderr);
      execl(KDN_LLAMA_TEST_KDND, KDN_LLAMA_TEST_KDND, "--socket", socket_.c_str(), "--host-arena-bytes", "256M",
            "--log-level", "warn", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Ready when a client can connect.
    for (int i = 0; i < 500; ++i) {
      kdn_connect_opts o{};
      o.struct_size = sizeof o;
      o.socket_path = socket_.c_str();
      kdn_client* c = nullptr;
      if (kdn_connect(&o, &c) == KDN_OK) {
        kdn_disconnect(c);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL() << "kdnd did not come up";
  }
  void stop_kdnd() {
    if (kdnd_ <= 0) return;
    kill(kdnd_, SIGTERM);
    int st = 0;
    waitpid(kdnd_, &st, 0);
    kdnd_ = -1;
  }

  // One kdn-llama process; its JSON report.
  Json ask(const char* question, uint32_t context, const std::string& extra = "") {
    const std::string cmd = std::string(KDN_LLAMA_TEST_CLI) + " --json --threads 1 --n-predict 32 --ctx 1024" +
                            " --chunk-tokens " + std::to_string(kTestChunk) + " --model " + KDN_LLAMA_TEST_MODEL +
                            " --prompt-file " + KDN_LLAMA_TEST_DOC + " --context-tokens " + std::to_string(context) +
                            " --socket " + socket_ + " --question '" + question + "' " + extra;
    Json j = Json::parse(run_command(cmd), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << cmd;
    return j.is_discarded() ? Json::object() : j;
  }

  // kdn-llama in RAG mode on three passages of the document, in the given order.
  Json ask_rag(const std::vector<int>& order, const std::string& extra = "") {
    const std::string doc = read_document();
    std::string cmd = std::string(KDN_LLAMA_TEST_CLI) + " --json --threads 1 --n-predict 16 --ctx 2048" +
                      " --chunk-tokens " + std::to_string(kTestChunk) + " --model " + KDN_LLAMA_TEST_MODEL +
                      " --socket " + socket_ + " --question 'Who may copy the program?' " + extra;
    for (int i : order) {
      const std::filesystem::path f = dir_ / ("passage-" + std::to_string(i) + ".txt");
      if (!std::filesystem::exists(f)) {
        FILE* out = std::fopen(f.c_str(), "w");
        const std::string part = doc.substr(2000 + size_t(i) * 1500, 900 + size_t(i) * 100);
        std::fwrite(part.data(), 1, part.size(), out);
        std::fclose(out);
      }
      cmd += " --segment " + f.string();
    }
    Json j = Json::parse(run_command(cmd), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << cmd;
    return j.is_discarded() ? Json::object() : j;
  }

  std::filesystem::path dir_;
  std::string socket_;
  pid_t kdnd_ = -1;
};

// RAG mode across processes: the first process stores the passages, a second one asked the same
// passages in another order loads all three at their new positions; recomputing everything
// answers as a full prefill does; without kdnd it falls back to one.
TEST_F(CrossProcess, RagModeReusesPassagesInAnotherOrderFromAnotherProcess) {
  const Json first = ask_rag({0, 1, 2});
  EXPECT_EQ(first["cache"], "kdnd");
  EXPECT_EQ(first["blend"]["segments_computed"], 3);
  EXPECT_GT(first["blend"]["chunks_stored"].get<int>(), 3);
  const Json again = ask_rag({2, 0, 1});
  EXPECT_EQ(again["blend"]["used"], true);
  EXPECT_EQ(again["blend"]["segments_reused"], 3);
  EXPECT_EQ(again["blend"]["segments_computed"], 0);
  EXPECT_GT(again["tokens_reused"].get<int>(), 0);
  const Json ref = ask_rag({2, 0, 1}, "--no-cache");
  EXPECT_EQ(ref["tokens_reused"], 0);
  const Json all = ask_rag({2, 0, 1}, "--blend all");
  EXPECT_EQ(all["blend"]["used"], true);
  EXPECT_EQ(all["answer_tokens"], ref["answer_tokens"]);
  const Json prefix = ask_rag({2, 0, 1}, "--blend prefix");
  EXPECT_EQ(prefix["cache"], "kdnd");
  EXPECT_EQ(prefix["answer_tokens"], ref["answer_tokens"]) << "prefix reuse is exact";
  stop_kdnd();
  const Json down = ask_rag({2, 0, 1});
  EXPECT_EQ(down["tokens_reused"], 0);
  EXPECT_EQ(down["answer_tokens"], ref["answer_tokens"]);
}

TEST_F(CrossProcess, EveryHitLengthFromAnotherProcessMatchesNoCache) {
  const Json a = ask(kQuestionA, 4 * kTestChunk);
  EXPECT_EQ(a["cache"], "kdnd");
  EXPECT_EQ(a["tokens_reused"], 0);
  EXPECT_EQ(a["chunks_stored"], 4);
  for (uint32_t k = 1; k <= 4; ++k) {
    // The prompt's document part is k chunks long, so exactly k of A's chunks match.
    const Json b = ask(kQuestionB, k * kTestChunk);
    const Json ref = ask(kQuestionB, k * kTestChunk, "--no-cache");
    EXPECT_EQ(b["tokens_reused"], k * kTestChunk) << "k=" << k;
    EXPECT_EQ(b["cache_status"], "ok");
    EXPECT_EQ(ref["tokens_reused"], 0);
    EXPECT_EQ(b["answer_tokens"], ref["answer_tokens"]) << "k=" << k;
    EXPECT_EQ(b["answer_tokens"].size(), 32u);
  }
}

TEST_F(CrossProcess, KdndDownFallsBackToPrefill) {
  const Json ref = ask(kQuestionA, 2 * kTestChunk, "--no-cache");
  stop_kdnd();
  const Json down = ask(kQuestionA, 2 * kTestChunk);
  EXPECT_NE(down["cache"].get<std::string>().find("unavailable"), std::string::npos) << down["cache"];
  EXPECT_EQ(down["tokens_reused"], 0);
  EXPECT_EQ(down["answer_tokens"], ref["answer_tokens"]);
}

TEST_F(CrossProcess, GarbageStoredByAFaultyEngineIsNeverLoaded) {
  // A faulty engine with the same fingerprint publishes non-finite bytes under the prompt's keys.
  std::unique_ptr<Engine> engine = testing::open_engine(true);
  ASSERT_NE(engine, nullptr);
  auto prompt = engine->chat_prompt(read_document(), kQuestionA, 2 * kTestChunk);
  ASSERT_TRUE(prompt.ok());
  {
    auto store = KdnChunkCache::connect(engine->identity().desc, socket_);
    ASSERT_TRUE(store.ok()) << store.status().what();
    auto res = (*store)->reserve(prompt.value(), 0, 2);
    ASSERT_TRUE(res.ok()) << res.status().what();
    for (uint32_t i = 0; i < 2; ++i) {
      std::span<uint8_t> slot = (*res)->slot(i);
      ASSERT_FALSE(slot.empty());
      std::memset(slot.data(), 0xff, slot.size());  // 0xffff is a NaN in fp16
    }
    ASSERT_TRUE((*res)->commit().ok());
  }
  const Json bad = ask(kQuestionA, 2 * kTestChunk);
  const Json ref = ask(kQuestionA, 2 * kTestChunk, "--no-cache");
  EXPECT_EQ(bad["tokens_reused"], 0);
  EXPECT_NE(bad["cache_status"], "ok");
  EXPECT_EQ(bad["answer_tokens"], ref["answer_tokens"]);
}

}  // namespace

// kdn-llama's command line as a person meets it: what it refuses and why, its help, its progress.
struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};
CliRun run_cli(const std::string& args) {
  CliRun r;
  const std::string cmd = std::string(KDN_LLAMA_TEST_CLI) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(KdnLlamaCli, ADirectoryOrAnEmptyDocumentIsRefusedWithItsName) {
  const auto dir = std::filesystem::temp_directory_path() / ("kdn-llama-cli-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string empty = (dir / "empty.txt").string();
  std::fclose(std::fopen(empty.c_str(), "w"));
  const std::string blank = (dir / "blank.txt").string();
  FILE* f = std::fopen(blank.c_str(), "w");
  std::fputs(" \n\t\n", f);
  std::fclose(f);
  const std::string model = std::string(" --model ") + KDN_LLAMA_TEST_MODEL + " --no-cache --question q";
  CliRun r = run_cli("--prompt-file " + dir.string() + model);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(dir.string() + " is a directory"), std::string::npos) << r.output;
  for (const std::string& file : {empty, blank}) {
    r = run_cli("--prompt-file " + file + model);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(file + " is empty"), std::string::npos) << r.output;
  }
  r = run_cli("--prompt-file " + (dir / "missing.txt").string() + model);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("missing.txt"), std::string::npos) << r.output;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(KdnLlamaCli, HelpShowsPlainChoicesAndDefaults) {
  const CliRun r = run_cli("--help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("->"), std::string::npos) << "CLI11 transformer text in --help:\n" << r.output;
  EXPECT_EQ(r.output.find("ENUM"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("auto|on|off"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hkvd|boundary|none|all|prefix"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--chunk-tokens UINT=256"), std::string::npos) << "the chunk size's default:\n" << r.output;
  const CliRun bad = run_cli("--prompt-file x --load-overlap sometimes");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("sometimes"), std::string::npos) << bad.output;
}

TEST(KdnLlamaCli, ProgressCountsThePrefilledTokens) {
  const std::string args = std::string("--json --threads 1 --n-predict 1 --ctx 1024 --chunk-tokens ") +
                           std::to_string(kTestChunk) + " --model " + KDN_LLAMA_TEST_MODEL + " --prompt-file " +
                           KDN_LLAMA_TEST_DOC + " --context-tokens " + std::to_string(2 * kTestChunk) +
                           " --no-cache --question q --progress";
  const CliRun r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto at = r.output.find("prefilling: " + std::to_string(kTestChunk) + " / ");
  EXPECT_NE(at, std::string::npos) << "one line per batch:\n" << r.output;
  // The last line of the prompt's prefill says every token is done.
  const std::regex done(R"(prefilling: (\d+) / (\d+) tokens\n)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, done)) << r.output;
  EXPECT_EQ(m[1].str(), m[2].str());
  EXPECT_GE(std::stoul(m[2].str()), 2u * kTestChunk);
}

}  // namespace kdn::llama
