// The `dattn` subcommands once their flags are parsed: each makes its RPCs to the coordinator,
// prints the outcome and returns an exit code (client/exit_codes.h). client/cli.cc parses the
// command line and calls these.
//
// Thread-safety: a Commands object is used by one thread (it writes to its streams).
#ifndef DATTN_CLIENT_COMMANDS_H_
#define DATTN_CLIENT_COMMANDS_H_

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/cli.h"
#include "client/connection.h"
#include "dattn/v1/admin.grpc.pb.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace dattn {
namespace client {

struct GlobalArgs {
  Coordinator coordinator;
  // The channel to the coordinator (TLS and token as connection.h resolves them); null: a
  // plaintext channel to coordinator.address.
  std::shared_ptr<grpc::Channel> channel;
  absl::Duration timeout = absl::Seconds(10);  // Deadline of each unary RPC.
  bool json = false;
  // Charts in ASCII even on a UTF-8 terminal (--ascii).
  bool ascii = false;
};

struct SubmitArgs {
  v1::SubmitJobRequest request;  // Complete: spec and idempotency key.
  bool key_generated = false;    // The key is the random default (tell the user how to retry).
  bool watch = false;
  bool wait = false;
  std::string output_file;  // Save the kept output here as .npy ("" = don't).
  absl::Duration reconnect_for = absl::Seconds(60);
};

// `dattn attend`: JobService.Attend on .npy files.
struct AttendArgs {
  // The attention spec, ring size, device, name and priority; dtype, shape and backward come from
  // the files.
  v1::AttendStart start;
  std::vector<std::string> inputs;   // q, k, v and, for the backward, dout (.npy).
  std::vector<std::string> outputs;  // Where to save out, dq, dk, dv (.npy); "" = not saved.
  absl::Duration call_timeout = absl::ZeroDuration();  // The whole call; zero: none.
  // The tensors go through a shared-memory region of this host (AttendStart.shared_memory)
  // instead of the stream: the coordinator and the ring's workers must run on this host.
  bool shared_memory = false;
};

// `dattn deploy`: a DeploymentSpec job.
struct DeployArgs {
  v1::SubmitJobRequest request;  // Spec (deployment) and idempotency key.
  // Wait until the deployment serves (or ends) for at most this long; zero: return at once.
  absl::Duration wait = absl::ZeroDuration();
};

// `dattn generate`: a Generate call, its tokens streamed to stdout.
struct GenerateArgs {
  v1::GenerateRequest request;
  bool print_tokens = false;                       // Token ids, one a line, instead of bytes.
  absl::Duration deadline = absl::ZeroDuration();  // The whole call; zero: none.
};

struct ListArgs {
  std::vector<v1::JobState> states;
  std::string tenant;
  int limit = 50;
  bool all = false;
};

class Commands {
 public:
  // `env` must outlive this object.
  Commands(GlobalArgs args, std::ostream& out, std::ostream& err, const CliEnvironment& env);

  int Submit(const SubmitArgs& args);
  // max_events: with events, how many of the latest to ask for (0: the coordinator's default).
  int Status(const std::string& job_id, bool events, int max_events,
             const std::string& output_file);
  int List(const ListArgs& args);
  // `dattn models`: the caller's registered models (ListModels), its deployments that are queued
  // or running, and the complete checkpoints of its newest `limit` training jobs (two ListJobs
  // walks). With --json, one ListJobsResponse: the deployments, then the training jobs (the
  // registry's JSON is `dattn models list --json`).
  int Models(int limit);
  // `dattn models list|import|delete`: the model registry (JobService.ListModels, ImportModel,
  // DeleteModel). --json prints the response.
  int ListModels(const std::string& name);
  int ImportModel(const v1::ImportModelRequest& request);
  int DeleteModel(const v1::DeleteModelRequest& request);
  int Watch(const std::string& job_id, absl::Duration reconnect_for);
  int Cancel(const std::string& job_id, const std::string& reason);
  int Workers(bool include_dead);
  // With `wait` > 0: then waits, up to `wait`, until the worker runs no task (kExitWaitRanOut
  // when some still run then): a Kubernetes preStop hook lets a worker's ranks finish this way.
  int Drain(const std::string& worker, absl::Duration wait = absl::ZeroDuration());
  int Undrain(const std::string& worker);
  int Health(const std::string& service);
  // Saves a succeeded job's kept output to `path` as .npy (ReadOutput, streamed chunk by chunk).
  int Output(const std::string& job_id, const std::string& path);
  // Deletes a finished job, its history and its output.
  int Delete(const std::string& job_id);
  // Streams q, k, v (and dout) from .npy files through JobService.Attend and saves the outputs as
  // they arrive (client/attend.cc). kExitUsage for files that are not 4-D arrays of one dtype and
  // shape; the call's own errors as for any RPC.
  int Attend(const AttendArgs& args);
  // Lists a training job's complete checkpoints: its result's when it SUCCEEDED, else those its
  // progress lists (the ones that exist now). kExitUsage for a job that is not a training job.
  int Checkpoints(const std::string& job_id);
  // Submits a deployment (client/serve.cc) and, with a wait, follows it until it serves: exit 0
  // once ready, the job's exit code if it ends first, kExitWaitRanOut when the wait runs out.
  int Deploy(const DeployArgs& args);
  // Streams a Generate call's tokens to stdout as they come (bytes for a byte-level model unless
  // print_tokens), then a summary line on stderr.
  int Generate(const GenerateArgs& args);
  // Prints a Score call's loss and per-token log-probabilities.
  int Score(const v1::ScoreRequest& request);

 private:
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  // Prints the error for a failed RPC `what` and returns its exit code.
  int RpcFailed(const grpc::Status& status, const std::string& what);
  // Follows a job to its end and prints its outcome; the exit code reflects how it ended.
  int FollowJob(const std::string& job_id, bool quiet, absl::Duration reconnect_for,
                const std::string& output_file);
  // Streams a succeeded job's kept output into `path` as .npy and reports its shape.
  // Writes the job's kept output to `path` (.npy); `saved` (optional) gets the tensor's header.
  int SaveOutput(const v1::Job& job, const std::string& path, v1::TensorHeader* saved = nullptr);
  void PrintJson(const google::protobuf::Message& message);
  // Whether charts may use Unicode: `out` is a terminal whose locale is UTF-8, and not --ascii.
  bool Unicode() const;

  const GlobalArgs args_;
  std::ostream& out_;
  std::ostream& err_;
  const CliEnvironment& env_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

// The exit code for a job that ended in `state`: 0 SUCCEEDED, 1 FAILED, 6 CANCELLED, 7 otherwise.
int ExitCodeForJobState(v1::JobState state);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_COMMANDS_H_
