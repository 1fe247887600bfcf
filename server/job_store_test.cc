// The job store in normal operation: submits (idempotent, racing, concurrent), updates and their
// state checks, events, listings and their pages, counts, the active jobs, the WAL kept small by
// the checkpointer, reopening, and the private files and directories it creates. What goes wrong
// (crashes, a failing disk, damaged or foreign files, bad options) is job_store_failure_test; the
// group-commit benchmark is job_store_throughput_test.
#include "server/job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_state.h"
#include "server/job_store_test_util.h"

namespace dattn {
namespace server {
namespace {

using store_test::Ev;
using store_test::MakeJob;
using store_test::Move;
using store_test::OpenOrDie;
using store_test::TestDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(JobStoreTest, SubmitThenGet) {
  const std::string path = TestDir() + "/sub/dir/jobs.db";  // Parents are created.
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->Health().ok());

  absl::StatusOr<SubmitOutcome> out = store->Submit(MakeJob("j-1", "k-1"), Ev("submitted"));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->created);
  EXPECT_EQ(out->submit_seq, 1);
  EXPECT_EQ(out->job.job_id(), "j-1");
  EXPECT_TRUE(out->job.has_create_time());  // Filled in by the store.

  absl::StatusOr<StoredJob> got = store->GetJob("j-1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->submit_seq, 1);
  EXPECT_EQ(got->job.SerializeAsString(), out->job.SerializeAsString());
  EXPECT_EQ(got->job.spec().attention().shape().seq_len(), 4096);

  absl::StatusOr<StoredJob> by_key = store->GetJobByKey("t", "k-1");
  ASSERT_TRUE(by_key.ok()) << by_key.status();
  EXPECT_EQ(by_key->job.job_id(), "j-1");

  absl::StatusOr<std::vector<v1::JobEvent>> events = store->Events("j-1", 0, 0);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].job_id(), "j-1");
  EXPECT_EQ((*events)[0].seq(), 1);
  EXPECT_EQ((*events)[0].state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ((*events)[0].kind(), "submitted");
  EXPECT_TRUE((*events)[0].has_time());

  absl::StatusOr<StoredJob> missing = store->GetJob("j-nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("j-nope"));
  EXPECT_EQ(store->GetJobByKey("t", "k-nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Events("j-nope", 0, 0).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<v1::JobEvent>> none_newer = store->Events("j-1", 1, 0);
  ASSERT_TRUE(none_newer.ok()) << none_newer.status();  // A known job with no newer events.
  EXPECT_TRUE(none_newer->empty());
  EXPECT_EQ(store->Events("j-1", -1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Events("j-1", 0, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

// The mode bits of `path` (07777), or -1 when it does not exist.
int ModeOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

// The job history is private: directories the store creates are 0700 and its files 0600, even
// under a umask that would leave them open to everyone.
TEST(JobStoreTest, CreatesPrivateDirectoriesAndFilesWhateverTheUmask) {
  const std::string base = TestDir();
  const std::string path = base + "/a/b/jobs.db";
  const mode_t old_umask = ::umask(0);
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Submit(MakeJob("j-1", "k-1"), Ev("submitted")).ok());
  ::umask(old_umask);
  EXPECT_EQ(ModeOf(base + "/a"), 0700);
  EXPECT_EQ(ModeOf(base + "/a/b"), 0700);
  for (const char* suffix : {"", "-wal", "-shm", ".lock"}) {
    EXPECT_EQ(ModeOf(path + suffix), 0600) << path + suffix;
  }
  ASSERT_TRUE(store->Close().ok());
}

// A store written before its files were private is tightened when opened; a file that is not a job
// store is left alone.
TEST(JobStoreTest, MakesAnExistingStorePrivateButNotAForeignFile) {
  const std::string path = TestDir() + "/jobs.db";
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Submit(MakeJob("j-1", "k-1"), Ev("submitted")).ok());
    ASSERT_TRUE(store->Close().ok());
  }
  for (const char* suffix : {"", "-wal", "-shm", ".lock"}) {
    ::chmod((path + suffix).c_str(), 0644);  // Those that exist.
  }
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    for (const char* suffix : {"", "-wal", "-shm", ".lock"}) {
      const int mode = ModeOf(path + suffix);
      if (mode >= 0) {
        EXPECT_EQ(mode, 0600) << path + suffix;
      }
    }
    EXPECT_EQ(ModeOf(path), 0600);
    ASSERT_TRUE(store->GetJob("j-1").ok());
    ASSERT_TRUE(store->Close().ok());
  }

  const std::string foreign = TestDir() + "/other.db";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t (x)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  ::chmod(foreign.c_str(), 0644);
  absl::StatusOr<std::unique_ptr<JobStore>> refused = JobStore::Open(foreign, JobStoreOptions());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_EQ(ModeOf(foreign), 0644);
}

TEST(JobStoreTest, WarnsAboutADataDirOthersCanReach) {
  const std::string dir = TestDir() + "/data";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  EXPECT_EQ(GroupOrWorldAccessWarning(dir), std::nullopt);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  std::optional<std::string> warning = GroupOrWorldAccessWarning(dir);
  ASSERT_TRUE(warning.has_value());
  EXPECT_THAT(*warning, HasSubstr(dir + " is mode 0755"));
  EXPECT_THAT(*warning, HasSubstr("chmod 700 " + dir));
  ASSERT_EQ(::chmod(dir.c_str(), 0710), 0);
  EXPECT_TRUE(GroupOrWorldAccessWarning(dir).has_value());
  EXPECT_EQ(GroupOrWorldAccessWarning(dir + "/missing"), std::nullopt);
}

TEST(JobStoreTest, StoredJobDropsEventsAndQueuePosition) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  v1::Job job = MakeJob("j-1", "k-1");
  *job.add_events() = Ev("bogus");
  job.set_queue_position(7);
  ASSERT_TRUE(store->Submit(job, Ev("submitted")).ok());
  absl::StatusOr<StoredJob> got = store->GetJob("j-1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->job.events_size(), 0);
  EXPECT_EQ(got->job.queue_position(), 0);
}

TEST(JobStoreTest, IdempotentResubmit) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  v1::Job first = MakeJob("j-1", "key", "t", 0, 7);
  ASSERT_TRUE(store->Submit(first, Ev("submitted")).ok());

  // A retry carries a freshly generated id; the key decides.
  absl::StatusOr<SubmitOutcome> again =
      store->Submit(MakeJob("j-2", "key", "t", 0, 7), Ev("submitted"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job.job_id(), "j-1");
  EXPECT_EQ(again->submit_seq, 1);
  EXPECT_EQ(store->GetJob("j-2").status().code(), absl::StatusCode::kNotFound);

  // The job moved on; a retry returns its current state and writes no event.
  v1::Job moved = first;
  Move(*store, moved, v1::JOB_STATE_PLACED, "placed");
  again = store->Submit(MakeJob("j-3", "key", "t", 0, 7), Ev("submitted"));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job.state(), v1::JOB_STATE_PLACED);
  EXPECT_EQ(store->Events("j-1", 0, 0)->size(), 2u);

  absl::StatusOr<SubmitOutcome> other =
      store->Submit(MakeJob("j-4", "key", "t", 0, 8), Ev("submitted"));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(other.status().message(), HasSubstr("\"key\""));
  EXPECT_THAT(other.status().message(), HasSubstr("j-1"));

  // The same id under another key is a coordinator bug, reported rather than overwritten.
  absl::StatusOr<SubmitOutcome> dup_id = store->Submit(MakeJob("j-1", "key-2"), Ev("submitted"));
  EXPECT_EQ(dup_id.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(dup_id.status().message(), HasSubstr("j-1"));
  EXPECT_EQ(store->GetJobByKey("t", "key-2").status().code(), absl::StatusCode::kNotFound);
}

TEST(JobStoreTest, SubmitRejectsMalformedInput) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  EXPECT_EQ(store->Submit(MakeJob("", "k"), Ev("submitted")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Submit(MakeJob("j", ""), Ev("submitted")).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::Job running = MakeJob("j", "k");
  running.set_state(v1::JOB_STATE_RUNNING);
  EXPECT_EQ(store->Submit(running, Ev("submitted")).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::JobEvent wrong_job = Ev("submitted");
  wrong_job.set_job_id("j-other");
  EXPECT_EQ(store->Submit(MakeJob("j", "k"), wrong_job).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::JobEvent wrong_state = Ev("submitted");
  wrong_state.set_state(v1::JOB_STATE_RUNNING);
  EXPECT_EQ(store->Submit(MakeJob("j", "k"), wrong_state).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->CountByState()->size(), 0u);
}

// Many callers racing on a few keys land in shared batches; each key must still produce exactly one
// job, and every other caller is told created=false with that job (same spec) or ALREADY_EXISTS
// (other spec).
TEST(JobStoreTest, RacingSubmitsOfOneKey) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  constexpr int kThreads = 16;
  constexpr int kKeys = 4;
  constexpr int kRounds = 20;
  struct Answer {
    std::string key;
    uint64_t seed;
    absl::StatusOr<SubmitOutcome> out;
  };
  std::vector<std::vector<Answer>> answers(kThreads);
  std::vector<std::thread> threads;
  absl::Barrier* start = new absl::Barrier(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (start->Block()) delete start;
      for (int r = 0; r < kRounds; ++r) {
        for (int k = 0; k < kKeys; ++k) {
          const std::string key = absl::StrCat("r", r, "-k", k);
          // Threads 0..11 send seed 1, 12..15 seed 2: the first writer of a key decides which wins.
          const uint64_t seed = t < 12 ? 1 : 2;
          answers[t].push_back(
              {key, seed,
               store->Submit(MakeJob(absl::StrCat("j-", r, "-", k, "-", t), key, "t", 0, seed),
                             Ev("submitted"))});
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  int created = 0, duplicates = 0, conflicts = 0;
  for (const auto& per_thread : answers) {
    for (const Answer& a : per_thread) {
      absl::StatusOr<StoredJob> winner = store->GetJobByKey("t", a.key);
      ASSERT_TRUE(winner.ok()) << winner.status();
      const uint64_t winning_seed = winner->job.spec().attention().seed();
      if (a.out.ok()) {
        EXPECT_EQ(a.out->job.job_id(), winner->job.job_id());
        EXPECT_EQ(a.out->submit_seq, winner->submit_seq);
        EXPECT_EQ(a.seed, winning_seed);
        (a.out->created ? created : duplicates)++;
      } else {
        EXPECT_EQ(a.out.status().code(), absl::StatusCode::kAlreadyExists) << a.out.status();
        EXPECT_NE(a.seed, winning_seed);
        conflicts++;
      }
    }
  }
  EXPECT_EQ(created, kKeys * kRounds);
  EXPECT_GT(duplicates, 0);
  EXPECT_GT(conflicts, 0);
  for (int r = 0; r < kRounds; ++r) {
    for (int k = 0; k < kKeys; ++k) {
      absl::StatusOr<StoredJob> job = store->GetJobByKey("t", absl::StrCat("r", r, "-k", k));
      ASSERT_TRUE(job.ok());
      EXPECT_EQ(store->Events(job->job.job_id(), 0, 0)->size(), 1u);
    }
  }
  EXPECT_EQ((*store->CountByState())[v1::JOB_STATE_QUEUED], kKeys * kRounds);
  JobStoreStats stats = store->Stats();
  std::printf("racing submits: %lld writes in %lld transactions, largest batch %lld\n",
              static_cast<long long>(stats.writes), static_cast<long long>(stats.transactions),
              static_cast<long long>(stats.largest_batch));
}

TEST(JobStoreTest, ConcurrentSubmitsAreDurableWithUniqueSeqs) {
  const std::string path = TestDir() + "/jobs.db";
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100;
  std::vector<std::vector<int64_t>> seqs(kThreads);
  {
    JobStoreOptions o;
    o.wal_checkpoint_pages = 20;  // Background checkpoints run while the writers write.
    auto store = OpenOrDie(path, o);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const std::string id = absl::StrCat("j-", t, "-", i);
          absl::StatusOr<SubmitOutcome> out = store->Submit(MakeJob(id, "k" + id), Ev("submitted"));
          ASSERT_TRUE(out.ok()) << out.status();
          ASSERT_TRUE(out->created);
          seqs[t].push_back(out->submit_seq);
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int i = 0; i < 500 && store->Stats().checkpoints == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GT(store->Stats().checkpoints, 0);
    EXPECT_EQ(store->Stats().checkpoint_failures, 0);
    ASSERT_TRUE(store->Close().ok());
  }
  std::set<int64_t> all;
  for (const auto& s : seqs) {
    EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));  // One caller's submits are ordered.
    all.insert(s.begin(), s.end());
  }
  ASSERT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kPerThread);

  auto store = OpenOrDie(path);
  absl::StatusOr<std::vector<StoredJob>> active = store->LoadActive();
  ASSERT_TRUE(active.ok());
  ASSERT_EQ(active->size(), static_cast<size_t>(kThreads * kPerThread));
  for (size_t i = 0; i < active->size(); ++i) EXPECT_EQ((*active)[i].submit_seq, int64_t(i) + 1);
  // The sequence continues after a reopen.
  absl::StatusOr<SubmitOutcome> next = store->Submit(MakeJob("j-next", "k-next"), Ev("submitted"));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->submit_seq, kThreads * kPerThread + 1);
}

// Without the background checkpointer (SQLite's own is off) the WAL would grow with every commit.
TEST(JobStoreTest, BackgroundCheckpointsBoundTheWal) {
  const std::string path = TestDir() + "/jobs.db";
  JobStoreOptions o;
  o.wal_checkpoint_pages = 64;
  auto store = OpenOrDie(path, o);
  int64_t largest_wal = 0;
  for (int i = 0; i < 600; ++i) {  // One commit each: ~7 pages apiece, ~4000 pages in all.
    ASSERT_TRUE(store->Submit(MakeJob(absl::StrCat("j-", i), absl::StrCat("k", i)), Ev("s")).ok());
    largest_wal = std::max<int64_t>(largest_wal, std::filesystem::file_size(path + "-wal"));
  }
  const JobStoreStats st = store->Stats();
  std::printf("600 commits: %lld checkpoints, largest WAL %lld KiB\n",
              static_cast<long long>(st.checkpoints), static_cast<long long>(largest_wal >> 10));
  EXPECT_GT(st.checkpoints, 0);
  EXPECT_EQ(st.transactions, 600);
  // Loose (the checkpointer runs when the scheduler lets it), yet far below the ~16 MiB of an
  // unchecked WAL.
  EXPECT_LT(largest_wal, 8 << 20);
  EXPECT_EQ((*store->CountByState())[v1::JOB_STATE_QUEUED], 600);
}

TEST(JobStoreTest, UpdateAppendsEventsAndChecksTransitions) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  v1::Job job = MakeJob("j-1", "k-1");
  ASSERT_TRUE(store->Submit(job, Ev("submitted")).ok());
  EXPECT_EQ(Move(*store, job, v1::JOB_STATE_PLACED, "placed"), 2);
  EXPECT_EQ(Move(*store, job, v1::JOB_STATE_RUNNING, "started"), 3);
  job.mutable_progress()->set_steps_done(1);
  EXPECT_EQ(Move(*store, job, v1::JOB_STATE_RUNNING, "progress"), 4);
  job.set_state_reason("done");
  EXPECT_EQ(Move(*store, job, v1::JOB_STATE_SUCCEEDED, "succeeded"), 5);

  absl::StatusOr<StoredJob> got = store->GetJob("j-1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(got->job.progress().steps_done(), 1);
  EXPECT_EQ(got->submit_seq, 1);

  absl::StatusOr<std::vector<v1::JobEvent>> events = store->Events("j-1", 0, 0);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> kinds;
  for (size_t i = 0; i < events->size(); ++i) {
    EXPECT_EQ((*events)[i].seq(), int64_t(i) + 1);
    kinds.push_back((*events)[i].kind());
  }
  EXPECT_THAT(kinds, ElementsAre("submitted", "placed", "started", "progress", "succeeded"));
  EXPECT_EQ((*events)[4].state(), v1::JOB_STATE_SUCCEEDED);
  absl::StatusOr<std::vector<v1::JobEvent>> window = store->Events("j-1", 2, 2);
  ASSERT_TRUE(window.ok());
  ASSERT_EQ(window->size(), 2u);
  EXPECT_EQ((*window)[0].seq(), 3);
  EXPECT_EQ((*window)[1].seq(), 4);
  // The latest two, oldest first; more than there are gives them all.
  absl::StatusOr<std::vector<v1::JobEvent>> latest = store->LatestEvents("j-1", 2);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_EQ(latest->size(), 2u);
  EXPECT_EQ((*latest)[0].seq(), 4);
  EXPECT_EQ((*latest)[1].seq(), 5);
  EXPECT_EQ(store->LatestEvents("j-1", 100)->size(), 5u);
  EXPECT_EQ(store->LatestEvents("j-1", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->LatestEvents("j-nope", 3).status().code(), absl::StatusCode::kNotFound);

  // Terminal is final; nothing is appended by a refused update.
  job.set_state(v1::JOB_STATE_RUNNING);
  absl::StatusOr<int64_t> bad = store->Update(job, Ev("started"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(bad.status().message(), HasSubstr("succeeded -> running"));
  EXPECT_THAT(bad.status().message(), HasSubstr("j-1"));
  EXPECT_EQ(store->Events("j-1", 0, 0)->size(), 5u);

  v1::Job ghost = MakeJob("j-ghost", "k-ghost");
  absl::StatusOr<int64_t> missing = store->Update(ghost, Ev("placed"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("j-ghost"));
}

TEST(JobStoreTest, UpdateKeepsKeyAndSpecImmutable) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  v1::Job job = MakeJob("j-1", "k-1");
  ASSERT_TRUE(store->Submit(job, Ev("submitted")).ok());
  v1::Job other_key = job;
  other_key.set_idempotency_key("k-2");
  EXPECT_EQ(store->Update(other_key, Ev("note")).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::Job other_spec = job;
  other_spec.mutable_spec()->mutable_attention()->set_seed(99);
  EXPECT_EQ(store->Update(other_spec, Ev("note")).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::JobEvent wrong_state = Ev("placed");
  wrong_state.set_state(v1::JOB_STATE_RUNNING);
  v1::Job placed = job;
  placed.set_state(v1::JOB_STATE_PLACED);
  EXPECT_EQ(store->Update(placed, wrong_state).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Events("j-1", 0, 0)->size(), 1u);
  EXPECT_EQ(store->GetJob("j-1")->job.state(), v1::JOB_STATE_QUEUED);
}

TEST(JobStoreTest, RacingUpdatesGetDistinctSeqsAndOnlyOneTerminal) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  v1::Job job = MakeJob("j-1", "k-1");
  ASSERT_TRUE(store->Submit(job, Ev("submitted")).ok());
  Move(*store, job, v1::JOB_STATE_PLACED, "placed");
  Move(*store, job, v1::JOB_STATE_RUNNING, "started");
  constexpr int kThreads = 4;
  constexpr int kPerThread = 50;
  std::vector<std::vector<int64_t>> seqs(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      v1::Job mine = job;
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<int64_t> seq = store->Update(mine, Ev("progress"));
        ASSERT_TRUE(seq.ok()) << seq.status();
        seqs[t].push_back(*seq);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<int64_t> all;
  for (const auto& s : seqs) all.insert(s.begin(), s.end());
  ASSERT_EQ(all.size(), size_t{kThreads * kPerThread});
  EXPECT_EQ(*all.begin(), 4);
  EXPECT_EQ(*all.rbegin(), 3 + kThreads * kPerThread);

  // A cancel racing a success: exactly one terminal update wins.
  std::atomic<int> ok{0}, refused{0};
  threads.clear();
  for (v1::JobState end :
       {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_CANCELLED, v1::JOB_STATE_FAILED}) {
    threads.emplace_back([&, end] {
      v1::Job mine = job;
      mine.set_state(end);
      absl::StatusOr<int64_t> seq = store->Update(mine, Ev(std::string(StateName(end))));
      (seq.ok() ? ok : refused)++;
      if (!seq.ok()) {
        EXPECT_EQ(seq.status().code(), absl::StatusCode::kFailedPrecondition);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 1);
  EXPECT_EQ(refused.load(), 2);
}

std::vector<std::string> Ids(const ListPage& page) {
  std::vector<std::string> ids;
  for (const StoredJob& j : page.jobs) ids.push_back(j.job.job_id());
  return ids;
}

// Walks every page of `filter` and returns the ids in order.
std::vector<std::string> ListAll(JobStore& store, const ListFilter& filter, int page_size) {
  std::vector<std::string> ids;
  std::string token;
  for (int pages = 0; pages < 1000; ++pages) {
    absl::StatusOr<ListPage> page = store.List(filter, page_size, token);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) break;
    EXPECT_LE(page->jobs.size(), static_cast<size_t>(page_size));
    for (const std::string& id : Ids(*page)) ids.push_back(id);
    token = page->next_page_token;
    if (token.empty()) break;
  }
  return ids;
}

TEST(JobStoreTest, ListNewestFirstWithPagesAndFilters) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  // 25 jobs: j-00 .. j-24; tenants cycle a, b, "" (stored as "default"); every 5th succeeds,
  // every 7th is cancelled, every 3rd (not yet ended) runs.
  std::vector<std::string> newest_first;
  for (int i = 0; i < 25; ++i) {
    const char* tenants[] = {"a", "b", ""};
    v1::Job job =
        MakeJob(absl::StrCat("j-", i < 10 ? "0" : "", i), absl::StrCat("k", i), tenants[i % 3]);
    ASSERT_TRUE(store->Submit(job, Ev("submitted")).ok());
    newest_first.insert(newest_first.begin(), job.job_id());
    if (i % 5 == 0 || i % 7 == 0 || i % 3 == 0) {
      Move(*store, job, v1::JOB_STATE_PLACED, "placed");
      Move(*store, job, v1::JOB_STATE_RUNNING, "started");
      if (i % 5 == 0) {
        Move(*store, job, v1::JOB_STATE_SUCCEEDED, "succeeded");
      } else if (i % 7 == 0) {
        Move(*store, job, v1::JOB_STATE_CANCELLED, "cancelled");
      }
    }
  }
  EXPECT_EQ(ListAll(*store, {}, 10), newest_first);
  EXPECT_EQ(ListAll(*store, {}, 1), newest_first);
  EXPECT_EQ(ListAll(*store, {}, 25), newest_first);
  absl::StatusOr<ListPage> exact = store->List({}, 25, "");
  ASSERT_TRUE(exact.ok());
  EXPECT_TRUE(exact->next_page_token.empty());  // No empty trailing page.
  absl::StatusOr<ListPage> deflt = store->List({}, 0, "");
  ASSERT_TRUE(deflt.ok());
  EXPECT_EQ(deflt->jobs.size(), 25u);

  auto expect_filter = [&](const ListFilter& f, auto pred) {
    std::vector<std::string> want;
    for (const std::string& id : newest_first) {
      if (pred(std::stoi(id.substr(2)))) want.push_back(id);
    }
    EXPECT_EQ(ListAll(*store, f, 4), want);
  };
  auto state_of = [](int i) {
    if (i % 5 == 0) return v1::JOB_STATE_SUCCEEDED;
    if (i % 7 == 0) return v1::JOB_STATE_CANCELLED;
    if (i % 3 == 0) return v1::JOB_STATE_RUNNING;
    return v1::JOB_STATE_QUEUED;
  };
  expect_filter({{v1::JOB_STATE_RUNNING}, "", ""},
                [&](int i) { return state_of(i) == v1::JOB_STATE_RUNNING; });
  expect_filter(
      {{v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_CANCELLED, v1::JOB_STATE_SUCCEEDED}, "", ""},
      [&](int i) {
        return state_of(i) == v1::JOB_STATE_SUCCEEDED || state_of(i) == v1::JOB_STATE_CANCELLED;
      });
  expect_filter({{}, "a", ""}, [](int i) { return i % 3 == 0; });
  expect_filter({{}, "default", ""}, [](int i) { return i % 3 == 2; });
  expect_filter({{v1::JOB_STATE_QUEUED}, "b", "attention"},
                [&](int i) { return i % 3 == 1 && state_of(i) == v1::JOB_STATE_QUEUED; });
  expect_filter({{}, "", "training"}, [](int) { return false; });
  expect_filter({{}, "nobody", ""}, [](int) { return false; });

  absl::StatusOr<ListPage> bad_state =
      store->List({{static_cast<v1::JobState>(42)}, "", ""}, 10, "");
  EXPECT_EQ(bad_state.status().code(), absl::StatusCode::kInvalidArgument);
  for (int size : {-1, 1001}) {
    absl::StatusOr<ListPage> bad = store->List({}, size, "");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << size;
    EXPECT_THAT(bad.status().message(), HasSubstr(std::to_string(size)));
  }
}

TEST(JobStoreTest, PagesStayStableWhileJobsArrive) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(store->Submit(MakeJob(absl::StrCat("j-", i), absl::StrCat("k", i)), Ev("s")).ok());
  }
  absl::StatusOr<ListPage> first = store->List({}, 3, "");
  ASSERT_TRUE(first.ok());
  EXPECT_THAT(Ids(*first), ElementsAre("j-5", "j-4", "j-3"));
  for (int i = 6; i < 9; ++i) {
    ASSERT_TRUE(store->Submit(MakeJob(absl::StrCat("j-", i), absl::StrCat("k", i)), Ev("s")).ok());
  }
  absl::StatusOr<ListPage> second = store->List({}, 3, first->next_page_token);
  ASSERT_TRUE(second.ok());
  EXPECT_THAT(Ids(*second), ElementsAre("j-2", "j-1", "j-0"));
  EXPECT_TRUE(second->next_page_token.empty());
  // A token can be replayed.
  absl::StatusOr<ListPage> replay = store->List({}, 3, first->next_page_token);
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(Ids(*replay), Ids(*second));
}

TEST(JobStoreTest, BadPageTokenIsInvalidArgument) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  ASSERT_TRUE(store->Submit(MakeJob("j-1", "k-1"), Ev("s")).ok());
  const std::string bad_tokens[] = {
      "garbage!",                                        // Not base64.
      absl::WebSafeBase64Escape("something else:5"),     // Wrong prefix.
      absl::WebSafeBase64Escape("dattn.jobs.v1:0"),      // Out of range.
      absl::WebSafeBase64Escape("dattn.jobs.v1:-3"),     //
      absl::WebSafeBase64Escape("dattn.jobs.v1:12abc"),  // Not a number.
  };
  for (const std::string& token : bad_tokens) {
    absl::StatusOr<ListPage> page = store->List({}, 10, token);
    EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument) << token;
    EXPECT_THAT(page.status().message(), HasSubstr(token));
  }
}

TEST(JobStoreTest, CountByStateAndLoadActive) {
  auto store = OpenOrDie(TestDir() + "/jobs.db");
  std::vector<v1::Job> jobs;
  for (int i = 0; i < 6; ++i) {
    jobs.push_back(MakeJob(absl::StrCat("j-", i), absl::StrCat("k", i)));
    ASSERT_TRUE(store->Submit(jobs.back(), Ev("submitted")).ok());
  }
  Move(*store, jobs[0], v1::JOB_STATE_CANCELLED, "cancelled");
  Move(*store, jobs[1], v1::JOB_STATE_PLACED, "placed");
  Move(*store, jobs[2], v1::JOB_STATE_PLACED, "placed");
  Move(*store, jobs[2], v1::JOB_STATE_RUNNING, "started");
  Move(*store, jobs[3], v1::JOB_STATE_FAILED, "failed");
  absl::StatusOr<std::map<v1::JobState, int64_t>> counts = store->CountByState();
  ASSERT_TRUE(counts.ok());
  std::map<v1::JobState, int64_t> want = {{v1::JOB_STATE_QUEUED, 2},
                                          {v1::JOB_STATE_PLACED, 1},
                                          {v1::JOB_STATE_RUNNING, 1},
                                          {v1::JOB_STATE_FAILED, 1},
                                          {v1::JOB_STATE_CANCELLED, 1}};
  EXPECT_EQ(*counts, want);
  absl::StatusOr<std::vector<StoredJob>> active = store->LoadActive();
  ASSERT_TRUE(active.ok());
  std::vector<std::string> ids;
  for (const StoredJob& j : *active) ids.push_back(j.job.job_id());
  EXPECT_THAT(ids, ElementsAre("j-1", "j-2", "j-4", "j-5"));
  EXPECT_EQ((*active)[1].job.state(), v1::JOB_STATE_RUNNING);
}

TEST(JobStoreTest, ReopenKeepsEverythingAndTheFileIsLocked) {
  const std::string path = TestDir() + "/jobs.db";
  v1::Job job = MakeJob("j-1", "k-1");
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store->Submit(job, Ev("submitted")).ok());
    Move(*store, job, v1::JOB_STATE_PLACED, "placed");
    ASSERT_TRUE(store->Submit(MakeJob("j-2", "k-2"), Ev("submitted")).ok());

    absl::StatusOr<std::unique_ptr<JobStore>> second = JobStore::Open(path);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(second.status().message(), HasSubstr(path));
    EXPECT_TRUE(store->Close().ok());
    EXPECT_TRUE(store->Close().ok());  // Idempotent.
    EXPECT_EQ(store->Submit(MakeJob("j-3", "k-3"), Ev("s")).status().code(),
              absl::StatusCode::kUnavailable);
    EXPECT_EQ(store->GetJob("j-1").status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(store->Health().code(), absl::StatusCode::kUnavailable);
  }
  auto store = OpenOrDie(path);
  absl::StatusOr<StoredJob> got = store->GetJob("j-1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->job.state(), v1::JOB_STATE_PLACED);
  EXPECT_EQ(store->Events("j-1", 0, 0)->size(), 2u);
  EXPECT_EQ(store->GetJobByKey("t", "k-2")->submit_seq, 2);
  EXPECT_EQ(Move(*store, job, v1::JOB_STATE_RUNNING, "started"), 3);
}

}  // namespace
}  // namespace server
}  // namespace dattn
