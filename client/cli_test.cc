// End-to-end tests of the `dattn` CLI: RunCli in-process against fake JobService and AdminService
// servers on an ephemeral port. The fakes record every request so the tests check exactly what the
// CLI sends, and script their answers (errors, event streams that break) to check what it does with
// them.
#include "client/cli.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/exit_codes.h"
#include "dattn/v1/admin.grpc.pb.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "dattn/v1/training.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "security/tokens.h"

namespace dattn {
namespace client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

template <typename T>
T Proto(const std::string& text) {
  T message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

v1::JobEvent Event(const std::string& job_id, int64_t seq, v1::JobState state,
                   const std::string& kind, int64_t done = 0, int64_t total = 0,
                   const std::string& message = "") {
  v1::JobEvent event;
  event.set_job_id(job_id);
  event.set_seq(seq);
  event.mutable_time()->set_seconds(1714564800 + seq);
  event.set_state(state);
  event.set_kind(kind);
  event.set_message(message);
  if (total > 0) {
    event.mutable_progress()->set_steps_done(done);
    event.mutable_progress()->set_steps_total(total);
  }
  return event;
}

// A JobService that keeps jobs in a map and answers as scripted.
class FakeJobService final : public v1::JobService::Service {
 public:
  struct WatchCall {
    std::vector<v1::JobEvent> events;  // Sent if seq > after_seq.
    grpc::Status end;                  // How the stream ends.
    int down_after = 0;                // Then the next N GetJob/WatchJob calls answer UNAVAILABLE.
  };

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override {
    absl::MutexLock lock(&mu_);
    submits_.push_back(*request);
    auto auth = context->client_metadata().find("authorization");
    authorizations_.push_back(auth == context->client_metadata().end()
                                  ? ""
                                  : std::string(auth->second.data(), auth->second.size()));
    if (!submit_status_.ok()) return submit_status_;
    v1::Job& job = jobs_["j-00000000000000a1"];
    job.set_job_id("j-00000000000000a1");
    job.set_idempotency_key(request->idempotency_key());
    *job.mutable_spec() = request->spec();
    job.set_state(v1::JOB_STATE_QUEUED);
    job.set_queue_position(3);
    job.mutable_create_time()->set_seconds(1714564800);
    *response->mutable_job() = job;
    response->set_created(true);
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::Job* response) override {
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      if (down_calls_ > 0) {
        --down_calls_;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator restarting");
      }
      gets_.push_back(*request);
      delay = get_delay_;
    }
    absl::SleepFor(delay);
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request->job_id());
    if (it == jobs_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("job ", request->job_id(), " does not exist"));
    }
    *response = it->second;
    if (!request->include_events()) {
      response->clear_events();
    } else {
      // The coordinator's rule: the latest max_events (0 = 1000), and how many were left out.
      const int keep = request->max_events() == 0 ? 1000 : request->max_events();
      const int drop = std::max(0, response->events_size() - keep);
      response->mutable_events()->DeleteSubrange(0, drop);
      response->set_events_omitted(drop);
    }
    return grpc::Status::OK;
  }

  // Pages of at most 2 jobs whatever page_size asks, so paging is exercised with few jobs; the
  // kind and states filters as the coordinator applies them.
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override {
    absl::MutexLock lock(&mu_);
    lists_.push_back(*request);
    std::vector<std::string> order;
    for (const std::string& id : list_order_) {
      const v1::Job& job = jobs_[id];
      const std::string kind = job.spec().has_training()     ? "training"
                               : job.spec().has_deployment() ? "deployment"
                                                             : "attention";
      if (!request->kind().empty() && request->kind() != kind) continue;
      if (!request->states().empty() &&
          std::find(request->states().begin(), request->states().end(), job.state()) ==
              request->states().end()) {
        continue;
      }
      order.push_back(id);
    }
    const int size = std::min(request->page_size() == 0 ? 50 : request->page_size(), 2);
    size_t start = request->page_token().empty() ? 0 : std::stoul(request->page_token());
    size_t i = start;
    for (; i < order.size() && response->jobs_size() < size; ++i) {
      *response->add_jobs() = jobs_[order[i]];
    }
    if (i < order.size()) response->set_next_page_token(std::to_string(i));
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::Job* response) override {
    absl::MutexLock lock(&mu_);
    cancels_.push_back(*request);
    auto it = jobs_.find(request->job_id());
    if (it == jobs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
    v1::Job& job = it->second;
    if (job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("job ", job.job_id(), " already ended; nothing to cancel"));
    }
    if (job.state() == v1::JOB_STATE_QUEUED) {
      job.set_state(v1::JOB_STATE_CANCELLED);
      job.set_state_reason(absl::StrCat("cancelled by user: ", request->reason()));
    }
    *response = job;
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    WatchCall call;
    {
      absl::MutexLock lock(&mu_);
      if (down_calls_ > 0) {
        --down_calls_;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator restarting");
      }
      const size_t index = watches_.size();
      watches_.push_back(*request);
      if (watch_script_.empty()) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
      }
      call = watch_script_[std::min(index, watch_script_.size() - 1)];
    }
    for (const v1::JobEvent& event : call.events) {
      if (event.seq() <= request->after_seq()) continue;
      {
        // Keep the stored job in step with the stream, as the coordinator would.
        absl::MutexLock lock(&mu_);
        v1::Job& job = jobs_[event.job_id()];
        job.set_state(event.state());
        if (event.has_progress()) *job.mutable_progress() = event.progress();
        if (event.state() == v1::JOB_STATE_SUCCEEDED || event.state() == v1::JOB_STATE_FAILED ||
            event.state() == v1::JOB_STATE_CANCELLED) {
          auto final_job = finals_.find(event.job_id());
          if (final_job != finals_.end()) job = final_job->second;
        }
      }
      if (!writer->Write(event)) return grpc::Status::CANCELLED;
    }
    absl::MutexLock lock(&mu_);
    down_calls_ = call.down_after;
    return call.end;
  }

  // Serves the output of `job_id` in chunks of `chunk` bytes.
  grpc::Status ReadOutput(grpc::ServerContext*, const v1::ReadOutputRequest* request,
                          grpc::ServerWriter<v1::TensorChunk>* writer) override {
    absl::MutexLock lock(&mu_);
    auto it = outputs_.find(request->job_id());
    if (it == outputs_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "job kept no output");
    }
    v1::TensorChunk head;
    *head.mutable_header() = it->second.first;
    writer->Write(head);
    const std::string& data = it->second.second;
    for (size_t offset = 0; offset < data.size(); offset += output_chunk_) {
      v1::TensorChunk chunk;
      chunk.set_offset(static_cast<int64_t>(offset));
      chunk.set_data(data.substr(offset, output_chunk_));
      writer->Write(chunk);
    }
    return grpc::Status::OK;
  }
  grpc::Status DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (jobs_.erase(request->job_id()) == 0) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
    }
    auto it = outputs_.find(request->job_id());
    if (it != outputs_.end()) {
      response->set_output_bytes_freed(static_cast<int64_t>(it->second.second.size()));
      outputs_.erase(it);
    }
    return grpc::Status::OK;
  }

  // The registry: a list of versions; ImportModel appends the next version of its name (the
  // request kept); DeleteModel removes one or all (NOT_FOUND for none).
  grpc::Status ImportModel(grpc::ServerContext*, const v1::ImportModelRequest* request,
                           v1::RegisteredModel* response) override {
    absl::MutexLock lock(&mu_);
    imports_.push_back(*request);
    int64_t version = 1;
    for (const v1::RegisteredModel& m : models_) {
      if (m.name() == request->name()) version = std::max(version, m.version() + 1);
    }
    v1::RegisteredModel m;
    m.set_name(request->name());
    m.set_version(version);
    m.set_parameters(85300000);
    m.set_weights("weights.safetensors, F32");
    m.set_bytes(341200000);
    m.set_source(request->path().empty() ? absl::StrCat("training job ", request->training_job_id(),
                                                        " step ", request->training_job_step())
                                         : absl::StrCat("folder ", request->path()));
    m.set_description(request->description());
    m.set_create_time_us(1796000000000000);
    models_.push_back(m);
    *response = m;
    return grpc::Status::OK;
  }
  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override {
    absl::MutexLock lock(&mu_);
    for (const v1::RegisteredModel& m : models_) {
      if (request->name().empty() || m.name() == request->name()) *response->add_models() = m;
    }
    return grpc::Status::OK;
  }
  grpc::Status DeleteModel(grpc::ServerContext*, const v1::DeleteModelRequest* request,
                           v1::DeleteModelResponse* response) override {
    absl::MutexLock lock(&mu_);
    std::vector<v1::RegisteredModel> kept;
    for (const v1::RegisteredModel& m : models_) {
      if (m.name() == request->name() &&
          (request->version() == 0 || m.version() == request->version())) {
        response->add_versions(m.version());
        response->set_bytes_freed(response->bytes_freed() + m.bytes());
      } else {
        kept.push_back(m);
      }
    }
    if (response->versions_size() == 0) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such model version");
    }
    models_ = kept;
    return grpc::Status::OK;
  }
  std::vector<v1::ImportModelRequest> imports() {
    absl::MutexLock lock(&mu_);
    return imports_;
  }

  void SetOutput(const std::string& job_id, const v1::TensorHeader& header, std::string data,
                 size_t chunk = 5) {
    absl::MutexLock lock(&mu_);
    outputs_[job_id] = {header, std::move(data)};
    output_chunk_ = chunk;
  }

  void AddJob(const v1::Job& job) {
    absl::MutexLock lock(&mu_);
    jobs_[job.job_id()] = job;
    list_order_.push_back(job.job_id());
  }
  void SetFinal(const v1::Job& job) {
    absl::MutexLock lock(&mu_);
    finals_[job.job_id()] = job;
  }
  void SetWatchScript(std::vector<WatchCall> script) {
    absl::MutexLock lock(&mu_);
    watch_script_ = std::move(script);
  }
  void SetSubmitStatus(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    submit_status_ = std::move(status);
  }
  void SetGetDelay(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    get_delay_ = delay;
  }
  std::vector<v1::SubmitJobRequest> submits() {
    absl::MutexLock lock(&mu_);
    return submits_;
  }
  std::vector<v1::GetJobRequest> gets() {
    absl::MutexLock lock(&mu_);
    return gets_;
  }
  std::vector<v1::ListJobsRequest> lists() {
    absl::MutexLock lock(&mu_);
    return lists_;
  }
  std::vector<v1::CancelJobRequest> cancels() {
    absl::MutexLock lock(&mu_);
    return cancels_;
  }
  std::vector<v1::WatchJobRequest> watches() {
    absl::MutexLock lock(&mu_);
    return watches_;
  }
  std::vector<std::string> authorizations() {
    absl::MutexLock lock(&mu_);
    return authorizations_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, v1::Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RegisteredModel> models_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ImportModelRequest> imports_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> list_order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::Job> finals_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::pair<v1::TensorHeader, std::string>> outputs_ ABSL_GUARDED_BY(mu_);
  size_t output_chunk_ ABSL_GUARDED_BY(mu_) = 5;
  std::vector<WatchCall> watch_script_ ABSL_GUARDED_BY(mu_);
  int down_calls_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status submit_status_ ABSL_GUARDED_BY(mu_);
  absl::Duration get_delay_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::SubmitJobRequest> submits_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> authorizations_ ABSL_GUARDED_BY(mu_);  // Of each submit.
  std::vector<v1::GetJobRequest> gets_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ListJobsRequest> lists_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::CancelJobRequest> cancels_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::WatchJobRequest> watches_ ABSL_GUARDED_BY(mu_);
};

class FakeAdminService final : public v1::AdminService::Service {
 public:
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override {
    absl::MutexLock lock(&mu_);
    include_dead_.push_back(request->include_dead());
    for (const v1::Worker& w : workers_) {
      if (w.state() != v1::WORKER_STATE_DEAD || request->include_dead())
        *response->add_workers() = w;
    }
    return grpc::Status::OK;
  }

  grpc::Status DrainWorker(grpc::ServerContext*, const v1::DrainWorkerRequest* request,
                           v1::Worker* response) override {
    absl::MutexLock lock(&mu_);
    for (v1::Worker& w : workers_) {
      if (w.worker_id() == request->worker_id() || w.name() == request->worker_id()) {
        w.set_state(v1::WORKER_STATE_DRAINING);
        *response = w;
        return grpc::Status::OK;
      }
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no worker with id or name '", request->worker_id(), "'"));
  }

  grpc::Status UndrainWorker(grpc::ServerContext*, const v1::UndrainWorkerRequest* request,
                             v1::Worker* response) override {
    absl::MutexLock lock(&mu_);
    undrains_.push_back(request->worker_id());
    for (v1::Worker& w : workers_) {
      if (w.worker_id() == request->worker_id() || w.name() == request->worker_id()) {
        if (w.state() == v1::WORKER_STATE_DEAD) {
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              absl::StrCat("worker ", w.worker_id(), " is dead"));
        }
        w.set_state(v1::WORKER_STATE_READY);
        *response = w;
        return grpc::Status::OK;
      }
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no worker with id or name '", request->worker_id(), "'"));
  }

  void AddWorker(const v1::Worker& w) {
    absl::MutexLock lock(&mu_);
    workers_.push_back(w);
  }
  std::vector<bool> include_dead() {
    absl::MutexLock lock(&mu_);
    return include_dead_;
  }
  std::vector<std::string> undrains() {
    absl::MutexLock lock(&mu_);
    return undrains_;
  }
  // The tasks worker `id` runs from now on.
  void SetTasks(const std::string& id, const std::vector<std::string>& tasks) {
    absl::MutexLock lock(&mu_);
    for (v1::Worker& w : workers_) {
      if (w.worker_id() == id) *w.mutable_task_ids() = {tasks.begin(), tasks.end()};
    }
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> include_dead_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> undrains_ ABSL_GUARDED_BY(mu_);
};

struct Result {
  int code;
  std::string out;
  std::string err;
};

int CountOf(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path) << text;
  return path;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&jobs_);
    builder.RegisterService(&admin_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
    env_.getenv = [this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
    env_.redraw_every = absl::Milliseconds(20);
  }

  void TearDown() override { server_->Shutdown(absl::ToChronoTime(absl::Now())); }

  // Runs `dattn ARGS` with no coordinator flag.
  Result RunRaw(std::vector<std::string> args) {
    args.insert(args.begin(), "dattn");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    std::ostringstream out, err;
    const int code = RunCli(static_cast<int>(argv.size()), argv.data(), out, err, env_);
    // ECHO_CLI=1 shows every command line and its output: a quick look at the human formatting.
    if (std::getenv("ECHO_CLI") != nullptr) {
      std::cerr << "$ " << absl::StrJoin(args, " ") << "  -> " << code << "\n"
                << out.str() << "[stderr]\n"
                << err.str() << "\n";
    }
    return {code, out.str(), err.str()};
  }

  // Runs `dattn --coordinator <fake> ARGS`.
  Result Run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--coordinator", address_});
    return RunRaw(std::move(args));
  }

  v1::Job SucceededJob(const std::string& id) {
    return Proto<v1::Job>(
        absl::StrCat(R"pb(
                       job_id: ")pb",
                     id, R"pb("
                              state: JOB_STATE_SUCCEEDED
                              spec {
                                name: "bench"
                                tenant: "research"
                                attention {
                                  attention {
                                    segment_lengths: [ 2048, 4096 ]
                                    dilation_rates: [ 1, 2 ]
                                    mode: ATTENTION_MODE_GROUPED
                                  }
                                  shape { batch: 1 seq_len: 8192 num_heads: 8 head_dim: 64 }
                                  dtype: DTYPE_FP32
                                  num_ranks: 2
                                  pass: PASS_FORWARD
                                  iterations: 10
                                }
                              }
                              create_time { seconds: 1714564800 }
                              start_time { seconds: 1714564802 }
                              end_time { seconds: 1714564812 }
                              progress { steps_done: 10 steps_total: 10 }
                              attempt: 1
                              worker_ids: [ "w-1", "w-2" ]
                              result {
                                attention {
                                  seconds_per_step: 0.0123
                                  tflops: 45.678
                                  flops_per_step: 5.6e11
                                  out_sum: 12.5
                                  out_sum_squares: 4096.25
                                  ranks {
                                    rank: 0
                                    worker_id: "w-1"
                                    seconds_total: 0.12
                                    seconds_per_step: 0.012
                                    tflops: 46.1
                                    out_sum: 6.25
                                    out_sum_squares: 2048.125
                                    peak_memory_bytes: 1073741824
                                  }
                                  ranks {
                                    rank: 1
                                    worker_id: "w-2"
                                    seconds_total: 0.123
                                    seconds_per_step: 0.0123
                                    tflops: 45.2
                                    out_sum: 6.25
                                    out_sum_squares: 2048.125
                                    peak_memory_bytes: 1073741824
                                  }
                                }
                              })pb"));
  }

  v1::Job RunningJob(const std::string& id) {
    v1::Job job = SucceededJob(id);
    job.set_state(v1::JOB_STATE_RUNNING);
    job.clear_result();
    job.clear_end_time();
    job.mutable_progress()->set_steps_done(3);
    return job;
  }

  // A training job of 300 steps that SUCCEEDED: 2 x 2 ranks, two checkpoints kept, a loss curve
  // falling from 5.5 to 1.7.
  v1::Job SucceededTrainingJob(const std::string& id) {
    v1::Job job = Proto<v1::Job>(R"pb(
      state: JOB_STATE_SUCCEEDED
      spec {
        name: "kjv-small"
        tenant: "research"
        training {
          config_json: "{\"steps\":300}"
          data_parallel: 2
          sequence_parallel: 2
          device: DEVICE_PREFERENCE_CPU
          checkpoint_dir: "/shared/ckpt"
        }
      }
      create_time { seconds: 1714564800 }
      start_time { seconds: 1714564802 }
      end_time { seconds: 1714565057 }
      progress { steps_done: 300 steps_total: 300 }
      attempt: 1
      worker_ids: [ "w-1", "w-2", "w-3", "w-4" ]
      result {
        training {
          steps: 300
          final_loss: 1.7234
          final_evaluation {
            step: 300
            has_validation: true
            validation_loss: 1.6729
            bits_per_byte: 2.4135
            retrieval_examples: 16
            retrieval_accuracy: 0.125
            retrieval_token_accuracy: 0.4
          }
          tokens_seen: 614400
          parameters: 831232
          data_parallel: 2
          sequence_parallel: 2
          seconds: 252.5
          median_step_seconds: 0.84
          planned_rank_bytes: 35433480192
          measured_rank_peak_bytes: 32212254720
          tokens_per_second: 2433.4
          mfu: 0.215
          flops_per_step: 1.9e10
          checkpoints {
            step: 200
            bytes: 10020000
            seconds: 0.31
            time { seconds: 1714564980 }
          }
          checkpoints {
            step: 300
            bytes: 10020000
            seconds: 0.29
            time { seconds: 1714565055 }
          }
        }
      })pb");
    job.set_job_id(id);
    v1::TrainingJobResult* result = job.mutable_result()->mutable_training();
    result->set_final_checkpoint(absl::StrCat("/shared/ckpt/", id, "/step-00000300"));
    result->mutable_checkpoints(0)->set_path(absl::StrCat("/shared/ckpt/", id, "/step-00000200"));
    result->mutable_checkpoints(1)->set_path(result->final_checkpoint());
    for (int step = 1; step <= 300; ++step) {
      v1::LossPoint* point = result->add_loss_curve();
      point->set_step(step);
      point->set_loss(1.7 + 3.8 * std::exp(-step / 40.0));
    }
    return job;
  }

  // The same job at step 120, with its latest figures and one checkpoint.
  v1::Job RunningTrainingJob(const std::string& id) {
    v1::Job job = SucceededTrainingJob(id);
    job.set_state(v1::JOB_STATE_RUNNING);
    job.clear_result();
    job.clear_end_time();
    job.mutable_progress()->set_steps_done(120);
    v1::TrainingProgress* progress = job.mutable_progress()->mutable_training();
    *progress = Proto<v1::TrainingProgress>(R"pb(
      step: 120
      steps_total: 300
      loss: 2.3456
      learning_rate: 0.0003
      grad_norm: 0.8125
      tokens_per_second: 12345
      step_seconds: 0.166
      tokens_seen: 245760
      resumed_from_step: 100
      restore_seconds: 1.25
      last_evaluation { step: 100 has_validation: true validation_loss: 2.31 bits_per_byte: 3.3326 }
      checkpoints {
        step: 100
        bytes: 10020000
        seconds: 0.31
        time { seconds: 1714564900 }
      })pb");
    progress->mutable_checkpoints(0)->set_path(absl::StrCat("/shared/ckpt/", id, "/step-00000100"));
    return job;
  }

  // A deployment named "kjv" of step 100 of the training job j-run, serving, 12 requests and 480
  // tokens done.
  v1::Job ServingDeployment(const std::string& id) {
    v1::Job job = RunningJob(id);
    job.clear_spec();
    job.mutable_spec()->set_name("kjv");
    v1::DeploymentSpec* d = job.mutable_spec()->mutable_deployment();
    d->set_training_job_id("j-run");
    d->set_training_job_step(100);
    d->set_checkpoint("/shared/ckpt/j-run/step-00000100");
    d->set_max_context(8192);
    v1::DeploymentStatus* s = job.mutable_progress()->mutable_deployment();
    s->set_ready(true);
    s->set_checkpoint_step(100);
    s->set_requests_done(12);
    s->set_tokens_generated(480);
    s->set_device("cuda bf16");
    return job;
  }

  FakeJobService jobs_;
  FakeAdminService admin_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::map<std::string, std::string> vars_;
  CliEnvironment env_;
};

// The request built from every flag at once.
TEST_F(CliTest, SubmitFlagsBuildTheExactRequest) {
  Result r = Run({"submit",          "-n",           "16384",      "--batch", "2",
                  "--heads",         "12",           "--head-dim", "64",      "--segments",
                  "2048, 4096,8192", "--rates",      "1,2,4",      "--mode",  "mixture",
                  "--head-offsets",  "blocked",      "--causal",   "--scale", "0.125",
                  "--dtype",         "bf16",         "--ranks",    "4",       "--pass",
                  "fwd-bwd",         "--iterations", "7",          "--seed",  "99",
                  "--return-output", "--device",     "gpu",        "--name",  "my-job",
                  "--tenant",        "team-a",       "--priority", "-5",      "--idempotency-key",
                  "key-123"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto expected = Proto<v1::SubmitJobRequest>(R"pb(
    idempotency_key: "key-123"
    spec {
      name: "my-job"
      tenant: "team-a"
      priority: -5
      attention {
        attention {
          segment_lengths: [ 2048, 4096, 8192 ]
          dilation_rates: [ 1, 2, 4 ]
          scale: 0.125
          causal: true
          mode: ATTENTION_MODE_MIXTURE
          head_offsets: HEAD_OFFSETS_BLOCKED
        }
        shape { batch: 2 seq_len: 16384 num_heads: 12 head_dim: 64 }
        dtype: DTYPE_BF16
        num_ranks: 4
        pass: PASS_FORWARD_BACKWARD
        iterations: 7
        seed: 99
        return_output: true
        device: DEVICE_PREFERENCE_GPU
      }
    })pb");
  std::vector<v1::SubmitJobRequest> submits = jobs_.submits();
  ASSERT_EQ(submits.size(), 1u);
  std::string diff;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(expected, submits[0])) << diff;
  EXPECT_THAT(r.out, HasSubstr("Submitted job j-00000000000000a1 (QUEUED, position 3"));
  EXPECT_THAT(r.out, HasSubstr("Idempotency key: key-123"));
}

// dattn deploy's flags: the DeploymentSpec they build (the device preference included), and a bad
// --device refused naming the flag before anything is sent.
TEST_F(CliTest, DeployFlagsBuildTheDeploymentSpec) {
  Result r = Run({"deploy", "--checkpoint", "/models/kjv/step-00000300", "--max-context", "8192",
                  "--max-batch", "16", "--max-queued", "9", "--device", "gpu", "--name", "kjv",
                  "--priority", "3"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  std::vector<v1::SubmitJobRequest> submits = jobs_.submits();
  ASSERT_EQ(submits.size(), 1u);
  const auto expected = Proto<v1::JobSpec>(R"pb(
    name: "kjv"
    priority: 3
    deployment {
      checkpoint: "/models/kjv/step-00000300"
      max_context: 8192
      max_batch: 16
      max_queued: 9
      device: DEVICE_PREFERENCE_GPU
    })pb");
  std::string diff;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(expected, submits[0].spec())) << diff;

  Result cpu = Run({"deploy", "--checkpoint", "/m", "--device", "cpu", "--ranks", "2"});
  ASSERT_EQ(cpu.code, kExitOk) << cpu.err;
  submits = jobs_.submits();
  ASSERT_EQ(submits.size(), 2u);
  EXPECT_EQ(submits[1].spec().deployment().device(), v1::DEVICE_PREFERENCE_CPU);
  EXPECT_EQ(submits[1].spec().deployment().ranks(), 2);

  Result bad = Run({"deploy", "--checkpoint", "/m", "--device", "tpu"});
  EXPECT_EQ(bad.code, kExitUsage);
  EXPECT_THAT(bad.err, HasSubstr("--device"));
  EXPECT_THAT(bad.err, HasSubstr("tpu"));
  EXPECT_EQ(jobs_.submits().size(), 2u);
  EXPECT_FALSE(submits[1].spec().has_recovery());  // The deployment kind's defaults.

  // Ring shrink, set only when given; a value that is not a boolean names the flag.
  Result fixed = Run({"deploy", "--checkpoint", "/m", "--ranks", "2", "--shrink-ring", "false",
                      "--single-device", "true"});
  ASSERT_EQ(fixed.code, kExitOk) << fixed.err;
  submits = jobs_.submits();
  ASSERT_EQ(submits.size(), 3u);
  EXPECT_TRUE(submits[2].spec().recovery().has_shrink_ring());
  EXPECT_FALSE(submits[2].spec().recovery().shrink_ring());
  EXPECT_TRUE(submits[2].spec().recovery().single_device());
  Result maybe = Run({"deploy", "--checkpoint", "/m", "--shrink-ring", "maybe"});
  EXPECT_EQ(maybe.code, kExitUsage);
  EXPECT_THAT(maybe.err, HasSubstr("--shrink-ring"));
  EXPECT_EQ(jobs_.submits().size(), 3u);
}

// Only the required flags: the defaults documented in docs/CLI.md, and a fresh random key printed.
TEST_F(CliTest, SubmitDefaultsAndGeneratedKey) {
  Result r = Run({"submit", "--seq-len", "4096", "--heads", "8", "--head-dim", "64", "--segments",
                  "2048", "--rates", "1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  Result again = Run({"submit", "--seq-len", "4096", "--heads", "8", "--head-dim", "64",
                      "--segments", "2048", "--rates", "1"});
  ASSERT_EQ(again.code, kExitOk) << again.err;
  std::vector<v1::SubmitJobRequest> submits = jobs_.submits();
  ASSERT_EQ(submits.size(), 2u);
  const auto expected_spec = Proto<v1::JobSpec>(R"pb(
    attention {
      attention { segment_lengths: 2048 dilation_rates: 1 mode: ATTENTION_MODE_GROUPED }
      shape { batch: 1 seq_len: 4096 num_heads: 8 head_dim: 64 }
      dtype: DTYPE_FP32
      num_ranks: 1
      pass: PASS_FORWARD
      iterations: 1
    })pb");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(expected_spec, submits[0].spec()))
      << submits[0].spec().DebugString();
  EXPECT_FALSE(submits[0].spec().attention().attention().has_scale());
  const std::string key = submits[0].idempotency_key();
  // UUID v4 layout: 8-4-4-4-12 hex digits, version nibble 4.
  ASSERT_EQ(key.size(), 36u) << key;
  EXPECT_EQ(key[8], '-');
  EXPECT_EQ(key[14], '4');
  EXPECT_NE(key, submits[1].idempotency_key());
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("--idempotency-key ", key)));
}

// The shipped example is meant for the demo cluster (two CPU workers, one slot each): CPU
// precision, CPU device, a ring of at most two ranks. tests/front_door_test runs it there.
TEST_F(CliTest, SubmitFromTheExampleYamlFile) {
  Result r = Run({"submit", "--file", "client/examples/attention-job.yaml"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto expected_spec = Proto<v1::JobSpec>(R"pb(
    name: "longnet-8k-mixture"
    tenant: "research"
    priority: 10
    attention {
      attention {
        segment_lengths: [ 512, 1024, 2048 ]
        dilation_rates: [ 1, 2, 4 ]
        causal: true
        mode: ATTENTION_MODE_MIXTURE
        head_offsets: HEAD_OFFSETS_MODULO
      }
      shape { batch: 1 seq_len: 8192 num_heads: 4 head_dim: 64 }
      dtype: DTYPE_FP32
      num_ranks: 2
      pass: PASS_FORWARD_BACKWARD
      iterations: 2
      seed: 42
      device: DEVICE_PREFERENCE_CPU
    })pb");
  ASSERT_EQ(jobs_.submits().size(), 1u);
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(expected_spec, jobs_.submits()[0].spec()))
      << jobs_.submits()[0].spec().DebugString();
}

// The GPU example, labelled as needing GPU workers.
TEST_F(CliTest, SubmitFromTheGpuExampleYamlFile) {
  Result r = Run({"submit", "--file", "client/examples/attention-job-gpu.yaml"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto expected_spec = Proto<v1::JobSpec>(R"pb(
    name: "longnet-32k-mixture-gpu"
    tenant: "research"
    priority: 10
    attention {
      attention {
        segment_lengths: [ 2048, 4096, 8192 ]
        dilation_rates: [ 1, 2, 4 ]
        causal: true
        mode: ATTENTION_MODE_MIXTURE
        head_offsets: HEAD_OFFSETS_MODULO
      }
      shape { batch: 1 seq_len: 32768 num_heads: 16 head_dim: 64 }
      dtype: DTYPE_BF16
      num_ranks: 4
      pass: PASS_FORWARD_BACKWARD
      iterations: 20
      seed: 42
      device: DEVICE_PREFERENCE_GPU
    })pb");
  ASSERT_EQ(jobs_.submits().size(), 1u);
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(expected_spec, jobs_.submits()[0].spec()))
      << jobs_.submits()[0].spec().DebugString();
}

TEST_F(CliTest, SubmitFromJsonFileWithKey) {
  const std::string path = WriteTemp("job.json", R"({
    "name": "json-job", "idempotency_key": "from-file", "kind": "attention",
    "attention": {"seq-len": 1024, "heads": 4, "head_dim": 32, "segments": [256, 512],
                  "rates": "1,2", "dtype": "fp64", "scale": 0.5, "device": "cpu",
                  "return_output": true, "seed": 7}
  })");
  Result r = Run({"submit", "--file", path});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto expected = Proto<v1::SubmitJobRequest>(R"pb(
    idempotency_key: "from-file"
    spec {
      name: "json-job"
      attention {
        attention {
          segment_lengths: [ 256, 512 ]
          dilation_rates: [ 1, 2 ]
          scale: 0.5
          mode: ATTENTION_MODE_GROUPED
        }
        shape { batch: 1 seq_len: 1024 num_heads: 4 head_dim: 32 }
        dtype: DTYPE_FP64
        num_ranks: 1
        pass: PASS_FORWARD
        iterations: 1
        seed: 7
        return_output: true
        device: DEVICE_PREFERENCE_CPU
      }
    })pb");
  ASSERT_EQ(jobs_.submits().size(), 1u);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(expected, jobs_.submits()[0]))
      << jobs_.submits()[0].DebugString();
}

TEST_F(CliTest, FlagsOverrideTheJobFile) {
  const std::string path = WriteTemp("override.yaml", R"(
name: from-file
attention:
  seq_len: 8192
  heads: 8
  head_dim: 64
  segments: [2048]
  rates: [1]
  causal: true
  dtype: bf16
  return_output: true
)");
  Result r = Run({"submit", "-f", path, "--seq-len", "4096", "--no-causal", "--name", "from-flag",
                  "--no-return-output", "--segments", "1024,2048", "--rates", "1,2"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  ASSERT_EQ(jobs_.submits().size(), 1u);
  const v1::JobSpec spec = jobs_.submits()[0].spec();
  EXPECT_EQ(spec.name(), "from-flag");
  EXPECT_EQ(spec.attention().shape().seq_len(), 4096);
  EXPECT_EQ(spec.attention().shape().num_heads(), 8);  // From the file.
  EXPECT_FALSE(spec.attention().attention().causal());
  EXPECT_FALSE(spec.attention().return_output());
  EXPECT_EQ(spec.attention().dtype(), v1::DTYPE_BF16);  // From the file.
  EXPECT_THAT(spec.attention().attention().segment_lengths(), ::testing::ElementsAre(1024, 2048));
}

TEST_F(CliTest, BadFlagsAreUsageErrorsNamingTheFlagAndValue) {
  const std::vector<std::string> base = {"submit", "--heads", "8", "--head-dim", "64"};
  struct Case {
    std::vector<std::string> extra;
    std::vector<std::string> expected;  // Substrings of stderr.
  };
  const std::vector<Case> cases = {
      {{"-n", "4096", "--segments", "2048,2k", "--rates", "1,2"},
       {"--segments", "'2k'", "integer"}},
      {{"-n", "4096", "--segments", "2048", "--rates", "0"}, {"--rates", "'0'"}},
      {{"-n", "lots", "--segments", "2048", "--rates", "1"}, {"--seq-len", "'lots'"}},
      {{"-n", "4096", "--segments", "2048", "--rates", "1", "--dtype", "fp8"},
       {"--dtype", "'fp8'", "bf16"}},
      {{"-n", "4096", "--segments", "2048", "--rates", "1", "--mode", "dilated"},
       {"--mode", "'dilated'", "mixture"}},
      {{"-n", "4096", "--segments", "2048", "--rates", "1", "--scale", "-1"}, {"--scale", "'-1'"}},
      {{"-n", "4096", "--segments", "2048,4096", "--rates", "1"},
       {"--segments", "--rates", "2048,4096"}},
      {{"--segments", "2048", "--rates", "1"}, {"missing", "--seq-len"}},
      {{"-n", "4096", "--segments", "2048", "--rates", "1", "--bogus"}, {"--bogus"}},
      {{"-n", "4096", "--segments", "2048", "--rates", "1", "--causal", "--no-causal"},
       {"--causal", "--no-causal"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = base;
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    Result r = Run(args);
    EXPECT_EQ(r.code, kExitUsage) << absl::StrJoin(args, " ") << "\n" << r.err;
    for (const std::string& s : c.expected) {
      EXPECT_THAT(r.err, HasSubstr(s)) << absl::StrJoin(args, " ");
    }
  }
  EXPECT_TRUE(jobs_.submits().empty()) << "nothing may be sent when the flags are wrong";
  // Global usage errors too.
  EXPECT_EQ(Run({"list", "--limit", "0"}).code, kExitUsage);
  EXPECT_EQ(Run({"frobnicate"}).code, kExitUsage);
  EXPECT_EQ(RunRaw({}).code, kExitUsage);
  Result state = Run({"list", "--state", "runing"});
  EXPECT_EQ(state.code, kExitUsage);
  EXPECT_THAT(state.err, HasSubstr("--state: 'runing'"));
}

// Mistyped commands, flags, values and job-file keys get a suggestion.
TEST_F(CliTest, MistypedCommandsAndFlagsGetASuggestion) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"stauts", "j-1"}, "unknown command 'stauts' (did you mean 'status'?); the commands are"},
      {{"wokers"}, "unknown command 'wokers' (did you mean 'workers'?)"},
      {{"undrian", "w-1"}, "unknown command 'undrian' (did you mean 'undrain'?)"},
      {{"frobnicate"}, "unknown command 'frobnicate'; the commands are submit, status, list"},
      {{"submit", "-n", "64", "--wach"},
       "unknown flag --wach for 'dattn submit' (did you mean --watch?)"},
      {{"submit", "--seqlen=64"},
       "unknown flag --seqlen for 'dattn submit' (did you mean --seq-len?)"},
      {{"list", "--limt", "3"}, "unknown flag --limt for 'dattn list' (did you mean --limit?)"},
      {{"--jsno", "list"}, "unknown flag --jsno for 'dattn list' (did you mean --json?)"},
      {{"workers", "--coordinater", "x:1"}, "(did you mean --coordinator?)"},
      {{"list", "--state", "runing"},
       "--state: 'runing' is not a job state (did you mean 'running'?)"},
      {{"submit", "-n", "64", "--heads", "1", "--head-dim", "8", "--segments", "64", "--rates", "1",
        "--mode", "mixtrue"},
       "'mixtrue' is not one of grouped, mixture (did you mean 'mixture'?)"},
  };
  for (const Case& c : cases) {
    Result r = Run(c.args);
    EXPECT_EQ(r.code, kExitUsage) << absl::StrJoin(c.args, " ");
    EXPECT_THAT(r.err, HasSubstr(c.expected)) << absl::StrJoin(c.args, " ");
  }
  const std::string typo = WriteTemp("typo-key.yaml", "attention:\n  seq_len: 4096\n  head: 8\n");
  Result r = Run({"submit", "--file", typo});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("attention.head: unknown key (did you mean 'heads'?)"));
  EXPECT_TRUE(jobs_.submits().empty());
}

TEST_F(CliTest, BadJobFilesAreUsageErrorsNamingTheKey) {
  const std::string typo = WriteTemp("typo.yaml", "attention:\n  seq_len: 4096\n  head: 8\n");
  Result r = Run({"submit", "--file", typo});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("typo.yaml:3: attention.head: unknown key"));
  EXPECT_THAT(r.err, HasSubstr("head_dim"));

  const std::string value = WriteTemp("value.yaml", "attention:\n  segments: [2048, x]\n");
  r = Run({"submit", "--file", value});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("attention.segments: 'x' is not an integer"));

  const std::string misplaced = WriteTemp("misplaced.yaml", "seq_len: 4096\n");
  r = Run({"submit", "--file", misplaced});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("belongs under attention:"));

  const std::string syntax = WriteTemp("syntax.yaml", "attention: {seq_len: 4096\n");
  r = Run({"submit", "--file", syntax});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("not valid YAML"));

  const std::string json = WriteTemp("bad.json", "{\"attention\": {\"seq_len\": 4096,}}");
  r = Run({"submit", "--file", json});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("not valid JSON"));

  r = Run({"submit", "--file", TempPath("does-not-exist.yaml")});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("does-not-exist.yaml"));
  EXPECT_TRUE(jobs_.submits().empty());
}

// Job files are bounded at 1 MiB: a bigger file (or a device that never ends) is refused naming the
// file and its size, without reading it all; a directory is refused for what it is.
TEST_F(CliTest, JobFilesAreAtMostOneMebibyte) {
  // Just under the limit: settings padded with a comment.
  const std::string settings =
      "attention: {seq_len: 4096, heads: 8, head_dim: 64, segments: [2048], rates: [1]}\n#";
  const std::string fits =
      WriteTemp("fits.yaml", settings + std::string((1 << 20) - settings.size() - 1, 'x') + "\n");
  Result r = Run({"submit", "--file", fits});
  EXPECT_EQ(r.code, kExitOk) << r.err;

  const std::string big = WriteTemp("big.yaml", settings + std::string(2 << 20, 'x') + "\n");
  r = Run({"submit", "--file", big});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("job file '", big, "' is ",
                                            settings.size() + (2 << 20) + 1, " bytes (2.0 MiB)")));
  EXPECT_THAT(r.err, HasSubstr("at most 1 MiB (1048576 bytes)"));

  r = Run({"submit", "--file", "/dev/zero"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("job file '/dev/zero' is more than 1048576 bytes"));

  r = Run({"submit", "--file", TempPath("")});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("is a directory"));
  EXPECT_EQ(jobs_.submits().size(), 1u);
}

TEST_F(CliTest, ServerRejectionIsExitFourWithTheServerMessage) {
  jobs_.SetSubmitStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     "spec.attention.num_ranks: 3 does not divide seq_len 4096"));
  Result r = Run({"submit", "-n", "4096", "--heads", "8", "--head-dim", "64", "--segments", "2048",
                  "--rates", "1", "--ranks", "3"});
  EXPECT_EQ(r.code, kExitRejected);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("num_ranks: 3 does not divide seq_len 4096"));

  jobs_.SetSubmitStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "needs 90 GiB, max 80"));
  r = Run({"submit", "-n", "4096", "--heads", "8", "--head-dim", "64", "--segments", "2048",
           "--rates", "1"});
  EXPECT_EQ(r.code, kExitRejected);
  EXPECT_THAT(r.err, HasSubstr("needs 90 GiB, max 80"));
}

TEST_F(CliTest, UnavailableCoordinatorIsExitFiveNamingTheAddress) {
  // A port that was just free and that nothing listens on: bind it, note it, close it.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  const std::string dead_address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  Result r = RunRaw({"--coordinator", dead_address, "list"});
  EXPECT_EQ(r.code, kExitUnavailable);
  EXPECT_THAT(r.err, HasSubstr(dead_address));
  EXPECT_THAT(r.err, HasSubstr("--coordinator"));
  EXPECT_THAT(r.err, HasSubstr("DATTN_COORDINATOR"));

  // A submit that may not have arrived says how to retry without a duplicate.
  r = RunRaw({"--coordinator", dead_address, "submit", "-n", "4096", "--heads", "8", "--head-dim",
              "64", "--segments", "2048", "--rates", "1", "--idempotency-key", "retry-me"});
  EXPECT_EQ(r.code, kExitUnavailable);
  EXPECT_THAT(r.err, HasSubstr("--idempotency-key retry-me"));
}

TEST_F(CliTest, DeadlineIsExitFiveNamingTheTimeout) {
  jobs_.AddJob(RunningJob("j-slow"));
  jobs_.SetGetDelay(absl::Seconds(1));
  Result r = Run({"status", "j-slow", "--timeout", "0.2"});
  EXPECT_EQ(r.code, kExitUnavailable);
  EXPECT_THAT(r.err, HasSubstr("--timeout"));
  EXPECT_THAT(r.err, HasSubstr(address_));
}

TEST_F(CliTest, CoordinatorFromEnvironmentAndFlagPrecedence) {
  vars_["DATTN_COORDINATOR"] = address_;
  admin_.AddWorker(
      Proto<v1::Worker>(R"pb(worker_id: "w-1" name: "host:0" state: WORKER_STATE_READY)pb"));
  Result r = RunRaw({"workers"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("host:0"));
  // The flag wins over the environment.
  r = RunRaw({"--coordinator", "127.0.0.1:1", "workers"});
  EXPECT_EQ(r.code, kExitUnavailable);
  EXPECT_THAT(r.err, HasSubstr("127.0.0.1:1 (from --coordinator)"));
  // A bad environment value is reported as such.
  vars_["DATTN_COORDINATOR"] = "127.0.0.1:1";
  r = RunRaw({"workers"});
  EXPECT_EQ(r.code, kExitUnavailable);
  EXPECT_THAT(r.err, HasSubstr("127.0.0.1:1 (from DATTN_COORDINATOR)"));
}

TEST_F(CliTest, ProcessEnvironmentReadsTheRealVariable) {
  ASSERT_EQ(setenv("DATTN_COORDINATOR", address_.c_str(), 1), 0);
  std::ostringstream out;
  CliEnvironment env = ProcessEnvironment(out);
  unsetenv("DATTN_COORDINATOR");
  EXPECT_FALSE(env.out_is_tty);  // Not std::cout.
  ASSERT_EQ(setenv("DATTN_COORDINATOR", address_.c_str(), 1), 0);
  const char* argv[] = {"dattn", "health"};
  std::ostringstream err;
  const int code = RunCli(2, argv, out, err);
  unsetenv("DATTN_COORDINATOR");
  EXPECT_EQ(code, kExitOk) << err.str();
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("Coordinator at ", address_, ": SERVING")));
}

TEST_F(CliTest, StatusShowsJobAndResultAndJson) {
  v1::Job job = SucceededJob("j-done");
  *job.add_events() = Event("j-done", 1, v1::JOB_STATE_QUEUED, "submitted");
  *job.add_events() =
      Event("j-done", 2, v1::JOB_STATE_SUCCEEDED, "succeeded", 10, 10, "all ranks done");
  jobs_.AddJob(job);

  Result r = Run({"status", "j-done"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(r.out, HasSubstr("B=1 N=8192 H=8 D=64 fp32, segments 2048,4096 rates 1,2, grouped"));
  EXPECT_THAT(r.out, HasSubstr("12.30 ms"));  // Seconds per step.
  EXPECT_THAT(r.out, HasSubstr("45.678"));    // TFLOP/s.
  EXPECT_THAT(r.out, HasSubstr("4096.25"));   // Checksum.
  EXPECT_THAT(r.out, HasSubstr("RANK  WORKER"));
  EXPECT_THAT(r.out, HasSubstr("1.0 GiB"));  // Per-rank peak memory.
  EXPECT_THAT(r.out, Not(HasSubstr("Events")));
  EXPECT_THAT(r.out, Not(HasSubstr("Expires")));  // Kept for ever.
  EXPECT_THAT(r.out, Not(HasSubstr("Asked")));    // It ran as submitted.
  EXPECT_FALSE(jobs_.gets().back().include_events());

  r = Run({"status", "j-done", "--events"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(jobs_.gets().back().include_events());
  EXPECT_THAT(r.out, HasSubstr("all ranks done"));

  r = Run({"status", "j-done", "--json", "--events"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json parsed = nlohmann::json::parse(r.out);
  EXPECT_EQ(parsed["job_id"], "j-done");
  EXPECT_EQ(parsed["state"], "JOB_STATE_SUCCEEDED");
  EXPECT_EQ(parsed["result"]["attention"]["ranks"].size(), 2u);
  EXPECT_EQ(parsed["events"].size(), 2u);

  // A job a recovery ran otherwise (a ring shrink here) says what it was submitted as.
  v1::Job shrunk = job;
  shrunk.set_job_id("j-shrunk");
  *shrunk.mutable_requested_spec() = job.spec();
  shrunk.mutable_requested_spec()->mutable_attention()->set_num_ranks(4);
  jobs_.AddJob(shrunk);
  r = Run({"status", "j-shrunk"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Asked"));
  EXPECT_THAT(r.out, HasSubstr("fp32, 4 ranks, fwd, 10 iteration(s)"));
  EXPECT_THAT(r.out, HasSubstr("(a recovery changed it: the events say which and why)"));

  // Under a finite retention the coordinator says when the job goes.
  job.mutable_expire_time()->set_seconds(4102444800);  // 2100-01-01.
  jobs_.AddJob(job);
  r = Run({"status", "j-done"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Expires"));
  EXPECT_THAT(r.out, HasSubstr("2100-01-01"));
  EXPECT_THAT(r.out, HasSubstr("with its output"));

  r = Run({"status", "j-missing"});
  EXPECT_EQ(r.code, kExitNotFound);
  EXPECT_THAT(r.err, HasSubstr("j-missing does not exist"));
}

TEST_F(CliTest, StatusShowsTheLatestEventsAndSaysHowManyAreLeftOut) {
  v1::Job job = RunningJob("j-long");
  *job.add_events() = Event("j-long", 1, v1::JOB_STATE_QUEUED, "submitted");
  for (int i = 2; i <= 6; ++i) {
    *job.add_events() = Event("j-long", i, v1::JOB_STATE_RUNNING, "progress", i, 10,
                              absl::StrCat("step ", i, " of 10"));
  }
  jobs_.AddJob(job);
  Result r = Run({"status", "j-long", "--events", "--max-events", "2"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(jobs_.gets().back().max_events(), 2);
  EXPECT_THAT(r.out, HasSubstr("(4 earlier events not shown"));
  EXPECT_THAT(r.out, HasSubstr("dattn watch j-long"));
  EXPECT_THAT(r.out, HasSubstr("step 6 of 10"));
  EXPECT_THAT(r.out, Not(HasSubstr("step 4 of 10")));

  r = Run({"status", "j-long", "--events"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(jobs_.gets().back().max_events(), 0);  // The coordinator's default.
  EXPECT_THAT(r.out, Not(HasSubstr("earlier events not shown")));

  r = Run({"status", "j-long", "--max-events", "1"});  // implies --events
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(jobs_.gets().back().include_events());
  EXPECT_THAT(r.out, HasSubstr("(5 earlier events not shown"));

  r = Run({"status", "j-long", "--events", "--max-events", "0"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--max-events"));
}

TEST_F(CliTest, ListTablePagingFiltersAndJson) {
  for (int i = 1; i <= 5; ++i) {
    v1::Job job = RunningJob(absl::StrCat("j-", i));
    job.mutable_spec()->set_name(absl::StrCat("job-number-", i));
    jobs_.AddJob(job);
  }
  Result r = Run({"list", "--limit", "3", "--state", "running,queued", "--tenant", "research"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << r.out;  // Header + 3 jobs.
  EXPECT_THAT(lines[0], HasSubstr("JOB ID"));
  EXPECT_THAT(lines[1], HasSubstr("job-number-1"));
  EXPECT_THAT(lines[1], HasSubstr("RUNNING"));
  EXPECT_THAT(lines[1], HasSubstr("3/10"));
  // The columns line up: every row has STATE where the header has it.
  const size_t state_column = lines[0].find("STATE");
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_EQ(lines[i].find("RUNNING"), state_column);
  EXPECT_THAT(r.err, HasSubstr("--all"));  // More exist.
  std::vector<v1::ListJobsRequest> requests = jobs_.lists();
  ASSERT_EQ(requests.size(), 2u);  // The fake's pages hold 2 jobs.
  EXPECT_EQ(requests[0].page_size(), 3);
  EXPECT_EQ(requests[1].page_size(), 1);
  EXPECT_EQ(requests[1].page_token(), "2");
  EXPECT_THAT(requests[0].states(),
              ::testing::ElementsAre(v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING));
  EXPECT_EQ(requests[0].tenant(), "research");

  r = Run({"list", "--all", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json parsed = nlohmann::json::parse(r.out);
  ASSERT_EQ(parsed["jobs"].size(), 5u);
  EXPECT_EQ(parsed["jobs"][4]["job_id"], "j-5");
  EXPECT_EQ(parsed["next_page_token"], "");
  EXPECT_EQ(r.err, "");
}

TEST_F(CliTest, WorkersTableAndJsonAndDrain) {
  admin_.AddWorker(Proto<v1::Worker>(R"pb(
    worker_id: "w-1"
    name: "gpu-host:0"
    state: WORKER_STATE_READY
    version: "0.1.0"
    free_memory_bytes: 85899345920
    task_ids: [ "j-1/1/0" ]
    capabilities {
      is_gpu: true
      device_name: "NVIDIA H100"
      device_index: 0
      total_memory_bytes: 85899345920
      dtypes: [ DTYPE_FP16, DTYPE_BF16, DTYPE_FP32 ]
      max_ranks: 1
    })pb"));
  admin_.AddWorker(Proto<v1::Worker>(R"pb(
    worker_id: "w-2"
    name: "cpu-host"
    state: WORKER_STATE_DEAD
    capabilities {
      num_threads: 16
      max_ranks: 2
      dtypes: [ DTYPE_FP32, DTYPE_FP64 ]
    })pb"));
  Result r = Run({"workers"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("gpu:0 NVIDIA H100"));
  EXPECT_THAT(r.out, HasSubstr("fp16,bf16,fp32"));
  EXPECT_THAT(r.out, HasSubstr("1/1"));
  EXPECT_THAT(r.out, HasSubstr("80.0 GiB / 80.0 GiB"));
  EXPECT_THAT(r.out, Not(HasSubstr("cpu-host")));
  EXPECT_THAT(r.out, Not(HasSubstr("device failed")));

  // A worker whose heartbeats say its device failed: shown so, with the error under the table.
  v1::Worker broken = Proto<v1::Worker>(R"pb(
    worker_id: "w-3"
    name: "gpu-host:1"
    state: WORKER_STATE_READY
    device_error: "INTERNAL: cudaMemGetInfo: an illegal memory access was encountered"
    capabilities { is_gpu: true device_index: 1 max_ranks: 1 })pb");
  admin_.AddWorker(broken);
  r = Run({"workers"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("DEVICE FAILED"));
  EXPECT_THAT(r.out, HasSubstr("w-3 (gpu-host:1): device failed: INTERNAL: cudaMemGetInfo: an "
                               "illegal memory access was encountered"));

  r = Run({"workers", "--all", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json parsed = nlohmann::json::parse(r.out);
  ASSERT_EQ(parsed["workers"].size(), 3u);
  EXPECT_EQ(parsed["workers"][1]["state"], "WORKER_STATE_DEAD");
  EXPECT_THAT(parsed["workers"][2]["device_error"].get<std::string>(), HasSubstr("illegal"));
  EXPECT_EQ(admin_.include_dead(), (std::vector<bool>{false, false, true}));

  r = Run({"drain", "gpu-host:0"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Worker w-1 (gpu-host:0) is DRAINING"));
  r = Run({"drain", "nope", "--json"});
  EXPECT_EQ(r.code, kExitNotFound);
  EXPECT_THAT(r.err, HasSubstr("no worker with id or name 'nope'"));
  EXPECT_EQ(r.out, "");

  r = Run({"undrain", "gpu-host:0"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Worker w-1 (gpu-host:0) is READY: work is placed on it again"));
  r = Run({"undrain", "w-1", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["state"], "WORKER_STATE_READY");
  EXPECT_EQ(admin_.undrains(), (std::vector<std::string>{"gpu-host:0", "w-1"}));
  r = Run({"undrain", "nope"});
  EXPECT_EQ(r.code, kExitNotFound);
  EXPECT_THAT(r.err, HasSubstr("no worker with id or name 'nope'"));
  r = Run({"undrain", "cpu-host"});
  EXPECT_EQ(r.code, kExitRejected);
  EXPECT_THAT(r.err, HasSubstr("is dead"));
  EXPECT_EQ(Run({"undrain"}).code, kExitUsage);
}

// drain --wait (a Kubernetes worker's preStop hook): returns once the worker runs no task, or exits
// 8 naming the tasks still running when the wait runs out.
TEST_F(CliTest, DrainWaitsForTheWorkersTasks) {
  admin_.AddWorker(Proto<v1::Worker>(R"pb(
    worker_id: "w-1"
    name: "dattn-worker-gpu-0"
    state: WORKER_STATE_READY
    task_ids: [ "j-1/1/0", "j-2/1/1" ]
    capabilities { max_ranks: 2 })pb"));
  Result r = Run({"drain", "dattn-worker-gpu-0", "--wait", "0.6"});
  EXPECT_EQ(r.code, kExitWaitRanOut) << r.err;
  EXPECT_THAT(r.err, HasSubstr("worker w-1 still runs 2 task(s) after 600ms: j-1/1/0, j-2/1/1"));

  std::thread finish([&] {
    absl::SleepFor(absl::Milliseconds(700));
    admin_.SetTasks("w-1", {});
  });
  const absl::Time start = absl::Now();
  r = Run({"drain", "dattn-worker-gpu-0", "--wait", "30"});
  const absl::Duration took = absl::Now() - start;
  finish.join();
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Worker w-1 (dattn-worker-gpu-0) is DRAINING: no new work will be "
                               "placed on it; it runs no task."));
  EXPECT_GE(took, absl::Milliseconds(700));
  EXPECT_LT(took, absl::Seconds(10));
  // Without tasks it returns at once; a bad --wait is a usage error.
  EXPECT_EQ(Run({"drain", "w-1", "--wait", "30"}).code, kExitOk);
  EXPECT_EQ(Run({"drain", "w-1", "--wait", "-1"}).code, kExitUsage);
}

TEST_F(CliTest, WatchFollowsToSucceeded) {
  jobs_.AddJob(RunningJob("j-w"));
  jobs_.SetFinal(SucceededJob("j-w"));
  jobs_.SetWatchScript({{{Event("j-w", 1, v1::JOB_STATE_QUEUED, "submitted"),
                          Event("j-w", 2, v1::JOB_STATE_RUNNING, "started"),
                          Event("j-w", 3, v1::JOB_STATE_RUNNING, "progress", 5, 10),
                          Event("j-w", 4, v1::JOB_STATE_SUCCEEDED, "succeeded", 10, 10)},
                         grpc::Status::OK}});
  Result r = Run({"watch", "j-w"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("#1  QUEUED  submitted"));
  EXPECT_THAT(r.out, HasSubstr("#3  RUNNING  progress  5/10 steps"));
  EXPECT_THAT(r.out, HasSubstr("Job j-w SUCCEEDED after 12.0s"));
  EXPECT_THAT(r.out, HasSubstr("45.678"));  // The result follows.
  EXPECT_EQ(jobs_.watches()[0].after_seq(), 0);
}

TEST_F(CliTest, WatchExitCodesForFailedAndCancelledAndMissing) {
  jobs_.AddJob(RunningJob("j-f"));
  v1::Job failed = RunningJob("j-f");
  failed.set_state(v1::JOB_STATE_FAILED);
  failed.set_state_reason("rank 1: out of device memory");
  jobs_.SetFinal(failed);
  jobs_.SetWatchScript({{{Event("j-f", 1, v1::JOB_STATE_RUNNING, "started"),
                          Event("j-f", 2, v1::JOB_STATE_FAILED, "failed", 0, 0, "oom")},
                         grpc::Status::OK}});
  Result r = Run({"watch", "j-f"});
  EXPECT_EQ(r.code, kExitJobFailed);
  EXPECT_THAT(r.out, HasSubstr("FAILED: rank 1: out of device memory"));

  jobs_.AddJob(RunningJob("j-c"));
  jobs_.SetFinal(Proto<v1::Job>(R"pb(job_id: "j-c"
                                     state: JOB_STATE_CANCELLED
                                     state_reason: "cancelled by alice")pb"));
  jobs_.SetWatchScript({{{Event("j-c", 1, v1::JOB_STATE_CANCELLED, "cancelled", 0, 0, "by alice")},
                         grpc::Status::OK}});
  r = Run({"watch", "j-c"});
  EXPECT_EQ(r.code, kExitCancelled);
  EXPECT_THAT(r.out, HasSubstr("CANCELLED: cancelled by alice"));

  r = Run({"watch", "j-unknown"});
  EXPECT_EQ(r.code, kExitNotFound);
}

// The stream breaks after two events; the CLI reconnects from event #2 and shows each event once.
TEST_F(CliTest, WatchReconnectsAfterABrokenStream) {
  jobs_.AddJob(RunningJob("j-r"));
  jobs_.SetFinal(SucceededJob("j-r"));
  const std::vector<v1::JobEvent> all = {
      Event("j-r", 1, v1::JOB_STATE_QUEUED, "submitted"),
      Event("j-r", 2, v1::JOB_STATE_RUNNING, "started"),
      Event("j-r", 3, v1::JOB_STATE_RUNNING, "progress", 5, 10),
      Event("j-r", 4, v1::JOB_STATE_SUCCEEDED, "succeeded", 10, 10)};
  jobs_.SetWatchScript({{{all[0], all[1]}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "restart")},
                        {all, grpc::Status::OK}});
  Result r = Run({"watch", "j-r", "--json"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  std::vector<v1::WatchJobRequest> watches = jobs_.watches();
  ASSERT_EQ(watches.size(), 2u);
  EXPECT_EQ(watches[1].after_seq(), 2);
  EXPECT_THAT(r.err,
              HasSubstr("lost the event stream of j-r after event #2 (UNAVAILABLE: restart)"));
  EXPECT_THAT(r.err, HasSubstr("reconnected to the event stream of j-r after"));
  // JSON Lines: one event per line, each exactly once, in order.
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << r.out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json event = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(event["seq"], std::to_string(i + 1));  // int64 is a string in protobuf JSON.
    EXPECT_EQ(event["job_id"], "j-r");
  }
}

TEST_F(CliTest, WatchGivesUpAfterReconnectFor) {
  jobs_.AddJob(RunningJob("j-gone"));
  jobs_.SetWatchScript({{{}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")}});
  Result r = Run({"watch", "j-gone", "--reconnect-for", "0.3"});
  EXPECT_EQ(r.code, kExitUnavailable);
  EXPECT_THAT(r.err, HasSubstr("could not reconnect"));
  EXPECT_GE(jobs_.watches().size(), 2u);
}

TEST_F(CliTest, WatchOnATerminalDrawsAProgressBar) {
  env_.out_is_tty = true;
  jobs_.AddJob(RunningJob("j-t"));
  jobs_.SetFinal(SucceededJob("j-t"));
  jobs_.SetWatchScript({{{Event("j-t", 1, v1::JOB_STATE_RUNNING, "started"),
                          Event("j-t", 2, v1::JOB_STATE_RUNNING, "progress", 5, 10),
                          Event("j-t", 3, v1::JOB_STATE_SUCCEEDED, "succeeded", 10, 10)},
                         grpc::Status::OK}});
  Result r = Run({"watch", "j-t"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(
      r.out, HasSubstr("\r\x1b[2Kj-t  RUNNING  [###############---------------]  5/10 steps  50%"));
  EXPECT_THAT(r.out, HasSubstr("[##############################]  10/10 steps  100%  elapsed"));
  EXPECT_THAT(r.out, HasSubstr("#1  RUNNING  started"));        // Non-progress events print above.
  EXPECT_THAT(r.out, Not(HasSubstr("#2  RUNNING  progress")));  // Progress only moves the bar.
}

// The text after the last redraw of a terminal's live line: what stays on screen.
std::string LastLine(const std::string& out) {
  const size_t at = out.rfind("\r\x1b[2K");
  return at == std::string::npos ? out : out.substr(at + 5, out.find('\n', at) - at - 5);
}

// The end event carries no progress (the coordinator's transition events do not) and the last
// progress event said 5 of 10: the line still ends full, from the final job.
TEST_F(CliTest, WatchOnATerminalEndsOnTheFinalStateNotAFrozenBar) {
  env_.out_is_tty = true;
  jobs_.AddJob(RunningJob("j-t"));
  jobs_.SetFinal(SucceededJob("j-t"));
  jobs_.SetWatchScript({{{Event("j-t", 1, v1::JOB_STATE_RUNNING, "started"),
                          Event("j-t", 2, v1::JOB_STATE_RUNNING, "progress", 5, 10),
                          Event("j-t", 3, v1::JOB_STATE_SUCCEEDED, "succeeded")},
                         grpc::Status::OK}});
  Result r = Run({"watch", "j-t"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(LastLine(r.out),
              StartsWith("j-t  SUCCEEDED  [##############################]  10/10 steps  100%  "
                         "elapsed 12.0s"))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("Job j-t SUCCEEDED after 12.0s"));
}

// A job that fails ends on a line that says where it stopped, without a bar, and the reason
// follows.
TEST_F(CliTest, WatchOnATerminalEndsAFailedJobWithItsReason) {
  env_.out_is_tty = true;
  jobs_.AddJob(RunningJob("j-f"));
  v1::Job failed = RunningJob("j-f");
  failed.set_state(v1::JOB_STATE_FAILED);
  failed.set_state_reason("rank 1: out of device memory");
  failed.mutable_end_time()->set_seconds(1714564806);
  jobs_.SetFinal(failed);
  jobs_.SetWatchScript({{{Event("j-f", 1, v1::JOB_STATE_RUNNING, "progress", 3, 10),
                          Event("j-f", 2, v1::JOB_STATE_FAILED, "failed", 0, 0, "oom")},
                         grpc::Status::OK}});
  Result r = Run({"watch", "j-f"});
  EXPECT_EQ(r.code, kExitJobFailed);
  EXPECT_THAT(LastLine(r.out), StartsWith("j-f  FAILED  at step 3 of 10  elapsed 6.0s")) << r.out;
  EXPECT_THAT(LastLine(r.out), Not(HasSubstr("[")));
  EXPECT_THAT(r.out, HasSubstr("Job j-f FAILED after 6.0s: rank 1: out of device memory"));

  jobs_.AddJob(RunningJob("j-c"));
  v1::Job cancelled = RunningJob("j-c");
  cancelled.set_state(v1::JOB_STATE_CANCELLED);
  cancelled.set_state_reason("cancelled by user: wrong shape");
  jobs_.SetFinal(cancelled);
  jobs_.SetWatchScript({{{Event("j-c", 1, v1::JOB_STATE_CANCELLED, "cancelled", 0, 0, "by user")},
                         grpc::Status::OK}});
  r = Run({"watch", "j-c"});
  EXPECT_EQ(r.code, kExitCancelled);
  EXPECT_THAT(LastLine(r.out), StartsWith("j-c  CANCELLED  at step 3 of 10")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("CANCELLED: cancelled by user: wrong shape"));
}

// While the coordinator is away every attempt fails; the outage is announced once when it starts
// and once when the coordinator answers again.
TEST_F(CliTest, WatchSaysOncePerOutageThatItReconnects) {
  jobs_.AddJob(RunningJob("j-o"));
  jobs_.SetFinal(SucceededJob("j-o"));
  const std::vector<v1::JobEvent> all = {
      Event("j-o", 1, v1::JOB_STATE_QUEUED, "submitted"),
      Event("j-o", 2, v1::JOB_STATE_RUNNING, "started"),
      Event("j-o", 3, v1::JOB_STATE_SUCCEEDED, "succeeded", 10, 10)};
  FakeJobService::WatchCall first{{all[0], all[1]},
                                  grpc::Status(grpc::StatusCode::UNAVAILABLE, "restart")};
  first.down_after = 3;  // Three failed attempts: about 0.7 s of backoff.
  jobs_.SetWatchScript({first, {all, grpc::Status::OK}});
  Result r = Run({"watch", "j-o"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(CountOf(r.err, "lost the event stream"), 1) << r.err;
  EXPECT_EQ(CountOf(r.err, "reconnected to the event stream of j-o after"), 1) << r.err;
  EXPECT_EQ(CountOf(r.out, "#3  SUCCEEDED"), 1) << r.out;
  EXPECT_EQ(jobs_.watches().size(), 2u);
}

// Terminal controls in every string the coordinator (or the user) gives: escape sequences (a
// window-title OSC with BEL, a screen clear), CR LF, a C1 CSI, a bidi override, DEL. Valid UTF-8,
// as protobuf strings must be.
const char kHostile[] =
    "ev\x1b]0;pwned\x07il\x1b[2J\r\nX\xc2\x9b"
    "31m\xe2\x80\xae\x7f";

// Whether `text` holds something a terminal acts on rather than shows: a control byte other than
// '\n', DEL, a C1 control, a bidi override. With `tty`, the CLI's own line redraws are allowed.
bool HasTerminalControls(std::string text, bool tty) {
  if (tty) {
    for (size_t at = text.find("\r\x1b[2K"); at != std::string::npos; at = text.find("\r\x1b[2K"))
      text.erase(at, 5);
  }
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
    if (c == 0xc2 && i + 1 < text.size() &&
        (static_cast<unsigned char>(text[i + 1]) & 0xe0) == 0x80)
      return true;
  }
  return text.find("\xe2\x80\xae") != std::string::npos;
}

TEST_F(CliTest, NamesAndMessagesReachTheTerminalEscaped) {
  v1::Job job = SucceededJob("j-evil");
  job.mutable_spec()->set_name(kHostile);
  job.mutable_spec()->set_tenant(kHostile);
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_state_reason(kHostile);
  job.set_idempotency_key(kHostile);
  job.add_worker_ids(kHostile);
  job.mutable_result()->mutable_attention()->mutable_ranks(0)->set_worker_id(kHostile);
  *job.add_events() = Event("j-evil", 1, v1::JOB_STATE_QUEUED, kHostile, 0, 0, kHostile);
  jobs_.AddJob(job);
  jobs_.SetFinal(job);
  v1::Worker worker;
  worker.set_worker_id("w-evil");
  worker.set_name(kHostile);
  worker.set_version(kHostile);
  worker.set_state(v1::WORKER_STATE_READY);
  worker.mutable_capabilities()->set_device_name(kHostile);
  admin_.AddWorker(worker);
  FakeJobService::WatchCall broken{
      {Event("j-evil", 1, v1::JOB_STATE_QUEUED, kHostile, 0, 0, kHostile)},
      grpc::Status(grpc::StatusCode::UNAVAILABLE, kHostile)};
  jobs_.SetWatchScript({broken,
                        {{Event("j-evil", 1, v1::JOB_STATE_QUEUED, kHostile, 0, 0, kHostile),
                          Event("j-evil", 2, v1::JOB_STATE_FAILED, kHostile, 0, 0, kHostile)},
                         grpc::Status::OK}});

  struct Case {
    std::vector<std::string> args;
    bool tty = false;
  };
  const std::vector<Case> cases = {
      {{"status", "j-evil", "--events"}},
      {{"list"}},
      {{"workers"}},
      {{"drain", "w-evil"}},
      {{"undrain", "w-evil"}},
      {{"watch", "j-evil"}},
      {{"watch", "j-evil"}, true},
      {{"status", kHostile}},           // The user's own argument, echoed in the error.
      {{"list", "--state", kHostile}},  // A usage error quoting it.
      {{kHostile}},                     // An unknown command.
      {{"submit", "-n", "64", "--heads", "1", "--head-dim", "8", "--segments", "64", "--rates", "1",
        "--name", kHostile}},  // The coordinator's refusal, below.
  };
  jobs_.SetSubmitStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, kHostile));
  for (const Case& c : cases) {
    env_.out_is_tty = c.tty;
    Result r = Run(c.args);
    const std::string what = absl::StrCat(absl::StrJoin(c.args, " "), c.tty ? " (tty)" : "");
    EXPECT_FALSE(HasTerminalControls(r.out, c.tty)) << what << "\n" << r.out;
    EXPECT_FALSE(HasTerminalControls(r.err, false)) << what << "\n" << r.err;
    EXPECT_THAT(r.out + r.err,
                HasSubstr("ev\\x1b]0;pwned\\x07il\\x1b[2J\\r\\nX\\u009b31m\\u202e\\x7f"))
        << what << "\n"
        << r.out << r.err;
  }

  // --json keeps the exact strings, as valid JSON.
  env_.out_is_tty = false;
  Result r = Run({"status", "j-evil", "--json", "--events"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json parsed = nlohmann::json::parse(r.out);
  EXPECT_EQ(parsed["spec"]["name"], kHostile);
  EXPECT_EQ(parsed["state_reason"], kHostile);
  EXPECT_EQ(parsed["events"][0]["message"], kHostile);
  EXPECT_FALSE(HasTerminalControls(r.out, false)) << r.out;
}

TEST_F(CliTest, SubmitWatchAndWaitReflectTheJobsEnd) {
  jobs_.SetFinal(SucceededJob("j-00000000000000a1"));
  jobs_.SetWatchScript(
      {{{Event("j-00000000000000a1", 1, v1::JOB_STATE_QUEUED, "submitted"),
         Event("j-00000000000000a1", 2, v1::JOB_STATE_SUCCEEDED, "succeeded", 10, 10)},
        grpc::Status::OK}});
  const std::vector<std::string> job = {"submit", "-n",         "8192", "--heads",
                                        "8",      "--head-dim", "64",   "--segments",
                                        "2048",   "--rates",    "1"};
  std::vector<std::string> args = job;
  args.push_back("--watch");
  Result r = Run(args);
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Submitted job j-00000000000000a1"));
  EXPECT_THAT(r.out, HasSubstr("#2  SUCCEEDED  succeeded"));
  EXPECT_THAT(r.out, HasSubstr("Job j-00000000000000a1 SUCCEEDED"));

  // --wait --json: a single JSON document, the final job.
  args = job;
  args.insert(args.end(), {"--wait", "--json"});
  r = Run(args);
  EXPECT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json parsed = nlohmann::json::parse(r.out);
  EXPECT_EQ(parsed["state"], "JOB_STATE_SUCCEEDED");
  EXPECT_EQ(parsed["result"]["attention"]["tflops"], 45.678);

  // A failing job makes --wait exit 1.
  v1::Job failed = SucceededJob("j-00000000000000a1");
  failed.set_state(v1::JOB_STATE_FAILED);
  failed.clear_result();
  failed.set_state_reason("engine error");
  jobs_.SetFinal(failed);
  jobs_.SetWatchScript(
      {{{Event("j-00000000000000a1", 1, v1::JOB_STATE_FAILED, "failed")}, grpc::Status::OK}});
  args = job;
  args.push_back("--wait");
  r = Run(args);
  EXPECT_EQ(r.code, kExitJobFailed);
  EXPECT_THAT(r.out, HasSubstr("engine error"));
}

// The .npy header and the data after it.
std::pair<std::string, std::string> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)) != 0) return {};
  const size_t header =
      static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  if ((10 + header) % 64 != 0) return {};
  return {bytes.substr(10, header), bytes.substr(10 + header)};
}

TEST_F(CliTest, OutputFileSavesTheKeptOutputAsNpy) {
  v1::Job done = SucceededJob("j-00000000000000a1");
  v1::TensorHeader header;
  header.set_dtype(v1::DTYPE_FP32);
  for (int64_t d : {1, 2, 1, 2}) header.add_shape(d);
  header.set_total_bytes(16);
  *done.mutable_result()->mutable_attention()->mutable_output_info() = header;
  jobs_.SetFinal(done);
  const float values[4] = {1.0f, -2.0f, 0.5f, 3.0f};
  const std::string data(reinterpret_cast<const char*>(values), sizeof(values));
  jobs_.SetOutput("j-00000000000000a1", header, data, /*chunk=*/4);
  jobs_.SetWatchScript(
      {{{Event("j-00000000000000a1", 1, v1::JOB_STATE_SUCCEEDED, "succeeded")}, grpc::Status::OK}});
  const std::string path = TempPath("out.npy");
  Result r = Run({"submit", "-n", "2", "--heads", "1", "--head-dim", "2", "--segments", "2",
                  "--rates", "1", "--output-file", path});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(jobs_.submits()[0].spec().attention().return_output());  // Implied.
  EXPECT_THAT(r.out, HasSubstr("fp32 [1, 2, 1, 2], 16 B (.npy)"));
  auto [dict, body] = ReadNpy(path);
  EXPECT_THAT(dict, HasSubstr("'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 1, 2), }"));
  EXPECT_EQ(body, data);
  EXPECT_FALSE(std::filesystem::exists(path + ".part"));

  // `dattn output` of a bf16 output: widened to float32, exactly.
  jobs_.AddJob(done);
  header.set_dtype(v1::DTYPE_BF16);
  header.set_total_bytes(8);
  const uint16_t bf16[4] = {0x3f80, 0xc000, 0x3f00, 0x4040};  // 1, -2, 0.5, 3.
  jobs_.SetOutput("j-00000000000000a1", header,
                  std::string(reinterpret_cast<const char*>(bf16), sizeof(bf16)), 2);
  const std::string widened = TempPath("bf16.npy");
  r = Run({"output", "j-00000000000000a1", "-o", widened});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bf16, saved as float32 .npy"));
  // --json: stdout holds exactly the header of what was saved; the notice goes to stderr.
  r = Run({"output", "j-00000000000000a1", "-o", widened, "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json saved = nlohmann::json::parse(r.out);
  EXPECT_EQ(saved["dtype"], "DTYPE_BF16");
  EXPECT_EQ(saved["total_bytes"], "8");
  EXPECT_THAT(r.err, HasSubstr("Saved output of"));
  auto [dict2, body2] = ReadNpy(widened);
  EXPECT_THAT(dict2, HasSubstr("'descr': '<f4'"));
  EXPECT_EQ(body2, data);

  // A stream that ends short leaves no file behind.
  header.set_total_bytes(12);
  jobs_.SetOutput("j-00000000000000a1", header,
                  std::string(reinterpret_cast<const char*>(bf16), sizeof(bf16)), 2);
  const std::string short_path = TempPath("short.npy");
  r = Run({"output", "j-00000000000000a1", "-o", short_path});
  EXPECT_EQ(r.code, kExitInternal);
  EXPECT_THAT(r.err, HasSubstr("ended after 8 of the tensor's 12 bytes"));
  EXPECT_FALSE(std::filesystem::exists(short_path));
  EXPECT_FALSE(std::filesystem::exists(short_path + ".part"));

  // status --output-file on a job that kept no output: the coordinator's NOT_FOUND.
  jobs_.AddJob(SucceededJob("j-plain"));
  r = Run({"status", "j-plain", "--output-file", TempPath("none.npy")});
  EXPECT_EQ(r.code, kExitNotFound);
  EXPECT_THAT(r.err, HasSubstr("kept no output"));
}

TEST_F(CliTest, DeleteRemovesAFinishedJob) {
  jobs_.AddJob(SucceededJob("j-del"));
  v1::TensorHeader header;
  header.set_dtype(v1::DTYPE_FP32);
  header.set_total_bytes(4096);
  jobs_.SetOutput("j-del", header, std::string(4096, 'x'));
  Result r = Run({"delete", "j-del"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Deleted job j-del and its output (4.0 KiB)"));
  r = Run({"delete", "j-del"});
  EXPECT_EQ(r.code, kExitNotFound);
}

TEST_F(CliTest, CancelQueuedRunningAndFinished) {
  v1::Job queued = RunningJob("j-q");
  queued.set_state(v1::JOB_STATE_QUEUED);
  jobs_.AddJob(queued);
  Result r = Run({"cancel", "j-q", "--reason", "wrong shape"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Job j-q is CANCELLED: cancelled by user: wrong shape"));
  EXPECT_EQ(jobs_.cancels().back().reason(), "wrong shape");

  jobs_.AddJob(RunningJob("j-run"));
  r = Run({"cancel", "j-run", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["state"], "JOB_STATE_RUNNING");

  jobs_.AddJob(SucceededJob("j-ok"));
  r = Run({"cancel", "j-ok"});
  EXPECT_EQ(r.code, kExitRejected);
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(r.err, HasSubstr("already ended"));
}

TEST_F(CliTest, HelpAndVersionExitZeroAndListExitCodes) {
  Result r = RunRaw({"--help"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("Exit codes:"));
  EXPECT_THAT(r.out, HasSubstr("5  coordinator unavailable"));
  r = RunRaw({"submit", "--help"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("--head-offsets"));
  // Outputs are kept beside the job store and read in chunks, not returned in the result.
  EXPECT_THAT(r.out, HasSubstr("Keep the output tensor (at most 16 GiB) on the coordinator"));
  EXPECT_THAT(r.out, Not(HasSubstr("64 MiB")));
  r = RunRaw({"--version"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("dattn.v1"));
  // Global flags may follow the subcommand.
  r = RunRaw({"health", "--coordinator", address_, "--json"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["status"], "SERVING");
}

// `dattn token new` prints a token and the token file's line for it: its SHA-256, tenant, role.
TEST_F(CliTest, TokenNewPrintsATokenAndItsHashedLine) {
  Result r = RunRaw({"token", "new", "--tenant", "team-a", "--role", "admin", "--name", "ci"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n');
  ASSERT_GE(lines.size(), 5u) << r.out;
  const std::string token = lines[1];
  EXPECT_EQ(token.rfind("dattn_", 0), 0u) << r.out;
  EXPECT_EQ(lines[4], security::HashToken(token) + " team-a admin ci");
  EXPECT_EQ(r.out.find(token, r.out.find("sha256:")), std::string::npos)
      << "the token itself must not be in the file's line";
  r = RunRaw({"token", "new", "--tenant", "a/b"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--tenant \"a/b\""));
  r = RunRaw({"token", "new", "--tenant", "a", "--role", "root"});
  EXPECT_EQ(r.code, kExitUsage);
}

// The token goes on every call as "Bearer <token>", from DATTN_TOKEN or --token-file; never in
// plaintext unless --insecure says so.
TEST_F(CliTest, TokensTravelInTheAuthorizationMetadata) {
  vars_["DATTN_TOKEN"] = "dattn_secret";
  Result r = Run(
      {"submit", "--seq-len=4096", "--heads=8", "--head-dim=64", "--segments=1024", "--rates=1"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("a bearer token goes only over TLS"));
  r = Run({"--insecure", "submit", "--seq-len=4096", "--heads=8", "--head-dim=64",
           "--segments=1024", "--rates=1"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string file = WriteTemp("token", "dattn_from_file\n");
  r = Run({"--insecure", "--token-file", file, "submit", "--seq-len=4096", "--heads=8",
           "--head-dim=64", "--segments=1024", "--rates=1"});
  ASSERT_EQ(r.code, 0) << r.err;
  vars_.erase("DATTN_TOKEN");
  r = Run(
      {"submit", "--seq-len=4096", "--heads=8", "--head-dim=64", "--segments=1024", "--rates=1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(jobs_.authorizations(),
              ::testing::ElementsAre("Bearer dattn_secret", "Bearer dattn_from_file", ""));
  r = Run({"--token-file", TempPath("no-such-token"), "list"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("cannot be read"));
  r = Run({"--tls-ca", TempPath("no-such-ca.pem"), "list"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--tls-ca"));
}

// ---- Training jobs ----

// The recovery policy from flags: set fields only (the rest take the kind's defaults); a value
// that is not a boolean is a usage error naming the flag.
TEST_F(CliTest, SubmitRecoveryPolicyFlags) {
  Result r = Run({"submit", "-n", "1024", "--heads", "4", "--head-dim", "32", "--segments", "256",
                  "--rates", "1", "--more-ranks", "true", "--lower-precision", "yes",
                  "--stall-seconds", "600"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  ASSERT_EQ(jobs_.submits().size(), 1u);
  // A copy: submits() returns the requests by value.
  const v1::RecoveryPolicy policy = jobs_.submits()[0].spec().recovery();
  EXPECT_FALSE(policy.has_split_batch());
  EXPECT_TRUE(policy.has_more_ranks() && policy.more_ranks());
  EXPECT_TRUE(policy.has_lower_precision() && policy.lower_precision());
  EXPECT_EQ(policy.stall_seconds(), 600);
  EXPECT_FALSE(policy.has_shrink_ring() || policy.has_single_device());
  r = Run({"submit", "-n", "1024", "--heads", "4", "--head-dim", "32", "--segments", "256",
           "--rates", "1", "--ranks", "2", "--shrink-ring", "true", "--single-device", "false"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  ASSERT_EQ(jobs_.submits().size(), 2u);
  const v1::RecoveryPolicy shrink = jobs_.submits()[1].spec().recovery();
  EXPECT_TRUE(shrink.has_shrink_ring() && shrink.shrink_ring());
  EXPECT_TRUE(shrink.has_single_device() && !shrink.single_device());
  r = Run({"submit", "-n", "1024", "--heads", "4", "--head-dim", "32", "--segments", "256",
           "--rates", "1", "--single-device", "perhaps"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--single-device"));
  r = Run({"submit", "-n", "1024", "--heads", "4", "--head-dim", "32", "--segments", "256",
           "--rates", "1", "--stall-seconds", "0"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--stall-seconds"));
  r = Run({"submit", "-n", "1024", "--heads", "4", "--head-dim", "32", "--segments", "256",
           "--rates", "1", "--split-batch", "maybe"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--split-batch"));
  EXPECT_THAT(r.err, HasSubstr("maybe"));
}

// A trainer config file, as `dattn-train --config` takes it.
constexpr char kTrainerConfig[] = R"({
  "model": {"vocab_size": 256, "d_model": 128, "num_layers": 4, "num_heads": 4, "ffn_dim": 512,
            "attention": {"mode": "grouped", "segment_lengths": [64, 128, 256],
                          "dilation_rates": [1, 2, 4]}},
  "data": {"paths": ["/shared/data/kjv.txt"], "format": "text"},
  "seq_len": 256, "batch_size": 8, "steps": 300, "optimizer": {"lr": 2e-3}
})";

// Every training flag at once: a TrainingJobSpec whose config_json is the file's text.
TEST_F(CliTest, SubmitTrainingFlagsBuildTheExactRequest) {
  const std::string config = WriteTemp("kjv.json", absl::StrCat(kTrainerConfig, "\n\n"));
  Result r = Run({"submit",
                  "--train-config",
                  config,
                  "--data-parallel",
                  "2",
                  "--sequence-parallel",
                  "4",
                  "--checkpoint-dir",
                  "/shared/ckpt",
                  "--init-from",
                  "/shared/ckpt/j-00000000000000ff/step-00000300",
                  "--device",
                  "gpu",
                  "--name",
                  "kjv",
                  "--tenant",
                  "team-a",
                  "--priority",
                  "5",
                  "--idempotency-key",
                  "train-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  v1::SubmitJobRequest expected = Proto<v1::SubmitJobRequest>(R"pb(
    idempotency_key: "train-1"
    spec {
      name: "kjv"
      tenant: "team-a"
      priority: 5
      training {
        data_parallel: 2
        sequence_parallel: 4
        device: DEVICE_PREFERENCE_GPU
        checkpoint_dir: "/shared/ckpt"
        init_from: "/shared/ckpt/j-00000000000000ff/step-00000300"
      }
    })pb");
  expected.mutable_spec()->mutable_training()->set_config_json(kTrainerConfig);
  ASSERT_EQ(jobs_.submits().size(), 1u);
  std::string diff;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(expected, jobs_.submits()[0])) << diff;
  EXPECT_THAT(r.out, HasSubstr("Submitted job j-00000000000000a1 (QUEUED"));

  // Only the config: the defaults (1 x 1, any device, no checkpoints).
  r = Run({"submit", "--train-config", config});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const v1::TrainingJobSpec defaults = jobs_.submits()[1].spec().training();
  EXPECT_EQ(defaults.data_parallel(), 1);
  EXPECT_EQ(defaults.sequence_parallel(), 1);
  EXPECT_EQ(defaults.device(), v1::DEVICE_PREFERENCE_ANY);
  EXPECT_EQ(defaults.checkpoint_dir(), "");
  EXPECT_EQ(defaults.config_json(), kTrainerConfig);
}

// The shipped example: 2 x 2 CPU ranks, a checkpoint folder, the trainer config written in YAML and
// sent as the JSON object it means (numbers, lists and strings as such).
TEST_F(CliTest, SubmitFromTheTrainingExampleYamlFile) {
  Result r = Run({"submit", "--file", "client/examples/training-job.yaml"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  ASSERT_EQ(jobs_.submits().size(), 1u);
  const v1::JobSpec spec = jobs_.submits()[0].spec();
  EXPECT_EQ(spec.name(), "kjv-small-2x2");
  EXPECT_EQ(spec.tenant(), "research");
  ASSERT_TRUE(spec.has_training()) << spec.DebugString();
  EXPECT_EQ(spec.training().data_parallel(), 2);
  EXPECT_EQ(spec.training().sequence_parallel(), 2);
  EXPECT_EQ(spec.training().device(), v1::DEVICE_PREFERENCE_CPU);
  EXPECT_EQ(spec.training().checkpoint_dir(), "/srv/dattn/checkpoints");
  EXPECT_EQ(spec.training().init_from(), "");
  const nlohmann::json config = nlohmann::json::parse(spec.training().config_json());
  EXPECT_EQ(config["model"]["d_model"], 128);
  EXPECT_EQ(config["model"]["attention"]["segment_lengths"], nlohmann::json({64, 128, 256}));
  EXPECT_EQ(config["model"]["attention"]["mode"], "grouped");
  EXPECT_EQ(config["data"]["paths"], nlohmann::json({"/srv/dattn/data/kjv.txt"}));
  EXPECT_EQ(config["seq_len"], 256);
  EXPECT_EQ(config["steps"], 300);
  EXPECT_DOUBLE_EQ(config["optimizer"]["lr"].get<double>(), 2e-3);
  EXPECT_DOUBLE_EQ(config["data"]["validation_fraction"].get<double>(), 0.01);
  EXPECT_EQ(config["checkpoint"]["keep_last"], 2);
  // The example's D and S fit its config: D divides the batch, S the sequence.
  EXPECT_EQ(config["batch_size"].get<int>() % spec.training().data_parallel(), 0);
  EXPECT_EQ(config["seq_len"].get<int>() % spec.training().sequence_parallel(), 0);
  // The trainer's own "device" is left to the placement (TrainingJobSpec.device).
  EXPECT_FALSE(config.contains("device"));

  // Flags override it, as for attention jobs.
  r = Run({"submit", "-f", "client/examples/training-job.yaml", "--data-parallel", "1",
           "--sequence-parallel", "4", "--checkpoint-dir", ""});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(jobs_.submits()[1].spec().training().data_parallel(), 1);
  EXPECT_EQ(jobs_.submits()[1].spec().training().sequence_parallel(), 4);
  EXPECT_EQ(jobs_.submits()[1].spec().training().checkpoint_dir(), "");
}

// config_file is read relative to the job file's folder, wherever `dattn submit` runs; a
// --train-config flag replaces the file's config.
TEST_F(CliTest, TrainingJobFileConfigFileIsRelativeToTheJobFile) {
  const std::string dir = TempPath("training-job-dir");
  std::filesystem::create_directories(dir + "/configs");
  std::ofstream(dir + "/configs/kjv.json") << kTrainerConfig;
  std::ofstream(dir + "/job.yaml") << "kind: training\n"
                                      "training:\n"
                                      "  config_file: configs/kjv.json\n"
                                      "  data_parallel: 2\n";
  Result r = Run({"submit", "-f", dir + "/job.yaml"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(jobs_.submits()[0].spec().training().config_json(), kTrainerConfig);
  EXPECT_EQ(jobs_.submits()[0].spec().training().data_parallel(), 2);
  EXPECT_FALSE(jobs_.submits()[0].spec().training().auto_data_parallel());

  // data_parallel: auto in the file, and --data-parallel auto: the coordinator picks D.
  std::ofstream(dir + "/auto.yaml") << "training:\n"
                                       "  config_file: configs/kjv.json\n"
                                       "  data_parallel: auto\n";
  r = Run({"submit", "-f", dir + "/auto.yaml"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(jobs_.submits().back().spec().training().auto_data_parallel());
  EXPECT_EQ(jobs_.submits().back().spec().training().data_parallel(), 0);
  r = Run({"submit", "-f", dir + "/job.yaml", "--data-parallel", "auto"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(jobs_.submits().back().spec().training().auto_data_parallel());
  r = Run({"submit", "-f", dir + "/job.yaml", "--data-parallel", "most"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("most"));

  const std::string other = WriteTemp("other.json", R"({"steps": 5})");
  r = Run({"submit", "-f", dir + "/job.yaml", "--train-config", other});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(jobs_.submits().back().spec().training().config_json(), R"({"steps": 5})");

  // A config file that is missing or not a JSON object: exit 2 naming the file and the key.
  std::ofstream(dir + "/job.yaml") << "training:\n  config_file: configs/missing.json\n";
  r = Run({"submit", "-f", dir + "/job.yaml"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(
      r.err, HasSubstr(absl::StrCat(dir, "/job.yaml:2: training.config_file: trainer config '", dir,
                                    "/configs/missing.json' cannot be read")));
  const std::string list = WriteTemp("list.json", "[1, 2]");
  r = Run({"submit", "--train-config", list});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("--train-config: trainer config '", list,
                                            "' is a JSON array, not an object")));
  const std::string broken = WriteTemp("broken.json", R"({"steps": 5,})");
  r = Run({"submit", "--train-config", broken});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("is not valid JSON"));
  r = Run({"submit", "--train-config", dir});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("is a directory"));
  EXPECT_EQ(jobs_.submits().size(), 4u);
}

// Settings of the other kind of job are refused, naming them; so are files with both sections.
TEST_F(CliTest, MixingAttentionAndTrainingSettingsIsAUsageError) {
  const std::string config = WriteTemp("mix.json", kTrainerConfig);
  const std::string training = WriteTemp("mix-training.yaml", "training:\n  config: {steps: 1}\n");
  const std::string attention =
      WriteTemp("mix-attention.yaml",
                "attention: {seq_len: 64, heads: 1, head_dim: 8, segments: [64], rates: [1]}\n");
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"submit", "-f", training, "--seq-len", "4096", "--ranks", "2"},
       "--seq-len (attention.seq_len), --ranks (attention.ranks) are settings of attention jobs, "
       "but this is a training job (training: in " +
           training + ")"},
      {{"submit", "-f", attention, "--data-parallel", "2"},
       "--data-parallel (training.data_parallel) is a setting of training jobs, but this is an "
       "attention job"},
      {{"submit", "--train-config", config, "--segments", "64", "--causal"},
       "--segments (attention.segments), --causal (attention.causal) (attention) and "
       "--train-config (training.config or training.config_file) (training) are settings of "
       "different kinds of job"},
      {{"submit", "-f", training, "--output-file", TempPath("x.npy")},
       "--output-file saves an attention job's output tensor, but this is a training job"},
      {{"submit", "--sequence-parallel", "2"},
       "missing --train-config (training.config or training.config_file)"},
      {{"submit", "--train-config", config, "--checkpoint-dir", "ckpt"},
       "--checkpoint-dir: 'ckpt' is not an absolute path"},
      {{"submit", "--train-config", config, "--data-parallel", "0"},
       "--data-parallel: '0' is out of range"},
      {{"submit", "--train-config", config, "--data-paralel", "2"},
       "unknown flag --data-paralel for 'dattn submit' (did you mean --data-parallel?)"},
  };
  for (const Case& c : cases) {
    Result r = Run(c.args);
    EXPECT_EQ(r.code, kExitUsage) << absl::StrJoin(c.args, " ");
    EXPECT_THAT(r.err, HasSubstr(c.expected)) << absl::StrJoin(c.args, " ");
  }
  const std::string both = WriteTemp("both.yaml",
                                     "attention: {seq_len: 64}\n"
                                     "training: {config: {steps: 1}}\n");
  Result r = Run({"submit", "-f", both});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("both.yaml:2: training: the file has both attention: and training: "
                               "sections, but a job is one kind of work"));
  const std::string typo = WriteTemp("typo-training.yaml", "training:\n  checkpoint-dri: /c\n");
  r = Run({"submit", "-f", typo});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("training.checkpoint-dri: unknown key (did you mean "
                               "'checkpoint_dir'?)"));
  EXPECT_TRUE(jobs_.submits().empty());

  // `dattn submit --help` lists the training flags in their own group.
  r = RunRaw({"submit", "--help"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("Training job settings"));
  EXPECT_THAT(r.out, HasSubstr("--train-config"));
  EXPECT_THAT(r.out, HasSubstr("--sequence-parallel"));
}

// The events a training job writes, one line each when stdout is not a terminal; a progress event
// without a message shows its figures. The end prints the result with its loss curve (ASCII).
TEST_F(CliTest, WatchATrainingJobPrintsItsEvents) {
  jobs_.AddJob(RunningTrainingJob("j-tr"));
  jobs_.SetFinal(SucceededTrainingJob("j-tr"));
  v1::JobEvent progress = Event("j-tr", 3, v1::JOB_STATE_RUNNING, "progress", 20, 300,
                                "step 20 of 300: loss 3.1416, lr 0.002, 2.4K tokens/s");
  v1::JobEvent quiet = Event("j-tr", 6, v1::JOB_STATE_RUNNING, "progress", 40, 300);
  quiet.mutable_progress()->mutable_training()->set_loss(2.7183);
  quiet.mutable_progress()->mutable_training()->set_learning_rate(0.0019);
  quiet.mutable_progress()->mutable_training()->set_tokens_per_second(2456);
  jobs_.SetWatchScript(
      {{{Event("j-tr", 1, v1::JOB_STATE_QUEUED, "submitted"),
         Event("j-tr", 2, v1::JOB_STATE_RUNNING, "started"), progress,
         Event("j-tr", 4, v1::JOB_STATE_RUNNING, "checkpoint", 0, 0,
               "checkpoint of step 20 committed: /shared/ckpt/j-tr/step-00000020 (1.2 MiB in "
               "0.31 s)"),
         Event("j-tr", 5, v1::JOB_STATE_RUNNING, "evaluation", 0, 0,
               "evaluation at step 20: validation loss 2.3100 (3.3326 bits/byte), retrieval 12.5% "
               "exact of 16 examples"),
         quiet,
         Event("j-tr", 7, v1::JOB_STATE_RUNNING, "resumed", 0, 0,
               "attempt 2 continued from the checkpoint of step 20 "
               "(/shared/ckpt/j-tr/step-00000020)"),
         Event("j-tr", 8, v1::JOB_STATE_SUCCEEDED, "succeeded", 300, 300)},
        grpc::Status::OK}});
  Result r = Run({"watch", "j-tr"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("#3  RUNNING  progress  20/300 steps  step 20 of 300: loss 3.1416, "
                               "lr 0.002, 2.4K tokens/s\n"));
  EXPECT_THAT(r.out, HasSubstr("#4  RUNNING  checkpoint  checkpoint of step 20 committed: "
                               "/shared/ckpt/j-tr/step-00000020 (1.2 MiB in 0.31 s)\n"));
  EXPECT_THAT(r.out,
              HasSubstr("#5  RUNNING  evaluation  evaluation at step 20: validation loss "
                        "2.3100 (3.3326 bits/byte), retrieval 12.5% exact of 16 examples\n"));
  EXPECT_THAT(r.out, HasSubstr("#6  RUNNING  progress  40/300 steps  loss 2.7183, lr 0.0019, "
                               "2.5K tokens/s\n"));
  EXPECT_THAT(r.out, HasSubstr("#7  RUNNING  resumed  attempt 2 continued from the checkpoint of "
                               "step 20"));
  EXPECT_THAT(r.out, HasSubstr("Job j-tr SUCCEEDED after 4m17s"));
  EXPECT_THAT(r.out, HasSubstr("Final loss        1.7234"));
  EXPECT_THAT(r.out, HasSubstr("Loss curve (training loss by step, 300 points)"));
  EXPECT_THAT(r.out, HasSubstr("  5.2276 |*"));  // The first column's mean, top left.
  EXPECT_FALSE(HasTerminalControls(r.out, false)) << r.out;

  // --json: the events as they are, one per line.
  r = Run({"watch", "j-tr", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 8u) << r.out;
  EXPECT_EQ(nlohmann::json::parse(lines[3])["kind"], "checkpoint");
  EXPECT_EQ(nlohmann::json::parse(lines[5])["progress"]["training"]["loss"], 2.7183);
}

// On a terminal the live line carries the loss, the rate and the last validation loss, and ends
// on the run's own final figures.
TEST_F(CliTest, WatchATrainingJobOnATerminalShowsTheLoss) {
  env_.out_is_tty = true;
  jobs_.AddJob(RunningTrainingJob("j-tt"));
  jobs_.SetFinal(SucceededTrainingJob("j-tt"));
  v1::JobEvent progress = Event("j-tt", 2, v1::JOB_STATE_RUNNING, "progress", 150, 300, "step 150");
  *progress.mutable_progress()->mutable_training() =
      RunningTrainingJob("j-tt").progress().training();
  progress.mutable_progress()->mutable_training()->set_loss(2.0001);
  jobs_.SetWatchScript({{{Event("j-tt", 1, v1::JOB_STATE_RUNNING, "started"), progress,
                          Event("j-tt", 3, v1::JOB_STATE_RUNNING, "evaluation", 0, 0,
                                "evaluation at step 150: validation loss 1.9000"),
                          Event("j-tt", 4, v1::JOB_STATE_SUCCEEDED, "succeeded")},
                         grpc::Status::OK}});
  Result r = Run({"watch", "j-tt"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("j-tt  RUNNING  [###############---------------]  150/300 steps  "
                               "50%  loss 2.0001  12.3K tok/s  val 2.3100  elapsed"));
  EXPECT_THAT(r.out, HasSubstr("#3  RUNNING  evaluation  evaluation at step 150"));
  EXPECT_THAT(LastLine(r.out),
              StartsWith("j-tt  SUCCEEDED  [##############################]  300/300 steps  100%  "
                         "loss 1.7234  2.4K tok/s  val 1.6729  elapsed 4m17s"))
      << r.out;
}

// `dattn status` of a running training job: its latest figures, newest checkpoint included.
TEST_F(CliTest, StatusShowsARunningTrainingJobsFigures) {
  jobs_.AddJob(RunningTrainingJob("j-run"));
  Result r = Run({"status", "j-run"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("Training        2 data x 2 sequence parallel (4 ranks), device cpu"));
  EXPECT_THAT(r.out, HasSubstr("Checkpoints to  /shared/ckpt\n"));
  EXPECT_THAT(r.out, HasSubstr("Progress        120/300 steps (40%)"));
  EXPECT_THAT(r.out, HasSubstr("  Step               120 of 300\n"));
  EXPECT_THAT(r.out, HasSubstr("  Loss               2.3456\n"));
  EXPECT_THAT(r.out, HasSubstr("  Learning rate      0.0003\n"));
  EXPECT_THAT(r.out, HasSubstr("  Throughput         12.3K tokens/s (166.00 ms/step)\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("MFU")));  // 0 on CPU workers: not known, not shown.
  EXPECT_THAT(r.out, HasSubstr("  Resumed            this attempt continued from the checkpoint of "
                               "step 100, restored in 1.25 s\n"));
  EXPECT_THAT(r.out, HasSubstr("  Last evaluation    step 100: validation loss 2.3100 (3.3326 "
                               "bits/byte)\n"));
  EXPECT_THAT(r.out, HasSubstr("  Newest checkpoint  step 100: /shared/ckpt/j-run/step-00000100 "
                               "(9.6 MiB)\n"));
  EXPECT_THAT(r.out, HasSubstr("1 complete (`dattn checkpoints j-run` lists them)"));
  EXPECT_THAT(r.out, Not(HasSubstr("Loss curve")));
}

// `dattn status` of a finished training job: the result and its loss curve, in ASCII unless stdout
// is a UTF-8 terminal (and --ascii does not say otherwise).
TEST_F(CliTest, StatusDrawsAFinishedTrainingJobsLossCurve) {
  jobs_.AddJob(SucceededTrainingJob("j-done"));
  Result r = Run({"status", "j-done"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  Steps             300\n"));
  EXPECT_THAT(r.out, HasSubstr("  Final loss        1.7234\n"));
  EXPECT_THAT(r.out, HasSubstr("  Final evaluation  step 300: validation loss 1.6729 (2.4135 "
                               "bits/byte), retrieval 12.5% exact (40.0% of answer tokens) of 16 "
                               "examples\n"));
  EXPECT_THAT(r.out,
              HasSubstr("  Throughput        2.4K tokens/s (over 4m12s; median step 0.840 s)\n"));
  EXPECT_THAT(r.out, HasSubstr("  MFU               21.5%\n"));
  EXPECT_THAT(r.out, HasSubstr("  Parameters        831232 (831.2K)\n"));
  EXPECT_THAT(r.out, HasSubstr("  Memory (rank 0)   33.0 GiB planned, 30.0 GiB measured peak (0.91 "
                               "of the plan)\n"));
  EXPECT_THAT(r.out, HasSubstr("  Parallelism       2 data x 2 sequence (4 ranks)\n"));
  EXPECT_THAT(r.out, HasSubstr("  Final checkpoint  /shared/ckpt/j-done/step-00000300\n"));
  EXPECT_THAT(r.out, HasSubstr("2 complete (`dattn checkpoints j-done` lists them)"));
  // The curve: 60 columns of 5 points each, 8 rows, labelled with its highest and lowest column.
  const size_t curve = r.out.find("Loss curve (training loss by step, 300 points)\n");
  ASSERT_NE(curve, std::string::npos) << r.out;
  std::vector<std::string> chart = absl::StrSplit(r.out.substr(curve), '\n', absl::SkipEmpty());
  ASSERT_EQ(chart.size(), 11u) << r.out;  // The title, 8 rows, the axis, the steps.
  EXPECT_EQ(chart[1], "  5.2276 |*");
  EXPECT_EQ(chart[2], "         | *");
  EXPECT_EQ(chart[8], absl::StrCat("  1.7022 |", std::string(22, ' '), std::string(38, '*')));
  EXPECT_EQ(chart[9], absl::StrCat("         +", std::string(60, '-')));
  EXPECT_EQ(chart[10], absl::StrCat("          1", std::string(56, ' '), "300"));
  for (const std::string& line : chart)
    EXPECT_EQ(line.find_first_of("\x80\xff"), std::string::npos);

  // A UTF-8 terminal: block elements.
  env_.out_is_tty = true;
  vars_["LANG"] = "en_US.UTF-8";
  r = Run({"status", "j-done"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  5.2276 \u2524\u2588\u2581\n"));
  EXPECT_THAT(r.out, HasSubstr("\u2514\u2500\u2500"));
  // --ascii, or a terminal of another character set: ASCII again.
  r = Run({"status", "j-done", "--ascii"});
  EXPECT_THAT(r.out, HasSubstr("  5.2276 |*"));
  vars_["LC_ALL"] = "C";
  r = Run({"status", "j-done"});
  EXPECT_THAT(r.out, HasSubstr("  5.2276 |*"));

  // --json: the Job as it is, its curve among the result's fields.
  r = Run({"status", "j-done", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json parsed = nlohmann::json::parse(r.out);
  EXPECT_EQ(parsed["result"]["training"]["loss_curve"].size(), 300u);
  EXPECT_EQ(parsed["spec"]["training"]["data_parallel"], 2);
}

TEST_F(CliTest, CheckpointsListsATrainingJobsCheckpoints) {
  jobs_.AddJob(SucceededTrainingJob("j-done"));
  Result r = Run({"checkpoints", "j-done"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[0], "STEP  PATH                               SIZE     WRITE TIME  COMMITTED");
  EXPECT_EQ(
      lines[1],
      "200   /shared/ckpt/j-done/step-00000200  9.6 MiB  310.00 ms   2024-05-01 12:03:00 UTC");
  EXPECT_EQ(
      lines[2],
      "300   /shared/ckpt/j-done/step-00000300  9.6 MiB  290.00 ms   2024-05-01 12:04:15 UTC");

  r = Run({"checkpoints", "j-done", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json parsed = nlohmann::json::parse(r.out);
  EXPECT_EQ(parsed["job_id"], "j-done");
  EXPECT_EQ(parsed["state"], "JOB_STATE_SUCCEEDED");
  EXPECT_EQ(parsed["checkpoint_dir"], "/shared/ckpt");
  ASSERT_EQ(parsed["checkpoints"].size(), 2u);
  EXPECT_EQ(parsed["checkpoints"][1]["step"],
            "300");  // int64 as a string, as protobuf JSON has it.
  EXPECT_EQ(parsed["checkpoints"][1]["path"], "/shared/ckpt/j-done/step-00000300");
  EXPECT_EQ(parsed["checkpoints"][1]["bytes"], "10020000");
  EXPECT_EQ(parsed["checkpoints"][1]["time"], "2024-05-01T12:04:15Z");

  // A running job: the checkpoints its progress lists (those that exist now).
  jobs_.AddJob(RunningTrainingJob("j-run"));
  r = Run({"checkpoints", "j-run"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("100   /shared/ckpt/j-run/step-00000100"));
  EXPECT_THAT(r.out, HasSubstr("job j-run is RUNNING: the checkpoints complete so far"));
  r = Run({"checkpoints", "j-run", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["checkpoints"].size(), 1u);

  // None yet, and none ever (no checkpoint_dir).
  v1::Job fresh = RunningTrainingJob("j-fresh");
  fresh.mutable_progress()->mutable_training()->clear_checkpoints();
  jobs_.AddJob(fresh);
  r = Run({"checkpoints", "j-fresh"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Job j-fresh (RUNNING) has no complete checkpoint in /shared/ckpt "
                               "yet."));
  fresh.set_job_id("j-none");
  fresh.mutable_spec()->mutable_training()->clear_checkpoint_dir();
  jobs_.AddJob(fresh);
  r = Run({"checkpoints", "j-none"});
  EXPECT_THAT(r.out, HasSubstr("submitted without a checkpoint_dir, so it writes none"));

  // An attention job has none: a usage error; an unknown job NOT_FOUND.
  jobs_.AddJob(SucceededJob("j-att"));
  r = Run({"checkpoints", "j-att"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("job j-att is an attention job: only training jobs have "
                               "checkpoints"));
  EXPECT_EQ(r.out, "");
  r = Run({"checkpoints", "j-missing"});
  EXPECT_EQ(r.code, kExitNotFound);
  EXPECT_THAT(r.err, HasSubstr("j-missing does not exist"));
  EXPECT_EQ(Run({"checkpoints"}).code, kExitUsage);
}

TEST_F(CliTest, ListShowsTrainingJobsWithTheirKind) {
  jobs_.AddJob(RunningTrainingJob("j-train"));
  jobs_.AddJob(RunningJob("j-attn"));
  Result r = Run({"list"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_THAT(lines[1], HasSubstr("j-train  training   kjv-small"));
  EXPECT_THAT(lines[1], HasSubstr("120/300"));
  EXPECT_THAT(lines[2], HasSubstr("j-attn   attention  bench"));
}

TEST_F(CliTest, ModelsListsDeploymentsAndTrainedCheckpoints) {
  // Nothing yet.
  Result empty = Run({"models"});
  ASSERT_EQ(empty.code, kExitOk) << empty.err;
  EXPECT_THAT(empty.out, HasSubstr("No deployment is queued or serving"));
  EXPECT_THAT(empty.out, HasSubstr("No training job has a complete checkpoint (no training jobs)"));

  jobs_.AddJob(SucceededTrainingJob("j-done"));
  jobs_.AddJob(RunningTrainingJob("j-run"));
  jobs_.AddJob(RunningJob("j-attn"));
  const v1::Job serving = ServingDeployment("j-dep1");
  jobs_.AddJob(serving);
  v1::Job loading = serving;
  loading.set_job_id("j-dep2");
  loading.mutable_spec()->clear_name();
  loading.mutable_spec()->mutable_deployment()->set_training_job_id("");
  loading.mutable_spec()->mutable_deployment()->set_training_job_step(0);
  loading.mutable_spec()->mutable_deployment()->set_checkpoint("/models/m/step-00000007");
  loading.mutable_progress()->clear_deployment();
  loading.mutable_spec()->mutable_deployment()->set_ranks(4);  // On a ring of 4 workers.
  jobs_.AddJob(loading);
  v1::Job ended = serving;
  ended.set_job_id("j-dep3");
  ended.set_state(v1::JOB_STATE_CANCELLED);
  jobs_.AddJob(ended);

  Result r = Run({"models"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  std::vector<std::string> all_lines = absl::StrSplit(r.out, '\n');
  ASSERT_GE(all_lines.size(), 12u) << r.out;
  EXPECT_EQ(all_lines[0], "No registered model (dattn models import).");
  EXPECT_EQ(all_lines[1], "");
  const std::vector<std::string> lines(all_lines.begin() + 2, all_lines.end());
  EXPECT_EQ(lines[0], "Deployments");
  EXPECT_THAT(lines[1], HasSubstr("DEPLOYMENT  NAME"));
  EXPECT_THAT(lines[2], HasSubstr("j-dep1      kjv   serving  j-run step 100"));
  EXPECT_THAT(lines[2], HasSubstr("8192"));
  EXPECT_THAT(lines[2], HasSubstr("8      1        cuda bf16  12        480"));
  EXPECT_THAT(lines[3], HasSubstr("j-dep2      -     loading  /models/m/step-00000007"));
  EXPECT_THAT(lines[3], HasSubstr("8      4        -          0"));
  EXPECT_THAT(r.out, Not(HasSubstr("j-dep3")));  // Ended: in dattn list, not here.
  EXPECT_EQ(lines[4], "");
  EXPECT_EQ(lines[5], "Trained models (the complete checkpoints of the newest 2 training jobs)");
  // Newest job first, its steps newest first; the final checkpoint deploys without --step.
  EXPECT_THAT(lines[7], HasSubstr("j-done"));
  EXPECT_THAT(lines[7], HasSubstr("300 (final)"));
  EXPECT_THAT(lines[7], HasSubstr("dattn deploy --from-job j-done"));
  EXPECT_THAT(lines[7], Not(HasSubstr("--step")));
  EXPECT_THAT(lines[8], HasSubstr("200"));
  EXPECT_THAT(lines[8], HasSubstr("dattn deploy --from-job j-done --step 200"));
  EXPECT_THAT(lines[9], HasSubstr("j-run"));
  EXPECT_THAT(lines[9], HasSubstr("RUNNING"));
  EXPECT_THAT(lines[9], HasSubstr("dattn deploy --from-job j-run --step 100"));
  // Two walks: queued and running deployments, then training jobs.
  std::vector<v1::ListJobsRequest> lists = jobs_.lists();
  ASSERT_GE(lists.size(), 2u);
  bool deployment_walk = false, training_walk = false;
  for (const v1::ListJobsRequest& l : lists) {
    deployment_walk |= l.kind() == "deployment" && l.states_size() == 2;
    training_walk |= l.kind() == "training" && l.states_size() == 0;
  }
  EXPECT_TRUE(deployment_walk && training_walk);

  // --limit 1: the newest training job only.
  Result one = Run({"models", "--limit", "1"});
  ASSERT_EQ(one.code, kExitOk) << one.err;
  EXPECT_THAT(one.out, HasSubstr("the newest 1 training job)"));
  EXPECT_THAT(one.out, Not(HasSubstr("j-run  ")));
  // --json: one ListJobsResponse, deployments first.
  Result json = Run({"models", "--json"});
  ASSERT_EQ(json.code, kExitOk) << json.err;
  const nlohmann::json parsed = nlohmann::json::parse(json.out);
  ASSERT_EQ(parsed["jobs"].size(), 4u) << json.out;
  EXPECT_EQ(parsed["jobs"][0]["job_id"], "j-dep1");
  EXPECT_EQ(parsed["jobs"][1]["job_id"], "j-dep2");
  EXPECT_EQ(parsed["jobs"][2]["job_id"], "j-done");
}

// `dattn models import|list|delete` and `dattn deploy --model`: the registry's calls, what they
// print, and usage errors before any call.
TEST_F(CliTest, ModelsImportListDeleteAndDeployByName) {
  Result imported = Run({"models", "import", "kjv", "/shared/kjv-bf16", "--description", "bf16"});
  ASSERT_EQ(imported.code, kExitOk) << imported.err;
  EXPECT_THAT(imported.out, HasSubstr("Imported kjv:1 (85.30M parameters, weights.safetensors, "
                                      "F32, 325.4 MiB) from folder /shared/kjv-bf16"));
  EXPECT_THAT(imported.out, HasSubstr("Serve it with: dattn deploy --model kjv:1"));
  Result from_job = Run({"models", "import", "kjv", "--from-job", "j-train", "--step", "300"});
  ASSERT_EQ(from_job.code, kExitOk) << from_job.err;
  std::vector<v1::ImportModelRequest> imports = jobs_.imports();
  ASSERT_EQ(imports.size(), 2u);
  EXPECT_EQ(imports[0].path(), "/shared/kjv-bf16");
  EXPECT_EQ(imports[0].description(), "bf16");
  EXPECT_EQ(imports[1].training_job_id(), "j-train");
  EXPECT_EQ(imports[1].training_job_step(), 300);

  Result list = Run({"models", "list"});
  ASSERT_EQ(list.code, kExitOk) << list.err;
  std::vector<std::string> lines = absl::StrSplit(list.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << list.out;
  EXPECT_THAT(lines[0], HasSubstr("MODEL  PARAMETERS  WEIGHTS"));
  EXPECT_THAT(lines[1], HasSubstr("kjv:1  85.30M"));
  EXPECT_THAT(lines[1], HasSubstr("folder /shared/kjv-bf16        bf16"));
  EXPECT_THAT(lines[2], HasSubstr("kjv:2"));
  EXPECT_THAT(lines[2], HasSubstr("training job j-train step 300  -"));
  Result overview = Run({"models"});
  ASSERT_EQ(overview.code, kExitOk) << overview.err;
  EXPECT_THAT(overview.out, HasSubstr("Registered models (dattn deploy --model NAME:VERSION)\n"));
  EXPECT_THAT(overview.out, HasSubstr("kjv:2"));
  Result json = Run({"models", "list", "--json"});
  ASSERT_EQ(json.code, kExitOk) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)["models"].size(), 2u);

  Result deploy = Run({"deploy", "--model", "kjv:2", "--max-context", "8192"});
  ASSERT_EQ(deploy.code, kExitOk) << deploy.err;
  const v1::DeploymentSpec d = jobs_.submits().back().spec().deployment();
  EXPECT_EQ(d.model(), "kjv");
  EXPECT_EQ(d.model_version(), 2);
  EXPECT_EQ(d.checkpoint(), "");
  Result newest = Run({"deploy", "--model", "kjv"});
  ASSERT_EQ(newest.code, kExitOk) << newest.err;
  EXPECT_EQ(jobs_.submits().back().spec().deployment().model_version(), 0);

  Result deleted = Run({"models", "delete", "kjv:1"});
  ASSERT_EQ(deleted.code, kExitOk) << deleted.err;
  EXPECT_THAT(deleted.out, HasSubstr("Deleted kjv version 1 (325.4 MiB freed)"));
  Result missing = Run({"models", "delete", "kjv:1"});
  EXPECT_NE(missing.code, kExitOk);
  EXPECT_THAT(missing.err, HasSubstr("delete model kjv:1"));

  const size_t submits = jobs_.submits().size();
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{"models", "import", "kjv"},
                                             {"models", "import", "kjv", "/x", "--from-job", "j"},
                                             {"models", "import", "kjv", "/x", "--step", "3"},
                                             {"models", "delete", "kjv:0"},
                                             {"deploy", "--model", "kjv", "--checkpoint", "/x"},
                                             {"deploy", "--model", "kjv:x"}}) {
    Result r = Run(bad);
    EXPECT_EQ(r.code, kExitUsage) << absl::StrJoin(bad, " ") << ": " << r.err;
  }
  EXPECT_EQ(jobs_.submits().size(), submits);
  EXPECT_EQ(jobs_.imports().size(), 2u);
}

TEST_F(CliTest, StatusAndListShowWhatADeploymentServes) {
  v1::Job job = ServingDeployment("j-dep1");
  job.mutable_progress()->set_steps_total(1);
  v1::DeploymentStatus* s = job.mutable_progress()->mutable_deployment();
  s->set_parameters(85300000);
  s->set_vocab_size(256);
  s->set_load_seconds(1.5);
  s->set_cache_bytes_per_sequence(168 << 20);
  s->set_running(3);
  s->set_queued(1);
  s->set_model_source("checkpoint of step 100");
  jobs_.AddJob(job);
  // The value of field `name` in `dattn status` output ("Name   value" lines), or "(absent)".
  auto field = [](const std::string& out, const std::string& name) -> std::string {
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      if (!absl::StartsWith(line, name + " ")) continue;
      return std::string(absl::StripLeadingAsciiWhitespace(line.substr(name.size())));
    }
    return "(absent)";
  };
  Result r = Run({"status", "j-dep1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(field(r.out, "Serving"), "serving") << r.out;
  EXPECT_EQ(field(r.out, "Progress"), "(absent)") << "a deployment has no steps to count";
  EXPECT_EQ(field(r.out, "Model"), "j-run step 100");
  EXPECT_EQ(field(r.out, "Serves"), "checkpoint of step 100");
  EXPECT_EQ(field(r.out, "Limits"), "max_context 8192, max_batch 8, max_queued 256");
  EXPECT_EQ(field(r.out, "Loaded"),
            "85.30M parameters, vocabulary 256, in 1.500 s; a sequence's cache 168.0 MiB");
  EXPECT_EQ(field(r.out, "Requests"), "3 running, 1 queued, 12 finished; 480 tokens generated");
  EXPECT_EQ(field(r.out, "Device"), "cuda bf16");
  Result list = Run({"list"});
  ASSERT_EQ(list.code, kExitOk) << list.err;
  std::vector<std::string> lines = absl::StrSplit(list.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << list.out;
  EXPECT_THAT(lines[1], HasSubstr("RUNNING  0    serving")) << list.out;
  // Loading: no figures yet.
  job.mutable_progress()->mutable_deployment()->set_ready(false);
  jobs_.AddJob(job);
  Result loading = Run({"status", "j-dep1"});
  EXPECT_EQ(field(loading.out, "Serving"), "loading") << loading.out;
  EXPECT_EQ(field(loading.out, "Requests"), "(absent)");
  // An imported model: its folder, and what the worker found there.
  job.mutable_spec()->mutable_deployment()->clear_training_job_id();
  job.mutable_spec()->mutable_deployment()->clear_training_job_step();
  job.mutable_spec()->mutable_deployment()->set_checkpoint("/shared/models/kjv-bf16");
  job.mutable_progress()->mutable_deployment()->set_ready(true);
  job.mutable_progress()->mutable_deployment()->set_checkpoint_step(0);
  job.mutable_progress()->mutable_deployment()->set_model_source(
      "imported model (model.safetensors, BF16)");
  jobs_.AddJob(job);
  Result imported = Run({"status", "j-dep1"});
  EXPECT_EQ(field(imported.out, "Model"), "/shared/models/kjv-bf16") << imported.out;
  EXPECT_EQ(field(imported.out, "Serves"), "imported model (model.safetensors, BF16)");
  EXPECT_EQ(field(imported.out, "Ring"), "(absent)") << "one worker";
  // On a ring of 4 workers.
  job.mutable_spec()->mutable_deployment()->set_ranks(4);
  jobs_.AddJob(job);
  Result ring = Run({"status", "j-dep1"});
  EXPECT_EQ(field(ring.out, "Ring"), "4 workers, each keeping 1/4 of every sequence's cache")
      << ring.out;
}

}  // namespace
}  // namespace client
}  // namespace dattn
