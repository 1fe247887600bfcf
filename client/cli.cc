#include "client/cli.h"

#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api/tenant.h"
#include "client/commands.h"
#include "client/exit_codes.h"
#include "client/job_file.h"
#include "client/parse.h"
#include "client/printable.h"
#include "client/submit_options.h"
#include "client/suggest.h"
#include "security/tokens.h"

namespace dattn {
namespace client {
namespace {

constexpr char kVersion[] = "dattn 0.1.0 (API dattn.v1)";

std::string Footer() {
  return absl::StrCat("\nThe coordinator's address comes from --coordinator, else $",
                      kCoordinatorEnv, ", else ", kDefaultCoordinator,
                      ".\n--coordinator, --timeout and --json may also follow the subcommand.\n\n",
                      ExitCodeHelp(), "\nJob files, examples and details: docs/CLI.md");
}

int UsageError(std::ostream& err, const std::string& message, const std::string& command) {
  err << "dattn: error: " << Printable(message) << '\n'
      << "Run 'dattn " << (command.empty() ? "" : command + " ") << "--help' for usage.\n";
  return kExitUsage;
}

absl::Duration Seconds(double seconds) { return absl::Milliseconds(seconds * 1000.0); }

// "--watch", "-f", ... of `app`'s own options (positional arguments have none).
std::vector<std::string> FlagNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    for (const std::string& name : option->get_snames()) names.push_back("-" + name);
  }
  return names;
}

// CLI11's message for a parse error, made specific when a command or flag was mistyped: "unknown
// command 'stauts' (did you mean 'status'?); the commands are ..." or "unknown flag --wach for
// 'dattn submit' (did you mean --watch?)". `command` is the subcommand recognised, or null.
std::string DescribeParseError(const CLI::App& app, const CLI::App* command,
                               const std::string& message) {
  const std::vector<std::string> extras = app.remaining();
  if (command == nullptr) {
    // No command was recognised: the first word that is not a flag was meant to be one.
    std::vector<std::string> commands;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      commands.push_back(sub->get_name());
    }
    for (const std::string& word : extras) {
      if (word.empty() || word[0] == '-') continue;
      return absl::StrCat("unknown command '", word, "'", DidYouMean(Suggest(word, commands)),
                          "; the commands are ", absl::StrJoin(commands, ", "));
    }
  }
  for (const std::string& extra : extras) {
    if (extra.size() < 2 || extra[0] != '-') continue;
    const std::string flag = extra.substr(0, extra.find('='));
    std::vector<std::string> flags = FlagNames(app);
    if (command != nullptr) {
      const std::vector<std::string> own = FlagNames(*command);
      flags.insert(flags.begin(), own.begin(), own.end());
    }
    return absl::StrCat(
        "unknown flag ", flag,
        command != nullptr ? absl::StrCat(" for 'dattn ", command->get_name(), "'") : std::string(),
        DidYouMean(Suggest(flag, flags), ""));
  }
  return message;
}

// The flags of `dattn submit` that mirror SubmitFields(), with storage CLI11 binds to. Deques keep
// element addresses stable as they grow. A boolean setting has two flags, --x and --no-x (the
// latter turns off what a job file turned on).
struct SubmitFieldFlags {
  std::deque<std::string> text;
  std::deque<bool> on;
  std::deque<bool> off;
  std::vector<CLI::Option*> options;      // Parallel to SubmitFields().
  std::vector<CLI::Option*> off_options;  // Parallel to SubmitFields(); nullptr unless is_bool.
};

void AddSubmitFieldFlags(CLI::App* submit, SubmitFieldFlags* flags) {
  for (const SubmitField& field : SubmitFields()) {
    const std::string group =
        field.sections == kAttentionSection  ? "Attention job settings (override --file)"
        : field.sections == kTrainingSection ? "Training job settings (override --file)"
                                             : "Job settings (override --file)";
    std::string names = field.short_flag.empty() ? field.flag : field.short_flag + "," + field.flag;
    flags->text.emplace_back();
    flags->on.push_back(false);
    flags->off.push_back(false);
    CLI::Option* option;
    CLI::Option* off_option = nullptr;
    if (field.is_bool) {
      option = submit->add_flag(names, flags->on.back(), field.help);
      const std::string off_flag = "--no-" + field.flag.substr(2);
      off_option = submit->add_flag(off_flag, flags->off.back(),
                                    "Turn " + field.flag + " off (overrides the job file)");
      off_option->group(group);
    } else {
      option = submit->add_option(names, flags->text.back(), field.help);
      option->type_name(field.value_name);
    }
    option->group(group);
    flags->options.push_back(option);
    flags->off_options.push_back(off_option);
  }
}

// The SubmitOptions given by flags; INVALID_ARGUMENT naming the flag and value otherwise.
absl::StatusOr<SubmitOptions> SubmitOptionsFromFlags(const SubmitFieldFlags& flags) {
  SubmitOptions options;
  const std::vector<SubmitField>& fields = SubmitFields();
  for (size_t i = 0; i < fields.size(); ++i) {
    std::string text;
    const bool off = flags.off_options[i] != nullptr && flags.off_options[i]->count() > 0;
    if (off && flags.options[i]->count() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(fields[i].flag, " and --no-",
                                                     fields[i].flag.substr(2),
                                                     " contradict each other: give one"));
    }
    if (flags.options[i]->count() > 0) {
      text = fields[i].is_bool ? "true" : flags.text[i];
    } else if (off) {
      text = "false";
    } else {
      continue;
    }
    absl::Status status = fields[i].set(text, &options);
    if (!status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(fields[i].flag, ": ", status.message()));
    }
  }
  return options;
}

}  // namespace

CliEnvironment ProcessEnvironment(const std::ostream& out) {
  CliEnvironment env;
  env.getenv = [](const char* name) -> const char* { return std::getenv(name); };
  env.out_is_tty = &out == &std::cout && isatty(STDOUT_FILENO) == 1;
  return env;
}

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  return RunCli(argc, argv, out, err, ProcessEnvironment(out));
}

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
           const CliEnvironment& env) {
  CLI::App app(
      "dattn: submit dilated-attention and LongNet training jobs to a dattn coordinator and follow "
      "them.",
      "dattn");
  app.footer(Footer());
  app.require_subcommand(1);
  app.fallthrough();
  app.set_version_flag("--version", kVersion);

  std::string coordinator_flag;
  double timeout_seconds = 10;
  bool json = false;
  app.add_option("--coordinator", coordinator_flag,
                 "Coordinator address HOST:PORT (default: $DATTN_COORDINATOR, else 127.0.0.1:7070)")
      ->type_name("ADDR");
  app.add_option("--timeout", timeout_seconds, "Deadline of each request, in seconds (default 10)")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", json,
               "Print machine-readable JSON (protobuf JSON of the API messages) instead of tables");
  std::string tls_ca_flag;
  std::string token_file_flag;
  bool insecure_flag = false;
  app.add_option("--tls-ca", tls_ca_flag,
                 "Cluster CA (PEM) to check the coordinator's TLS certificate (default: "
                 "$DATTN_TLS_CA); without one the connection is plaintext")
      ->type_name("PATH");
  app.add_option("--token-file", token_file_flag,
                 "File whose first line is your bearer token (default: the token in $DATTN_TOKEN)")
      ->type_name("PATH");
  app.add_flag("--insecure", insecure_flag,
               "Plaintext to a coordinator started --insecure, even with a token");
  bool ascii_flag = false;
  app.add_flag("--ascii", ascii_flag,
               "Draw charts (a training job's loss curve) in ASCII; the default unless stdout is a "
               "UTF-8 terminal");

  // submit
  CLI::App* submit = app.add_subcommand(
      "submit", "Submit an attention job, or a training job (--train-config, or a training: file)");
  SubmitFieldFlags submit_fields;
  std::string job_file;
  bool watch_flag = false;
  bool wait_flag = false;
  std::string output_file;
  double reconnect_seconds = 60;
  submit->add_option("-f,--file", job_file, "Job file (YAML, or JSON if it ends in .json)")
      ->type_name("PATH");
  AddSubmitFieldFlags(submit, &submit_fields);
  submit->add_flag("--watch", watch_flag,
                   "Follow the job with a live display; the exit code reflects how it ends");
  submit->add_flag("--wait", wait_flag,
                   "Wait quietly for the job to end, then print it; the exit code reflects how it "
                   "ends");
  submit
      ->add_option("--output-file", output_file,
                   "Keep the output and save it to PATH as a .npy file (implies --return-output "
                   "and --wait)")
      ->type_name("PATH");
  submit
      ->add_option("--reconnect-for", reconnect_seconds,
                   "With --watch/--wait: keep reconnecting a broken event stream this long "
                   "(default 60)")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber);

  // status
  CLI::App* status = app.add_subcommand("status", "Show a job: state, spec, progress, result");
  std::string status_job;
  bool status_events = false;
  std::string status_output;
  status->add_option("JOB_ID", status_job, "The job")->required();
  int status_max_events = 0;
  status->add_flag("--events", status_events, "Include the job's event history (the latest 1000)");
  status
      ->add_option("--max-events", status_max_events,
                   "Show the latest N events (1 to 10000; implies --events, which shows 1000)")
      ->type_name("N")
      ->check(CLI::Range(1, 10000));
  status
      ->add_option("--output-file", status_output,
                   "Save the job's kept output to PATH as a .npy file")
      ->type_name("PATH");

  // list
  CLI::App* list = app.add_subcommand("list", "List jobs, newest first");
  std::string list_states;
  ListArgs list_args;
  list->add_option("--state", list_states,
                   "Only jobs in these states: comma-separated queued, placed, running, "
                   "succeeded, failed, cancelled, or the groups active, ended")
      ->type_name("STATES");
  list->add_option("--tenant", list_args.tenant, "Only this tenant's jobs")->type_name("NAME");
  list->add_option("--limit", list_args.limit, "Show at most N jobs (default 50)")
      ->type_name("N")
      ->check(CLI::PositiveNumber);
  list->add_flag("--all", list_args.all, "Page through every matching job (ignores --limit)");

  // watch
  CLI::App* watch = app.add_subcommand(
      "watch",
      "Follow a job until it ends: live progress on a terminal, one line per event otherwise");
  std::string watch_job;
  double watch_reconnect_seconds = 60;
  watch->add_option("JOB_ID", watch_job, "The job")->required();
  watch
      ->add_option("--reconnect-for", watch_reconnect_seconds,
                   "Keep reconnecting a broken event stream this long (default 60)")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber);

  // cancel
  CLI::App* cancel = app.add_subcommand("cancel", "Cancel a job");
  std::string cancel_job;
  std::string cancel_reason;
  cancel->add_option("JOB_ID", cancel_job, "The job")->required();
  cancel->add_option("--reason", cancel_reason, "Recorded in the job's history (at most 256 chars)")
      ->type_name("TEXT");

  // workers
  CLI::App* workers = app.add_subcommand("workers", "List the workers registered");
  bool workers_all = false;
  workers->add_flag("--all", workers_all, "Include dead workers");

  // drain
  CLI::App* drain =
      app.add_subcommand("drain", "Stop placing work on a worker; its running tasks finish");
  std::string drain_worker;
  drain->add_option("WORKER", drain_worker, "Worker id or name")->required();
  double drain_wait_s = 0;
  drain
      ->add_option("--wait", drain_wait_s,
                   "Then wait up to SECONDS until the worker runs no task (exit 8 if some still "
                   "run); 0: do not wait")
      ->check(CLI::Range(0.0, 86400.0));

  // undrain
  CLI::App* undrain =
      app.add_subcommand("undrain", "Place work on a drained worker again (undoes drain)");
  std::string undrain_worker;
  undrain->add_option("WORKER", undrain_worker, "Worker id or name")->required();

  // token
  CLI::App* token =
      app.add_subcommand("token", "Make a client token (for the coordinator's admin)");
  token->require_subcommand(1);
  CLI::App* token_new = token->add_subcommand(
      "new", "Print a new random token and its line for the coordinator's --token-file");
  std::string token_tenant;
  std::string token_role = "user";
  std::string token_name;
  token_new->add_option("--tenant", token_tenant, "Tenant of the token's jobs")->required();
  token_new->add_option("--role", token_role, "user (own tenant) or admin (every tenant)")
      ->check(CLI::IsMember({"user", "admin"}));
  token_new->add_option("--name", token_name, "Label in the audit log (default: the hash prefix)");

  // health
  CLI::App* health = app.add_subcommand("health", "Ask the coordinator whether it is serving");
  std::string health_service;
  health
      ->add_option("--service", health_service,
                   "grpc.health.v1 service name (default \"\": the whole server)")
      ->type_name("NAME");

  // output
  CLI::App* output = app.add_subcommand(
      "output", "Save a succeeded job's kept output (--return-output) as a .npy file");
  std::string output_job;
  std::string output_path;
  output->add_option("JOB_ID", output_job, "The job")->required();
  output->add_option("-o,--output-file", output_path, "Where to write it (NumPy .npy)")
      ->type_name("PATH")
      ->required();

  // attend
  CLI::App* attend = app.add_subcommand(
      "attend",
      "Dilated attention on your own tensors: q, k, v (.npy) in, out back (with --dout also dq, "
      "dk, dv), streamed to the ranks that own them (docs/ATTEND.md)");
  std::vector<std::string> attend_inputs;
  std::string attend_dout, attend_segments, attend_rates, attend_mode = "grouped";
  std::string attend_head_offsets, attend_device = "any", attend_name;
  std::vector<std::string> attend_outputs(4);
  bool attend_causal = false, attend_shared_memory = false;
  double attend_scale = 0, attend_timeout = 0;
  int attend_ranks = 0, attend_priority = 0;
  attend
      ->add_option("QKV", attend_inputs,
                   "q.npy k.npy v.npy: (B, N, H, D) arrays of one dtype (float64, float32 or "
                   "float16)")
      ->required()
      ->expected(3);
  attend->add_option("--dout", attend_dout, "dout.npy: also the backward (dq, dk, dv)")
      ->type_name("PATH");
  attend->add_option("-o,--output-file", attend_outputs[0], "Save out here (.npy)")
      ->type_name("PATH")
      ->required();
  attend->add_option("--dq", attend_outputs[1], "With --dout: save dq here")->type_name("PATH");
  attend->add_option("--dk", attend_outputs[2], "With --dout: save dk here")->type_name("PATH");
  attend->add_option("--dv", attend_outputs[3], "With --dout: save dv here")->type_name("PATH");
  attend->add_option("--segments", attend_segments, "Segment lengths, e.g. 2048,4096")
      ->type_name("LIST")
      ->required();
  attend->add_option("--rates", attend_rates, "Dilation rates, e.g. 1,2")
      ->type_name("LIST")
      ->required();
  attend->add_flag("--causal", attend_causal, "Causal within each dilated segment");
  attend->add_option("--mode", attend_mode, "grouped (default) or mixture")->type_name("MODE");
  attend->add_option("--head-offsets", attend_head_offsets, "modulo or blocked (mixture only)")
      ->type_name("RULE");
  attend->add_option("--scale", attend_scale, "Softmax scale (default 1/sqrt(D))")
      ->type_name("X")
      ->check(CLI::PositiveNumber);
  attend->add_option("--ranks", attend_ranks, "Ring size P (dividing N); 0: the fewest that fit")
      ->type_name("P")
      ->check(CLI::NonNegativeNumber);
  attend->add_option("--device", attend_device, "any (default), cpu or gpu")->type_name("KIND");
  attend->add_option("--name", attend_name, "Job name")->type_name("NAME");
  attend->add_option("--priority", attend_priority, "-100 .. 100")->type_name("N");
  attend->add_option("--call-timeout", attend_timeout, "Deadline of the whole call, in seconds")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber);
  attend->add_flag("--shared-memory", attend_shared_memory,
                   "Pass the tensors through shared memory of this host instead of the stream "
                   "(the coordinator, started with --attend-shared-memory, and its workers run "
                   "here)");

  // checkpoints
  CLI::App* checkpoints =
      app.add_subcommand("checkpoints", "List a training job's complete checkpoints");
  std::string checkpoints_job;
  checkpoints->add_option("JOB_ID", checkpoints_job, "The training job")->required();

  // deploy
  CLI::App* deploy = app.add_subcommand(
      "deploy",
      "Serve a model (registered, a checkpoint or an imported folder) on a worker: Generate "
      "and Score "
      "(docs/SERVING.md)");
  std::string deploy_checkpoint, deploy_from_job, deploy_name, deploy_model;
  int64_t deploy_max_context = 0, deploy_step = 0;
  int deploy_max_batch = 0, deploy_max_queued = 0, deploy_priority = 0, deploy_ranks = 0;
  std::string deploy_device = "any";
  double deploy_wait = 0;
  deploy
      ->add_option("--checkpoint", deploy_checkpoint,
                   "A checkpoint step folder, or an imported model's folder (config.json and "
                   "safetensors weights), as the coordinator and the workers see it")
      ->type_name("DIR");
  deploy
      ->add_option("--model", deploy_model,
                   "Or a registered model (dattn models import): NAME (its newest version) or "
                   "NAME:VERSION")
      ->type_name("NAME[:VERSION]");
  deploy
      ->add_option("--from-job", deploy_from_job,
                   "Or a training job that succeeded: its final checkpoint")
      ->type_name("JOB_ID");
  deploy
      ->add_option("--step", deploy_step,
                   "With --from-job: that step's saved checkpoint instead (the job in any state)")
      ->type_name("N")
      ->check(CLI::PositiveNumber);
  deploy
      ->add_option("--max-context", deploy_max_context,
                   "Longest prompt + generated tokens a request may reach (default 4096)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  deploy->add_option("--max-batch", deploy_max_batch, "Sequences decoded at once (default 8)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  deploy->add_option("--max-queued", deploy_max_queued, "Requests waiting at most (default 256)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  deploy
      ->add_option("--ranks", deploy_ranks,
                   "Workers it runs on as one ring, each keeping 1/N of every sequence's cache "
                   "(default 1; must divide --max-context)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  deploy
      ->add_option("--device", deploy_device,
                   "any (default: GPU workers when they have room), cpu (fp32) or gpu (bf16; "
                   "with --ranks a ring of GPUs)")
      ->type_name("KIND");
  std::optional<bool> deploy_shrink_ring, deploy_single_device;
  deploy
      ->add_option("--shrink-ring", deploy_shrink_ring,
                   "A worker of its ring lost for good: may it serve again on fewer ranks of "
                   "the workers left? (default true)")
      ->type_name("BOOL");
  deploy
      ->add_option("--single-device", deploy_single_device,
                   "The same, on one worker when no smaller ring holds it (default true)")
      ->type_name("BOOL");
  deploy->add_option("--name", deploy_name, "Job name")->type_name("NAME");
  deploy->add_option("--priority", deploy_priority, "-100 .. 100 (placement)")->type_name("N");
  deploy->add_option("--wait", deploy_wait, "Wait up to this long until it serves")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber);

  // generate
  CLI::App* generate = app.add_subcommand(
      "generate", "Continue a prompt on a deployment, printing tokens as they come");
  std::string generate_id, generate_prompt, generate_prompt_tokens;
  std::vector<std::string> generate_stops, generate_stop_tokens;
  GenerateArgs generate_args;
  double generate_temperature = 0, generate_top_p = 1, generate_deadline = 0;
  int64_t generate_top_k = 0, generate_max_tokens = 0;
  uint64_t generate_seed = 0;
  int generate_priority = 0;
  generate->add_option("DEPLOYMENT", generate_id, "The deployment's job id")->required();
  generate->add_option("--prompt", generate_prompt, "The prompt as text (byte-level models)")
      ->type_name("TEXT");
  generate->add_option("--prompt-tokens", generate_prompt_tokens, "Or as token ids: 1,2,3")
      ->type_name("IDS");
  generate->add_option("--max-tokens", generate_max_tokens, "Tokens to generate (default 16)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--temperature", generate_temperature, "0 (default): greedy")
      ->type_name("T");
  generate->add_option("--top-k", generate_top_k, "Keep the k most probable (0: all)")
      ->type_name("K");
  generate->add_option("--top-p", generate_top_p, "Keep the most probable up to p (default 1)")
      ->type_name("P");
  generate->add_option("--seed", generate_seed, "Sampling seed")->type_name("N");
  generate->add_option("--stop", generate_stops, "Stop before this text (repeatable)")
      ->type_name("TEXT");
  generate->add_option("--stop-tokens", generate_stop_tokens, "Stop before these ids (repeatable)")
      ->type_name("IDS");
  generate->add_option("--priority", generate_priority, "-100 .. 100 in the deployment's queue")
      ->type_name("N");
  generate->add_flag("--print-tokens", generate_args.print_tokens, "Print token ids, one a line");
  generate->add_option("--deadline", generate_deadline, "Deadline of the whole call (default none)")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber);

  // score
  CLI::App* score = app.add_subcommand(
      "score", "Log-probability of each token given those before it, on a deployment");
  std::string score_id, score_text, score_tokens;
  score->add_option("DEPLOYMENT", score_id, "The deployment's job id")->required();
  score->add_option("--text", score_text, "Text (byte-level models)")->type_name("TEXT");
  score->add_option("--tokens", score_tokens, "Or token ids: 1,2,3")->type_name("IDS");

  // delete
  CLI::App* del =
      app.add_subcommand("delete", "Delete a finished job, its history and its kept output");
  std::string delete_job;
  del->add_option("JOB_ID", delete_job, "The job")->required();

  // models
  CLI::App* models = app.add_subcommand(
      "models",
      "The models: deployments queued or serving, and training jobs' complete checkpoints");
  int models_limit = 20;
  models->add_option("--limit", models_limit, "Training jobs to look at, newest first (default 20)")
      ->type_name("N")
      ->check(CLI::PositiveNumber);
  models->require_subcommand(0, 1);
  CLI::App* models_list =
      models->add_subcommand("list", "The registered models' versions (all, or one name's)");
  std::string models_list_name;
  models_list->add_option("NAME", models_list_name, "Only this model's versions");
  CLI::App* models_import = models->add_subcommand(
      "import",
      "Copy a model into the registry as the next version of NAME: a folder the coordinator "
      "reads, or a training job's checkpoint");
  std::string import_name, import_dir, import_job, import_description;
  int64_t import_step = 0;
  models_import->add_option("NAME", import_name, "The model's name ([A-Za-z0-9._-], 1 to 64)")
      ->required();
  models_import
      ->add_option("DIR", import_dir,
                   "A checkpoint step folder or an imported model's folder (config.json and "
                   "safetensors weights), as the coordinator sees it")
      ->type_name("DIR");
  models_import
      ->add_option("--from-job", import_job,
                   "Or a training job that succeeded: its final checkpoint")
      ->type_name("JOB_ID");
  models_import
      ->add_option("--step", import_step, "With --from-job: that step's saved checkpoint instead")
      ->type_name("N")
      ->check(CLI::PositiveNumber);
  models_import->add_option("--description", import_description, "Kept with the version")
      ->type_name("TEXT");
  CLI::App* models_delete = models->add_subcommand(
      "delete", "Remove a version of a registered model (NAME:VERSION), or every version (NAME)");
  std::string delete_model;
  models_delete->add_option("MODEL", delete_model, "NAME or NAME:VERSION")->required();

  for (CLI::App* sub : {submit, status, list, watch, cancel, output, attend, checkpoints, del,
                        workers, drain, undrain, health, deploy, generate, score, models}) {
    sub->footer("Exit codes: see 'dattn --help'. Details: docs/CLI.md");
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help, --version.
      app.exit(e, out, err);
      return kExitOk;
    }
    std::string command;
    const CLI::App* parsed = nullptr;
    for (CLI::App* sub : app.get_subcommands()) {
      command = sub->get_name();
      parsed = sub;
    }
    return UsageError(err, DescribeParseError(app, parsed, e.what()), command);
  }

  if (token_new->parsed()) {
    if (!dattn::api::IsTenantName(token_tenant)) {
      return UsageError(err,
                        absl::StrCat("--tenant \"", token_tenant,
                                     "\" must be 1..64 characters of [A-Za-z0-9._-]"),
                        "token new");
    }
    if (!token_name.empty() && token_name.find_first_of(" \t#") != std::string::npos) {
      return UsageError(err, "--name must not contain spaces, tabs or '#'", "token new");
    }
    absl::StatusOr<std::string> secret = dattn::security::NewToken();
    if (!secret.ok()) {
      err << "dattn: error: " << secret.status().message() << '\n';
      return kExitInternal;
    }
    out << "token (give it to its holder, who passes it with --token-file or DATTN_TOKEN; it is "
           "shown only now):\n"
        << *secret << "\n\nline for the coordinator's --token-file:\n"
        << dattn::security::HashToken(*secret) << ' ' << token_tenant << ' ' << token_role
        << (token_name.empty() ? "" : " " + token_name) << '\n';
    return kExitOk;
  }

  GlobalArgs global;
  global.coordinator =
      ResolveCoordinator(coordinator_flag, env.getenv ? env.getenv(kCoordinatorEnv) : nullptr);
  global.timeout = Seconds(timeout_seconds);
  {
    auto getenv = [&env](const char* name) { return env.getenv ? env.getenv(name) : nullptr; };
    absl::StatusOr<ClientSecurity> security = ResolveSecurity(
        tls_ca_flag, getenv(kTlsCaEnv), token_file_flag, getenv(kTokenEnv), insecure_flag);
    if (!security.ok()) return UsageError(err, std::string(security.status().message()), "");
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        MakeChannel(global.coordinator.address, *security);
    if (!channel.ok()) return UsageError(err, std::string(channel.status().message()), "");
    global.channel = *std::move(channel);
  }
  global.json = json;
  global.ascii = ascii_flag;

  try {
    if (submit->parsed()) {
      SubmitOptions options;
      if (!job_file.empty()) {
        absl::StatusOr<SubmitOptions> from_file = ReadJobFile(job_file);
        if (!from_file.ok()) {
          return UsageError(err, std::string(from_file.status().message()), "submit");
        }
        options = *from_file;
      }
      absl::StatusOr<SubmitOptions> from_flags = SubmitOptionsFromFlags(submit_fields);
      if (!from_flags.ok()) {
        return UsageError(err, std::string(from_flags.status().message()), "submit");
      }
      MergeSubmitOptions(*from_flags, &options);
      absl::StatusOr<JobKind> kind = JobKindOf(options);
      if (!kind.ok()) return UsageError(err, std::string(kind.status().message()), "submit");
      if (!output_file.empty()) {
        if (*kind == JobKind::kTraining) {
          return UsageError(
              err,
              absl::StrCat("--output-file saves an attention job's output tensor, "
                           "but this is a training job (",
                           options.kind.has_value() ? options.kind_source : "its settings say so",
                           "): its model is its checkpoints (dattn checkpoints "
                           "JOB_ID)"),
              "submit");
        }
        options.return_output = true;
      }
      absl::StatusOr<v1::JobSpec> spec = BuildJobSpec(options);
      if (!spec.ok()) return UsageError(err, std::string(spec.status().message()), "submit");

      SubmitArgs args;
      *args.request.mutable_spec() = *std::move(spec);
      args.key_generated = !options.idempotency_key.has_value();
      args.request.set_idempotency_key(args.key_generated ? RandomIdempotencyKey()
                                                          : *options.idempotency_key);
      args.watch = watch_flag;
      args.wait = wait_flag || !output_file.empty();
      args.output_file = output_file;
      args.reconnect_for = Seconds(reconnect_seconds);
      return Commands(global, out, err, env).Submit(args);
    }
    if (status->parsed()) {
      return Commands(global, out, err, env)
          .Status(status_job, status_events || status_max_events > 0, status_max_events,
                  status_output);
    }
    if (models_list->parsed()) return Commands(global, out, err, env).ListModels(models_list_name);
    if (models_import->parsed()) {
      if (import_dir.empty() == import_job.empty()) {
        return UsageError(err, "give DIR or --from-job JOB_ID (one of them)", "models import");
      }
      if (import_step != 0 && import_job.empty()) {
        return UsageError(err, "--step: only with --from-job (a step of that job's checkpoints)",
                          "models import");
      }
      v1::ImportModelRequest request;
      request.set_name(import_name);
      request.set_path(import_dir);
      request.set_training_job_id(import_job);
      request.set_training_job_step(import_step);
      request.set_description(import_description);
      return Commands(global, out, err, env).ImportModel(request);
    }
    if (models_delete->parsed()) {
      absl::StatusOr<ModelRef> ref = ParseModelRef(delete_model);
      if (!ref.ok()) {
        return UsageError(err, std::string(ref.status().message()), "models delete");
      }
      v1::DeleteModelRequest request;
      request.set_name(ref->name);
      request.set_version(ref->version);
      return Commands(global, out, err, env).DeleteModel(request);
    }
    if (models->parsed()) return Commands(global, out, err, env).Models(models_limit);
    if (list->parsed()) {
      if (!list_states.empty()) {
        absl::StatusOr<std::vector<v1::JobState>> states = ParseJobStates(list_states);
        if (!states.ok()) {
          return UsageError(err, absl::StrCat("--state: ", states.status().message()), "list");
        }
        list_args.states = *states;
      }
      return Commands(global, out, err, env).List(list_args);
    }
    if (watch->parsed()) {
      return Commands(global, out, err, env).Watch(watch_job, Seconds(watch_reconnect_seconds));
    }
    if (cancel->parsed()) {
      return Commands(global, out, err, env).Cancel(cancel_job, cancel_reason);
    }
    if (output->parsed()) return Commands(global, out, err, env).Output(output_job, output_path);
    if (attend->parsed()) {
      AttendArgs args;
      auto usage = [&](const std::string& flag, const absl::Status& s) {
        return UsageError(err, absl::StrCat(flag, ": ", s.message()), "attend");
      };
      absl::StatusOr<std::vector<int64_t>> segments = ParseIntList(attend_segments, 1, INT64_MAX);
      if (!segments.ok()) return usage("--segments", segments.status());
      absl::StatusOr<std::vector<int64_t>> rates = ParseIntList(attend_rates, 1, INT64_MAX);
      if (!rates.ok()) return usage("--rates", rates.status());
      if (segments->size() != rates->size()) {
        return UsageError(err,
                          absl::StrCat("--segments has ", segments->size(), " value(s), --rates ",
                                       rates->size(), "; give one rate per segment length"),
                          "attend");
      }
      v1::AttentionSpec* spec = args.start.mutable_attention();
      for (int64_t w : *segments) spec->add_segment_lengths(w);
      for (int64_t r : *rates) spec->add_dilation_rates(r);
      spec->set_causal(attend_causal);
      absl::StatusOr<v1::AttentionMode> mode = ParseMode(attend_mode);
      if (!mode.ok()) return usage("--mode", mode.status());
      spec->set_mode(*mode);
      if (!attend_head_offsets.empty()) {
        absl::StatusOr<v1::HeadOffsets> offsets = ParseHeadOffsets(attend_head_offsets);
        if (!offsets.ok()) return usage("--head-offsets", offsets.status());
        spec->set_head_offsets(*offsets);
      }
      if (attend_scale > 0) spec->set_scale(attend_scale);
      absl::StatusOr<v1::DevicePreference> device = ParseDevice(attend_device);
      if (!device.ok()) return usage("--device", device.status());
      args.start.set_device(*device);
      args.start.set_num_ranks(attend_ranks);
      args.start.set_name(attend_name);
      args.start.set_priority(attend_priority);
      args.inputs = attend_inputs;
      if (!attend_dout.empty()) args.inputs.push_back(attend_dout);
      if (attend_dout.empty() &&
          !(attend_outputs[1].empty() && attend_outputs[2].empty() && attend_outputs[3].empty())) {
        return UsageError(err, "--dq, --dk and --dv need --dout (the backward)", "attend");
      }
      args.outputs = attend_outputs;
      if (attend_timeout > 0) args.call_timeout = Seconds(attend_timeout);
      args.shared_memory = attend_shared_memory;
      return Commands(global, out, err, env).Attend(args);
    }
    if (del->parsed()) return Commands(global, out, err, env).Delete(delete_job);
    if (deploy->parsed()) {
      if (!deploy_checkpoint.empty() + !deploy_from_job.empty() + !deploy_model.empty() != 1) {
        return UsageError(
            err, "give --model NAME[:VERSION], --checkpoint DIR or --from-job JOB_ID (one of them)",
            "deploy");
      }
      if (deploy_step != 0 && deploy_from_job.empty()) {
        return UsageError(err, "--step: only with --from-job (a step of that job's checkpoints)",
                          "deploy");
      }
      DeployArgs args;
      v1::JobSpec* spec = args.request.mutable_spec();
      spec->set_name(deploy_name);
      spec->set_priority(deploy_priority);
      v1::DeploymentSpec* d = spec->mutable_deployment();
      if (!deploy_model.empty()) {
        absl::StatusOr<ModelRef> ref = ParseModelRef(deploy_model);
        if (!ref.ok()) {
          return UsageError(err, absl::StrCat("--model: ", ref.status().message()), "deploy");
        }
        d->set_model(ref->name);
        d->set_model_version(ref->version);
      }
      d->set_checkpoint(deploy_checkpoint);
      d->set_training_job_id(deploy_from_job);
      d->set_training_job_step(deploy_step);
      d->set_max_context(deploy_max_context);
      d->set_max_batch(deploy_max_batch);
      d->set_max_queued(deploy_max_queued);
      d->set_ranks(deploy_ranks);
      absl::StatusOr<v1::DevicePreference> device = ParseDevice(deploy_device);
      if (!device.ok()) {
        return UsageError(err, absl::StrCat("--device: ", device.status().message()), "deploy");
      }
      d->set_device(*device);
      if (deploy_shrink_ring) spec->mutable_recovery()->set_shrink_ring(*deploy_shrink_ring);
      if (deploy_single_device) {
        spec->mutable_recovery()->set_single_device(*deploy_single_device);
      }
      args.request.set_idempotency_key(RandomIdempotencyKey());
      args.wait = Seconds(deploy_wait);
      return Commands(global, out, err, env).Deploy(args);
    }
    if (generate->parsed() || score->parsed()) {
      const char* command = generate->parsed() ? "generate" : "score";
      auto ids = [&](const std::string& flag, const std::string& text,
                     google::protobuf::RepeatedField<int32_t>* to) -> std::optional<int> {
        absl::StatusOr<std::vector<int64_t>> list = ParseIntList(text, 0, INT32_MAX);
        if (!list.ok()) {
          return UsageError(err, absl::StrCat(flag, ": ", list.status().message()), command);
        }
        for (int64_t t : *list) to->Add(static_cast<int32_t>(t));
        return std::nullopt;
      };
      if (score->parsed()) {
        if (score_text.empty() == score_tokens.empty()) {
          return UsageError(err, "give --text TEXT or --tokens IDS (one of them)", command);
        }
        v1::ScoreRequest request;
        request.set_deployment_id(score_id);
        request.set_text(score_text);
        if (!score_tokens.empty()) {
          if (auto code = ids("--tokens", score_tokens, request.mutable_tokens())) return *code;
        }
        return Commands(global, out, err, env).Score(request);
      }
      if (generate_prompt.empty() == generate_prompt_tokens.empty()) {
        return UsageError(err, "give --prompt TEXT or --prompt-tokens IDS (one of them)", command);
      }
      v1::GenerateRequest& r = generate_args.request;
      r.set_deployment_id(generate_id);
      r.set_prompt_text(generate_prompt);
      if (!generate_prompt_tokens.empty()) {
        if (auto code = ids("--prompt-tokens", generate_prompt_tokens, r.mutable_prompt())) {
          return *code;
        }
      }
      r.set_max_tokens(generate_max_tokens);
      r.mutable_sampling()->set_temperature(generate_temperature);
      r.mutable_sampling()->set_top_k(generate_top_k);
      r.mutable_sampling()->set_top_p(generate_top_p);
      r.mutable_sampling()->set_seed(generate_seed);
      r.set_priority(generate_priority);
      for (const std::string& stop : generate_stops) r.add_stop_text(stop);
      for (const std::string& stop : generate_stop_tokens) {
        if (auto code = ids("--stop-tokens", stop, r.add_stop()->mutable_tokens())) return *code;
      }
      generate_args.deadline = Seconds(generate_deadline);
      return Commands(global, out, err, env).Generate(generate_args);
    }
    if (checkpoints->parsed()) {
      return Commands(global, out, err, env).Checkpoints(checkpoints_job);
    }
    if (workers->parsed()) return Commands(global, out, err, env).Workers(workers_all);
    if (drain->parsed()) {
      return Commands(global, out, err, env).Drain(drain_worker, absl::Seconds(drain_wait_s));
    }
    if (undrain->parsed()) return Commands(global, out, err, env).Undrain(undrain_worker);
    if (health->parsed()) return Commands(global, out, err, env).Health(health_service);
  } catch (const std::exception& e) {
    // Nothing below is expected to throw; an allocation failure or a library bug ends here rather
    // than in std::terminate.
    err << "dattn: internal error: " << Printable(e.what()) << '\n';
    return kExitInternal;
  }
  return UsageError(err, "no command given", "");
}

}  // namespace client
}  // namespace dattn
