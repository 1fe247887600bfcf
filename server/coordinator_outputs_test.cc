// Outputs out of band: ranks upload their shards, the job succeeds once every shard is stored,
// ReadOutput streams the assembled tensor in chunks, listings carry no tensor, finished jobs are
// deleted on request and after the retention (on a FakeClock), and a restart keeps only what a
// succeeded job holds.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "api/limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/coordinator_test_util.h"

namespace dattn {
namespace server {
namespace {

using ctest::FakeWorker;
using ctest::ValidRequest;
using ctest::WaitFor;
using ::testing::HasSubstr;
using CoordinatorTest = ctest::CoordinatorTest;

// ValidRequest's job with its output kept, `ranks` ranks and batch `batch`: (batch, 256, 2, 16)
// fp32.
v1::SubmitJobRequest OutputRequest(const std::string& key, int ranks = 1, int batch = 1) {
  v1::SubmitJobRequest request = ValidRequest(key);
  v1::AttentionJobSpec* a = request.mutable_spec()->mutable_attention();
  a->set_return_output(true);
  a->set_num_ranks(ranks);
  a->mutable_shape()->set_batch(batch);
  return request;
}

v1::TensorHeader ShardHeader(int batch, int ranks) {
  v1::TensorHeader header;
  header.set_dtype(v1::DTYPE_FP32);
  for (int64_t d : {int64_t{batch}, int64_t{256 / ranks}, int64_t{2}, int64_t{16}}) {
    header.add_shape(d);
  }
  header.set_total_bytes(int64_t{batch} * (256 / ranks) * 2 * 16 * 4);
  return header;
}

// Bytes that tell (rank, position) apart: byte i of rank r's shard is (r * 97 + i * 13) % 251.
std::string ShardBytes(int rank, int64_t size) {
  std::string data(size, '\0');
  for (int64_t i = 0; i < size; ++i) data[i] = static_cast<char>((rank * 97 + i * 13) % 251);
  return data;
}

struct Read {
  absl::Status status;
  v1::TensorHeader header;
  std::string data;
  int chunks = 0;
  int64_t largest_chunk = 0;
};

Read ReadAll(Coordinator* coordinator, const std::string& job_id) {
  Read out;
  v1::ReadOutputRequest request;
  request.set_job_id(job_id);
  out.status = coordinator->ReadOutput(request, [&](const v1::TensorChunk& chunk) {
    if (chunk.has_header()) out.header = chunk.header();
    EXPECT_EQ(chunk.offset(), static_cast<int64_t>(out.data.size()));
    out.data += chunk.data();
    ++out.chunks;
    out.largest_chunk = std::max<int64_t>(out.largest_chunk, chunk.data().size());
    return true;
  });
  return out;
}

TEST_F(CoordinatorTest, AnUploadedOutputIsReadBackAndListingsCarryNoTensor) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(OutputRequest("out")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  const std::string task = assign->assign().task_id();
  // The plan travels with the assignment: the worker need not analyse the spec.
  ASSERT_TRUE(assign->assign().has_attention_plan());
  EXPECT_EQ(assign->assign().attention_plan().position_end(), 256);
  EXPECT_EQ(assign->assign().attention_plan().iterations(), 4);
  const v1::TensorHeader header = ShardHeader(1, 1);
  const std::string data = ShardBytes(0, header.total_bytes());
  absl::StatusOr<v1::UploadOutputResponse> up = worker->Upload(task, header, data, 5000);
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_FALSE(up->stop());
  ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_SUCCEEDED).ok());
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  EXPECT_EQ(job.result().attention().output_info().total_bytes(), header.total_bytes());
  EXPECT_FALSE(job.result().attention().has_output());
  Read read = ReadAll(coordinator_.get(), id);
  ASSERT_TRUE(read.status.ok()) << read.status;
  EXPECT_EQ(read.header.total_bytes(), header.total_bytes());
  EXPECT_EQ(read.data, data);
  v1::ListJobsRequest list;
  absl::StatusOr<v1::ListJobsResponse> listed = coordinator_->ListJobs(list);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->jobs_size(), 1);
  EXPECT_FALSE(listed->jobs(0).result().attention().has_output());
  EXPECT_TRUE(listed->jobs(0).result().attention().has_output_info());
}

// A ring's output is its ranks' shards interleaved per batch item: (B, N, H, D) row-major.
TEST_F(CoordinatorTest, ARingsOutputIsAssembledFromItsShardsInChunks) {
  FakeWorker* w0 = AddWorker("cpu-0");
  FakeWorker* w1 = AddWorker("cpu-1");
  const std::string id = Submit(OutputRequest("ring-out", 2, 3)).job_id();
  std::vector<std::pair<FakeWorker*, v1::TaskAssignment>> ranks;
  for (FakeWorker* w : {w0, w1}) {
    std::optional<v1::WorkerCommand> c = w->Next();
    ASSERT_TRUE(c.has_value());
    ranks.emplace_back(w, c->assign());
  }
  const v1::TensorHeader header = ShardHeader(3, 2);
  for (auto& [w, a] : ranks) {
    ASSERT_TRUE(w->Upload(a.task_id(), header, ShardBytes(a.rank(), header.total_bytes())).ok());
  }
  for (auto& [w, a] : ranks) {
    v1::TaskReport report;
    report.set_worker_id(w->id());
    report.set_task_id(a.task_id());
    report.set_state(v1::TASK_STATE_SUCCEEDED);
    report.mutable_rank_result()->set_seconds_per_step(0.1);
    report.set_ring_formation_seconds(0.01);
    w->Drop(a.task_id());
    ASSERT_TRUE(coordinator_->ReportTask(report).ok());
  }
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_SUCCEEDED) << Get(id).state_reason();
  Read read = ReadAll(coordinator_.get(), id);
  ASSERT_TRUE(read.status.ok()) << read.status;
  const int64_t block = 128 * 2 * 16 * 4;  // One batch item of one rank.
  std::string expected;
  for (int b = 0; b < 3; ++b) {
    for (int r = 0; r < 2; ++r)
      expected += ShardBytes(r, header.total_bytes()).substr(b * block, block);
  }
  EXPECT_EQ(read.data, expected);
  EXPECT_EQ(std::vector<int64_t>(read.header.shape().begin(), read.header.shape().end()),
            std::vector<int64_t>({3, 256, 2, 16}));
  EXPECT_LE(read.largest_chunk, api::kMaxOutputChunkBytes);
}

// A success without the shard the job keeps is not a success: the attempt is retried.
TEST_F(CoordinatorTest, SuccessWithoutTheOutputShardIsRetried) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(OutputRequest("no-shard")).job_id();
  std::optional<v1::WorkerCommand> first = worker->Next();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(worker->Report(first->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  v1::Job job = Get(id, true);
  EXPECT_NE(job.state(), v1::JOB_STATE_SUCCEEDED);
  bool requeued = false;
  for (const v1::JobEvent& e : job.events()) {
    requeued |= e.kind() == "requeued" &&
                e.message().find("without uploading its output shard") != std::string::npos;
  }
  EXPECT_TRUE(requeued) << job.DebugString();
  std::optional<v1::WorkerCommand> second = worker->Next();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->assign().attempt(), 2);
}

TEST_F(CoordinatorTest, BadUploadsAreRefusedNamingWhatIsWrong) {
  FakeWorker* worker = AddWorker("cpu-0");
  Submit(OutputRequest("bad-upload"));
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  const std::string task = assign->assign().task_id();
  v1::TensorHeader wrong = ShardHeader(1, 1);
  wrong.set_shape(1, 255);
  absl::StatusOr<v1::UploadOutputResponse> up = worker->Upload(task, wrong, "");
  EXPECT_EQ(up.status().code(), absl::StatusCode::kFailedPrecondition) << up.status();
  EXPECT_THAT(up.status().message(), HasSubstr("is not rank 0's"));
  // Chunks must arrive in order and end on the shard's size.
  const v1::TensorHeader header = ShardHeader(1, 1);
  v1::UploadOutputRequest first;
  first.set_worker_id(worker->id());
  first.set_task_id(task);
  *first.mutable_chunk()->mutable_header() = header;
  int calls = 0;
  up = coordinator_->UploadOutput(first, [&](v1::UploadOutputRequest* m) {
    if (calls++ > 0) return false;
    m->mutable_chunk()->set_offset(100);
    m->mutable_chunk()->set_data("x");
    return true;
  });
  EXPECT_EQ(up.status().code(), absl::StatusCode::kInvalidArgument) << up.status();
  EXPECT_THAT(up.status().message(), HasSubstr("in order"));
  up = worker->Upload(task, header, std::string(100, 'y'));
  EXPECT_EQ(up.status().code(), absl::StatusCode::kFailedPrecondition) << up.status();
  EXPECT_THAT(up.status().message(), HasSubstr("after 100 of its"));
  // A task the coordinator does not know: stop.
  up = worker->Upload("j-0000000000000000/1/0", header, "");
  ASSERT_TRUE(up.ok());
  EXPECT_TRUE(up->stop());
  // A job that keeps no output.
  const std::string plain = Submit(ValidRequest("plain")).job_id();
  ASSERT_TRUE(worker->Fail(task, absl::StatusCode::kInvalidArgument, "give up").ok());
  std::optional<v1::WorkerCommand> next = worker->Next();
  ASSERT_TRUE(next.has_value());
  ASSERT_EQ(next->assign().job_id(), plain);
  up = worker->Upload(next->assign().task_id(), header, "");
  EXPECT_EQ(up.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(up.status().message(), HasSubstr("keeps no output"));
}

TEST_F(CoordinatorTest, ReadingAnOutputThatIsNotThereSaysWhy) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string queued = Submit(ValidRequest("queued")).job_id();
  Read read = ReadAll(coordinator_.get(), queued);
  EXPECT_EQ(read.status.code(), absl::StatusCode::kFailedPrecondition) << read.status;
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  read = ReadAll(coordinator_.get(), queued);
  EXPECT_EQ(read.status.code(), absl::StatusCode::kNotFound) << read.status;
  EXPECT_THAT(read.status.message(), HasSubstr("without return_output"));
  read = ReadAll(coordinator_.get(), "j-unknown");
  EXPECT_EQ(read.status.code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, DeleteRemovesAFinishedJobAndItsOutput) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(OutputRequest("delete")).job_id();
  v1::DeleteJobRequest del;
  del.set_job_id(id);
  absl::StatusOr<v1::DeleteJobResponse> refused = coordinator_->DeleteJob(del);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  const v1::TensorHeader header = ShardHeader(1, 1);
  ASSERT_TRUE(
      worker->Upload(assign->assign().task_id(), header, ShardBytes(0, header.total_bytes())).ok());
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  const std::string outputs = options_.data_dir + "/outputs/" + id;
  EXPECT_TRUE(std::filesystem::exists(outputs));
  absl::StatusOr<v1::DeleteJobResponse> deleted = coordinator_->DeleteJob(del);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->output_bytes_freed(), header.total_bytes());
  EXPECT_FALSE(std::filesystem::exists(outputs));
  v1::GetJobRequest get;
  get.set_job_id(id);
  EXPECT_EQ(coordinator_->GetJob(get).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->DeleteJob(del).status().code(), absl::StatusCode::kNotFound);
}

// On a FakeClock: a finished job shows when it expires, and is deleted once its retention is over,
// while a queued job is not.
TEST_F(CoordinatorTest, FinishedJobsAreDeletedAfterTheRetention) {
  options_.retention = absl::Hours(1);
  UseFakeClock();
  const std::string done = Submit(ValidRequest("done")).job_id();
  const std::string waiting = Submit(ValidRequest("waiting")).job_id();
  ASSERT_TRUE(Cancel(done).ok());
  v1::Job job = Get(done);
  ASSERT_TRUE(job.has_expire_time());
  EXPECT_EQ(job.expire_time().seconds() - job.end_time().seconds(), 3600);
  clock_.Advance(absl::Minutes(59));
  absl::SleepFor(absl::Milliseconds(300));  // Monitor passes run; nothing is due yet.
  EXPECT_EQ(Get(done).state(), v1::JOB_STATE_CANCELLED);
  clock_.Advance(absl::Minutes(2));
  v1::GetJobRequest get;
  get.set_job_id(done);
  EXPECT_TRUE(WaitFor([&] { return absl::IsNotFound(coordinator_->GetJob(get).status()); }))
      << "still there after its retention";
  EXPECT_EQ(Get(waiting).state(), v1::JOB_STATE_QUEUED);
}

// Shards of attempts that did not succeed are removed; a succeeded job's output survives a restart.
TEST_F(CoordinatorTest, ARestartKeepsOnlyWhatSucceededJobsHold) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string kept = Submit(OutputRequest("kept")).job_id();
  std::optional<v1::WorkerCommand> a = worker->Next();
  ASSERT_TRUE(a.has_value());
  const v1::TensorHeader header = ShardHeader(1, 1);
  const std::string data = ShardBytes(0, header.total_bytes());
  ASSERT_TRUE(worker->Upload(a->assign().task_id(), header, data).ok());
  ASSERT_TRUE(worker->Report(a->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  // A running job's uploaded shard, then a restart: that attempt will never finish.
  const std::string running = Submit(OutputRequest("running")).job_id();
  std::optional<v1::WorkerCommand> b = worker->Next();
  ASSERT_TRUE(b.has_value());
  ASSERT_TRUE(worker->Upload(b->assign().task_id(), header, data).ok());
  const std::string stale = options_.data_dir + "/outputs/" + running + "/1";
  ASSERT_TRUE(std::filesystem::exists(stale));
  Restart();
  EXPECT_FALSE(std::filesystem::exists(stale));
  Read read = ReadAll(coordinator_.get(), kept);
  ASSERT_TRUE(read.status.ok()) << read.status;
  EXPECT_EQ(read.data, data);
}

}  // namespace
}  // namespace server
}  // namespace dattn
