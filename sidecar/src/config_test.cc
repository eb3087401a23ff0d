#include <kdn/sidecar/config.h>

#include "config_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace kdn::sidecar {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A temporary directory for config and token files, removed afterwards.
class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-config-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text, mode_t mode = 0600) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    chmod(path.c_str(), mode);
    return path;
  }
  // Loads `text` as kdnd.toml into `c`; returns the error message ("" on success).
  std::string load(Config& c, const std::string& text) {
    std::string error;
    const Status st = c.load_toml(write("kdnd.toml", text), &error);
    EXPECT_EQ(st.ok(), error.empty()) << error;
    if (!st.ok()) {
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << error;
    }
    return error;
  }
  std::string load(const std::string& text) {
    Config c;
    return load(c, text);
  }

  std::string dir_;
};

// ---- the table

TEST(ConfigTable, KeysSitInTheirSections) {
  using config_table::Section;
  std::set<std::string> seen;
  for (const config_table::KeyDef& k : config_table::keys()) {
    const std::string key = k.key;
    EXPECT_TRUE(seen.insert(key).second) << key << " twice";
    switch (config_table::section_of(k)) {
      case Section::kDaemon:
        EXPECT_EQ(key.find('.'), std::string::npos) << key;
        break;
      case Section::kTierHost:
        EXPECT_EQ(key.rfind("tier.host.", 0), 0u) << key;
        break;
      case Section::kTierDisk:
        EXPECT_EQ(key.rfind("tier.disk.", 0), 0u) << key;
        break;
      case Section::kTierRemote:
        EXPECT_EQ(key.rfind("tier.remote.", 0), 0u) << key;
        break;
      case Section::kTierGpu:
        EXPECT_EQ(key.rfind("tier.gpu.", 0), 0u) << key;
        break;
      case Section::kNamespace:
        EXPECT_EQ(key.rfind("namespace.*.", 0), 0u) << key;
        break;
    }
    EXPECT_EQ(config_table::find_key(config_table::section_of(k), config_table::local_name(k)), &k);
  }
  ASSERT_EQ(config_keys().size(), config_table::keys().size());
  EXPECT_STREQ(config_keys()[0].key, config_table::keys()[0].key);
}

// A literal default in the table must be what the struct starts with, or --help lies.
TEST(ConfigTable, DefaultTextsMatchTheStructs) {
  const Config fresh;
  const NamespaceConfig fresh_ns;
  for (const config_table::KeyDef& k : config_table::keys()) {
    if (k.computed) continue;
    Config c;
    NamespaceConfig ns;
    std::string why;
    ASSERT_TRUE(config_table::assign_text(k, k.default_text, c, &ns, &why)) << k.key << ": " << why;
    EXPECT_EQ(config_table::value_text(k, c, &ns), config_table::value_text(k, fresh, &fresh_ns)) << k.key;
  }
}

TEST(ConfigTable, ConfigKeysShowTypesDefaultsAndBounds) {
  std::map<std::string, const ConfigKeyInfo*> by_key;
  for (const ConfigKeyInfo& k : config_keys()) by_key[k.key] = &k;
  EXPECT_STREQ(by_key.at("tier.host.eviction")->type, "lru|s3fifo");
  EXPECT_STREQ(by_key.at("tier.host.bytes")->type, "size");
  EXPECT_STREQ(by_key.at("namespace.*.allow_uids")->type, "list of u32");
  EXPECT_STREQ(by_key.at("max_sessions")->default_text, "256");
  EXPECT_STREQ(by_key.at("metrics_file")->default_text, "\"\"");
  EXPECT_THAT(by_key.at("slice_us")->help, HasSubstr("between 10 and 100000"));
  EXPECT_THAT(by_key.at("tier.host.slab_bytes")->help, HasSubstr("at least 1M"));
}

// docs/operations.md carries the key table by hand; it must match config_keys(), row for row.
TEST(ConfigTable, OperationsDocListsEveryKey) {
  std::ifstream f(KDN_OPERATIONS_MD);
  ASSERT_TRUE(f) << KDN_OPERATIONS_MD;
  std::stringstream text;
  text << f.rdbuf();
  const std::string doc = text.str();
  auto cell = [](std::string s) {  // a '|' inside a cell is written "\|"
    for (size_t i = s.find('|'); i != std::string::npos; i = s.find('|', i + 2)) s.insert(i, "\\");
    return s;
  };
  for (const ConfigKeyInfo& k : config_keys()) {
    const std::string row = "| `" + std::string(k.key) + "` | " + cell(k.type) + " | " + cell(k.default_text) + " | " +
                            cell(k.help) + " |\n";
    EXPECT_THAT(doc, HasSubstr(row)) << "docs/operations.md lacks or has a stale row for " << k.key;
  }
  // Rows of the key tables (those headed "| key | type | default | meaning |"; the document has
  // other tables, the metric families').
  size_t rows = 0;
  const std::string header = "\n| key | type | default | meaning |\n";
  for (size_t t = doc.find(header); t != std::string::npos; t = doc.find(header, t + 1)) {
    size_t line = doc.find('\n', t + 1) + 1;  // the separator row
    for (line = doc.find('\n', line) + 1; line < doc.size() && doc[line] == '|'; line = doc.find('\n', line) + 1) {
      if (doc.compare(line, 3, "| `") == 0) ++rows;
      if (doc.find('\n', line) == std::string::npos) break;
    }
  }
  EXPECT_EQ(rows, config_keys().size()) << "docs/operations.md lists a key the code lacks";
}

// ---- sizes, names, defaults

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

TEST(Config, NamespaceNames) {
  EXPECT_TRUE(valid_namespace_name("default"));
  EXPECT_TRUE(valid_namespace_name("team-a.v2_x"));
  EXPECT_TRUE(valid_namespace_name(std::string(63, 'n')));
  EXPECT_FALSE(valid_namespace_name(std::string(64, 'n')));
  EXPECT_FALSE(valid_namespace_name(""));
  EXPECT_FALSE(valid_namespace_name(".hidden"));
  EXPECT_FALSE(valid_namespace_name("a b"));
  EXPECT_FALSE(valid_namespace_name("a/b"));
}

TEST(Config, DefaultsAreValid) {
  Config c;
  c.fill_defaults();
  std::string error;
  EXPECT_TRUE(c.validate(&error).ok()) << error;
  EXPECT_FALSE(c.socket_path.empty());
  EXPECT_GE(c.host.bytes, c.host.slab_bytes);
  EXPECT_LE(c.host.bytes, 4ull << 30);
  EXPECT_GE(c.host.copy_threads, 1u);
  EXPECT_LE(c.host.copy_threads, 4u);
  const std::set<uint32_t> admins(c.admin_uids.begin(), c.admin_uids.end());
  EXPECT_EQ(admins.size(), c.admin_uids.size()) << "duplicates";
  EXPECT_EQ(admins, (std::set<uint32_t>{getuid(), 0}));
  EXPECT_EQ(c.create_namespace_uids, c.admin_uids);
  ASSERT_EQ(c.namespaces.size(), 1u);
  EXPECT_EQ(c.namespaces[0].name, "default");
  EXPECT_EQ(c.namespaces[0].line, 0);
  EXPECT_EQ(c.namespaces[0].allow_uids, std::vector<uint32_t>{getuid()});
}

TEST(Config, FillDefaultsIsIdempotentAndKeepsWhatIsSet) {
  Config c;
  ASSERT_TRUE(c.set("admin_uids", "7").ok());
  ASSERT_TRUE(c.set("namespace.team.allow_uids", "1001").ok());
  ASSERT_TRUE(c.set("tier.host.bytes", "1G").ok());
  c.fill_defaults();
  const std::string once = c.to_toml();
  c.fill_defaults();
  EXPECT_EQ(c.to_toml(), once);
  EXPECT_EQ(c.admin_uids, std::vector<uint32_t>{7});
  EXPECT_EQ(c.host.bytes, 1ull << 30);
  ASSERT_EQ(c.namespaces.size(), 2u);
  EXPECT_EQ(c.namespaces[0].allow_uids, std::vector<uint32_t>{1001});
  EXPECT_EQ(c.namespaces[1].name, "default");
}

// ---- TOML files

TEST_F(ConfigFiles, SectionsSetTheirKeys) {
  Config c;
  ASSERT_EQ(load(c,
                 "socket = \"/run/kdn/s.sock\"\n"       // 1
                 "max_sessions = 100\n"                 // 2
                 "admin_uids = [5, 6]\n"                // 3
                 "[tier.host]\n"                        // 4
                 "bytes = \"2G\"\n"                     // 5
                 "slab_bytes = 16777216\n"              // 6
                 "eviction = \"s3fifo\"\n"              // 7
                 "populate = false\n"                   // 8
                 "[namespace.team-b]\n"                 // 9
                 "allow_uids = [1001, 1002]\n"          // 10
                 "max_bytes = \"1G\"\n"                 // 11
                 "[namespace.\"team.a\"]\n"             // 12
                 "token_file = \"/etc/kdn/a.token\"\n"  // 13
                 "max_sessions = 8\n"),                 // 14
            "");
  EXPECT_EQ(c.socket_path, "/run/kdn/s.sock");
  EXPECT_EQ(c.max_sessions, 100u);
  EXPECT_EQ(c.admin_uids, (std::vector<uint32_t>{5, 6}));
  EXPECT_EQ(c.host.bytes, 2ull << 30);
  EXPECT_EQ(c.host.slab_bytes, 16ull << 20);
  EXPECT_EQ(c.host.eviction, "s3fifo");
  EXPECT_FALSE(c.host.populate);
  ASSERT_EQ(c.namespaces.size(), 2u);  // in file order, not toml++'s sorted order
  EXPECT_EQ(c.namespaces[0].name, "team-b");
  EXPECT_EQ(c.namespaces[0].line, 9);
  EXPECT_EQ(c.namespaces[0].allow_uids, (std::vector<uint32_t>{1001, 1002}));
  EXPECT_EQ(c.namespaces[0].max_bytes, 1ull << 30);
  EXPECT_EQ(c.namespaces[1].name, "team.a");
  EXPECT_EQ(c.namespaces[1].line, 12);
  EXPECT_EQ(c.namespaces[1].token_file, "/etc/kdn/a.token");
  EXPECT_EQ(c.namespaces[1].max_sessions, 8u);
  ASSERT_NE(c.find_namespace("team.a"), nullptr);
  c.fill_defaults();
  EXPECT_EQ(c.namespaces.size(), 3u);
  std::string error;
  EXPECT_TRUE(c.validate(&error).ok()) << error;
}

TEST_F(ConfigFiles, TheGpuTierSection) {
  Config c;
  EXPECT_EQ(c.gpu.enable, "auto");
  EXPECT_EQ(c.gpu.bytes, 0u);
  EXPECT_TRUE(c.gpu.pin_host);
  EXPECT_EQ(c.gpu.slice_bytes, 8ull << 20);
  EXPECT_EQ(c.gpu.codec, "none");
  ASSERT_EQ(load(c,
                 "[tier.gpu]\n"
                 "enable = \"on\"\n"
                 "bytes = \"8G\"\n"
                 "pin_host = false\n"
                 "slice_bytes = \"4M\"\n"
                 "max_registrations = 4\n"
                 "codec = \"kivi4\"\n"),
            "");
  EXPECT_EQ(c.gpu.codec, "kivi4");
  EXPECT_EQ(c.gpu.enable, "on");
  EXPECT_EQ(c.gpu.bytes, 8ull << 30);
  EXPECT_FALSE(c.gpu.pin_host);
  EXPECT_EQ(c.gpu.slice_bytes, 4ull << 20);
  EXPECT_EQ(c.gpu.max_registrations, 4u);
  c.fill_defaults();
  std::string error;
  EXPECT_TRUE(c.validate(&error).ok()) << error;
  Config bad;
  ASSERT_EQ(load(bad, "[tier.gpu]\nenable = \"maybe\"\n"), "");
  bad.fill_defaults();
  EXPECT_FALSE(bad.validate(&error).ok());
  EXPECT_THAT(error, HasSubstr("tier.gpu.enable"));
  Config lossy;
  ASSERT_EQ(load(lossy, "[tier.gpu]\ncodec = \"kivi2\"\n"), "");
  lossy.fill_defaults();
  EXPECT_FALSE(lossy.validate(&error).ok());
  EXPECT_THAT(error, HasSubstr("tier.gpu.codec"));
  Config small;
  ASSERT_EQ(load(small, "[tier.gpu]\nslice_bytes = 100\n"), "");
  small.fill_defaults();
  EXPECT_FALSE(small.validate(&error).ok());
  EXPECT_THAT(error, HasSubstr("tier.gpu.slice_bytes"));
  EXPECT_THAT(load(small, "[tier.gpu]\nbyts = 1\n"), HasSubstr("did you mean 'tier.gpu.bytes'"));
}

TEST_F(ConfigFiles, AnEmptyNamespaceSectionDeclaresIt) {
  Config c;
  ASSERT_EQ(load(c, "\n[namespace.default]\n[namespace.x]\n"), "");
  c.fill_defaults();
  ASSERT_EQ(c.namespaces.size(), 2u);  // "default" is declared, so not added again
  EXPECT_EQ(c.namespaces[0].name, "default");
  EXPECT_EQ(c.namespaces[0].line, 2);
  EXPECT_EQ(c.namespaces[1].name, "x");
}

TEST_F(ConfigFiles, UnknownKeysSectionsAndTiersAreErrors) {
  EXPECT_EQ(load("spin_us = 5\n\nhost_arena_byte = 5\n"),
            dir_ + "/kdnd.toml:3: unknown key 'host_arena_byte' (did you mean 'tier.host.bytes'?)");
  EXPECT_THAT(load("eviction = \"lru\"\n"),
              AllOf(HasSubstr("kdnd.toml:1: unknown key 'eviction'"), HasSubstr("'tier.host.eviction'")));
  EXPECT_THAT(load("[tier.host]\nbyts = 1\n"), AllOf(HasSubstr("kdnd.toml:2: unknown key 'tier.host.byts'"),
                                                     HasSubstr("did you mean 'tier.host.bytes'")));
  EXPECT_THAT(load("[namespace.a]\nmax_byte = 1\n"), AllOf(HasSubstr("kdnd.toml:2: unknown key 'namespace.a.max_byte'"),
                                                           HasSubstr("did you mean 'namespace.a.max_bytes'")));
  EXPECT_EQ(load("x = 1\n[server]\nport = 5\n"), dir_ + "/kdnd.toml:1: unknown key 'x'");
  EXPECT_THAT(load("[server]\nport = 5\n"), HasSubstr("kdnd.toml:1: unknown section '[server]'"));
  EXPECT_THAT(load("[tier.host.extra]\n"), HasSubstr("kdnd.toml:1: unknown section '[tier.host.extra]'"));
  EXPECT_THAT(load("[tier.host]\nbytes = 5\n[tier.tpu]\nbytes = 5\n"),
              HasSubstr("kdnd.toml:3: unknown tier 'tpu' (this kdnd has: host, disk, remote, gpu)"));
  EXPECT_THAT(load("[namespace.team.a]\n"), AllOf(HasSubstr("kdnd.toml:1: unknown section '[namespace.team.a]'"),
                                                  HasSubstr("[namespace.\"team.a\"]")));
  EXPECT_THAT(load("tier = 5\n"), HasSubstr("kdnd.toml:1: tier = 5: tiers are sections"));
  EXPECT_THAT(load("[[namespace]]\n"), HasSubstr("kdnd.toml:1: namespace = "));
}

TEST_F(ConfigFiles, BadNamespaceNamesAreErrors) {
  EXPECT_THAT(load("\n[namespace.\".hidden\"]\n"),
              AllOf(HasSubstr("kdnd.toml:2: [namespace.\".hidden\"]"), HasSubstr("does not start with '.'")));
  EXPECT_THAT(load("[namespace.\"a b\"]\n"), AllOf(HasSubstr("kdnd.toml:1:"), HasSubstr("\"a b\"")));
  EXPECT_THAT(load("[namespace." + std::string(64, 'n') + "]\n"), HasSubstr("1 to 63 bytes"));
  EXPECT_EQ(load("[namespace." + std::string(63, 'n') + "]\n"), "");
  EXPECT_THAT(load("namespace.a = 5\n"), HasSubstr("kdnd.toml:1: namespace.a = 5: expected a section"));
}

// Each bad value: the message names file:line, the dotted key and the value as written.
TEST_F(ConfigFiles, BadValuesNameLineKeyAndValue) {
  struct Case {
    const char* file;
    const char* message;
  } cases[] = {
      {"[tier.host]\n\n\n\n\n\nbytes = \"4Q\"\n",
       "kdnd.toml:7: tier.host.bytes = \"4Q\": not a size (a number with K, M, G or T)"},
      {"[tier.host]\nbytes = -1\n", "kdnd.toml:2: tier.host.bytes = -1: must not be negative"},
      {"[tier.host]\nbytes = \"-1G\"\n", "kdnd.toml:2: tier.host.bytes = \"-1G\": must not be negative"},
      {"[tier.host]\nslab_bytes = 1.5\n", "kdnd.toml:2: tier.host.slab_bytes = 1.5: not a size"},
      {"max_sessions = -4\n", "kdnd.toml:1: max_sessions = -4: must not be negative"},
      {"max_sessions = 4294967296\n", "kdnd.toml:1: max_sessions = 4294967296: too large (at most 4294967295)"},
      {"max_sessions = \"10\"\n", "kdnd.toml:1: max_sessions = \"10\": expected a whole number"},
      {"[tier.host]\npopulate = \"yes\"\n", "kdnd.toml:2: tier.host.populate = \"yes\": expected true or false"},
      {"log_level = 3\n", "kdnd.toml:1: log_level = 3: expected a string in quotes"},
      {"[namespace.a]\nallow_uids = [1001, -2]\n",
       "kdnd.toml:2: namespace.a.allow_uids = [ 1001, -2 ]: element 2 (-2): must not be negative"},
      {"[namespace.a]\nallow_gids = [\"x\"]\n", "kdnd.toml:2: namespace.a.allow_gids = "},
      {"admin_uids = 0\n", "kdnd.toml:1: admin_uids = 0: expected a list of whole numbers"},
      {"create_namespace_uids = [4294967296]\n", "element 1 (4294967296): too large"},
      {"[tier.host]\neviction = { a = 1 }\n", "kdnd.toml:2: tier.host.eviction = { a = 1 }: expected a string"},
  };
  for (const Case& c : cases) EXPECT_THAT(load(c.file), HasSubstr(c.message)) << c.file;
}

TEST_F(ConfigFiles, SyntaxErrorsGiveLineAndColumn) {
  EXPECT_THAT(load("spin_us = 5\neviction = [\n"), AllOf(HasSubstr("kdnd.toml:2:"), HasSubstr("TOML syntax error")));
  EXPECT_THAT(load("a = 1\na = 2\n"), HasSubstr("kdnd.toml:2:5: TOML syntax error"));
}

TEST_F(ConfigFiles, AnUnreadableFileNamesItAndErrno) {
  Config c;
  std::string error;
  const Status st = c.load_toml(dir_ + "/missing.toml", &error);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(error, dir_ + "/missing.toml: cannot read: No such file or directory");
}

TEST_F(ConfigFiles, AFailedLoadChangesNothing) {
  Config c;
  const std::string before = c.to_toml();
  EXPECT_NE(load(c, "max_sessions = 5\n[namespace.a]\n[tier.host]\nbytes = \"4Q\"\n"), "");
  EXPECT_EQ(c.to_toml(), before);
}

TEST_F(ConfigFiles, TheFirstErrorInTheFileIsReported) {
  // toml++ sorts keys by name; the loader still reports in file order.
  EXPECT_THAT(load("zz = 1\naa = 2\n"), HasSubstr("kdnd.toml:1: unknown key 'zz'"));
}

// ---- set()

TEST(ConfigSet, TopLevelTierAndNamespaceKeys) {
  Config c;
  ASSERT_TRUE(c.set("max_sessions", "12").ok());
  ASSERT_TRUE(c.set("tier.host.bytes", "8G").ok());
  ASSERT_TRUE(c.set("tier.host.hugepages", "no").ok());
  ASSERT_TRUE(c.set("allow_create_namespaces", "0").ok());
  ASSERT_TRUE(c.set("namespace.team.a.max_bytes", "2G").ok());  // a name may hold dots
  ASSERT_TRUE(c.set("namespace.team.a.allow_uids", "1001, 1002").ok());
  EXPECT_EQ(c.max_sessions, 12u);
  EXPECT_EQ(c.host.bytes, 8ull << 30);
  EXPECT_FALSE(c.host.hugepages);
  EXPECT_FALSE(c.allow_create_namespaces);
  ASSERT_EQ(c.namespaces.size(), 1u);
  EXPECT_EQ(c.namespaces[0].name, "team.a");
  EXPECT_EQ(c.namespaces[0].line, 0);
  EXPECT_EQ(c.namespaces[0].max_bytes, 2ull << 30);
  EXPECT_EQ(c.namespaces[0].allow_uids, (std::vector<uint32_t>{1001, 1002}));
}

TEST(ConfigSet, ListsAreCommaSeparated) {
  Config c;
  ASSERT_TRUE(c.set("admin_uids", "1,2 , 3").ok());
  EXPECT_EQ(c.admin_uids, (std::vector<uint32_t>{1, 2, 3}));
  ASSERT_TRUE(c.set("admin_uids", "[4, 5]").ok());  // as --print-config writes it
  EXPECT_EQ(c.admin_uids, (std::vector<uint32_t>{4, 5}));
  ASSERT_TRUE(c.set("admin_uids", "").ok());
  EXPECT_TRUE(c.admin_uids.empty());
  std::string error;
  EXPECT_FALSE(c.set("admin_uids", "1,x", &error).ok());
  EXPECT_EQ(error, "--set admin_uids=1,x: element 2: not a whole number");
  EXPECT_FALSE(c.set("admin_uids", "1,-3", &error).ok());
  EXPECT_EQ(error, "--set admin_uids=1,-3: element 2: must not be negative");
  EXPECT_FALSE(c.set("admin_uids", "1,", &error).ok());
}

TEST(ConfigSet, ErrorsNameTheFlagKeyAndValue) {
  struct Case {
    const char* key;
    const char* value;
    const char* message;
  } cases[] = {
      {"tier.host.bytes", "4Q", "--set tier.host.bytes=4Q: not a size (a number with K, M, G or T)"},
      {"tier.host.bytes", "-4G", "--set tier.host.bytes=-4G: must not be negative"},
      {"max_sessions", "-1", "--set max_sessions=-1: must not be negative"},
      {"max_sessions", "4294967296", "--set max_sessions=4294967296: too large (at most 4294967295)"},
      {"max_sessions", "many", "--set max_sessions=many: not a whole number"},
      {"tier.host.populate", "maybe", "--set tier.host.populate=maybe: not a bool"},
      {"max_sesions", "1", "--set max_sesions=1: unknown key 'max_sesions' (did you mean 'max_sessions'?)"},
      {"tier.tpu.bytes", "1G", "--set tier.tpu.bytes=1G: unknown tier 'tpu' (this kdnd has: host, disk, remote, gpu)"},
      {"tier.host", "1G", "--set tier.host=1G: unknown key 'tier.host'"},
      {"namespace.a.max_byte", "1",
       "--set namespace.a.max_byte=1: unknown key 'namespace.a.max_byte' (did you "
       "mean 'namespace.a.max_bytes'?)"},
      {"namespace..x.max_bytes", "1", "--set namespace..x.max_bytes=1: '.x': a namespace name"},
      {"namespace.max_bytes", "1", "--set namespace.max_bytes=1: unknown key 'namespace.max_bytes'"},
      {"socket", "/run/kdn/\xc3(.sock", ": not valid UTF-8 text"},    // a cut-off two-byte sequence
      {"socket", "/run/kdn/\xed\xa0\x80", ": not valid UTF-8 text"},  // a UTF-16 surrogate
      {"socket", "/run/kdn/\xc0\xaf", ": not valid UTF-8 text"},      // an overlong '/'
  };
  for (const Case& k : cases) {
    Config c;
    std::string error;
    const Status st = c.set(k.key, k.value, &error);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << k.key;
    EXPECT_THAT(error, HasSubstr(k.message));
    EXPECT_TRUE(c.namespaces.empty()) << "a failed set declared a namespace";
  }
}

TEST(ConfigSet, UnicodeTextPrintsAndLoadsBack) {
  Config c;
  std::string error;
  ASSERT_TRUE(c.set("socket", "/run/kdn/m\xc3\xbcnchen-\xf0\x9f\x94\x91.sock", &error).ok()) << error;
  c.fill_defaults();
  ASSERT_TRUE(c.validate(&error).ok()) << error;
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/kdn-config-unicode.toml";
  std::ofstream(path) << c.to_toml();
  Config back;
  ASSERT_TRUE(back.load_toml(path, &error).ok()) << error;
  EXPECT_EQ(back.socket_path, c.socket_path);
  std::filesystem::remove(path);
}

TEST(ConfigSet, OriginNamesTheFlag) {
  Config c;
  std::string error;
  EXPECT_FALSE(c.set("tier.host.bytes", "4Q", &error, "--host-arena-bytes 4Q").ok());
  EXPECT_EQ(error, "--host-arena-bytes 4Q: not a size (a number with K, M, G or T)");
  EXPECT_EQ(c.host.bytes, 0u);
}

// ---- validate()

TEST(ConfigValidate, EachProblemNamesTheKeyAndValue) {
  struct Case {
    const char* what;
    void (*edit)(Config&);
    const char* message;
  } cases[] = {
      {"slab", [](Config& c) { c.host.slab_bytes = 512 << 10; },
       "tier.host.slab_bytes = \"512K\": must be at least 1M"},
      {"arena", [](Config& c) { c.host.bytes = 32 << 20; },
       "tier.host.bytes = \"32M\": smaller than tier.host.slab_bytes = \"64M\""},
      {"ns arena", [](Config& c) { c.namespaces[0].max_bytes = 1 << 20; },
       "namespace.default.max_bytes = \"1M\": smaller than tier.host.slab_bytes = \"64M\""},
      {"eviction", [](Config& c) { c.host.eviction = "random"; },
       "tier.host.eviction = \"random\": must be lru or s3fifo"},
      {"log", [](Config& c) { c.log_level = "loud"; },
       "log_level = \"loud\": must be trace, debug, info, warn, error or off"},
      {"sessions", [](Config& c) { c.max_sessions = 0; }, "max_sessions = 0: must be at least 1"},
      {"per uid", [](Config& c) { c.max_sessions_per_uid = 0; }, "max_sessions_per_uid = 0: must be at least 1"},
      {"namespaces", [](Config& c) { c.max_namespaces = 0; }, "max_namespaces = 0: must be at least 1"},
      {"leases", [](Config& c) { c.max_leases = 0; }, "max_leases = 0: must be at least 1"},
      {"lease count", [](Config& c) { c.max_lease_count = 0; }, "max_lease_count = 0: must be at least 1"},
      {"reservations", [](Config& c) { c.max_reservations = 0; }, "max_reservations = 0: must be at least 1"},
      {"in flight", [](Config& c) { c.max_in_flight = 0; }, "max_in_flight = 0: must be between 1 and 4096"},
      {"in flight max", [](Config& c) { c.max_in_flight = 4097; }, "max_in_flight = 4097: must be between 1 and 4096"},
      {"models", [](Config& c) { c.max_models = 0; }, "max_models = 0: must be at least 1"},
      {"models total", [](Config& c) { c.max_models_total = 0; }, "max_models_total = 0: must be at least 1"},
      {"timeout", [](Config& c) { c.reservation_timeout_ms = 0; }, "reservation_timeout_ms = 0: must be at least 1"},
      {"socket empty", [](Config& c) { c.socket_path.clear(); }, "socket = \"\": empty"},
      {"socket long", [](Config& c) { c.socket_path = "/" + std::string(107, 's'); },
       "bytes; a Unix socket path holds at most 107"},
      {"spin", [](Config& c) { c.spin_us = 1000001; }, "spin_us = 1000001: must be at most 1000000"},
      {"slice low", [](Config& c) { c.slice_us = 9; }, "slice_us = 9: must be between 10 and 100000"},
      {"slice high", [](Config& c) { c.slice_us = 100001; }, "slice_us = 100001: must be between 10 and 100000"},
      {"staging", [](Config& c) { c.staging_bytes = 8ull << 30; },
       "staging_bytes = \"8G\": larger than max_staging_bytes = \"4G\""},
      {"too many namespaces",
       [](Config& c) { c.max_namespaces = 1, c.namespaces.push_back(c.namespaces[0]), c.namespaces[1].name = "b"; },
       "max_namespaces = 1: 2 namespaces are declared (default, b)"},
      {"ns sessions", [](Config& c) { c.namespaces[0].max_sessions = 257; },
       "namespace.default.max_sessions = 257: larger than max_sessions = 256"},
      {"token", [](Config& c) { c.token = std::string(64, 't'); }, "token = \"<set>\": 64 bytes"},
  };
  for (const Case& k : cases) {
    Config c;
    c.host.bytes = 1ull << 30;
    c.fill_defaults();
    k.edit(c);
    std::string error;
    const Status st = c.validate(&error);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << k.what;
    EXPECT_THAT(error, HasSubstr(k.message)) << k.what;
  }
}

TEST_F(ConfigFiles, ValidateNamesTheLineOfAFileNamespace) {
  Config c;
  ASSERT_EQ(load(c, "\n\n[namespace.t]\nmax_bytes = \"1M\"\n"), "");
  c.fill_defaults();
  std::string error;
  EXPECT_FALSE(c.validate(&error).ok());
  EXPECT_THAT(error, HasSubstr("namespace.t.max_bytes = \"1M\" ([namespace.t] on line 3): smaller than"));
}

// ---- to_toml()

TEST_F(ConfigFiles, PrintedConfigLoadsBackTheSame) {
  for (const char* token : {"", "s3cret"}) {
    Config c;
    ASSERT_EQ(load(c,
                   "metrics_file = \"/tmp/m \\\"q\\\".prom\"\nspin_us = 7\n"
                   "[tier.host]\nbytes = 1234567\neviction = \"s3fifo\"\n"
                   "[namespace.b]\nallow_gids = [10, 20]\n[namespace.\"team.a\"]\nmax_bytes = \"3G\"\n"),
              "");
    c.token = token;
    c.fill_defaults();
    const std::string printed = c.to_toml();
    EXPECT_THAT(printed, HasSubstr(*token ? "token = \"<set>\"" : "token = \"\""));
    EXPECT_EQ(printed.find("s3cret"), std::string::npos);
    EXPECT_THAT(printed, HasSubstr("[namespace.\"team.a\"]"));
    Config back;
    ASSERT_EQ(load(back, printed), "") << printed;
    if (*token) back.token = token;
    EXPECT_EQ(back.to_toml(), printed);
    for (const ConfigKeyInfo& k : config_keys()) {
      std::string key = k.key;
      if (key.rfind("namespace.*.", 0) == 0)
        key = "[namespace.b]";
      else if (key.rfind("tier.host.", 0) == 0)
        key = key.substr(10);
      else if (key.rfind("tier.disk.", 0) == 0)
        key = key.substr(10);
      else if (key.rfind("tier.remote.", 0) == 0)
        key = key.substr(12);
      else if (key.rfind("tier.gpu.", 0) == 0)
        key = key.substr(9);
      EXPECT_THAT(printed, HasSubstr(key)) << "missing from --print-config";
    }
  }
}

// ---- namespace tokens

TEST_F(ConfigFiles, TokenFileRules) {
  Config c;
  c.token = "shared";
  NamespaceConfig ns;
  ns.name = "team";
  std::string token, error;
  ASSERT_TRUE(load_namespace_token(ns, c, &token, &error).ok());
  EXPECT_EQ(token, "shared");

  ns.token_file = write("ok.token", "  s3cret \t\r\nsecond line\n", 0600);
  ASSERT_TRUE(load_namespace_token(ns, c, &token, &error).ok()) << error;
  EXPECT_EQ(token, "s3cret");

  ns.token_file = write("open.token", "s3cret\n", 0644);
  EXPECT_FALSE(load_namespace_token(ns, c, &token, &error).ok());
  EXPECT_THAT(error, AllOf(HasSubstr("namespace.team.token_file = \"" + ns.token_file + "\""), HasSubstr("0644"),
                           HasSubstr("others")));

  ns.token_file = write("writable.token", "s3cret\n", 0602);
  EXPECT_FALSE(load_namespace_token(ns, c, &token, &error).ok());

  ns.token_file = dir_ + "/missing.token";
  const Status st = load_namespace_token(ns, c, &token, &error);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.sys_errno(), ENOENT);
  EXPECT_THAT(error, AllOf(HasSubstr(ns.token_file), HasSubstr("No such file or directory")));

  ns.token_file = write("empty.token", " \n", 0600);
  EXPECT_FALSE(load_namespace_token(ns, c, &token, &error).ok());
  EXPECT_THAT(error, HasSubstr("its first line is empty"));

  ns.token_file = write("long.token", std::string(64, 'x') + "\n", 0600);
  EXPECT_FALSE(load_namespace_token(ns, c, &token, &error).ok());
  EXPECT_THAT(error, HasSubstr("64 bytes; at most 63"));
  ns.token_file = write("max.token", std::string(63, 'x'), 0400);
  EXPECT_TRUE(load_namespace_token(ns, c, &token, &error).ok()) << error;
  EXPECT_EQ(token.size(), 63u);
}

}  // namespace
}  // namespace kdn::sidecar
