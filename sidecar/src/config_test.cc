#include <kdn/sidecar/config.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace kdn::sidecar {
namespace {

TEST(Config, ParseSize) {
  uint64_t v = 0;
  EXPECT_TRUE(parse_size("64M", &v));
  EXPECT_EQ(v, 64ull << 20);
  EXPECT_TRUE(parse_size("4G", &v));
  EXPECT_EQ(v, 4ull << 30);
  EXPECT_TRUE(parse_size("4096", &v));
  EXPECT_EQ(v, 4096u);
  EXPECT_FALSE(parse_size("", &v));
  EXPECT_FALSE(parse_size("-1G", &v));
  EXPECT_FALSE(parse_size("12Q", &v));
  EXPECT_FALSE(parse_size("99999999999T", &v));
}

TEST(Config, DefaultsWork) {
  Config c;
  c.fill_defaults();
  EXPECT_FALSE(c.socket_path.empty());
  EXPECT_GE(c.host_arena_bytes, c.slab_bytes);
  EXPECT_TRUE(c.validate().ok());
}

TEST(Config, TomlOverridesAndRejectsTypos) {
  const char* path = "/tmp/kdn_config_test.toml";
  {
    std::ofstream f(path);
    f << "host_arena_bytes = \"1G\"\neviction = \"s3fifo\"\nspin_us = 10\n";
  }
  Config c;
  ASSERT_TRUE(c.load_toml(path).ok());
  EXPECT_EQ(c.host_arena_bytes, 1ull << 30);
  EXPECT_EQ(c.eviction, "s3fifo");
  EXPECT_EQ(c.spin_us, 10u);
  {
    std::ofstream f(path);
    f << "host_arena_byte = 5\n";
  }
  Config d;
  EXPECT_FALSE(d.load_toml(path).ok());
  {
    std::ofstream f(path);
    f << "eviction = [\n";
  }
  EXPECT_FALSE(d.load_toml(path).ok());
  std::remove(path);
}

TEST(Config, ValidateRejectsNonsense) {
  Config c;
  c.fill_defaults();
  c.eviction = "random";
  EXPECT_FALSE(c.validate().ok());
  c.eviction = "lru";
  c.host_arena_bytes = 1024;
  EXPECT_FALSE(c.validate().ok());
}

}  // namespace
}  // namespace kdn::sidecar
