// Multi-rank jobs: gangs, rendezvous stores, formation failures, ring failures.
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "api/rendezvous.h"
#include "engine/comm/tcp_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/coordinator_test_util.h"
#include "server/job_state.h"
#include "server/metrics.h"

namespace dattn {
namespace server {
namespace {

using ctest::Assignments;
using ctest::FakeWorker;
using ctest::FormedReport;
using ctest::Holder;
using ctest::NewDataDir;
using ctest::RingRequest;
using ctest::ValidRequest;
using ctest::WaitFor;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using CoordinatorTest = ctest::CoordinatorTest;

TEST_F(CoordinatorTest, RingJobRunsAsAGangWithItsRendezvousAndCombinedResult) {
  std::vector<FakeWorker*> workers = {AddWorker("cpu-0"), AddWorker("cpu-1")};
  v1::SubmitJobRequest request = RingRequest("ring", 2);
  request.mutable_spec()->mutable_attention()->set_return_output(true);
  const std::string id = Submit(request).job_id();
  std::vector<v1::TaskAssignment> ranks = Assignments(workers);
  ASSERT_EQ(ranks.size(), 2u);
  const v1::Job placed = Get(id);
  ASSERT_EQ(placed.worker_ids_size(), 2);
  for (int r = 0; r < 2; ++r) {
    const v1::RingInfo& ring = ranks[r].ring();
    EXPECT_EQ(ranks[r].task_id(), absl::StrCat(id, "/1/", r));
    EXPECT_EQ(ring.ring_id(), id + "/1");
    EXPECT_EQ(ring.rank(), r);
    EXPECT_EQ(ring.size(), 2);
    EXPECT_EQ(ring.backend(), "gloo");
    EXPECT_EQ(ring.formation_timeout_ms(),
              absl::ToInt64Milliseconds(options_.ring_formation_timeout));
    EXPECT_EQ(ring.comm_timeout_ms(), absl::ToInt64Milliseconds(options_.ring_comm_timeout));
    EXPECT_EQ(ring.store_address(), ranks[0].ring().store_address());
    EXPECT_EQ(ring.store_secret().size(), 32u);
    EXPECT_EQ(ring.store_secret(), ranks[0].ring().store_secret());
  }
  // The store is up, and it is the ring's own: it holds what ranks put there, and only ranks that
  // present the ring's secret get in.
  const std::string address = ranks[0].ring().store_address();
  comm::TcpStoreOptions connect;
  connect.connect_timeout = absl::Seconds(2);
  connect.request_timeout = absl::Seconds(2);
  EXPECT_TRUE(absl::IsPermissionDenied(comm::TcpStore::Connect(address, connect).status()));
  connect.secret = ranks[0].ring().store_secret();
  {
    absl::StatusOr<std::unique_ptr<comm::TcpStore>> store =
        comm::TcpStore::Connect(address, connect);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Set(api::JoinedKey(id + "/1", 0), "rank 0").ok());
    EXPECT_TRUE((*store)->Get(api::JoinedKey(id + "/1", 0), absl::ZeroDuration()).ok());
  }
  v1::Job job = Get(id, true);
  EXPECT_THAT(job.events(1).message(), HasSubstr("gloo ring " + id + "/1"));
  EXPECT_THAT(job.events(1).message(), HasSubstr("rank 1 on "));

  // Each rank returns its (1, 128, 2, 16) fp32 shard; the job's output is rank 0's then rank 1's.
  std::string shards[2];
  for (int r = 0; r < 2; ++r) {
    FakeWorker* worker = Holder(workers, placed.worker_ids(r));
    ASSERT_NE(worker, nullptr);
    ASSERT_TRUE(coordinator_
                    ->ReportTask(
                        FormedReport(*worker, ranks[r].task_id(), v1::TASK_STATE_STARTED, 0.25 + r))
                    .ok());
    shards[r] = std::string(128 * 2 * 16 * 4, static_cast<char>('a' + r));
    v1::TaskReport done =
        FormedReport(*worker, ranks[r].task_id(), v1::TASK_STATE_SUCCEEDED, 0.25 + r);
    v1::RankResult* result = done.mutable_rank_result();
    result->set_seconds_per_step(0.1 * (r + 1));
    result->set_tflops(1.0 + r);
    result->set_out_sum(1.5);
    result->set_out_sum_squares(2.0 + r);
    v1::TensorHeader header;
    header.set_dtype(v1::DTYPE_FP32);
    for (int64_t d : {1, 128, 2, 16}) header.add_shape(d);
    header.set_total_bytes(static_cast<int64_t>(shards[r].size()));
    absl::StatusOr<v1::UploadOutputResponse> uploaded =
        worker->Upload(ranks[r].task_id(), header, shards[r]);
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
    absl::StatusOr<v1::ReportTaskResponse> reply = coordinator_->ReportTask(done);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_FALSE(reply->stop());
  }
  job = Get(id, true);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  const v1::AttentionJobResult& result = job.result().attention();
  ASSERT_EQ(result.ranks_size(), 2);
  EXPECT_DOUBLE_EQ(result.seconds_per_step(), 0.2);  // The slower rank.
  EXPECT_DOUBLE_EQ(result.out_sum(), 3.0);
  EXPECT_DOUBLE_EQ(result.out_sum_squares(), 5.0);
  EXPECT_DOUBLE_EQ(result.ranks(1).ring_formation_seconds(), 1.25);
  EXPECT_THAT(result.output_info().shape(), ElementsAre(1, 256, 2, 16));
  std::string output;
  v1::ReadOutputRequest read;
  read.set_job_id(id);
  ASSERT_TRUE(coordinator_
                  ->ReadOutput(read,
                               [&](const v1::TensorChunk& chunk) {
                                 output += chunk.data();
                                 return true;
                               })
                  .ok());
  EXPECT_EQ(output, shards[0] + shards[1]);

  const std::string text = metrics_->Serialize();
  EXPECT_THAT(text,
              HasSubstr("dattn_ring_formations_total{backend=\"gloo\",outcome=\"formed\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_ring_formation_seconds_count{backend=\"gloo\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_ring_formation_seconds_sum{backend=\"gloo\"} 1.25"));
  EXPECT_THAT(text, HasSubstr("dattn_attention_job_tflops_count{device=\"cpu\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_attention_step_seconds_count{device=\"cpu\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_worker_rank_step_seconds_count{worker=\"cpu-1\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_worker_attention_tflops{worker=\""));
  EXPECT_THAT(text, HasSubstr("dattn_worker_memory_free_bytes{worker=\"cpu-0\"} 1073741824"));
  EXPECT_THAT(text, HasSubstr("dattn_worker_memory_reserved_bytes{worker=\"cpu-0\"} 0"));

  // The attempt is over: its store goes away (the scheduling loop destroys it).
  EXPECT_TRUE(WaitFor([&] {
    comm::TcpStoreOptions quick = connect;
    quick.connect_timeout = absl::Milliseconds(50);
    quick.request_timeout = absl::Milliseconds(50);
    return absl::IsUnavailable(comm::TcpStore::Connect(address, quick).status());
  }));
}

TEST_F(CoordinatorTest, RingFormationTimeoutNamesTheMissingRankAndRequeues) {
  std::vector<FakeWorker*> workers = {AddWorker("early"), AddWorker("late")};
  const std::string id = Submit(RingRequest("form", 2)).job_id();
  std::vector<v1::TaskAssignment> ranks = Assignments(workers);
  ASSERT_EQ(ranks.size(), 2u);
  const v1::Job placed = Get(id);
  FakeWorker* first = Holder(workers, placed.worker_ids(0));
  FakeWorker* second = Holder(workers, placed.worker_ids(1));
  ASSERT_TRUE(first != nullptr && second != nullptr);
  // Rank 1's worker says it is still preparing; rank 0 arrives, waits, and times out.
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id(second->id());
  v1::RunningTask* running = heartbeat.add_tasks();
  running->set_task_id(ranks[1].task_id());
  running->set_phase(v1::RANK_PHASE_PREPARING);
  ASSERT_TRUE(coordinator_->Heartbeat(heartbeat).ok());
  {
    comm::TcpStoreOptions connect;
    connect.connect_timeout = absl::Seconds(2);
    connect.request_timeout = absl::Seconds(2);
    connect.secret = ranks[0].ring().store_secret();
    absl::StatusOr<std::unique_ptr<comm::TcpStore>> store =
        comm::TcpStore::Connect(ranks[0].ring().store_address(), connect);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Set(api::JoinedKey(ranks[0].ring().ring_id(), 0), "early").ok());
  }
  ASSERT_TRUE(first
                  ->Fail(ranks[0].task_id(), absl::StatusCode::kDeadlineExceeded,
                         "ring formation timed out after 30s: rank 1 of 2 never arrived")
                  .ok());
  // Requeued (and, both workers being free, possibly placed again at once).
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.attempt(), 2);
  std::vector<std::string> kinds = EventKinds(job);
  kinds.resize(std::min<size_t>(kinds.size(), 4));
  EXPECT_THAT(kinds, ElementsAre("submitted", "placed", "ring_formation_failed", "requeued"));
  const std::string& message = job.events(2).message();
  EXPECT_THAT(message, HasSubstr("ring " + id + "/1 did not form"));
  // Rank 1, its worker (id and name) and what that worker last said of it.
  EXPECT_THAT(message, ::testing::ContainsRegex("rank 1 on " + second->id() +
                                                " \\((early|late)\\) \\(preparing"));
  EXPECT_THAT(message, HasSubstr("never arrived within 30.0 s"));
  EXPECT_THAT(message, HasSubstr("rank 1 of 2 never arrived"));  // The reporting rank's words.
  EXPECT_THAT(job.events(3).message(), HasSubstr("ring formation failed: rank 1 on"));
  // The rank that never arrived is told to stop; the job runs again as attempt 2.
  std::optional<v1::WorkerCommand> cancel = second->Next();
  ASSERT_TRUE(cancel.has_value());
  ASSERT_TRUE(cancel->has_cancel());
  EXPECT_EQ(cancel->cancel().task_id(), ranks[1].task_id());
  EXPECT_TRUE(cancel->cancel().abort());  // Its attempt failed: stop at once.
  // Its slot stays taken until the worker says the rank ended: no attempt 2 before that.
  EXPECT_FALSE(first->Next(absl::Milliseconds(300)).has_value());
  ASSERT_TRUE(second->Report(ranks[1].task_id(), v1::TASK_STATE_CANCELLED).ok());
  std::optional<v1::WorkerCommand> again = first->Next();
  ASSERT_TRUE(again.has_value() && again->has_assign());
  EXPECT_EQ(again->assign().attempt(), 2);
  EXPECT_EQ(again->assign().ring().ring_id(), id + "/2");
  EXPECT_NE(again->assign().ring().store_address(), ranks[0].ring().store_address());
  EXPECT_EQ(again->assign().ring().store_secret().size(), 32u);
  EXPECT_NE(again->assign().ring().store_secret(), ranks[0].ring().store_secret());
  EXPECT_THAT(metrics_->Serialize(),
              HasSubstr("dattn_ring_formations_total{backend=\"gloo\",outcome=\"timed_out\"} 1"));
}

TEST_F(CoordinatorTest, RingRankFailureCancelsItsPeersAndRequeues) {
  std::vector<FakeWorker*> workers = {AddWorker("cpu-0"), AddWorker("cpu-1")};
  const std::string id = Submit(RingRequest("peer", 2)).job_id();
  std::vector<v1::TaskAssignment> ranks = Assignments(workers);
  ASSERT_EQ(ranks.size(), 2u);
  const v1::Job placed = Get(id);
  FakeWorker* first = Holder(workers, placed.worker_ids(0));
  FakeWorker* second = Holder(workers, placed.worker_ids(1));
  for (int r = 0; r < 2; ++r) {
    FakeWorker* w = r == 0 ? first : second;
    ASSERT_TRUE(
        coordinator_->ReportTask(FormedReport(*w, ranks[r].task_id(), v1::TASK_STATE_STARTED, 0.1))
            .ok());
  }
  v1::TaskReport failed = FormedReport(*second, ranks[1].task_id(), v1::TASK_STATE_FAILED, 0.1);
  failed.set_error("ring forward on rank 1 of 2, phase 1 of 2: recv from rank 0 failed");
  failed.set_error_code(static_cast<int>(absl::StatusCode::kUnavailable));
  ASSERT_TRUE(coordinator_->ReportTask(failed).ok());
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.attempt(), 2);
  std::vector<std::string> kinds = EventKinds(job);
  kinds.resize(std::min<size_t>(kinds.size(), 5));
  EXPECT_THAT(kinds, ElementsAre("submitted", "placed", "started", "ring_failed", "requeued"));
  EXPECT_THAT(job.events(3).message(), HasSubstr("rank 1 on " + second->id()));
  EXPECT_THAT(job.events(3).message(), HasSubstr("recv from rank 0 failed"));
  EXPECT_THAT(job.events(3).message(), HasSubstr("rank 0 on " + first->id()));
  // Its peer is cancelled (it still runs); the failing rank, which stopped, is not.
  std::optional<v1::WorkerCommand> cancel = first->Next();
  ASSERT_TRUE(cancel.has_value());
  ASSERT_TRUE(cancel->has_cancel());
  EXPECT_EQ(cancel->cancel().task_id(), ranks[0].task_id());
  // The peer's late report of the old attempt is stale.
  absl::StatusOr<v1::ReportTaskResponse> late =
      first->Fail(ranks[0].task_id(), absl::StatusCode::kAborted,
                  "communicator aborted: the task was cancelled");
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->stop());
  const std::string text = metrics_->Serialize();
  EXPECT_THAT(text,
              HasSubstr("dattn_ring_formations_total{backend=\"gloo\",outcome=\"formed\"} 1"));
  EXPECT_THAT(text,
              HasSubstr("dattn_recoveries_total{kind=\"task_failed\",outcome=\"requeued\"} 1"));
}

TEST_F(CoordinatorTest, RingsGoOnlyToWorkersThatJoinThem) {
  AddWorker("solo-0", int64_t{1} << 30, 1, true, /*joins_rings=*/false);
  AddWorker("solo-1", int64_t{1} << 30, 1, true, /*joins_rings=*/false);
  absl::StatusOr<v1::SubmitJobResponse> ring = coordinator_->SubmitJob(RingRequest("r", 2));
  ASSERT_FALSE(ring.ok());
  EXPECT_EQ(ring.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(ring.status().message()), HasSubstr("join sequence-parallel rings"));
  EXPECT_TRUE(coordinator_->SubmitJob(ValidRequest("single")).ok());
}

// After a restart, workers re-register one by one (each once its cancelled tasks stop). A ring that
// was running before is not failed by the feasibility check while only part of its cluster is back.
TEST_F(CoordinatorTest, ARingPlacedBeforeARestartWaitsForItsWorkers) {
  options_.feasibility_settle = absl::Milliseconds(50);
  Restart();
  std::vector<FakeWorker*> workers = {AddWorker("a"), AddWorker("b")};
  const std::string ring = Submit(RingRequest("ring", 2)).job_id();
  ASSERT_TRUE(WaitState(ring, v1::JOB_STATE_PLACED));
  Restart();
  FakeWorker* back = AddWorker("a");
  absl::SleepFor(absl::Milliseconds(400));  // Well past the settle time, one worker of two back.
  v1::Job job = Get(ring, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED) << job.state_reason();
  FakeWorker* other = AddWorker("b");
  ASSERT_TRUE(WaitState(ring, v1::JOB_STATE_PLACED)) << Get(ring).state_reason();
  EXPECT_TRUE(back->Next().has_value());
  EXPECT_TRUE(other->Next().has_value());
}

// A queued job that fitted the cluster at submit (found by the chaos run on GPUs: a coordinator
// killed while a worker was down failed the whole queue as "can never run"): after a restart with
// one worker of two back, it waits, and runs once the other is back. A job accepted while no worker
// was ready is still failed once the workers settle without room for it.
TEST_F(CoordinatorTest, AQueuedJobThatFittedBeforeARestartWaitsForItsWorkers) {
  options_.feasibility_settle = absl::Milliseconds(50);
  Restart();
  AddWorker("a");
  AddWorker("b");
  const std::string running = Submit(RingRequest("running", 2)).job_id();
  ASSERT_TRUE(WaitState(running, v1::JOB_STATE_PLACED));
  const v1::Job queued = Submit(RingRequest("queued", 2));  // Fits, behind the first.
  EXPECT_TRUE(queued.fitted_cluster());
  Restart();
  AddWorker("a");
  absl::SleepFor(absl::Milliseconds(400));  // Well past the settle time, one worker of two back.
  EXPECT_EQ(Get(queued.job_id()).state(), v1::JOB_STATE_QUEUED)
      << Get(queued.job_id()).state_reason();
  EXPECT_EQ(Get(running).state(), v1::JOB_STATE_QUEUED) << Get(running).state_reason();
  AddWorker("b");
  ASSERT_TRUE(WaitState(running, v1::JOB_STATE_PLACED)) << Get(running).state_reason();

  // Accepted with no worker ready, then a restart: checked against the workers that settle.
  Restart();
  const v1::Job unchecked = Submit(RingRequest("unchecked", 4));
  EXPECT_FALSE(unchecked.fitted_cluster());
  Restart();
  AddWorker("c");
  ASSERT_TRUE(WaitState(unchecked.job_id(), v1::JOB_STATE_FAILED));
  EXPECT_THAT(Get(unchecked.job_id()).state_reason(), HasSubstr("can never run"));
}

// Ring shrink (issue 19): a job a lost worker requeued, that the workers left cannot hold as it
// ran.
class ShrinkTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    options_.feasibility_settle = absl::Milliseconds(50);
    Restart();
  }

  // Submits `request`, waits until each of `workers` got its rank, and says they started.
  std::string Run(const v1::SubmitJobRequest& request, const std::vector<FakeWorker*>& workers) {
    const std::string id = Submit(request).job_id();
    for (const v1::TaskAssignment& rank : Assignments(workers)) {
      FakeWorker* w = Holder(workers, Get(id).worker_ids(rank.ring().rank()));
      EXPECT_NE(w, nullptr);
      if (w != nullptr) {
        EXPECT_TRUE(
            coordinator_->ReportTask(FormedReport(*w, rank.task_id(), v1::TASK_STATE_STARTED, 0.1))
                .ok());
      }
    }
    EXPECT_TRUE(WaitState(id, v1::JOB_STATE_RUNNING));
    return id;
  }

  // `lost` falls silent for good; the others end their cancelled ranks (as real workers do).
  void Lose(FakeWorker* lost, const std::vector<FakeWorker*>& others) {
    lost->StopHeartbeats();
    for (FakeWorker* w : others) {
      std::optional<v1::WorkerCommand> cancel = w->Next();
      ASSERT_TRUE(cancel.has_value() && cancel->has_cancel()) << w->id();
      EXPECT_TRUE(
          w->Fail(cancel->cancel().task_id(), absl::StatusCode::kAborted, "communicator aborted")
              .ok());
    }
  }
};

// 4 ranks, one worker lost for good: the job continues on the largest ring of the 3 workers left
// that divides seq_len (2), saying so, and keeps the spec it was asked for.
TEST_F(ShrinkTest, ARingThatLostAWorkerForGoodShrinksOntoTheWorkersLeft) {
  std::vector<FakeWorker*> workers = {AddWorker("a"), AddWorker("b"), AddWorker("c"),
                                      AddWorker("d")};
  v1::SubmitJobRequest request = RingRequest("shrink", 4);
  request.mutable_spec()->mutable_recovery()->set_shrink_ring(true);
  const std::string id = Run(request, workers);
  Lose(workers[3], {workers[0], workers[1], workers[2]});
  ASSERT_TRUE(
      WaitFor([&] { return Get(id).spec().attention().num_ranks() == 2; }, absl::Seconds(10)))
      << EventsText(Get(id, true));
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.requested_spec().attention().num_ranks(), 4);
  EXPECT_THAT(EventsText(job), HasSubstr("shrunk: the ready workers cannot hold the job as it "
                                         "ran (4 ranks): the job can never run on the ready "
                                         "workers"));
  EXPECT_THAT(EventsText(job), HasSubstr("it continues on 2 ranks ("));
  // The second attempt is a ring of 2 on two of the three survivors.
  ASSERT_TRUE(WaitState(id, v1::JOB_STATE_PLACED)) << EventsText(Get(id, true));
  job = Get(id);
  EXPECT_EQ(job.attempt(), 2);
  ASSERT_EQ(job.worker_ids_size(), 2);
  for (const std::string& w : job.worker_ids()) EXPECT_NE(w, workers[3]->id());
  EXPECT_THAT(metrics_->Serialize(), HasSubstr("outcome=\"shrunk\"} 1"));
}

// An attention job keeps its ring size unless its policy allows a shrink: it waits, saying why.
TEST_F(ShrinkTest, WithoutShrinkARingWaitsForItsWorkersAndSaysWhy) {
  std::vector<FakeWorker*> workers = {AddWorker("a"), AddWorker("b")};
  const std::string id = Run(RingRequest("fixed", 2), workers);
  Lose(workers[1], {workers[0]});
  ASSERT_TRUE(
      WaitFor([&] { return EventsText(Get(id, true)).find("waiting: ") != std::string::npos; },
              absl::Seconds(10)))
      << EventsText(Get(id, true));
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.spec().attention().num_ranks(), 2);
  EXPECT_THAT(EventsText(job),
              HasSubstr("its recovery policy allows no fewer ranks (spec.recovery.shrink_ring, "
                        "spec.recovery.single_device): it waits for workers"));
}

TEST_F(ShrinkTest, WithSingleDeviceOnlyARingContinuesOnOneRank) {
  std::vector<FakeWorker*> more = {AddWorker("c"), AddWorker("d")};
  v1::SubmitJobRequest single = RingRequest("single", 2);
  single.mutable_spec()->mutable_recovery()->set_single_device(true);
  const std::string one = Run(single, more);
  Lose(more[1], {more[0]});
  ASSERT_TRUE(
      WaitFor([&] { return Get(one).spec().attention().num_ranks() == 1; }, absl::Seconds(10)))
      << EventsText(Get(one, true));
  EXPECT_THAT(EventsText(Get(one, true)), HasSubstr("it continues on 1 rank ("));
}

// A training gang of 2 x 2 that lost a worker continues as 1 x 2 (the most ranks, then the most
// sequence ranks) from its newest checkpoint, by default (a deployment's ring:
// coordinator_deployments_test).
TEST_F(ShrinkTest, ATrainingGangShrinksByDefault) {
  std::vector<FakeWorker*> workers = {
      AddWorker("a", int64_t{64} << 30), AddWorker("b", int64_t{64} << 30),
      AddWorker("c", int64_t{64} << 30), AddWorker("d", int64_t{64} << 30)};
  v1::SubmitJobRequest request;
  request.set_idempotency_key("gang");
  v1::TrainingJobSpec* training = request.mutable_spec()->mutable_training();
  training->set_config_json(ctest::LadderTrainingConfig(1));
  training->set_device(v1::DEVICE_PREFERENCE_CPU);
  training->set_data_parallel(2);
  training->set_sequence_parallel(2);
  const std::string id = Run(request, workers);
  Lose(workers[0], {workers[1], workers[2], workers[3]});
  ASSERT_TRUE(
      WaitFor([&] { return Get(id).spec().training().data_parallel() == 1; }, absl::Seconds(10)))
      << EventsText(Get(id, true));
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.spec().training().sequence_parallel(), 2);
  EXPECT_EQ(job.requested_spec().training().data_parallel(), 2);
  EXPECT_THAT(EventsText(job),
              HasSubstr("it continues on data_parallel 1, sequence_parallel 2, micro_batches 1 ("));
  EXPECT_THAT(EventsText(job), HasSubstr("from its newest checkpoint"));
}

}  // namespace
}  // namespace server
}  // namespace dattn
