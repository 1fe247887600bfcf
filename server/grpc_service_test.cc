#include "server/grpc_service.h"
#include "api/limits.h"

#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dattn/v1/admin.grpc.pb.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "dattn/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/access.h"
#include "server/coordinator.h"
#include "server/metrics.h"

namespace dattn {
namespace server {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

v1::SubmitJobRequest ValidRequest(const std::string& key) {
  v1::SubmitJobRequest request;
  request.set_idempotency_key(key);
  v1::AttentionJobSpec* a = request.mutable_spec()->mutable_attention();
  a->mutable_attention()->add_segment_lengths(32);
  a->mutable_attention()->add_dilation_rates(1);
  a->mutable_shape()->set_batch(1);
  a->mutable_shape()->set_seq_len(128);
  a->mutable_shape()->set_num_heads(1);
  a->mutable_shape()->set_head_dim(8);
  a->set_dtype(v1::DTYPE_FP64);
  a->set_num_ranks(1);
  return request;
}

class GrpcServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const char* tmp = std::getenv("TEST_TMPDIR");
    CoordinatorOptions options;
    options.data_dir =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/grpc_test_", getpid(), "_", counter++);
    options.stream_poll_interval = absl::Milliseconds(20);
    coordinator_ = std::make_unique<Coordinator>(options, &metrics_);
    absl::StatusOr<std::unique_ptr<GrpcServer>> server =
        GrpcServer::Start("127.0.0.1:0", coordinator_.get(), &metrics_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(api::kMaxMessageBytes);
    args.SetMaxSendMessageSize(api::kMaxMessageBytes);
    channel_ =
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args);
    jobs_ = v1::JobService::NewStub(channel_);
    workers_ = v1::WorkerRegistry::NewStub(channel_);
    admin_ = v1::AdminService::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
  }
  void TearDown() override {
    coordinator_->StopAccepting();
    coordinator_->CloseStreams();
    server_->Shutdown(absl::Now() + absl::Seconds(2));
    EXPECT_TRUE(coordinator_->Close().ok());
  }

  void StartCoordinator() {
    ASSERT_TRUE(coordinator_->Start().ok());
    server_->SetServing(true);
  }

  HealthCheckResponse::ServingStatus Health(const std::string& service) {
    grpc::ClientContext context;
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    grpc::Status s = health_->Check(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.status();
  }

  grpc::Status Submit(const v1::SubmitJobRequest& request, v1::SubmitJobResponse* response) {
    grpc::ClientContext context;
    return jobs_->SubmitJob(&context, request, response);
  }

  Metrics metrics_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerRegistry::Stub> workers_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

TEST(StatusMappingTest, EveryCodeMapsToTheSameGrpcCodeAndKeepsTheMessage) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code),
                              code == 0 ? "" : absl::StrCat("message ", code));
    const grpc::Status mapped = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(mapped.error_code()), code);
    EXPECT_EQ(mapped.error_message(), std::string(status.message()));
  }
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "odd")).error_code(),
            grpc::StatusCode::UNKNOWN);
}

TEST(AccessTest, LocalPeersAreLoopbackAndUnixSockets) {
  for (const char* local :
       {"ipv4:127.0.0.1:5000", "ipv4:127.1.2.3:1", "ipv6:[::1]:5000", "ipv6:[::ffff:127.0.0.1]:80",
        "unix:/run/dattn.sock", "unix-abstract:dattn"}) {
    EXPECT_TRUE(Access::IsLocalPeer(local)) << local;
  }
  for (const char* remote :
       {"ipv4:10.0.0.7:5000", "ipv4:128.0.0.1:1", "ipv6:[::2]:5000", "ipv6:[fe80::1]:22",
        "ipv6:%5B::2%5D:22", "ipv4:1.127.0.0:1", "", "127.0.0.1:80"}) {
    EXPECT_FALSE(Access::IsLocalPeer(remote)) << remote;
  }
}

TEST_F(GrpcServiceTest, LiveBeforeReadyThenServing) {
  // The server answers before the store is open: health NOT_SERVING, calls UNAVAILABLE.
  EXPECT_EQ(Health(""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health("dattn.v1.JobService"), HealthCheckResponse::NOT_SERVING);
  v1::SubmitJobResponse response;
  grpc::Status early = Submit(ValidRequest("early"), &response);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(early.error_message(), HasSubstr("starting"));

  StartCoordinator();
  EXPECT_EQ(Health(""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health("dattn.v1.JobService"), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health("dattn.v1.WorkerRegistry"), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health("dattn.v1.AdminService"), HealthCheckResponse::SERVING);

  server_->SetServing(false);
  EXPECT_EQ(Health(""), HealthCheckResponse::NOT_SERVING);
}

TEST_F(GrpcServiceTest, ErrorsKeepTheirCodesAndMessages) {
  StartCoordinator();
  v1::SubmitJobResponse response;
  ASSERT_TRUE(Submit(ValidRequest("a"), &response).ok());
  EXPECT_TRUE(response.created());
  const std::string id = response.job().job_id();

  v1::SubmitJobRequest bad = ValidRequest("b");
  bad.mutable_spec()->mutable_attention()->mutable_shape()->set_head_dim(0);
  grpc::Status invalid = Submit(bad, &response);
  EXPECT_EQ(invalid.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(invalid.error_message(), "spec.attention.shape.head_dim: must be >= 1, got 0");

  v1::SubmitJobRequest conflict = ValidRequest("a");
  conflict.mutable_spec()->set_priority(9);
  EXPECT_EQ(Submit(conflict, &response).error_code(), grpc::StatusCode::ALREADY_EXISTS);

  // A ring whose size does not divide N: refused, naming both.
  v1::SubmitJobRequest multi = ValidRequest("m");
  multi.mutable_spec()->mutable_attention()->set_num_ranks(3);
  grpc::Status ring = Submit(multi, &response);
  EXPECT_EQ(ring.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ring.error_message(),
            "spec.attention.num_ranks: must divide shape.seq_len = 128, got 3");

  {
    grpc::ClientContext context;
    v1::GetJobRequest get;
    get.set_job_id("j-ffffffffffffffff");
    v1::Job job;
    grpc::Status s = jobs_->GetJob(&context, get, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr("j-ffffffffffffffff"));
  }
  {
    grpc::ClientContext context;
    v1::CancelJobRequest cancel;
    cancel.set_job_id(id);
    v1::Job job;
    ASSERT_TRUE(jobs_->CancelJob(&context, cancel, &job).ok());
    EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  }
  {
    grpc::ClientContext context;
    v1::DrainWorkerRequest drain;
    drain.set_worker_id("nobody");
    v1::Worker worker;
    EXPECT_EQ(admin_->DrainWorker(&context, drain, &worker).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    v1::UndrainWorkerRequest undrain;
    undrain.set_worker_id("nobody");
    v1::Worker worker;
    grpc::Status s = admin_->UndrainWorker(&context, undrain, &worker);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr("\"nobody\""));
  }
  const std::string text = metrics_.Serialize();
  EXPECT_THAT(
      text, HasSubstr("dattn_rpc_total{code=\"OK\",method=\"/dattn.v1.JobService/SubmitJob\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_rpc_total{code=\"INVALID_ARGUMENT\",method=\"/"
                              "dattn.v1.JobService/SubmitJob\"} 2"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "dattn_rpc_total{code=\"NOT_FOUND\",method=\"/dattn.v1.AdminService/DrainWorker\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_rpc_total{code=\"NOT_FOUND\",method=\"/dattn.v1.AdminService/"
                              "UndrainWorker\"} 1"));
}

TEST_F(GrpcServiceTest, WorkerAndWatcherStreamsOverGrpc) {
  StartCoordinator();
  v1::RegisterWorkerRequest reg;
  reg.set_name("cpu-a");
  reg.mutable_capabilities()->set_total_memory_bytes(int64_t{1} << 30);
  reg.mutable_capabilities()->add_dtypes(v1::DTYPE_FP64);
  reg.mutable_capabilities()->set_max_ranks(1);
  v1::RegisterWorkerResponse registered;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(workers_->RegisterWorker(&context, reg, &registered).ok());
  }
  EXPECT_GT(registered.heartbeat_interval_ms(), 0);

  grpc::ClientContext stream_context;
  v1::StreamAssignmentsRequest stream_request;
  stream_request.set_worker_id(registered.worker_id());
  std::unique_ptr<grpc::ClientReader<v1::WorkerCommand>> commands =
      workers_->StreamAssignments(&stream_context, stream_request);

  v1::SubmitJobRequest request = ValidRequest("streamed");
  request.mutable_spec()->mutable_attention()->set_return_output(true);
  // (1, 6144, 16, 8) fp64: a 6 MiB output.
  request.mutable_spec()->mutable_attention()->mutable_shape()->set_seq_len(6144);
  request.mutable_spec()->mutable_attention()->mutable_shape()->set_num_heads(16);
  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(Submit(request, &submitted).ok());
  const std::string id = submitted.job().job_id();

  grpc::ClientContext watch_context;
  v1::WatchJobRequest watch;
  watch.set_job_id(id);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> events = jobs_->WatchJob(&watch_context, watch);

  v1::WorkerCommand command;
  ASSERT_TRUE(commands->Read(&command));
  ASSERT_TRUE(command.has_assign());
  EXPECT_EQ(command.assign().job_id(), id);

  // The shard goes up in a client stream of chunks, then the report.
  const std::string shard(size_t{6} << 20, 'x');
  {
    grpc::ClientContext context;
    v1::UploadOutputResponse uploaded;
    std::unique_ptr<grpc::ClientWriter<v1::UploadOutputRequest>> upload =
        workers_->UploadOutput(&context, &uploaded);
    v1::UploadOutputRequest first;
    first.set_worker_id(registered.worker_id());
    first.set_task_id(command.assign().task_id());
    first.mutable_chunk()->mutable_header()->set_dtype(v1::DTYPE_FP64);
    for (int64_t d : {1, 6144, 16, 8}) first.mutable_chunk()->mutable_header()->add_shape(d);
    first.mutable_chunk()->mutable_header()->set_total_bytes(static_cast<int64_t>(shard.size()));
    ASSERT_TRUE(upload->Write(first));
    for (size_t offset = 0; offset < shard.size(); offset += size_t{1} << 20) {
      v1::UploadOutputRequest chunk;
      chunk.mutable_chunk()->set_offset(static_cast<int64_t>(offset));
      chunk.mutable_chunk()->set_data(shard.substr(offset, size_t{1} << 20));
      ASSERT_TRUE(upload->Write(chunk));
    }
    ASSERT_TRUE(upload->WritesDone());
    grpc::Status s = upload->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_FALSE(uploaded.stop());
  }
  v1::TaskReport report;
  report.set_worker_id(registered.worker_id());
  report.set_task_id(command.assign().task_id());
  report.set_state(v1::TASK_STATE_SUCCEEDED);
  report.mutable_rank_result()->set_seconds_per_step(0.01);
  {
    grpc::ClientContext context;
    v1::ReportTaskResponse reply;
    grpc::Status s = workers_->ReportTask(&context, report, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_FALSE(reply.stop());
  }

  std::vector<std::string> kinds;
  v1::JobEvent event;
  while (events->Read(&event)) kinds.push_back(event.kind());
  EXPECT_TRUE(events->Finish().ok());
  EXPECT_THAT(kinds, ::testing::ElementsAre("submitted", "placed", "started", "succeeded"));

  {
    grpc::ClientContext context;
    v1::GetJobRequest get;
    get.set_job_id(id);
    v1::Job job;
    ASSERT_TRUE(jobs_->GetJob(&context, get, &job).ok());
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ(job.result().attention().output_info().total_bytes(), int64_t{6} << 20);
  }
  {
    // Read back in chunks of at most 4 MiB.
    grpc::ClientContext context;
    v1::ReadOutputRequest read;
    read.set_job_id(id);
    std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> chunks = jobs_->ReadOutput(&context, read);
    v1::TensorChunk chunk;
    std::string data;
    int count = 0;
    while (chunks->Read(&chunk)) {
      EXPECT_LE(chunk.data().size(), size_t{4} << 20);
      data += chunk.data();
      ++count;
    }
    ASSERT_TRUE(chunks->Finish().ok());
    EXPECT_EQ(data, shard);
    EXPECT_EQ(count, 3);  // The header, 4 MiB, 2 MiB.
  }
  {
    grpc::ClientContext context;
    v1::ListWorkersResponse list;
    ASSERT_TRUE(admin_->ListWorkers(&context, v1::ListWorkersRequest(), &list).ok());
    ASSERT_EQ(list.workers_size(), 1);
    EXPECT_EQ(list.workers(0).name(), "cpu-a");
  }
  // Closing the streams ends the worker's stream with UNAVAILABLE.
  coordinator_->CloseStreams();
  while (commands->Read(&command)) {
  }
  EXPECT_EQ(commands->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace server
}  // namespace dattn
