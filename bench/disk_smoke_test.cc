// End to end: kdn-bench disk against this build's kdnd, on a small plan in a temporary
// directory. Checks that every figure is measured (or null when fio is missing), that every
// chunk came back intact after the restart, and that kdnd stopped cleanly. Does not judge the
// figures themselves (that is the benchmark's job).
#include "smoke_util.h"

#include <cstdlib>
#include <filesystem>

namespace {

using kdn::bench::smoke::at;
using kdn::bench::smoke::BenchRun;
using kdn::bench::smoke::run_bench;

TEST(DiskBenchSmokeTest, MeasuresEveryFigureAgainstARealKdnd) {
  char tmpl[] = "/tmp/kdn-disk-smoke-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  BenchRun run = run_bench("disk --json --dir " + dir +
                           " --data-mib 16 --doc-chunks 4 --codec-mib 8 --fio-seconds 1 --read-passes 2"
                           " --recovery-chunks 300 --lookup-samples 300 --prefetch-docs 1");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(run.exit_code, 0) << run.said();
  nlohmann::json j = nlohmann::json::parse(run.stdout_text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << run.stdout_text;
  for (const char* key :
       {"kdn.t2_read_gbps", "kdn.t2_write_gbps", "kdn.recovery_s_10k", "kdn.prefetch_hidden_fraction",
        "kdn.lookup.idle_p50_us", "kdn.lookup.idle_keys_p50_us", "kdn.lookup.loaded_p50_us", "kdn.lookup.loaded_max_us",
        "kdn.t2_read_gbps_by_codec.none", "kdn.t2_read_gbps_by_codec.lossless", "kdn.t2_read_gbps_by_codec.int8",
        "kdn.t2_read_gbps_by_codec.kivi4", "kdn.codec_ratio.kivi4"}) {
    const nlohmann::json& v = at(j, key);
    EXPECT_TRUE(v.is_number()) << key << " = " << v;
  }
  EXPECT_GT(at(j, "kdn.t2_read_gbps").get<double>(), 0.0);
  EXPECT_EQ(at(j, "kdn.t2_read_gbps_runs").size(), 2u);
  EXPECT_EQ(at(j, "kdn.disk.faults_crc").get<uint64_t>(), 0u);
  EXPECT_TRUE(at(j, "kdn.recovery.every_chunk_served").get<bool>());
  EXPECT_EQ(at(j, "kdn.recovery.chunks").get<uint64_t>(), 300u + (4 - 300 % 4) % 4);
  EXPECT_EQ(at(j, "kdnd.exit_after_sigterm").get<std::string>(), "exit 0");
  // fio present: baselines and ratios are numbers; absent: null, never invented.
  for (const char* key : {"baselines.fio_randread_gbps", "baselines.fio_overwrite_gbps", "baselines.fio_seqwrite_gbps",
                          "ratios.read_vs_fio", "ratios.write_vs_fio", "ratios.write_vs_fio_seqwrite"}) {
    const nlohmann::json& v = at(j, key);
    EXPECT_TRUE(v.is_number() || v.is_null()) << key;
  }
  EXPECT_TRUE(at(j, "bars.read_vs_fio.pass").is_boolean() || at(j, "bars.read_vs_fio.pass").is_null());
  EXPECT_TRUE(at(j, "bars.recovery_s_10k.pass").is_boolean());
}

TEST(DiskBenchSmokeTest, ADirectoryIsRequired) {
  BenchRun run = run_bench("disk --json");
  EXPECT_NE(run.exit_code, 0);
}

}  // namespace
