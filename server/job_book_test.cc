// The job book alone: its state machine, the write protocol the coordinator drives, readers'
// view, watchers.
#include "server/job_book.h"

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_kind.h"

namespace dattn {
namespace server {
namespace {

using ::testing::HasSubstr;

class JobBookTest : public ::testing::Test {
 protected:
  JobRun* AddQueued(const std::string& id) {
    StoredJob stored;
    stored.job.set_job_id(id);
    stored.job.set_state(v1::JOB_STATE_QUEUED);
    stored.submit_seq = ++seq_;
    return book_.Add(stored, &kind_, nullptr);
  }
  // Commits every write of `ticket` as the coordinator would, numbering events from next_seq_.
  void CommitAll(const Ticket& ticket) {
    PendingWrite write;
    absl::Status done;
    while (book_.NextWrite(ticket, &write, &done)) book_.WriteCommitted(ticket, write, ++next_seq_);
    EXPECT_TRUE(done.ok()) << done;
  }

  Metrics metrics_;
  AttentionKind kind_{&metrics_};
  JobBook book_{&metrics_};
  const absl::Time now_ = absl::FromUnixSeconds(1000);
  int64_t seq_ = 0;
  int64_t next_seq_ = 1;
};

TEST_F(JobBookTest, ReadersSeeOnlyWhatIsCommittedAndWatchersGetIt) {
  JobRun* run = AddQueued("j-1");
  Watcher watcher;
  book_.Subscribe("j-1", &watcher);
  Ticket placed = book_.Transition(run, v1::JOB_STATE_PLACED, "placed", "on w-1", now_);
  ASSERT_NE(placed.queue, nullptr);
  EXPECT_EQ(run->job.state(), v1::JOB_STATE_PLACED);
  EXPECT_EQ(book_.Public(*run).state(), v1::JOB_STATE_QUEUED);  // Not yet durable.
  EXPECT_TRUE(book_.TakeEvents(&watcher).empty());
  CommitAll(placed);
  EXPECT_EQ(book_.Public(*run).state(), v1::JOB_STATE_PLACED);
  std::deque<v1::JobEvent> events = book_.TakeEvents(&watcher);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind(), "placed");
  EXPECT_EQ(events[0].seq(), 2);
  EXPECT_EQ(events[0].state(), v1::JOB_STATE_PLACED);
  EXPECT_TRUE(book_.AnyActiveRun());
  book_.Unsubscribe("j-1", &watcher);
  EXPECT_EQ(book_.watchers(), 0u);
}

TEST_F(JobBookTest, AFinishedJobLeavesOnceItsLastWriteCommits) {
  JobRun* run = AddQueued("j-2");
  Ticket cancelled = book_.Transition(run, v1::JOB_STATE_CANCELLED, "cancelled", "by test", now_);
  EXPECT_TRUE(run->terminal);
  EXPECT_TRUE(run->job.has_end_time());
  EXPECT_NE(book_.Find("j-2"), nullptr);
  CommitAll(cancelled);
  EXPECT_EQ(book_.Find("j-2"), nullptr);
  EXPECT_EQ(book_.size(), 0u);
}

TEST_F(JobBookTest, AForbiddenTransitionChangesNothing) {
  JobRun* run = AddQueued("j-3");
  Ticket t = book_.Transition(run, v1::JOB_STATE_SUCCEEDED, "succeeded", "skipping", now_);
  EXPECT_EQ(t.queue, nullptr);
  EXPECT_EQ(run->job.state(), v1::JOB_STATE_QUEUED);
}

// A transient failure keeps the write first in line and lists the queue as stalled; the next flush
// commits it in order. A refusal for good sticks to the job.
TEST_F(JobBookTest, FailedWritesStayInOrderOrStick) {
  JobRun* run = AddQueued("j-4");
  Ticket first = book_.Transition(run, v1::JOB_STATE_PLACED, "placed", "", now_);
  Ticket second = book_.Transition(run, v1::JOB_STATE_RUNNING, "started", "", now_);
  PendingWrite write;
  absl::Status done;
  ASSERT_TRUE(book_.NextWrite(first, &write, &done));
  absl::Status failed = book_.WriteFailed(first, write, absl::UnavailableError("disk full"));
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(failed.message()), HasSubstr("cannot record job j-4: disk full"));
  ASSERT_EQ(book_.Stalled().size(), 1u);
  EXPECT_EQ(book_.FirstPendingJob(book_.Stalled()[0]), "j-4");
  // The retry commits both, the placed event first.
  ASSERT_TRUE(book_.NextWrite(second, &write, &done));
  EXPECT_EQ(write.event.kind(), "placed");
  book_.WriteCommitted(second, write, 2);
  ASSERT_TRUE(book_.NextWrite(second, &write, &done));
  EXPECT_EQ(write.event.kind(), "started");
  book_.WriteCommitted(second, write, 3);
  EXPECT_FALSE(book_.NextWrite(second, &write, &done));
  EXPECT_TRUE(done.ok());
  book_.Unstall(second);
  EXPECT_TRUE(book_.Stalled().empty());

  Ticket third = book_.Transition(run, v1::JOB_STATE_SUCCEEDED, "succeeded", "", now_);
  ASSERT_TRUE(book_.NextWrite(third, &write, &done));
  book_.WriteFailed(third, write, absl::FailedPreconditionError("forbidden")).IgnoreError();
  EXPECT_FALSE(book_.NextWrite(third, &write, &done));
  EXPECT_EQ(done.code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace server
}  // namespace dattn
