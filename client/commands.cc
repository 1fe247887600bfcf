#include "client/commands.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/exit_codes.h"
#include "client/format.h"
#include "client/npy.h"
#include "client/watch.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace client {

int ExitCodeForJobState(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_SUCCEEDED:
      return kExitOk;
    case v1::JOB_STATE_FAILED:
      return kExitJobFailed;
    case v1::JOB_STATE_CANCELLED:
      return kExitCancelled;
    default:
      return kExitInternal;
  }
}

Commands::Commands(GlobalArgs args, std::ostream& out, std::ostream& err, const CliEnvironment& env)
    : args_(std::move(args)),
      out_(out),
      err_(err),
      env_(env),
      channel_(args_.channel != nullptr ? args_.channel : *MakeChannel(args_.coordinator.address)),
      jobs_(v1::JobService::NewStub(channel_)),
      admin_(v1::AdminService::NewStub(channel_)) {}

std::unique_ptr<grpc::ClientContext> Commands::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + args_.timeout));
  return context;
}

int Commands::RpcFailed(const grpc::Status& status, const std::string& what) {
  err_ << "dattn: error: "
       << Printable(DescribeRpcError(status, what, args_.coordinator, args_.timeout)) << '\n';
  return ExitCodeForRpc(status.error_code());
}

void Commands::PrintJson(const google::protobuf::Message& message) {
  out_ << ToJson(message, /*pretty=*/true) << '\n';
}

bool Commands::Unicode() const {
  if (args_.ascii || !env_.out_is_tty) return false;
  // The locale's character set, as the C library picks it: LC_ALL, else LC_CTYPE, else LANG.
  for (const char* name : {"LC_ALL", "LC_CTYPE", "LANG"}) {
    const char* value = env_.getenv ? env_.getenv(name) : nullptr;
    if (value == nullptr || *value == '\0') continue;
    const std::string locale = absl::AsciiStrToLower(value);
    return absl::StrContains(locale, "utf-8") || absl::StrContains(locale, "utf8");
  }
  return false;
}

int Commands::Submit(const SubmitArgs& args) {
  v1::SubmitJobResponse response;
  grpc::Status status = jobs_->SubmitJob(NewContext().get(), args.request, &response);
  const std::string& key = args.request.idempotency_key();
  if (!status.ok()) {
    const int code = RpcFailed(status, "submit the job");
    if (code == kExitUnavailable) {
      err_ << "dattn: the job may or may not have been accepted. Retrying is safe with the same "
              "key: add --idempotency-key "
           << Printable(key) << '\n';
    }
    return code;
  }
  const v1::Job& job = response.job();
  const bool follow = args.watch || args.wait;
  if (args_.json) {
    // --wait prints only the final job (one document); --watch streams JSON Lines after this one.
    if (!args.wait || args.watch) out_ << ToJson(response, /*pretty=*/!args.watch) << '\n';
  } else {
    if (response.created()) {
      out_ << "Submitted job " << Printable(job.job_id()) << " (" << StateName(job.state());
      if (job.state() == v1::JOB_STATE_QUEUED && job.queue_position() > 0) {
        out_ << ", position " << job.queue_position() << " in the queue";
      }
      out_ << ")\n";
    } else {
      out_ << "Job " << Printable(job.job_id()) << " already exists for this idempotency key ("
           << StateName(job.state()) << "); no new job was created\n";
    }
    out_ << "Idempotency key: " << Printable(key);
    if (args.key_generated) {
      out_ << "  (to retry safely: --idempotency-key " << Printable(key) << ")";
    }
    out_ << '\n';
    if (!follow) out_ << "Follow it with: dattn watch " << Printable(job.job_id()) << '\n';
  }
  out_ << std::flush;
  if (!follow) return kExitOk;
  return FollowJob(job.job_id(), /*quiet=*/!args.watch, args.reconnect_for, args.output_file);
}

int Commands::FollowJob(const std::string& job_id, bool quiet, absl::Duration reconnect_for,
                        const std::string& output_file) {
  WatchOptions options;
  if (quiet) {
    options.display = WatchOptions::Display::kQuiet;
  } else if (args_.json) {
    options.display = WatchOptions::Display::kJson;
  } else {
    options.display = env_.out_is_tty ? WatchOptions::Display::kTty : WatchOptions::Display::kLines;
  }
  options.rpc_timeout = args_.timeout;
  options.reconnect_for = reconnect_for;
  options.redraw_every = env_.redraw_every;
  WatchResult result = WatchJob(jobs_.get(), job_id, options, out_, err_);
  if (!result.status.ok()) return RpcFailed(result.status, "watch job " + job_id);

  const v1::Job& job = result.job;
  if (quiet) {
    if (args_.json) {
      PrintJson(job);
    } else {
      PrintJob(job, absl::Now(), Unicode(), out_);
    }
  } else if (!args_.json) {
    out_ << "Job " << Printable(job.job_id()) << " " << StateName(job.state());
    const absl::Time created = ToTime(job.create_time());
    const absl::Time ended = ToTime(job.end_time());
    if (created != absl::InfinitePast() && ended != absl::InfinitePast()) {
      out_ << " after " << HumanDuration(ended - created);
    }
    if (!job.state_reason().empty()) out_ << ": " << Printable(job.state_reason());
    out_ << '\n';
    if (job.result().has_attention()) {
      out_ << '\n';
      PrintAttentionResult(job.result().attention(), job.spec().attention().pass(), out_);
    }
    if (job.result().has_training()) {
      out_ << '\n';
      PrintTrainingResult(job.result().training(), job.job_id(), Unicode(), out_);
    }
  }
  out_ << std::flush;
  const int code = ExitCodeForJobState(job.state());
  if (code == kExitOk && !output_file.empty()) return SaveOutput(job, output_file);
  return code;
}

int Commands::SaveOutput(const v1::Job& job, const std::string& path, v1::TensorHeader* saved) {
  if (job.state() != v1::JOB_STATE_SUCCEEDED) {
    err_ << "dattn: error: job " << Printable(job.job_id()) << " is " << StateName(job.state())
         << ": it has an output tensor only once it SUCCEEDED\n";
    return kExitNotFound;
  }
  // The output never travels in the Job: it is read in chunks, straight into the file.
  grpc::ClientContext context;
  v1::ReadOutputRequest request;
  request.set_job_id(job.job_id());
  std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader =
      jobs_->ReadOutput(&context, request);
  v1::TensorChunk chunk;
  std::unique_ptr<NpyWriter> writer;
  v1::TensorHeader header;
  absl::Status local;
  while (local.ok() && reader->Read(&chunk)) {
    if (chunk.has_header()) {
      header = chunk.header();
      absl::StatusOr<std::unique_ptr<NpyWriter>> opened = NpyWriter::Open(path, header);
      if (!opened.ok()) {
        local = opened.status();
      } else {
        writer = *std::move(opened);
      }
    }
    if (local.ok() && !chunk.data().empty()) {
      local = writer == nullptr
                  ? absl::DataLossError("the stream carried data before the tensor's header")
                  : writer->Append(chunk.data());
    }
  }
  if (!local.ok()) {
    context.TryCancel();
    reader->Finish().IgnoreError();
    err_ << "dattn: error: cannot save the output of job " << Printable(job.job_id()) << " to "
         << Printable(path) << ": " << Printable(std::string(local.message())) << '\n';
    return kExitInternal;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcFailed(status, "read the output of job " + job.job_id());
  if (writer == nullptr) {
    err_ << "dattn: error: the output stream of job " << Printable(job.job_id())
         << " carried no tensor\n";
    return kExitInternal;
  }
  if (absl::Status s = writer->Finish(); !s.ok()) {
    err_ << "dattn: error: cannot save the output of job " << Printable(job.job_id()) << " to "
         << Printable(path) << ": " << Printable(std::string(s.message())) << '\n';
    return kExitInternal;
  }
  // In --json mode stdout holds only the JSON document, so the notice goes to stderr.
  std::ostream& notice = args_.json ? err_ : out_;
  notice << "Saved output of " << Printable(job.job_id()) << " to " << Printable(path) << ": "
         << DTypeName(header.dtype()) << " [" << absl::StrJoin(header.shape(), ", ") << "], "
         << FormatBytes(header.total_bytes())
         << (header.dtype() == v1::DTYPE_BF16 ? " (bf16, saved as float32 .npy)" : " (.npy)")
         << '\n'
         << std::flush;
  if (saved != nullptr) *saved = header;
  return kExitOk;
}

int Commands::Output(const std::string& job_id, const std::string& path) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  grpc::Status status = jobs_->GetJob(NewContext().get(), request, &job);
  if (!status.ok()) return RpcFailed(status, "get job " + job_id);
  v1::TensorHeader saved;
  const int code = SaveOutput(job, path, &saved);
  if (code == kExitOk && args_.json) PrintJson(saved);  // The one JSON document: what was saved.
  return code;
}

int Commands::Delete(const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  v1::DeleteJobResponse response;
  grpc::Status status = jobs_->DeleteJob(NewContext().get(), request, &response);
  if (!status.ok()) return RpcFailed(status, "delete job " + job_id);
  if (args_.json) {
    PrintJson(response);
  } else {
    out_ << "Deleted job " << Printable(job_id);
    if (response.output_bytes_freed() > 0) {
      out_ << " and its output (" << FormatBytes(response.output_bytes_freed()) << ")";
    }
    out_ << '\n' << std::flush;
  }
  return kExitOk;
}

int Commands::Status(const std::string& job_id, bool events, int max_events,
                     const std::string& output_file) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_include_events(events);
  request.set_max_events(events ? max_events : 0);
  v1::Job job;
  grpc::Status status = jobs_->GetJob(NewContext().get(), request, &job);
  if (!status.ok()) return RpcFailed(status, "get job " + job_id);
  if (args_.json) {
    PrintJson(job);
  } else {
    PrintJob(job, absl::Now(), Unicode(), out_);
  }
  out_ << std::flush;
  if (!output_file.empty()) return SaveOutput(job, output_file);
  return kExitOk;
}

int Commands::Checkpoints(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  grpc::Status status = jobs_->GetJob(NewContext().get(), request, &job);
  if (!status.ok()) return RpcFailed(status, "get job " + job_id);
  if (!job.spec().has_training()) {
    err_ << "dattn: error: job " << Printable(job.job_id()) << " is "
         << (job.spec().has_attention() ? "an attention job" : "not a training job")
         << ": only training jobs have checkpoints\n";
    return kExitUsage;
  }
  // A succeeded job's result lists its checkpoints as they were at the end; until then (and for a
  // job that failed or was cancelled) its progress lists those that exist now.
  const bool from_result = job.result().has_training();
  const google::protobuf::RepeatedPtrField<v1::TrainingCheckpoint>& checkpoints =
      from_result ? job.result().training().checkpoints() : job.progress().training().checkpoints();
  if (args_.json) {
    // One document: the job, its state, and the checkpoints in the protobuf JSON mapping.
    nlohmann::ordered_json document;
    document["job_id"] = job.job_id();
    document["state"] = v1::JobState_Name(job.state());
    document["checkpoint_dir"] = job.spec().training().checkpoint_dir();
    document["checkpoints"] = nlohmann::ordered_json::array();
    for (const v1::TrainingCheckpoint& checkpoint : checkpoints) {
      document["checkpoints"].push_back(
          nlohmann::ordered_json::parse(ToJson(checkpoint, /*pretty=*/false)));
    }
    out_ << document.dump(2) << '\n' << std::flush;
    return kExitOk;
  }
  if (checkpoints.empty()) {
    out_ << "Job " << Printable(job.job_id()) << " (" << StateName(job.state())
         << ") has no complete checkpoint";
    if (job.spec().training().checkpoint_dir().empty()) {
      out_ << ": it was submitted without a checkpoint_dir, so it writes none";
    } else {
      out_ << " in " << Printable(job.spec().training().checkpoint_dir()) << " yet";
    }
    out_ << ".\n" << std::flush;
    return kExitOk;
  }
  CheckpointsTable(checkpoints).Print(out_);
  if (!from_result && !IsTerminal(job.state())) {
    out_ << "(job " << Printable(job.job_id()) << " is " << StateName(job.state())
         << ": the checkpoints complete so far; older ones are pruned to checkpoint.keep_last)\n";
  }
  out_ << std::flush;
  return kExitOk;
}

int Commands::List(const ListArgs& args) {
  v1::ListJobsResponse all;
  std::string token;
  int64_t remaining = args.all ? INT64_MAX : args.limit;
  do {
    v1::ListJobsRequest request;
    for (v1::JobState s : args.states) request.add_states(s);
    request.set_tenant(args.tenant);
    request.set_page_size(static_cast<int32_t>(std::min<int64_t>(remaining, 1000)));
    request.set_page_token(token);
    v1::ListJobsResponse page;
    grpc::Status status = jobs_->ListJobs(NewContext().get(), request, &page);
    if (!status.ok()) return RpcFailed(status, "list jobs");
    for (v1::Job& job : *page.mutable_jobs()) {
      if (remaining == 0) break;
      *all.add_jobs() = std::move(job);
      --remaining;
    }
    token = page.next_page_token();
  } while (!token.empty() && remaining > 0);
  all.set_next_page_token(token);

  if (args_.json) {
    PrintJson(all);
  } else if (all.jobs_size() == 0) {
    out_ << "No jobs" << (args.states.empty() && args.tenant.empty() ? "" : " match the filters")
         << ".\n";
  } else {
    std::vector<v1::Job> jobs(all.jobs().begin(), all.jobs().end());
    JobsTable(jobs, absl::Now()).Print(out_);
  }
  if (!token.empty()) {
    err_ << "dattn: more jobs exist beyond these " << all.jobs_size()
         << ": raise --limit or use --all\n";
  }
  out_ << std::flush;
  return kExitOk;
}

int Commands::Models(int limit) {
  // Every job of `kind` in `states` (all when empty), newest first, up to `most`.
  auto walk = [&](const std::string& kind, std::vector<v1::JobState> states, int64_t most,
                  std::vector<v1::Job>* jobs) -> std::optional<int> {
    std::string token;
    do {
      v1::ListJobsRequest request;
      request.set_kind(kind);
      for (v1::JobState s : states) request.add_states(s);
      request.set_page_size(static_cast<int32_t>(std::min<int64_t>(most, 1000)));
      request.set_page_token(token);
      v1::ListJobsResponse page;
      grpc::Status status = jobs_->ListJobs(NewContext().get(), request, &page);
      if (!status.ok()) return RpcFailed(status, absl::StrCat("list ", kind, " jobs"));
      for (v1::Job& job : *page.mutable_jobs()) {
        if (static_cast<int64_t>(jobs->size()) >= most) break;
        jobs->push_back(std::move(job));
      }
      token = page.next_page_token();
    } while (!token.empty() && static_cast<int64_t>(jobs->size()) < most);
    return std::nullopt;
  };
  std::vector<v1::Job> deployments, training;
  if (std::optional<int> failed = walk("deployment", {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING},
                                       INT64_MAX, &deployments)) {
    return *failed;
  }
  if (std::optional<int> failed = walk("training", {}, limit, &training)) return *failed;
  v1::ListModelsResponse registered;
  if (!args_.json) {
    grpc::Status status =
        jobs_->ListModels(NewContext().get(), v1::ListModelsRequest(), &registered);
    if (!status.ok()) return RpcFailed(status, "list registered models");
  }
  if (args_.json) {
    v1::ListJobsResponse all;
    for (const v1::Job& job : deployments) *all.add_jobs() = job;
    for (const v1::Job& job : training) *all.add_jobs() = job;
    PrintJson(all);
    out_ << std::flush;
    return kExitOk;
  }
  if (registered.models_size() == 0) {
    out_ << "No registered model (dattn models import).\n";
  } else {
    out_ << "Registered models (dattn deploy --model NAME:VERSION)\n";
    RegisteredModelsTable({registered.models().begin(), registered.models().end()}).Print(out_);
  }
  out_ << '\n';
  if (deployments.empty()) {
    out_ << "No deployment is queued or serving (dattn deploy).\n";
  } else {
    out_ << "Deployments\n";
    DeploymentsTable(deployments, absl::Now()).Print(out_);
  }
  const Table trained = TrainedModelsTable(training);
  out_ << '\n';
  if (trained.empty()) {
    out_ << "No training job has a complete checkpoint"
         << (training.empty() ? " (no training jobs)" : "") << ".\n";
  } else {
    out_ << "Trained models (the complete checkpoints of the newest " << training.size()
         << " training job" << (training.size() == 1 ? "" : "s") << ")\n";
    trained.Print(out_);
  }
  out_ << std::flush;
  return kExitOk;
}

int Commands::ListModels(const std::string& name) {
  v1::ListModelsRequest request;
  request.set_name(name);
  v1::ListModelsResponse response;
  grpc::Status status = jobs_->ListModels(NewContext().get(), request, &response);
  if (!status.ok()) return RpcFailed(status, "list registered models");
  if (args_.json) {
    PrintJson(response);
  } else if (response.models_size() == 0) {
    out_ << (name.empty() ? std::string("No registered model (dattn models import).")
                          : absl::StrCat("No model named ", Printable(name), " is registered."))
         << '\n';
  } else {
    RegisteredModelsTable({response.models().begin(), response.models().end()}).Print(out_);
  }
  out_ << std::flush;
  return kExitOk;
}

int Commands::ImportModel(const v1::ImportModelRequest& request) {
  v1::RegisteredModel model;
  // A copy of many gigabytes takes a while: the call may take an hour (or --timeout, if longer);
  // a client that gives up (Ctrl-C, the deadline) cancels the copy, which leaves nothing.
  std::unique_ptr<grpc::ClientContext> context = NewContext();
  context->set_deadline(absl::ToChronoTime(absl::Now() + std::max(args_.timeout, absl::Hours(1))));
  grpc::Status status = jobs_->ImportModel(context.get(), request, &model);
  if (!status.ok()) return RpcFailed(status, "import model " + request.name());
  if (args_.json) {
    PrintJson(model);
  } else {
    out_ << "Imported " << Printable(model.name()) << ":" << model.version() << " ("
         << FormatCount(model.parameters()) << " parameters, " << Printable(model.weights()) << ", "
         << FormatBytes(model.bytes()) << ") from " << Printable(model.source())
         << "\nServe it with: dattn deploy --model " << Printable(model.name()) << ":"
         << model.version() << '\n';
  }
  out_ << std::flush;
  return kExitOk;
}

int Commands::DeleteModel(const v1::DeleteModelRequest& request) {
  v1::DeleteModelResponse response;
  grpc::Status status = jobs_->DeleteModel(NewContext().get(), request, &response);
  const std::string what = request.version() == 0
                               ? request.name()
                               : absl::StrCat(request.name(), ":", request.version());
  if (!status.ok()) return RpcFailed(status, "delete model " + what);
  if (args_.json) {
    PrintJson(response);
  } else {
    out_ << "Deleted " << Printable(request.name()) << " version"
         << (response.versions_size() == 1 ? " " : "s ") << absl::StrJoin(response.versions(), ", ")
         << " (" << FormatBytes(response.bytes_freed()) << " freed)\n";
  }
  out_ << std::flush;
  return kExitOk;
}

int Commands::Watch(const std::string& job_id, absl::Duration reconnect_for) {
  return FollowJob(job_id, /*quiet=*/false, reconnect_for, /*output_file=*/"");
}

int Commands::Cancel(const std::string& job_id, const std::string& reason) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  v1::Job job;
  grpc::Status status = jobs_->CancelJob(NewContext().get(), request, &job);
  if (!status.ok()) return RpcFailed(status, "cancel job " + job_id);
  if (args_.json) {
    PrintJson(job);
  } else if (job.state() == v1::JOB_STATE_CANCELLED) {
    out_ << "Job " << Printable(job.job_id()) << " is CANCELLED";
    if (!job.state_reason().empty()) out_ << ": " << Printable(job.state_reason());
    out_ << '\n';
  } else {
    out_ << "Cancel requested for job " << Printable(job.job_id()) << " (" << StateName(job.state())
         << "): it ends CANCELLED once its workers stop. Follow it with: dattn watch "
         << Printable(job.job_id()) << '\n';
  }
  out_ << std::flush;
  return kExitOk;
}

int Commands::Workers(bool include_dead) {
  v1::ListWorkersRequest request;
  request.set_include_dead(include_dead);
  v1::ListWorkersResponse response;
  grpc::Status status = admin_->ListWorkers(NewContext().get(), request, &response);
  if (!status.ok()) return RpcFailed(status, "list workers");
  if (args_.json) {
    PrintJson(response);
  } else if (response.workers_size() == 0) {
    out_ << (include_dead ? "No workers are registered.\n"
                          : "No live workers are registered (--all includes dead ones).\n");
  } else {
    std::vector<v1::Worker> workers(response.workers().begin(), response.workers().end());
    WorkersTable(workers, absl::Now()).Print(out_);
    for (const v1::Worker& w : workers) {
      if (w.device_error().empty() || w.state() == v1::WORKER_STATE_DEAD) continue;
      out_ << Printable(w.worker_id()) << " (" << Printable(w.name())
           << "): device failed: " << Printable(w.device_error())
           << "; it gets no new work until its device works again (restart the worker)\n";
    }
  }
  out_ << std::flush;
  return kExitOk;
}

int Commands::Drain(const std::string& worker, absl::Duration wait) {
  v1::DrainWorkerRequest request;
  request.set_worker_id(worker);
  v1::Worker response;
  grpc::Status status = admin_->DrainWorker(NewContext().get(), request, &response);
  if (!status.ok()) return RpcFailed(status, "drain worker " + worker);
  if (wait > absl::ZeroDuration() && response.task_ids_size() > 0) {
    // The worker's tasks finish on their own; ListWorkers (dead ones included: a worker that died
    // meanwhile has no task left here either) says when.
    const absl::Time deadline = absl::Now() + wait;
    while (response.task_ids_size() > 0) {
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        err_ << "dattn: worker " << Printable(response.worker_id()) << " still runs "
             << response.task_ids_size() << " task(s) after " << absl::FormatDuration(wait) << ": "
             << Printable(absl::StrJoin(response.task_ids(), ", ")) << '\n'
             << std::flush;
        return kExitWaitRanOut;
      }
      absl::SleepFor(std::min(absl::Milliseconds(500), deadline - now));
      v1::ListWorkersRequest list;
      list.set_include_dead(true);
      v1::ListWorkersResponse listed;
      status = admin_->ListWorkers(NewContext().get(), list, &listed);
      if (!status.ok()) return RpcFailed(status, "list workers");
      bool found = false;
      for (const v1::Worker& w : listed.workers()) {
        if (w.worker_id() == response.worker_id()) {
          response = w;
          found = true;
        }
      }
      if (!found) response.clear_task_ids();  // Forgotten by the coordinator: nothing runs there.
    }
  }
  if (args_.json) {
    PrintJson(response);
  } else {
    out_ << "Worker " << Printable(response.worker_id());
    if (!response.name().empty()) out_ << " (" << Printable(response.name()) << ")";
    out_ << " is " << WorkerStateName(response.state()) << ": no new work will be placed on it";
    if (response.task_ids_size() > 0) {
      out_ << "; " << response.task_ids_size() << " running task(s) will finish";
    } else if (wait > absl::ZeroDuration()) {
      out_ << "; it runs no task";
    }
    out_ << ".\n";
  }
  out_ << std::flush;
  return kExitOk;
}

int Commands::Undrain(const std::string& worker) {
  v1::UndrainWorkerRequest request;
  request.set_worker_id(worker);
  v1::Worker response;
  grpc::Status status = admin_->UndrainWorker(NewContext().get(), request, &response);
  if (!status.ok()) return RpcFailed(status, "undrain worker " + worker);
  if (args_.json) {
    PrintJson(response);
  } else {
    out_ << "Worker " << Printable(response.worker_id());
    if (!response.name().empty()) out_ << " (" << Printable(response.name()) << ")";
    out_ << " is " << WorkerStateName(response.state())
         << ": work is placed on it again (it hears so with its next heartbeat).\n";
  }
  out_ << std::flush;
  return kExitOk;
}

int Commands::Health(const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(NewContext().get(), request, &response);
  if (!status.ok()) return RpcFailed(status, "check the coordinator's health");
  const bool serving = response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  if (args_.json) {
    PrintJson(response);
  } else {
    out_ << "Coordinator at " << Printable(args_.coordinator.address) << ": "
         << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()) << '\n';
  }
  out_ << std::flush;
  return serving ? kExitOk : kExitUnavailable;
}

}  // namespace client
}  // namespace dattn
