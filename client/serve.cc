// `dattn deploy`, `dattn generate` and `dattn score`: deployments (commands.h; docs/SERVING.md).
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/exit_codes.h"
#include "client/format.h"
#include "client/printable.h"

namespace dattn {
namespace client {

int Commands::Deploy(const DeployArgs& args) {
  v1::SubmitJobResponse response;
  grpc::Status status = jobs_->SubmitJob(NewContext().get(), args.request, &response);
  if (!status.ok()) return RpcFailed(status, "deploy");
  const std::string id = response.job().job_id();
  if (args.wait <= absl::ZeroDuration()) {
    if (args_.json) {
      PrintJson(response);
    } else {
      out_ << "Deployment " << Printable(id) << " submitted ("
           << Printable(response.job().state_reason().empty()
                            ? std::string(StateName(response.job().state()))
                            : response.job().state_reason())
           << "); it serves once `dattn status " << Printable(id) << "` says so\n";
    }
    return kExitOk;
  }
  const absl::Time until = absl::Now() + args.wait;
  v1::Job job = response.job();
  while (true) {
    v1::GetJobRequest get;
    get.set_job_id(id);
    status = jobs_->GetJob(NewContext().get(), get, &job);
    if (!status.ok()) return RpcFailed(status, "follow deployment " + id);
    if (job.state() == v1::JOB_STATE_RUNNING && job.progress().deployment().ready()) break;
    if (job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
        job.state() == v1::JOB_STATE_CANCELLED) {
      err_ << "dattn: error: deployment " << Printable(id) << " ended " << StateName(job.state())
           << ": " << Printable(job.state_reason()) << '\n';
      return ExitCodeForJobState(job.state());
    }
    if (absl::Now() >= until) {
      err_ << "dattn: error: deployment " << Printable(id) << " is not serving after "
           << absl::FormatDuration(args.wait) << " (" << StateName(job.state()) << ": "
           << Printable(job.state_reason()) << ")\n";
      return kExitWaitRanOut;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (args_.json) {
    PrintJson(job);
  } else {
    const v1::DeploymentStatus& d = job.progress().deployment();
    const std::string source = d.model_source().empty()
                                   ? absl::StrCat("checkpoint of step ", d.checkpoint_step())
                                   : d.model_source();
    out_ << "Deployment " << Printable(id) << " serves the " << Printable(source) << " ("
         << d.parameters() << " parameters, vocabulary " << d.vocab_size() << ", loaded in "
         << absl::StrFormat("%.2f", d.load_seconds()) << " s"
         << (d.ranks() > 1 ? absl::StrCat(", on a ring of ", d.ranks(), " workers") : "")
         << "); try: dattn generate " << Printable(id) << " --prompt '...'\n";
  }
  return kExitOk;
}

int Commands::Generate(const GenerateArgs& args) {
  grpc::ClientContext context;
  if (args.deadline > absl::ZeroDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + args.deadline));
  }
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      jobs_->Generate(&context, args.request);
  v1::GenerateResponse response;
  v1::GenerateDone done;
  bool bytes = !args.print_tokens && args.request.prompt_size() == 0;
  while (reader->Read(&response)) {
    if (args_.json) {
      PrintJson(response);
      continue;
    }
    if (response.has_token()) {
      if (bytes) {
        out_ << static_cast<char>(response.token().token());
      } else {
        out_ << response.token().token() << '\n';
      }
      out_.flush();
    } else if (response.has_done()) {
      done = response.done();
    }
  }
  const grpc::Status status = reader->Finish();
  if (bytes && !args_.json) out_ << '\n' << std::flush;
  if (!status.ok())
    return RpcFailed(status, "generate on deployment " + args.request.deployment_id());
  if (!args_.json) {
    err_ << "dattn: " << done.generated_tokens() << " tokens after a prompt of "
         << done.prompt_tokens() << " (finish: " << Printable(done.finish_reason())
         << "), first token after " << absl::StrFormat("%.3f", done.first_token_seconds()) << " s, "
         << absl::StrFormat("%.2f", done.seconds()) << " s in all\n";
  }
  return kExitOk;
}

int Commands::Score(const v1::ScoreRequest& request) {
  v1::ScoreResponse response;
  grpc::Status status = jobs_->Score(NewContext().get(), request, &response);
  if (!status.ok()) return RpcFailed(status, "score on deployment " + request.deployment_id());
  if (args_.json) {
    PrintJson(response);
    return kExitOk;
  }
  out_ << absl::StrFormat("loss %.4f nats per token over %d tokens (%.4f bits), %.3f s\n",
                          response.loss(), response.logprobs_size(),
                          response.loss() / std::log(2.0), response.seconds());
  for (int i = 0; i < response.logprobs_size(); ++i) {
    out_ << absl::StrFormat("%6d  %10.4f\n", i + 1, response.logprobs(i));
  }
  return kExitOk;
}

}  // namespace client
}  // namespace dattn
