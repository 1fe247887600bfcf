// What goes wrong under the job store, and what it promises then: a process killed mid-write loses
// nothing it acknowledged; a failing disk fails writes until a probe commits again; a damaged file,
// a file that is not a database, another program's database and a store of a newer schema are
// refused on open; bad options and paths are rejected.
#include "server/job_store.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_store_test_util.h"

namespace dattn {
namespace server {
namespace {

using store_test::Ev;
using store_test::MakeJob;
using store_test::Move;
using store_test::OpenOrDie;
using store_test::TestDir;
using ::testing::HasSubstr;

// The real fault: a child process acknowledges submits through a pipe and is SIGKILLed mid-stream.
// Every job it acknowledged must be in the store afterwards.
TEST(JobStoreTest, AcknowledgedSubmitsSurviveSigkill) {
  const std::string path = TestDir() + "/jobs.db";
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    auto store = JobStore::Open(path);
    if (!store.ok()) _exit(2);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0;; ++i) {
          const std::string id = absl::StrCat("j-", t, "-", i);
          absl::StatusOr<SubmitOutcome> out = (*store)->Submit(MakeJob(id, "k" + id), Ev("s"));
          if (!out.ok()) _exit(3);
          const std::string line = id + "\n";
          if (write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size()))
            _exit(4);
        }
      });
    }
    for (auto& th : threads) th.join();
    _exit(0);
  }
  close(fds[1]);
  FILE* acks = fdopen(fds[0], "r");
  ASSERT_NE(acks, nullptr);
  std::vector<std::string> acked;
  char buf[128];
  bool killed = false;
  while (std::fgets(buf, sizeof(buf), acks) != nullptr) {
    acked.emplace_back(buf, strcspn(buf, "\n"));
    if (!killed && acked.size() >= 400) {
      kill(pid, SIGKILL);  // Submits are still in flight; acks already in the pipe are still read.
      killed = true;
    }
  }
  std::fclose(acks);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(killed) << "child ended early, status " << wstatus;
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << wstatus;

  auto store = OpenOrDie(path);  // Also runs quick_check.
  ASSERT_NE(store, nullptr);
  for (const std::string& id : acked) {
    absl::StatusOr<StoredJob> job = store->GetJob(id);
    ASSERT_TRUE(job.ok()) << "acknowledged job lost: " << job.status();
    EXPECT_EQ(store->Events(id, 0, 0)->size(), 1u);
  }
  int64_t total = (*store->CountByState())[v1::JOB_STATE_QUEUED];
  EXPECT_GE(total, static_cast<int64_t>(acked.size()));
  std::printf("sigkill: %zu acknowledged, %lld in the store after reopening\n", acked.size(),
              static_cast<long long>(total));
  // The writer recovered cleanly: the sequence continues past everything stored.
  absl::StatusOr<SubmitOutcome> next = store->Submit(MakeJob("j-after", "k-after"), Ev("s"));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->submit_seq, total + 1);
}

// A real storage fault: the writer's file writes hit RLIMIT_FSIZE (EFBIG, like a full disk). The
// failed batch is reported, the error sticks until a probe write commits again, and nothing
// acknowledged is lost; once the limit is lifted (space returns) a probe brings the store back
// without reopening it, and writes go on.
TEST(JobStoreTest, StorageFailureSticksUntilAProbeCommitsAndLosesNothingAcknowledged) {
  const std::string path = TestDir() + "/jobs.db";
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    signal(SIGXFSZ, SIG_IGN);  // Get EFBIG instead of dying.
    auto store = JobStore::Open(path);
    if (!store.ok()) _exit(2);
    // 2 MiB per file (the soft limit only, so that it can be lifted again): the WAL fills it.
    struct rlimit limit;
    if (getrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(3);
    const rlim_t hard = limit.rlim_max;
    limit.rlim_cur = 2 << 20;
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(3);
    absl::Status first_error;
    for (int i = 0; i < 1000 && first_error.ok(); ++i) {
      v1::Job job = MakeJob(absl::StrCat("j-", i), absl::StrCat("k", i));
      job.set_state_reason(std::string(64 << 10, 'x'));  // 64 KiB rows.
      absl::StatusOr<SubmitOutcome> out = (*store)->Submit(job, Ev("s"));
      if (out.ok()) {
        const std::string line = job.job_id() + "\n";
        if (write(fds[1], line.data(), line.size()) < 0) _exit(4);
      } else {
        first_error = out.status();
      }
    }
    if (first_error.ok()) _exit(5);
    if (first_error.code() != absl::StatusCode::kUnavailable) _exit(6);
    // Sticky: later writes fail at once with the same error, Health reports it, reads still work.
    absl::StatusOr<SubmitOutcome> later = (*store)->Submit(MakeJob("j-x", "k-x"), Ev("s"));
    if (later.status() != first_error) _exit(7);
    if ((*store)->Health() != first_error) _exit(8);
    if (!(*store)->GetJob("j-0").ok()) _exit(9);
    // No room at all (a small probe could still overwrite the failed batch's frames below 2 MiB):
    // a probe fails and the store stays unhealthy.
    limit.rlim_cur = 4096;
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(3);
    if ((*store)->Probe().ok() || (*store)->Health().ok()) _exit(11);
    // Room again: the probe commits, the store is healthy and takes writes, in submit order.
    limit.rlim_cur = hard;
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(3);
    if (!(*store)->Probe().ok() || !(*store)->Health().ok()) _exit(12);
    if ((*store)->Stats().recoveries != 1) _exit(13);
    absl::StatusOr<SubmitOutcome> after = (*store)->Submit(MakeJob("j-after", "k-after"), Ev("s"));
    if (!after.ok()) _exit(14);
    const std::string after_line = "j-after\n";
    if (write(fds[1], after_line.data(), after_line.size()) < 0) _exit(4);
    const std::string msg = std::string(first_error.message()) + "\n";
    if (write(fds[1], msg.data(), msg.size()) < 0) _exit(4);
    _exit((*store)->Close().ok() ? 0 : 10);
  }
  close(fds[1]);
  FILE* out = fdopen(fds[0], "r");
  ASSERT_NE(out, nullptr);
  std::vector<std::string> lines;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), out) != nullptr) lines.emplace_back(buf, strcspn(buf, "\n"));
  std::fclose(out);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus)) << wstatus;
  ASSERT_EQ(WEXITSTATUS(wstatus), 0)
      << "child check failed; output: " << (lines.empty() ? "" : lines.back());
  ASSERT_FALSE(lines.empty());
  std::printf("storage failure reported as: %s\n", lines.back().c_str());
  EXPECT_THAT(lines.back(), HasSubstr(path));
  lines.pop_back();
  ASSERT_GT(lines.size(), 0u);

  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  for (const std::string& id : lines) EXPECT_TRUE(store->GetJob(id).ok()) << id;
  EXPECT_EQ((*store->CountByState())[v1::JOB_STATE_QUEUED], static_cast<int64_t>(lines.size()));
}

TEST(JobStoreTest, GarbageFileIsDataLossNamingThePath) {
  const std::string path = TestDir() + "/jobs.db";
  {
    std::ofstream f(path, std::ios::binary);
    for (int i = 0; i < 4096; ++i) f.put(static_cast<char>(i * 7 + 3));
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path));
  EXPECT_THAT(store.status().message(), HasSubstr("not a database"));
}

TEST(JobStoreTest, DamagedPagesAreDataLoss) {
  const std::string path = TestDir() + "/jobs.db";
  {
    auto store = OpenOrDie(path);
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(
          store->Submit(MakeJob(absl::StrCat("j-", i), absl::StrCat("k", i)), Ev("s")).ok());
    }
    ASSERT_TRUE(store->Close().ok());  // Checkpoints the WAL into the main file.
  }
  const auto size = std::filesystem::file_size(path);
  ASSERT_GT(size, 8u * 4096);
  {
    // Scribble over every page after the first (the header stays valid, so only a check notices).
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    for (uint64_t page = 1; page * 4096 < size; ++page) {
      f.seekp(page * 4096 + 100);
      for (int i = 0; i < 64; ++i) f.put(static_cast<char>(0xA5));
    }
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path));
}

TEST(JobStoreTest, ForeignDatabaseIsRefusedAndLeftAlone) {
  const std::string path = TestDir() + "/other.db";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "CREATE TABLE t (x); INSERT INTO t VALUES (1);", nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  const auto size_before = std::filesystem::file_size(path);
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("not a job store"));
  EXPECT_EQ(std::filesystem::file_size(path), size_before);
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
}

TEST(JobStoreTest, NewerSchemaIsRefused) {
  const std::string path = TestDir() + "/jobs.db";
  ASSERT_TRUE(OpenOrDie(path)->Close().ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "INSERT INTO schema_version VALUES (99, 0)", nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("schema version 99"));
}

// Idempotency keys are per tenant: the same key in two tenants makes two jobs, a key never finds
// or blocks another tenant's job, and a clash names the key as the client gave it.
TEST(JobStoreTest, IdempotencyKeysArePerTenant) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  ASSERT_NE(store, nullptr);
  absl::StatusOr<SubmitOutcome> a =
      store->Submit(MakeJob("j-a", "shared", "alice"), Ev("submitted"));
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<SubmitOutcome> b = store->Submit(MakeJob("j-b", "shared", "bob"), Ev("submitted"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->created) << "bob's key found alice's job";
  EXPECT_EQ(store->GetJobByKey("alice", "shared")->job.job_id(), "j-a");
  EXPECT_EQ(store->GetJobByKey("bob", "shared")->job.job_id(), "j-b");
  EXPECT_EQ(store->GetJobByKey("carol", "shared").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetJobByKey("bob", "shared")->job.idempotency_key(), "shared");
  v1::Job other = MakeJob("j-a2", "shared", "alice", /*priority=*/5);
  absl::StatusOr<SubmitOutcome> clash = store->Submit(other, Ev("submitted"));
  ASSERT_EQ(clash.status().code(), absl::StatusCode::kAlreadyExists) << clash.status();
  EXPECT_THAT(clash.status().message(), HasSubstr("idempotency key \"shared\" is already used"));
  // Updates keep working with the scoped key.
  v1::Job job = a->job;
  EXPECT_GT(Move(*store, job, v1::JOB_STATE_CANCELLED, "cancelled"), 0);
}

// A store written before keys were per tenant (schema version 2: the bare key in the column) is
// migrated when opened: its jobs are found by their tenant and key.
TEST(JobStoreTest, KeysOfAnOlderStoreAreMigratedToTheirTenant) {
  const std::string path = TestDir() + "/jobs.db";
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Submit(MakeJob("j-1", "k-1", ""), Ev("submitted")).ok());
    ASSERT_TRUE(store->Submit(MakeJob("j-2", "k-2", "team"), Ev("submitted")).ok());
    ASSERT_TRUE(store->Close().ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "UPDATE jobs SET idempotency_key = substr(idempotency_key, "
                         "instr(idempotency_key, '/') + 1);"
                         "DELETE FROM schema_version WHERE version >= 3;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<StoredJob> one = store->GetJobByKey("", "k-1");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->job.job_id(), "j-1");
  EXPECT_EQ(store->GetJobByKey("team", "k-2")->job.job_id(), "j-2");
  EXPECT_EQ(store->GetJobByKey("", "k-2").status().code(), absl::StatusCode::kNotFound);
}

TEST(JobStoreTest, BadOptionsAndPath) {
  EXPECT_EQ(JobStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
  const std::string path = TestDir() + "/jobs.db";
  JobStoreOptions o;
  o.read_connections = 0;
  EXPECT_EQ(JobStore::Open(path, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.max_batch_writes = 0;
  EXPECT_EQ(JobStore::Open(path, o).status().code(), absl::StatusCode::kInvalidArgument);
  // A directory where the file should be.
  std::filesystem::create_directories(path + ".dir");
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path + ".dir");
  EXPECT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr(path + ".dir"));
}

}  // namespace
}  // namespace server
}  // namespace dattn
