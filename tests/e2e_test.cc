// End-to-end tests of the control plane: the real dattn-coordinator, dattn-worker and dattn
// binaries on loopback, driven through the CLI and raw gRPC. Each test builds its own cluster (own
// data dir, ephemeral ports), so tests are independent and may run in parallel.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "dattn/v1/job_service.grpc.pb.h"
#include "engine/attention_spec.h"
#include "engine/testing/oracle.h"
#include "client/connection.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/cluster_fixture.h"
#include "worker/random_inputs.h"

namespace dattn::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A job small enough for a few milliseconds per step on one CPU thread.
std::vector<std::string> SmallJobFlags(const std::string& pass = "fwd-bwd", int seed = 7,
                                       int iterations = 1) {
  return {"--seq-len=96",
          "--heads=3",
          "--head-dim=8",
          "--segments=16,32",
          "--rates=1,2",
          "--dtype=fp64",
          "--pass=" + pass,
          "--seed=" + std::to_string(seed),
          "--iterations=" + std::to_string(iterations)};
}

// A job that runs for many seconds (cancel and kill tests): a long sequence, many iterations.
std::vector<std::string> LongJobFlags(int iterations = 100000) {
  return {"--seq-len=8192", "--heads=4",
          "--head-dim=64",  "--segments=1024,2048",
          "--rates=1,2",    "--dtype=fp32",
          "--pass=fwd-bwd", "--iterations=" + std::to_string(iterations)};
}

using E2E = ClusterTest;

// Submit through the CLI, watch to completion, and check the reported result against the float64
// oracle run here on the same generated inputs.
TEST_F(E2E, SubmitWatchAndCheckResultAgainstOracle) {
  StartCluster(2);
  std::vector<std::string> args = {"submit"};
  for (const auto& f : SmallJobFlags("fwd-bwd", 7, 2)) args.push_back(f);
  args.push_back("--watch");
  ProcessResult r = cluster_->Cli(args, seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
  const std::string id = JobIdFrom(r.out);
  ASSERT_FALSE(id.empty()) << r.out;

  dattn::v1::Job job;
  ASSERT_TRUE(cluster_->WaitForJobEnd(id, seconds(10), &job));
  ASSERT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  EXPECT_TRUE(HasEvent(job, "submitted")) << EventsText(job);
  EXPECT_TRUE(HasEvent(job, "placed")) << EventsText(job);
  EXPECT_TRUE(HasEvent(job, "started")) << EventsText(job);
  EXPECT_EQ(job.progress().steps_done(), 2);
  ASSERT_TRUE(job.result().has_attention());
  const auto& result = job.result().attention();
  ASSERT_EQ(result.ranks_size(), 1);

  // The same function, computed independently: inputs from the documented generator, the oracle.
  oracle::Shape shape;
  shape.batch = 1;
  shape.seq_len = 96;
  shape.num_heads = 3;
  shape.head_dim = 8;
  const int64_t n = shape.NumElements();
  std::vector<double> q(n), k(n), v(n), dout(n);
  for (int64_t i = 0; i < n; ++i) {
    q[i] = worker::StandardNormalAt(7, worker::InputTensor::kQ, i);
    k[i] = worker::StandardNormalAt(7, worker::InputTensor::kK, i);
    v[i] = worker::StandardNormalAt(7, worker::InputTensor::kV, i);
    dout[i] = worker::StandardNormalAt(7, worker::InputTensor::kDout, i);
  }
  AttentionSpec spec;
  spec.segment_lengths = {16, 32};
  spec.dilation_rates = {1, 2};
  auto fwd = oracle::Forward(spec, shape, q, k, v);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  auto grads = oracle::Backward(spec, shape, q, k, v, dout);
  ASSERT_TRUE(grads.ok()) << grads.status();
  double out_sum = 0, out_sq = 0, grad_sum = 0, grad_sq = 0;
  for (double x : fwd->out) out_sum += x, out_sq += x * x;
  for (const auto* g : {&grads->dq, &grads->dk, &grads->dv}) {
    for (double x : *g) grad_sum += x, grad_sq += x * x;
  }
  // fp64 end to end: sums agree to rounding (a sum of ~2300 terms, relative to its magnitude).
  EXPECT_NEAR(result.out_sum_squares(), out_sq, 1e-10 * out_sq);
  EXPECT_NEAR(result.out_sum(), out_sum, 1e-10 * std::sqrt(out_sq) * 50);
  EXPECT_NEAR(result.grad_sum_squares(), grad_sq, 1e-10 * grad_sq);
  EXPECT_NEAR(result.grad_sum(), grad_sum, 1e-10 * std::sqrt(grad_sq) * 50);
  EXPECT_GT(result.seconds_per_step(), 0);
  EXPECT_GT(result.tflops(), 0);

  // The CLI shows the finished job.
  ProcessResult status = cluster_->Cli({"status", id});
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_NE(status.out.find("succeeded"), std::string::npos) << status.out;
}

// Outputs beyond any message size: a 64 MiB output, after which listings stay small (they carry no
// tensor), and a 256 MiB output streamed back to a .npy file that equals the float64 oracle in
// every element. w = [16], r = [1], not causal: each 16-row segment depends only on its own rows,
// so the oracle runs a segment-aligned block of rows at a time on inputs drawn at their global
// positions, and nothing the size of the output is ever in this process's memory at once.
TEST_F(E2E, LargeOutputsStreamAndListingsStaySmall) {
  StartCluster(1);
  const std::string small = cluster_->dir() + "/64mib.npy";
  // (1, 65536, 16, 16) fp32 = 64 MiB.
  ProcessResult r = cluster_->Cli(
      {"submit", "--seq-len=65536", "--heads=16", "--head-dim=16", "--segments=16", "--rates=1",
       "--dtype=fp32", "--device=cpu", "--seed=3", "--output-file=" + small},
      seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
  ProcessResult list = cluster_->Cli({"list"});
  EXPECT_EQ(list.exit_code, 0) << list.out << list.err;
  {
    dattn::v1::ListJobsRequest request;
    dattn::v1::ListJobsResponse response;
    grpc::ClientContext ctx;
    ASSERT_TRUE(cluster_->jobs().ListJobs(&ctx, request, &response).ok());
    ASSERT_EQ(response.jobs_size(), 1);
    EXPECT_LT(response.ByteSizeLong(), size_t{64} << 10);
    EXPECT_EQ(response.jobs(0).result().attention().output_info().total_bytes(), int64_t{64} << 20);
  }
  EXPECT_EQ(ReadNpyData(small).size(), size_t{64} << 20);
  std::filesystem::remove(small);

  // (1, 262144, 16, 16) fp32 = 256 MiB.
  const std::string big = cluster_->dir() + "/256mib.npy";
  const oracle::Shape shape{1, 262144, 16, 16};
  r = cluster_->Cli(
      {"submit", "--seq-len=262144", "--heads=16", "--head-dim=16", "--segments=16", "--rates=1",
       "--dtype=fp32", "--device=cpu", "--seed=11", "--output-file=" + big},
      seconds(600));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
  std::ifstream in(big, std::ios::binary);
  char magic[10];
  ASSERT_TRUE(in.read(magic, 10));
  const size_t header_len =
      static_cast<unsigned char>(magic[8]) | (static_cast<unsigned char>(magic[9]) << 8);
  in.seekg(static_cast<std::streamoff>(10 + header_len));
  AttentionSpec spec;
  spec.segment_lengths = {16};
  spec.dilation_rates = {1};
  constexpr int64_t kBlock = 2048;  // Positions per oracle call: 128 segments.
  const int64_t row = shape.num_heads * shape.head_dim;
  std::vector<float> got(static_cast<size_t>(kBlock * row));
  double err = 0, norm = 0;
  for (int64_t p0 = 0; p0 < shape.seq_len; p0 += kBlock) {
    const oracle::Shape block{1, kBlock, shape.num_heads, shape.head_dim};
    const int64_t n = block.NumElements();
    std::vector<double> q(n), k(n), v(n);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t global = static_cast<uint64_t>(p0 * row + i);
      q[i] = worker::StandardNormalAt(11, worker::InputTensor::kQ, global);
      k[i] = worker::StandardNormalAt(11, worker::InputTensor::kK, global);
      v[i] = worker::StandardNormalAt(11, worker::InputTensor::kV, global);
    }
    auto fwd = oracle::Forward(spec, block, q, k, v);
    ASSERT_TRUE(fwd.ok());
    ASSERT_TRUE(in.read(reinterpret_cast<char*>(got.data()), n * 4)) << "short at " << p0;
    for (int64_t i = 0; i < n; ++i) {
      err += (got[i] - fwd->out[i]) * (got[i] - fwd->out[i]);
      norm += fwd->out[i] * fwd->out[i];
    }
  }
  char extra;
  EXPECT_FALSE(in.read(&extra, 1)) << "the file is longer than the tensor";
  EXPECT_LE(std::sqrt(err / norm), 1e-5);  // fp32 on the CPU.
}

// The output tensor travels back when asked and equals the oracle's output.
TEST_F(E2E, ReturnedOutputEqualsOracle) {
  StartCluster(1);
  const std::string file = cluster_->dir() + "/out.npy";
  std::vector<std::string> args = {"submit", "--output-file=" + file};
  for (const auto& f : SmallJobFlags("fwd")) args.push_back(f);
  ProcessResult r = cluster_->Cli(args, seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
  std::string dict;
  const std::string bytes = ReadNpyData(file, &dict);
  EXPECT_NE(dict.find("'descr': '<f8', 'fortran_order': False, 'shape': (1, 96, 3, 8)"),
            std::string::npos)
      << dict;
  oracle::Shape shape{1, 96, 3, 8};
  const int64_t n = shape.NumElements();
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), n * 8);
  std::vector<double> q(n), k(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    q[i] = worker::StandardNormalAt(7, worker::InputTensor::kQ, i);
    k[i] = worker::StandardNormalAt(7, worker::InputTensor::kK, i);
    v[i] = worker::StandardNormalAt(7, worker::InputTensor::kV, i);
  }
  AttentionSpec spec;
  spec.segment_lengths = {16, 32};
  spec.dilation_rates = {1, 2};
  auto fwd = oracle::Forward(spec, shape, q, k, v);
  ASSERT_TRUE(fwd.ok());
  const double* got = reinterpret_cast<const double*>(bytes.data());
  double err = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += (got[i] - fwd->out[i]) * (got[i] - fwd->out[i]);
    norm += fwd->out[i] * fwd->out[i];
  }
  EXPECT_LE(std::sqrt(err / norm), 1e-12);
}

// 3,000 tiny jobs on two one-slot workers: right after a rank succeeds the coordinator places the
// next job on the same worker, so a worker that freed its slot only after sending its final report
// refused it as busy (about 1 job in 1,500 failed that way, all attempts spent in milliseconds).
// Every job must succeed on its first attempt: attempt 1 means no placement was refused or failed.
TEST_F(E2E, ThousandsOfTinyJobsOnOneSlotWorkersAllSucceedFirstTime) {
  StartCluster(0);
  std::string error;
  for (int i = 0; i < 2; ++i)
    ASSERT_GE(cluster_->AddWorker(1, &error, "", {"--slots=1"}), 0) << error;
  ASSERT_TRUE(cluster_->WaitForReadyWorkers(2, seconds(30))) << cluster_->Logs();

  constexpr int kJobs = 3000;
  constexpr int kSubmitters = 8;
  std::vector<std::thread> submitters;
  std::atomic<int> submit_errors{0};
  for (int t = 0; t < kSubmitters; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = t; i < kJobs; i += kSubmitters) {
        dattn::v1::SubmitJobRequest request;
        request.set_idempotency_key("tiny-" + std::to_string(i));
        auto* a = request.mutable_spec()->mutable_attention();
        a->mutable_attention()->add_segment_lengths(8);
        a->mutable_attention()->add_dilation_rates(1);
        a->mutable_shape()->set_batch(1);
        a->mutable_shape()->set_seq_len(16);
        a->mutable_shape()->set_num_heads(1);
        a->mutable_shape()->set_head_dim(4);
        a->set_dtype(dattn::v1::DTYPE_FP32);
        a->set_num_ranks(1);
        a->set_seed(static_cast<uint64_t>(i));
        a->set_device(dattn::v1::DEVICE_PREFERENCE_CPU);
        dattn::v1::SubmitJobResponse response;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
        if (!cluster_->jobs().SubmitJob(&ctx, request, &response).ok()) ++submit_errors;
      }
    });
  }
  for (std::thread& t : submitters) t.join();
  ASSERT_EQ(submit_errors.load(), 0) << cluster_->Logs();

  // Page through every job until none is active; then every one must have succeeded first time.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(8);
  int succeeded = 0;
  std::vector<std::string> problems;
  while (std::chrono::steady_clock::now() < deadline) {
    succeeded = 0;
    problems.clear();
    int active = 0;
    std::string token;
    do {
      dattn::v1::ListJobsRequest request;
      request.set_page_size(1000);
      request.set_page_token(token);
      dattn::v1::ListJobsResponse response;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
      ASSERT_TRUE(cluster_->jobs().ListJobs(&ctx, request, &response).ok());
      for (const auto& job : response.jobs()) {
        switch (job.state()) {
          case dattn::v1::JOB_STATE_SUCCEEDED:
            ++succeeded;
            if (job.attempt() != 1) {
              problems.push_back(job.job_id() + " succeeded on attempt " +
                                 std::to_string(job.attempt()));
            }
            break;
          case dattn::v1::JOB_STATE_FAILED:
          case dattn::v1::JOB_STATE_CANCELLED:
            problems.push_back(job.job_id() + " ended " + dattn::v1::JobState_Name(job.state()) +
                               ": " + job.state_reason());
            break;
          default:
            ++active;
        }
      }
      token = response.next_page_token();
    } while (!token.empty());
    if (active == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_EQ(succeeded, kJobs);
  EXPECT_TRUE(problems.empty()) << problems.size() << " jobs, e.g. " << problems.front();
}

TEST_F(E2E, CancelWhileQueued) {
  StartCluster(0);  // No workers: the job stays queued.
  const std::string id = Submit(SmallJobFlags());
  dattn::v1::Job job;
  ASSERT_TRUE(cluster_->WaitForJobState(id, dattn::v1::JOB_STATE_QUEUED, seconds(5), &job));
  ProcessResult c = cluster_->Cli({"cancel", id, "--reason=test says stop"});
  EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
  ASSERT_TRUE(cluster_->WaitForJobEnd(id, seconds(10), &job));
  EXPECT_EQ(job.state(), dattn::v1::JOB_STATE_CANCELLED);
  EXPECT_NE(job.state_reason().find("test says stop"), std::string::npos) << job.state_reason();
  // A watcher of a cancelled job ends with the documented exit code.
  ProcessResult w = cluster_->Cli({"watch", id});
  EXPECT_EQ(w.exit_code, 6) << w.out << w.err;
}

TEST_F(E2E, CancelWhileRunning) {
  StartCluster(1);
  const std::string id = Submit(LongJobFlags());
  dattn::v1::Job job;
  ASSERT_TRUE(cluster_->WaitForJobState(id, dattn::v1::JOB_STATE_RUNNING, seconds(30), &job))
      << cluster_->Logs();
  ProcessResult c = cluster_->Cli({"cancel", id});
  EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
  ASSERT_TRUE(cluster_->WaitForJobEnd(id, seconds(30), &job)) << cluster_->Logs();
  EXPECT_EQ(job.state(), dattn::v1::JOB_STATE_CANCELLED) << EventsText(job);
  // The worker is free again: a new job runs to completion.
  std::vector<std::string> flags = SmallJobFlags();
  flags.push_back("--wait");
  ProcessResult r = cluster_->Cli([&] {
    std::vector<std::string> a = {"submit"};
    a.insert(a.end(), flags.begin(), flags.end());
    return a;
  }());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
}

TEST_F(E2E, IdempotentResubmit) {
  StartCluster(1);
  std::vector<std::string> flags = SmallJobFlags();
  flags.push_back("--idempotency-key=e2e-key-1");
  const std::string first = Submit(flags);
  const std::string second = Submit(flags);
  EXPECT_EQ(first, second);
  // The same key with another spec is refused, naming the key.
  std::vector<std::string> args = {"submit", "--idempotency-key=e2e-key-1"};
  for (const auto& f : SmallJobFlags("fwd-bwd", 8)) args.push_back(f);
  ProcessResult r = cluster_->Cli(args);
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("e2e-key-1"), std::string::npos) << r.out << r.err;
  // Exactly one job exists.
  dattn::v1::ListJobsRequest req;
  dattn::v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(cluster_->jobs().ListJobs(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.jobs_size(), 1);
}

// kill -9 of the coordinator with queued and running jobs: after a restart on the same data dir
// every acknowledged job is there, and all of them finish.
TEST_F(E2E, CoordinatorKill9LosesNothing) {
  StartCluster(1);
  const std::string running = Submit(LongJobFlags());
  dattn::v1::Job job;
  ASSERT_TRUE(cluster_->WaitForJobState(running, dattn::v1::JOB_STATE_RUNNING, seconds(30), &job))
      << cluster_->Logs();
  std::vector<std::string> queued;
  for (int i = 0; i < 5; ++i) {
    queued.push_back(Submit(SmallJobFlags("fwd-bwd", 100 + i)));
  }
  cluster_->coordinator().Signal(SIGKILL);
  ASSERT_TRUE(cluster_->coordinator().Wait(seconds(10)).has_value());

  std::string error;
  ASSERT_TRUE(cluster_->StartCoordinator(&error)) << error;
  for (const std::string& id : queued) {
    grpc::ClientContext ctx;
    dattn::v1::GetJobRequest req;
    req.set_job_id(id);
    dattn::v1::Job got;
    grpc::Status s = cluster_->jobs().GetJob(&ctx, req, &got);
    ASSERT_TRUE(s.ok()) << id << ": " << s.error_message();
  }
  // The running job was requeued (its history says why); cancel it so the queue drains quickly.
  ASSERT_TRUE(cluster_->WaitForJobState(running, dattn::v1::JOB_STATE_RUNNING, seconds(60), &job))
      << EventsText(job) << cluster_->Logs();
  EXPECT_TRUE(HasEvent(job, "coordinator_restarted")) << EventsText(job);
  ProcessResult c = cluster_->Cli({"cancel", running});
  EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
  for (const std::string& id : queued) {
    ASSERT_TRUE(cluster_->WaitForJobEnd(id, seconds(60), &job)) << id << cluster_->Logs();
    EXPECT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << id << " " << job.state_reason();
  }
}

// kill -9 of a worker running a job: the coordinator notices the silence, records the loss with a
// reason, and the job runs again on the other worker.
TEST_F(E2E, WorkerKill9IsRecordedAndRecovered) {
  ClusterOptions options;
  options.dead_after_ms = 1500;
  StartCluster(0, options);
  std::string error;
  ASSERT_GE(cluster_->AddWorker(1, &error, "victim"), 0) << error;
  ASSERT_TRUE(cluster_->WaitForReadyWorkers(1, seconds(30))) << cluster_->Logs();
  const std::string id = Submit(LongJobFlags(12));
  dattn::v1::Job job;
  ASSERT_TRUE(cluster_->WaitForJobState(id, dattn::v1::JOB_STATE_RUNNING, seconds(30), &job))
      << cluster_->Logs();
  ASSERT_GE(cluster_->AddWorker(1, &error, "survivor"), 0) << error;
  ASSERT_TRUE(cluster_->WaitForReadyWorkers(2, seconds(30))) << cluster_->Logs();
  cluster_->worker(0).Signal(SIGKILL);

  ASSERT_TRUE(cluster_->WaitForJobEnd(id, seconds(120), &job)) << cluster_->Logs();
  EXPECT_TRUE(HasEvent(job, "worker_lost")) << EventsText(job);
  bool names_victim = false;
  for (const auto& e : job.events()) {
    if (e.kind() == "worker_lost" && e.message().find("victim") != std::string::npos) {
      names_victim = true;
    }
  }
  EXPECT_TRUE(names_victim) << EventsText(job);
  EXPECT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << EventsText(job);
  EXPECT_GE(job.attempt(), 2);
  ProcessResult workers = cluster_->Cli({"workers", "--all"});
  EXPECT_NE(workers.out.find("DEAD"), std::string::npos) << workers.out;
}

// Every malformed request class is refused with INVALID_ARGUMENT and a message naming the field;
// the coordinator stays healthy throughout.
TEST_F(E2E, MalformedRequestsGetClearErrors) {
  StartCluster(1);
  auto valid = [] {
    dattn::v1::SubmitJobRequest req;
    req.set_idempotency_key("k");
    auto* a = req.mutable_spec()->mutable_attention();
    a->mutable_attention()->add_segment_lengths(16);
    a->mutable_attention()->add_dilation_rates(1);
    a->mutable_shape()->set_batch(1);
    a->mutable_shape()->set_seq_len(32);
    a->mutable_shape()->set_num_heads(2);
    a->mutable_shape()->set_head_dim(8);
    a->set_dtype(dattn::v1::DTYPE_FP32);
    a->set_num_ranks(1);
    a->set_iterations(1);
    return req;
  };
  struct Case {
    const char* name;
    std::function<void(dattn::v1::SubmitJobRequest*)> mutate;
    const char* must_mention;
  };
  std::vector<Case> cases = {
      {"no key", [](auto* r) { r->clear_idempotency_key(); }, "idempotency_key"},
      {"no work", [](auto* r) { r->mutable_spec()->clear_attention(); }, "attention"},
      {"empty segments",
       [](auto* r) {
         r->mutable_spec()->mutable_attention()->mutable_attention()->clear_segment_lengths();
       },
       "segment"},
      {"zero segment",
       [](auto* r) {
         r->mutable_spec()->mutable_attention()->mutable_attention()->set_segment_lengths(0, 0);
       },
       "0"},
      {"zero rate",
       [](auto* r) {
         r->mutable_spec()->mutable_attention()->mutable_attention()->set_dilation_rates(0, 0);
       },
       "0"},
      {"length mismatch",
       [](auto* r) {
         r->mutable_spec()->mutable_attention()->mutable_attention()->add_dilation_rates(2);
       },
       "dilation"},
      {"zero head_dim",
       [](auto* r) { r->mutable_spec()->mutable_attention()->mutable_shape()->set_head_dim(0); },
       "head_dim"},
      {"zero batch",
       [](auto* r) { r->mutable_spec()->mutable_attention()->mutable_shape()->set_batch(0); },
       "batch"},
      {"no dtype",
       [](auto* r) {
         r->mutable_spec()->mutable_attention()->set_dtype(dattn::v1::DTYPE_UNSPECIFIED);
       },
       "dtype"},
      {"H < G",
       [](auto* r) {
         auto* a = r->mutable_spec()->mutable_attention();
         a->mutable_attention()->add_segment_lengths(32);
         a->mutable_attention()->add_dilation_rates(2);
         a->mutable_attention()->add_segment_lengths(64);
         a->mutable_attention()->add_dilation_rates(4);
       },
       "3"},
      {"negative iterations",
       [](auto* r) { r->mutable_spec()->mutable_attention()->set_iterations(-1); }, "iterations"},
      {"bad priority", [](auto* r) { r->mutable_spec()->set_priority(1000); }, "priority"},
      {"overflowing shape",
       [](auto* r) {
         auto* s = r->mutable_spec()->mutable_attention()->mutable_shape();
         s->set_batch(int64_t{1} << 40);
         s->set_seq_len(int64_t{1} << 40);
       },
       "overflow"},
      {"bad scale",
       [](auto* r) { r->mutable_spec()->mutable_attention()->mutable_attention()->set_scale(-1); },
       "scale"},
  };
  int index = 0;
  for (const Case& c : cases) {
    dattn::v1::SubmitJobRequest req = valid();
    req.set_idempotency_key("malformed-" + std::to_string(index++));
    c.mutate(&req);
    grpc::ClientContext ctx;
    dattn::v1::SubmitJobResponse resp;
    grpc::Status s = cluster_->jobs().SubmitJob(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.must_mention), std::string::npos)
        << c.name << ": " << s.error_message();
  }
  // Unknown job ids and bad page tokens.
  {
    grpc::ClientContext ctx;
    dattn::v1::GetJobRequest req;
    req.set_job_id("j-doesnotexist");
    dattn::v1::Job job;
    grpc::Status s = cluster_->jobs().GetJob(&ctx, req, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(s.error_message().find("j-doesnotexist"), std::string::npos) << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    dattn::v1::ListJobsRequest req;
    req.set_page_token("not-a-token");
    dattn::v1::ListJobsResponse resp;
    grpc::Status s = cluster_->jobs().ListJobs(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  // Bad CLI flags are usage errors naming the flag; nothing is sent.
  ProcessResult bad = cluster_->Cli(
      {"submit", "--seq-len=abc", "--heads=1", "--head-dim=8", "--segments=4", "--rates=1"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("seq-len"), std::string::npos) << bad.err;

  // Still alive and serving.
  auto health = grpc::health::v1::Health::NewStub(cluster_->ChannelWithToken(""));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hresp;
  ASSERT_TRUE(health->Check(&ctx, hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE(cluster_->coordinator().running());
}

// /metrics is valid Prometheus text (promtool) and carries the documented families after a job.
TEST_F(E2E, MetricsPassPromtool) {
  StartCluster(1);
  std::vector<std::string> flags = SmallJobFlags();
  flags.push_back("--wait");
  std::vector<std::string> args = {"submit"};
  args.insert(args.end(), flags.begin(), flags.end());
  ProcessResult r = cluster_->Cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ProcessOptions curl;
  curl.name = "curl";
  curl.log_dir = cluster_->dir();
  curl.argv = {"/usr/bin/curl", "-sf", "http://" + cluster_->metrics_address() + "/metrics"};
  ProcessResult m = RunCommand(curl, seconds(10));
  ASSERT_EQ(m.exit_code, 0) << m.err;
  for (const char* family : {"dattn_jobs", "dattn_queue_depth", "dattn_job_duration_seconds",
                             "dattn_job_queue_wait_seconds", "dattn_attention_tokens_total",
                             "dattn_attention_flops_total", "dattn_workers", "dattn_rpc_total"}) {
    EXPECT_NE(m.out.find(family), std::string::npos) << family << "\n" << m.out;
  }
  const std::string metrics_file = cluster_->dir() + "/metrics.txt";
  {
    std::ofstream f(metrics_file);
    f << m.out;
  }
  ProcessOptions promtool;
  promtool.name = "promtool";
  promtool.log_dir = cluster_->dir();
  promtool.argv = {"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + metrics_file};
  ProcessResult p = RunCommand(promtool, seconds(30));
  EXPECT_EQ(p.exit_code, 0) << p.out << p.err;
}

// Every daemon answers grpc.health.v1; SIGTERM shuts the coordinator down cleanly (exit 0) and a
// restart serves the finished job.
TEST_F(E2E, HealthAndGracefulShutdown) {
  StartCluster(1);
  std::optional<std::string> worker_health =
      cluster_->worker(0).WaitForStderr("health endpoint on ([0-9.]+:[0-9]+)", seconds(10));
  ASSERT_TRUE(worker_health.has_value()) << cluster_->Logs();
  for (const std::string& address : {cluster_->address(), *worker_health}) {
    // TLS on both (the worker's health port serves the worker's certificate); no token needed.
    client::ClientSecurity tls;
    tls.ca_file = cluster_->ca_file();
    auto health = grpc::health::v1::Health::NewStub(*client::MakeChannel(address, tls));
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = health->Check(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << address << ": " << s.error_message();
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << address;
  }
  std::vector<std::string> flags = SmallJobFlags();
  flags.push_back("--wait");
  std::vector<std::string> args = {"submit"};
  args.insert(args.end(), flags.begin(), flags.end());
  ProcessResult r = cluster_->Cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string id = JobIdFrom(r.out);

  cluster_->coordinator().Signal(SIGTERM);
  auto done = cluster_->coordinator().Wait(seconds(30));
  ASSERT_TRUE(done.has_value()) << "coordinator did not exit after SIGTERM";
  EXPECT_EQ(done->exit_code, 0) << done->err;

  cluster_->worker(0).Signal(SIGTERM);
  auto worker_done = cluster_->worker(0).Wait(seconds(30));
  ASSERT_TRUE(worker_done.has_value()) << "worker did not exit after SIGTERM";
  EXPECT_EQ(worker_done->exit_code, 0) << worker_done->err;

  std::string error;
  ASSERT_TRUE(cluster_->StartCoordinator(&error)) << error;
  ProcessResult status = cluster_->Cli({"status", id, "--json"});
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_NE(status.out.find("JOB_STATE_SUCCEEDED"), std::string::npos) << status.out;
}

}  // namespace
}  // namespace dattn::testing
