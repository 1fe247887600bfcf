#include "worker/host_info.h"

#include "gtest/gtest.h"

namespace dattn {
namespace worker {
namespace {

constexpr char kMeminfo[] =
    "MemTotal:       24576000 kB\n"
    "MemFree:         1000000 kB\n"
    "MemAvailable:   20000000 kB\n"
    "HugePages_Total:       0\n"
    "Broken:             lots kB\n";

TEST(HostInfoTest, ParsesMeminfoFieldsInBytes) {
  EXPECT_EQ(*ParseMeminfoBytes(kMeminfo, "MemTotal"), int64_t{24576000} * 1024);
  EXPECT_EQ(*ParseMeminfoBytes(kMeminfo, "MemAvailable"), int64_t{20000000} * 1024);
  EXPECT_EQ(*ParseMeminfoBytes(kMeminfo, "HugePages_Total"), 0);
  EXPECT_EQ(ParseMeminfoBytes(kMeminfo, "SwapTotal").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseMeminfoBytes(kMeminfo, "Broken").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostInfoTest, ParsesCpuModel) {
  EXPECT_EQ(ParseCpuModel("processor\t: 0\nvendor_id\t: GenuineIntel\n"
                          "model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nprocessor\t: 1\n"
                          "model name\t: other\n"),
            "Intel(R) Xeon(R) CPU @ 2.20GHz");
  EXPECT_EQ(ParseCpuModel("Processor : AArch64\nHardware : Example SoC\n"), "Example SoC");
  EXPECT_EQ(ParseCpuModel("processor : 0\n"), "cpu");
}

TEST(HostInfoTest, ReadsTheLiveHost) {
  absl::StatusOr<int64_t> total = ReadMeminfoBytes("MemTotal");
  ASSERT_TRUE(total.ok()) << total.status();
  absl::StatusOr<int64_t> available = ReadMeminfoBytes("MemAvailable");
  ASSERT_TRUE(available.ok()) << available.status();
  EXPECT_GT(*total, 0);
  EXPECT_LE(*available, *total);
  EXPECT_FALSE(ReadCpuModel().empty());
}

}  // namespace
}  // namespace worker
}  // namespace dattn
