// What a new user and a reliability test meet first, against the real binaries: the metrics port
// answers whatever is asked of it and the coordinator keeps serving; a drained worker can be
// undrained and takes work again; the data dir is private; the shipped example job runs on the demo
// cluster.
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/cluster_fixture.h"

namespace dattn::testing {
namespace {

using std::chrono::seconds;

using FrontDoor = ClusterTest;

// `curl` of `url` with `extra` flags; returns what -w '%{http_code}' printed ("404"), "" on
// failure.
std::string HttpCode(Cluster& cluster, const std::string& path,
                     const std::vector<std::string>& extra = {}) {
  ProcessOptions curl;
  curl.name = "curl";
  curl.log_dir = cluster.dir();
  curl.argv = {"/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10"};
  curl.argv.insert(curl.argv.end(), extra.begin(), extra.end());
  curl.argv.push_back("http://" + cluster.metrics_address() + path);
  ProcessResult r = RunCommand(curl, seconds(20));
  return r.exit_code == 0 ? r.out : "";
}

// What browsers, probes and port scans ask a metrics port: each gets an HTTP answer, and the
// coordinator process keeps running and serving gRPC and /metrics. (The coordinator used to die
// with SIGSEGV on the first of these: civetweb's 404 path overflowed its small thread stacks.)
TEST_F(FrontDoor, MetricsPortAnswersAnyPathAndTheCoordinatorKeepsServing) {
  StartCluster(0);
  ASSERT_FALSE(cluster_->metrics_address().empty()) << cluster_->Logs();
  struct Ask {
    std::string path;
    std::vector<std::string> flags;
    std::string code;
  };
  const std::vector<Ask> asks = {
      {"/", {}, "200"},
      {"/favicon.ico", {}, "404"},
      {"/healthz", {}, "200"},
      {"/" + std::string(10 << 10, 'x'), {}, "404"},
      {"/metrics", {"--head"}, "200"},
      {"/metrics", {"-X", "POST", "--data", "a=b"}, "405"},
      {"/robots.txt", {"-X", "DELETE"}, "405"},
      {"/" + std::string(100 << 10, 'y'), {}, "431"},
  };
  for (const Ask& ask : asks) {
    EXPECT_EQ(HttpCode(*cluster_, ask.path, ask.flags), ask.code) << ask.path.substr(0, 40) << "\n"
                                                                  << cluster_->Logs();
    ASSERT_TRUE(cluster_->coordinator().running()) << ask.path.substr(0, 40) << "\n"
                                                   << cluster_->Logs();
  }
  EXPECT_EQ(HttpCode(*cluster_, "/metrics"), "200");
  ProcessResult health = cluster_->Cli({"health"});
  EXPECT_EQ(health.exit_code, 0) << health.out << health.err;
  EXPECT_NE(health.out.find("SERVING"), std::string::npos) << health.out;
  EXPECT_TRUE(cluster_->coordinator().running());
}

// A drained worker gets nothing; `dattn undrain` makes it take work again: the job queued meanwhile
// runs on it.
TEST_F(FrontDoor, UndrainedWorkerTakesWorkAgain) {
  StartCluster(1);
  ProcessResult drain = cluster_->Cli({"drain", "worker-0"});
  ASSERT_EQ(drain.exit_code, 0) << drain.out << drain.err;
  EXPECT_NE(drain.out.find("DRAINING"), std::string::npos) << drain.out;
  const std::string id = Submit({"--seq-len=64", "--heads=2", "--head-dim=8", "--segments=16",
                                 "--rates=1", "--dtype=fp64", "--iterations=2"});
  ASSERT_FALSE(id.empty());
  dattn::v1::Job job;
  ASSERT_TRUE(cluster_->WaitForJobState(id, dattn::v1::JOB_STATE_QUEUED, seconds(10), &job));
  ProcessResult undrain = cluster_->Cli({"undrain", "worker-0"});
  ASSERT_EQ(undrain.exit_code, 0) << undrain.out << undrain.err;
  EXPECT_NE(undrain.out.find("is READY"), std::string::npos) << undrain.out;
  ASSERT_TRUE(cluster_->WaitForJobEnd(id, seconds(60), &job)) << cluster_->Logs();
  EXPECT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << job.state_reason() << "\n"
                                                         << EventsText(job);
  EXPECT_EQ(job.attempt(), 1) << EventsText(job);  // No attempt spent on a drain refusal.
}

// The example job file a new user tries first runs, as shipped, on the demo cluster of
// scripts/demo.sh: two CPU workers (one slot each; one engine thread here).
TEST_F(FrontDoor, TheShippedExampleRunsOnTheDemoCluster) {
  StartCluster(2);
  ProcessResult r = cluster_->Cli(
      {"submit", "--file", testutil::RunfilePath("client/examples/attention-job.yaml"), "--wait"},
      seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
  EXPECT_NE(r.out.find("SUCCEEDED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 of 2 ranks succeeded"), std::string::npos) << r.out;
}

// --retention-hours: a finished job, its history and its output are deleted once the retention is
// over (the monitor deletes them); before that, `dattn get` says when. Bad values exit 2 naming the
// flag.
TEST_F(FrontDoor, FinishedJobsAreDeletedAfterTheRetention) {
  ClusterOptions options;
  options.coordinator_flags = {"--retention-hours=0.001"};  // 3.6 s.
  StartCluster(1, options);
  const std::string id = Submit({"--seq-len=64", "--heads=2", "--head-dim=8", "--segments=16",
                                 "--rates=1", "--dtype=fp64", "--iterations=1", "--return-output"});
  ASSERT_FALSE(id.empty());
  dattn::v1::Job job;
  ASSERT_TRUE(cluster_->WaitForJobEnd(id, seconds(60), &job)) << cluster_->Logs();
  ASSERT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  ProcessResult got = cluster_->Cli({"status", id});
  EXPECT_EQ(got.exit_code, 0) << got.out << got.err;
  EXPECT_NE(got.out.find("Expires"), std::string::npos) << got.out;
  const std::string outputs = cluster_->data_dir() + "/outputs/" + id;
  struct stat st {};
  EXPECT_EQ(::stat(outputs.c_str(), &st), 0) << outputs;
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  ProcessResult gone;
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    gone = cluster_->Cli({"status", id});
  } while (gone.exit_code == 0 && std::chrono::steady_clock::now() < deadline);
  EXPECT_NE(gone.exit_code, 0) << gone.out;
  EXPECT_NE(gone.err.find("finished jobs are deleted 3.6s after they end"), std::string::npos)
      << gone.err;
  EXPECT_NE(::stat(outputs.c_str(), &st), 0) << outputs << " outlived its job";

  for (const char* bad : {"--retention-hours=-1", "--retention-hours=soon"}) {
    ProcessOptions o;
    o.name = "bad-retention";
    o.log_dir = cluster_->dir();
    o.argv = {testutil::RunfilePath("server/dattn-coordinator"), "--listen=127.0.0.1:0",
              "--data-dir=" + cluster_->dir() + "/unused", bad};
    ProcessResult r = RunCommand(o, seconds(20));
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.err;
    EXPECT_NE(r.err.find("--retention-hours"), std::string::npos) << r.err;
  }
}

int ModeOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

// The coordinator creates its data dir 0700 and its store files 0600; a data dir that already
// exists open to others is left as it is, with a warning that says how to fix it.
TEST_F(FrontDoor, TheDataDirIsPrivate) {
  StartCluster(0);
  const std::string dir = cluster_->data_dir();
  EXPECT_EQ(ModeOf(dir), 0700);
  for (const char* file : {"/jobs.db", "/jobs.db.lock"})
    EXPECT_EQ(ModeOf(dir + file), 0600) << file;
  EXPECT_EQ(cluster_->coordinator().ReadStderr().find("warning: data dir"), std::string::npos);

  ClusterOptions options;
  options.name = "loose-data-dir";
  Cluster loose(options);
  ASSERT_EQ(::mkdir(loose.data_dir().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(loose.data_dir().c_str(), 0755), 0);
  std::string error;
  ASSERT_TRUE(loose.StartCoordinator(&error)) << error;
  std::optional<std::string> warning = loose.coordinator().WaitForStderr(
      "(warning: data dir [^\\n]* is mode 0755[^\\n]*chmod 700[^\\n]*)", seconds(10));
  ASSERT_TRUE(warning.has_value()) << loose.Logs();
  EXPECT_EQ(ModeOf(loose.data_dir()), 0755);  // Warned about, not changed.
  EXPECT_EQ(ModeOf(loose.data_dir() + "/jobs.db"), 0600);
}

}  // namespace
}  // namespace dattn::testing
