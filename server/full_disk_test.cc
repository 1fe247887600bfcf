// The coordinator on a real full file system: a tmpfs of a few MiB mounted in a private mount
// namespace (this binary's main() enters one before any thread starts), filled to the last byte
// with a file and then emptied again. The store must fail its writes while the disk is full, the
// coordinator must report not ready (also when nothing was written: its idle probe), and both must
// come back by themselves once space returns, with nothing acknowledged lost.
//
// Mounting needs CAP_SYS_ADMIN in a mount namespace: root, or an unprivileged user namespace. Where
// neither is possible every test skips, saying why.
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/metrics.h"

namespace dattn {
namespace server {
namespace {

using ::testing::HasSubstr;

// Set by main(): the tmpfs mount point, or why there is none.
std::string g_mount_dir;
std::string g_mount_error;

bool WriteFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  return ::close(fd) == 0 && ok;
}

// Enters a private mount namespace (directly as root, else inside a new user namespace) and mounts
// a tmpfs of `size_mib` at `dir`. Must run before any thread starts (a user namespace needs a
// single-threaded caller). Returns "" or what failed.
std::string MountPrivateTmpfs(const std::string& dir, int size_mib) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::StrCat("cannot create ", dir, ": ", ec.message());
  if (::unshare(CLONE_NEWNS) != 0) {
    const int first = errno;
    const uid_t uid = ::getuid();
    const gid_t gid = ::getgid();
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      return absl::StrCat("unshare(CLONE_NEWNS): ", std::strerror(first),
                          "; unshare(CLONE_NEWUSER | CLONE_NEWNS): ", std::strerror(errno));
    }
    if (!WriteFile("/proc/self/setgroups", "deny") ||
        !WriteFile("/proc/self/uid_map", absl::StrCat("0 ", uid, " 1")) ||
        !WriteFile("/proc/self/gid_map", absl::StrCat("0 ", gid, " 1"))) {
      return absl::StrCat("cannot map ids in a user namespace: ", std::strerror(errno));
    }
  }
  // Nothing mounted here may show outside this process.
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return absl::StrCat("mount --make-rprivate /: ", std::strerror(errno));
  }
  const std::string options = absl::StrCat("size=", size_mib, "m,mode=0700");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
    return absl::StrCat("mount -t tmpfs ", dir, ": ", std::strerror(errno));
  }
  return "";
}

// Fills the file system of `path` to the last byte; returns the bytes written.
int64_t FillDisk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  const std::string block(64 << 10, 'f');
  int64_t written = 0;
  for (size_t chunk = block.size(); chunk > 0;) {
    const ssize_t n = ::write(fd, block.data(), chunk);
    if (n > 0) {
      written += n;
    } else if (n < 0 && errno == ENOSPC) {
      chunk /= 2;  // Down to single bytes: nothing at all is left.
    } else {
      break;
    }
  }
  ::close(fd);
  return written;
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

v1::SubmitJobRequest Request(const std::string& key) {
  v1::SubmitJobRequest request;
  request.set_idempotency_key(key);
  v1::AttentionJobSpec* a = request.mutable_spec()->mutable_attention();
  a->mutable_attention()->add_segment_lengths(64);
  a->mutable_attention()->add_dilation_rates(1);
  a->mutable_shape()->set_batch(1);
  a->mutable_shape()->set_seq_len(256);
  a->mutable_shape()->set_num_heads(2);
  a->mutable_shape()->set_head_dim(16);
  a->set_dtype(v1::DTYPE_FP32);
  a->set_num_ranks(1);
  a->set_device(v1::DEVICE_PREFERENCE_CPU);
  return request;
}

class FullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!g_mount_error.empty()) GTEST_SKIP() << "no private tmpfs: " << g_mount_error;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = absl::StrCat(g_mount_dir, "/", info->name());
    std::filesystem::create_directories(dir_);
    options_.data_dir = dir_ + "/data";
    options_.dead_after = absl::Milliseconds(400);  // The monitor runs every 100 ms.
    options_.store_probe_interval = absl::Milliseconds(200);
    Open();
  }
  void TearDown() override {
    if (coordinator_ != nullptr) coordinator_->Close().IgnoreError();
    std::filesystem::remove_all(dir_);
  }
  void Open() {
    coordinator_ = std::make_unique<Coordinator>(options_, &metrics_);
    absl::Status started = coordinator_->Start();
    ASSERT_TRUE(started.ok()) << started;
  }
  v1::Job Get(const std::string& id) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    absl::StatusOr<v1::Job> job = coordinator_->GetJob(request);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  std::string dir_;
  CoordinatorOptions options_;
  Metrics metrics_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(FullDiskTest, WritesFailWhileFullAndResumeWhenSpaceReturnsWithoutARestart) {
  absl::StatusOr<v1::SubmitJobResponse> before = coordinator_->SubmitJob(Request("before"));
  ASSERT_TRUE(before.ok()) << before.status();
  const std::string before_id = before->job().job_id();

  const std::string filler = dir_ + "/filler";
  ASSERT_GT(FillDisk(filler), 0);
  // The next commit that needs a new page of the file system fails.
  absl::Status failed;
  for (int i = 0; i < 50 && failed.ok(); ++i) {
    failed = coordinator_->SubmitJob(Request(absl::StrCat("while-full-", i))).status();
  }
  ASSERT_FALSE(failed.ok()) << "50 submits committed on a full file system";
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  ASSERT_TRUE(WaitFor([&] { return !coordinator_->Health().ok(); }, absl::Seconds(5)));
  EXPECT_THAT(coordinator_->Health().message(), HasSubstr("jobs.db"));
  // While full, a change is refused without being made: the job stays as it was.
  v1::CancelJobRequest cancel;
  cancel.set_job_id(before_id);
  absl::StatusOr<v1::Job> refused = coordinator_->CancelJob(cancel);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("retry once it recovers"));
  EXPECT_EQ(Get(before_id).state(), v1::JOB_STATE_QUEUED);
  // Still full a while later: still not ready (the probes keep failing).
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(coordinator_->Health().ok());

  // Space returns: ready again by itself, and writes go on.
  ASSERT_TRUE(std::filesystem::remove(filler));
  ASSERT_TRUE(WaitFor([&] { return coordinator_->Health().ok(); }, absl::Seconds(5)))
      << coordinator_->Health();
  absl::StatusOr<v1::SubmitJobResponse> after = coordinator_->SubmitJob(Request("after"));
  ASSERT_TRUE(after.ok()) << after.status();
  absl::StatusOr<v1::Job> cancelled = coordinator_->CancelJob(cancel);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);

  // Everything acknowledged is on disk: a restarted coordinator has both jobs as last written.
  ASSERT_TRUE(coordinator_->Close().ok());
  Open();
  EXPECT_EQ(Get(before_id).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Get(after->job().job_id()).state(), v1::JOB_STATE_QUEUED);
}

TEST_F(FullDiskTest, AnIdleStoreThatCannotBeWrittenIsReportedBeforeAnyWriteFails) {
  ASSERT_TRUE(coordinator_->Health().ok());
  const std::string filler = dir_ + "/filler";
  ASSERT_GT(FillDisk(filler), 0);
  // Nobody writes: the idle probe finds out.
  ASSERT_TRUE(WaitFor([&] { return !coordinator_->Health().ok(); }, absl::Seconds(5)))
      << "still ready on a full file system";
  ASSERT_TRUE(std::filesystem::remove(filler));
  ASSERT_TRUE(WaitFor([&] { return coordinator_->Health().ok(); }, absl::Seconds(5)))
      << coordinator_->Health();
}

}  // namespace
}  // namespace server
}  // namespace dattn

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* tmp = std::getenv("TEST_TMPDIR");
  dattn::server::g_mount_dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/full_disk_test_fs");
  dattn::server::g_mount_error = dattn::server::MountPrivateTmpfs(dattn::server::g_mount_dir, 8);
  if (!dattn::server::g_mount_error.empty()) {
    std::fprintf(stderr, "full_disk_test: %s\n", dattn::server::g_mount_error.c_str());
  }
  return RUN_ALL_TESTS();
}
