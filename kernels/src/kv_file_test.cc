// KV chunk files: round trip, and rejection of malformed sidecars.
#include <kdn/kernels/kv_file.h>
#include <kdn/kernels/synthetic.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace kdn::kernels {
namespace {

class KvFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-kvfile-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write_text(const std::string& name, const std::string& text) { std::ofstream(dir_ + "/" + name) << text; }
  std::string dir_;
};

TEST_F(KvFileTest, RoundTrip) {
  const ChunkGeometry g{3, 2, 16, 8, DType::kF16};
  std::vector<uint8_t> chunk(chunk_bytes(g));
  ASSERT_TRUE(fill_synthetic_kv(chunk.data(), g, SyntheticKvParams{}).ok());
  ASSERT_TRUE(write_kv_file(dir_ + "/a", g, chunk.data(), "smollm2-135m", 256).ok());
  Result<KvFileInfo> info = read_kv_file_info(dir_ + "/a.json");
  ASSERT_TRUE(info.ok()) << info.status().what();
  EXPECT_EQ(info->geo.layers, 3u);
  EXPECT_EQ(info->geo.kv_heads, 2u);
  EXPECT_EQ(info->geo.head_dim, 16u);
  EXPECT_EQ(info->geo.tokens, 8u);
  EXPECT_EQ(info->geo.dtype, DType::kF16);
  EXPECT_EQ(info->model, "smollm2-135m");
  EXPECT_EQ(info->first_position, 256);
  std::vector<uint8_t> back(chunk.size());
  ASSERT_TRUE(read_kv_file(*info, back.data(), back.size()).ok());
  EXPECT_EQ(back, chunk);
  EXPECT_FALSE(read_kv_file(*info, back.data(), back.size() - 1).ok());
}

TEST_F(KvFileTest, MalformedSidecarsAreRejectedAndSkipped) {
  const ChunkGeometry g{1, 1, 4, 2, DType::kF16};
  std::vector<uint8_t> chunk(chunk_bytes(g), 0);
  ASSERT_TRUE(write_kv_file(dir_ + "/good", g, chunk.data(), "m", 0).ok());
  ASSERT_TRUE(write_kv_file(dir_ + "/short", g, chunk.data(), "m", 0).ok());
  ASSERT_EQ(truncate((dir_ + "/short.kv").c_str(), 3), 0);
  write_text("notjson.json", "{layers: ");
  write_text("notjson.kv", "");
  write_text("wrongfmt.json",
             R"({"format":"other","version":1,"layers":1,"kv_heads":1,"head_dim":4,"tokens":2,"dtype":"f16"})");
  write_text("negative.json",
             R"({"format":"kdn-kv-chunk","version":1,"layers":-1,"kv_heads":1,"head_dim":4,"tokens":2,"dtype":"f16"})");
  write_text(
      "huge.json",
      R"({"format":"kdn-kv-chunk","version":1,"layers":4000000000,"kv_heads":1,"head_dim":4,"tokens":2,"dtype":"f16"})");
  write_text("badtype.json",
             R"({"format":"kdn-kv-chunk","version":1,"layers":1,"kv_heads":1,"head_dim":4,"tokens":2,"dtype":"q4"})");
  write_text("version.json",
             R"({"format":"kdn-kv-chunk","version":2,"layers":1,"kv_heads":1,"head_dim":4,"tokens":2,"dtype":"f16"})");
  EXPECT_FALSE(read_kv_file_info(dir_ + "/short.json").ok());
  EXPECT_FALSE(read_kv_file_info(dir_ + "/notjson.json").ok());
  EXPECT_EQ(read_kv_file_info(dir_ + "/version.json").status().code(), Code::kVersion);
  size_t skipped = 0;
  Result<std::vector<KvFileInfo>> all = list_kv_dir(dir_, &skipped);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].kv_path, dir_ + "/good.kv");
  EXPECT_EQ(skipped, 7u);
  EXPECT_FALSE(list_kv_dir(dir_ + "/missing", nullptr).ok());
}

}  // namespace
}  // namespace kdn::kernels
