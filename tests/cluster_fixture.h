// A gtest fixture around tests/cluster.h: one cluster per test, named after the test, and a
// submit through the CLI that expects a job id; and the attention job flags of the fault tests.
#ifndef DATTN_TESTS_CLUSTER_FIXTURE_H_
#define DATTN_TESTS_CLUSTER_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cluster.h"

namespace dattn::testing {

// `dattn submit` flags of an fp64 forward+backward attention job on CPU workers (B = 1, H = 4,
// D = 32, w = [256, 1024], r = [1, 2]) that may continue on fewer ranks after losing a worker
// (--shrink-ring; also on one rank with `single_device`): the fault tests' job.
inline std::vector<std::string> ShrinkableAttentionFlags(int seq_len, int ranks, int iterations,
                                                         int seed, bool single_device) {
  std::vector<std::string> flags = {"--batch=1",
                                    "--seq-len=" + std::to_string(seq_len),
                                    "--heads=4",
                                    "--head-dim=32",
                                    "--segments=256,1024",
                                    "--rates=1,2",
                                    "--dtype=fp64",
                                    "--pass=fwd-bwd",
                                    "--seed=" + std::to_string(seed),
                                    "--device=cpu",
                                    "--ranks=" + std::to_string(ranks),
                                    "--iterations=" + std::to_string(iterations),
                                    "--shrink-ring=true"};
  if (single_device) flags.push_back("--single-device=true");
  return flags;
}

class ClusterTest : public ::testing::Test {
 protected:
  // Starts a coordinator and `workers` workers (fails the test if they do not come up).
  void StartCluster(int workers, ClusterOptions options = {}) {
    options.name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    cluster_ = std::make_unique<Cluster>(options);
    std::string error;
    ASSERT_TRUE(cluster_->Start(workers, &error)) << error;
  }

  // `dattn submit` with `flags` and then `extra`; expects exit 0 and a job id, which it returns.
  // last_out_ keeps the CLI's output.
  std::string Submit(const std::vector<std::string>& flags,
                     const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"submit"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), extra.begin(), extra.end());
    ProcessResult r = cluster_->Cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
    const std::string id = JobIdFrom(r.out);
    EXPECT_FALSE(id.empty()) << r.out;
    last_out_ = r.out;
    return id;
  }

  std::unique_ptr<Cluster> cluster_;
  std::string last_out_;
};

}  // namespace dattn::testing

#endif  // DATTN_TESTS_CLUSTER_FIXTURE_H_
