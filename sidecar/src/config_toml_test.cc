// Config::load_toml (config_toml.cc) on malformed files: empty and comment-only files, files
// cut short anywhere, bytes that are not UTF-8, duplicate keys and sections, values of the
// wrong type in shapes config_test.cc does not try, and unknown keys deep in a file. Each
// error names the file and the line, and a failed load leaves the configuration as it was.
#include <kdn/sidecar/config.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kdn::sidecar {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class ConfigTomlFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-config-toml-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/kdnd.toml";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Loads `bytes`, written as they are, into a default Config; returns the error ("" when
  // it loaded). A failed load must leave the Config untouched.
  std::string load(const std::string& bytes) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
    Config c;
    c.fill_defaults();
    const std::string before = c.to_toml();
    std::string error;
    const Status st = c.load_toml(path_, &error);
    EXPECT_EQ(st.ok(), error.empty()) << error;
    if (!st.ok()) {
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << error;
      EXPECT_EQ(c.to_toml(), before) << "a failed load changed the configuration";
    }
    return error;
  }
  // The prefix every message about line `line` starts with.
  std::string at(int line) const { return path_ + ":" + std::to_string(line) + ":"; }

  std::string dir_, path_;
};

TEST_F(ConfigTomlFiles, AnEmptyOrCommentOnlyFileChangesNothing) {
  for (const std::string text : {"", "\n\n\n", "# only a comment\n", "   \t\n# a\n\n# b", "\r\n\r\n"}) {
    Config c;
    c.fill_defaults();
    const std::string before = c.to_toml();
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << text;
    std::string error;
    EXPECT_TRUE(c.load_toml(path_, &error).ok()) << error;
    EXPECT_EQ(c.to_toml(), before);
  }
}

TEST_F(ConfigTomlFiles, AFileCutShortIsASyntaxErrorAtItsLine) {
  const std::string whole = "max_sessions = 64\nlog_level = \"info\"\n[tier.host]\nbytes = \"4G\"\n";
  ASSERT_EQ(load(whole), "");
  // Cut inside each part of the file: a section header, a key, a value, a string.
  struct Cut {
    const char* text;
    int line;
  };
  const Cut cuts[] = {
      {"max_sessions = 64\nlog_level = \"in", 2},
      {"max_sessions = 64\nlog_level =", 2},
      {"max_sessions = 64\nlog_level", 2},
      {"max_sessions = 64\nlog_level = \"info\"\n[tier.ho", 3},
      {"max_sessions = 64\nlog_level = \"info\"\n[tier.host]\nbytes = ", 4},
      {"max_sessions = 64\nadmin_uids = [1, 2", 2},
      {"[namespace.a]\nallow_uids = [1,\n", 2},
  };
  for (const Cut& c : cuts) {
    SCOPED_TRACE(c.text);
    EXPECT_THAT(load(c.text), AllOf(StartsWith(at(c.line)), HasSubstr("TOML syntax error")));
  }
}

TEST_F(ConfigTomlFiles, BytesThatAreNotUtf8AreASyntaxError) {
  struct Bad {
    std::string text;
    int line;
  };
  const Bad bad[] = {
      {"max_sessions = 4\nlog_level = \"in\xff"
       "fo\"\n",
       2},                                                         // an invalid byte in a string
      {"max_sessions = 4\n# a comment \xc3\x28 here\n", 2},        // a broken two-byte sequence
      {"\n\nlog_level = \"\xe2\x82\"\n", 3},                       // a three-byte sequence cut short
      {"log_level = \"info\"\nmax_sessions = \"\xc0\xaf\"\n", 2},  // an overlong encoding
      {"log_level = \"\xed\xa0\x80\"\n", 1},                       // a UTF-16 surrogate
      {"max_sessions = 4\nlog_level = \"\xe2\x82", 2},             // cut inside a character
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.text);
    EXPECT_THAT(load(b.text), AllOf(StartsWith(at(b.line)), HasSubstr("TOML syntax error"), HasSubstr("utf-8")));
  }
  // The same characters well formed load (and come back as written).
  Config c;
  std::ofstream(path_, std::ios::binary | std::ios::trunc) << "log_level = \"info\" # caf\xc3\xa9\n";
  std::string error;
  EXPECT_TRUE(c.load_toml(path_, &error).ok()) << error;
}

TEST_F(ConfigTomlFiles, ANulByteIsASyntaxError) {
  EXPECT_THAT(load(std::string("max_sessions = 4\nlog_level = \"a") + '\0' + "b\"\n"),
              AllOf(StartsWith(at(2)), HasSubstr("TOML syntax error")));
}

TEST_F(ConfigTomlFiles, DuplicateKeysAndSectionsNameTheSecondLine) {
  struct Dup {
    const char* text;
    int line;
  };
  const Dup dups[] = {
      {"max_sessions = 4\nlog_level = \"info\"\nmax_sessions = 8\n", 3},
      {"[tier.host]\nbytes = \"1G\"\n\n[tier.host]\nbytes = \"2G\"\n", 4},
      {"[tier.host]\nbytes = \"1G\"\nbytes = \"1G\"\n", 3},  // even the same value
      {"[namespace.a]\nmax_bytes = \"1G\"\n[namespace.b]\n[namespace.a]\n", 4},
      {"tier.host.bytes = \"1G\"\n[tier.host]\nbytes = \"2G\"\n", 2},  // dotted, then a table
  };
  for (const Dup& d : dups) {
    SCOPED_TRACE(d.text);
    EXPECT_THAT(load(d.text), AllOf(StartsWith(at(d.line)), HasSubstr("TOML syntax error")));
  }
}

TEST_F(ConfigTomlFiles, WrongTypesNameTheKeyAndTheValueAsWritten) {
  struct Wrong {
    const char* text;
    const char* message;
  };
  const Wrong wrong[] = {
      {"max_sessions = 1.0\n", ":1: max_sessions = 1.0: expected a whole number"},
      {"max_sessions = true\n", ":1: max_sessions = true: expected a whole number"},
      {"max_sessions = [4]\n", ":1: max_sessions = [ 4 ]: expected a whole number"},
      {"max_sessions = 1979-05-27\n", ":1: max_sessions = 1979-05-27: expected a whole number"},
      {"log_level = [1]\n", ":1: log_level = [ 1 ]: expected a string in quotes"},
      {"log_level = true\n", ":1: log_level = true: expected a string in quotes"},
      {"[tier.host]\npopulate = 1\n", ":2: tier.host.populate = 1: expected true or false"},
      {"[tier.host]\nbytes = true\n", ":2: tier.host.bytes = true: not a size (a number with K, M, G or T)"},
  };
  for (const Wrong& w : wrong) {
    SCOPED_TRACE(w.text);
    EXPECT_EQ(load(w.text), path_ + w.message);
  }
}

TEST_F(ConfigTomlFiles, AKeyGivenAsASectionIsNamed) {
  EXPECT_THAT(load("max_sessions = 4\n\n[log_level]\nx = 1\n"), StartsWith(at(3)));
}

TEST_F(ConfigTomlFiles, UnknownKeysDeepInAFileNameTheirLine) {
  std::string text = "# kdnd\n\nmax_sessions = 4\n\n[tier.host]\n";
  for (int i = 0; i < 40; ++i) text += "# filler\n";  // lines 6..45
  text += "bytes = \"1G\"\nsurprise = 1\n";           // lines 46, 47
  EXPECT_EQ(load(text), at(47) + " unknown key 'tier.host.surprise'");
  EXPECT_EQ(load("[tier.host]\nbytes = \"1G\"\n[bogus]\nx = 1\n"), at(3) + " unknown section '[bogus]'");
}

TEST_F(ConfigTomlFiles, ALineEndingInCrLfCountsAsOneLine) {
  EXPECT_EQ(load("max_sessions = 4\r\n\r\nbogus = 1\r\n"), at(3) + " unknown key 'bogus'");
}

}  // namespace
}  // namespace kdn::sidecar
