#include "client/format.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "api/limits.h"
#include "api/tenant.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace client {
namespace {

// Aligned "key  value" lines, indented by `indent` spaces.
void PrintFields(const std::vector<std::pair<std::string, std::string>>& fields, int indent,
                 std::ostream& out) {
  size_t width = 0;
  for (const auto& field : fields) width = std::max(width, field.first.size());
  for (const auto& field : fields) {
    out << std::string(indent, ' ') << field.first
        << std::string(width - field.first.size() + 2, ' ') << Printable(field.second) << '\n';
  }
}

std::string Checksum(double value) { return absl::StrFormat("%.10g", value); }

std::string AttentionSummary(const v1::AttentionJobSpec& job) {
  const v1::AttentionSpec& a = job.attention();
  const v1::TensorShape& s = job.shape();
  std::string text = absl::StrCat("B=", s.batch(), " N=", s.seq_len(), " H=", s.num_heads(),
                                  " D=", s.head_dim(), " ", DTypeName(job.dtype()), ", segments ",
                                  absl::StrJoin(a.segment_lengths(), ","), " rates ",
                                  absl::StrJoin(a.dilation_rates(), ","), ", ", ModeName(a.mode()));
  if (a.head_offsets() != v1::HEAD_OFFSETS_UNSPECIFIED) {
    absl::StrAppend(&text, " (", HeadOffsetsName(a.head_offsets()), " offsets)");
  }
  if (a.causal()) absl::StrAppend(&text, ", causal");
  if (a.has_scale()) absl::StrAppend(&text, ", scale ", a.scale());
  return text;
}

std::string RunSummary(const v1::AttentionJobSpec& job) {
  const int ranks = std::max(job.num_ranks(), 1);
  std::string text =
      absl::StrCat(ranks, ranks == 1 ? " rank" : " ranks", ", ", PassName(job.pass()), ", ",
                   std::max(job.iterations(), 1), " iteration(s), seed ", job.seed(), ", device ",
                   DeviceName(job.device()));
  if (job.return_output()) absl::StrAppend(&text, ", returns output");
  return text;
}

std::string TrainingSummary(const v1::TrainingJobSpec& job) {
  const int data = std::max(job.data_parallel(), 1);
  const int sequence = std::max(job.sequence_parallel(), 1);
  return absl::StrCat(data, " data x ", sequence, " sequence parallel (", data * sequence,
                      data * sequence == 1 ? " rank" : " ranks", "), device ",
                      DeviceName(job.device()));
}

// A training spec's micro_batches (in its trainer config), for the Asked line.
std::string MicroBatches(const v1::TrainingJobSpec& job) {
  const nlohmann::json config = nlohmann::json::parse(job.config_json(), nullptr, false);
  if (!config.is_object() || !config.contains("micro_batches")) return "";
  return absl::StrCat(", micro_batches ", config["micro_batches"].dump());
}

// What a job was submitted as, when a recovery (the out-of-memory ladder, a ring shrink) runs it
// otherwise: the spec parts those change, as the lines above print the ones it runs with.
std::string AskedSummary(const v1::JobSpec& asked) {
  std::string text;
  if (asked.has_attention()) {
    text = absl::StrCat(DTypeName(asked.attention().dtype()), ", ", RunSummary(asked.attention()));
  } else if (asked.has_training()) {
    text = absl::StrCat(TrainingSummary(asked.training()), MicroBatches(asked.training()));
  } else if (asked.has_deployment()) {
    const int ranks = std::max(asked.deployment().ranks(), 1);
    text = absl::StrCat(ranks, ranks == 1 ? " rank" : " ranks");
  }
  return absl::StrCat(text, " (a recovery changed it: the events say which and why)");
}

std::string Loss(double loss) { return absl::StrFormat("%.4f", loss); }
std::string LearningRate(double lr) { return absl::StrFormat("%.3g", lr); }
std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", fraction * 100); }

std::string CheckpointText(const v1::TrainingCheckpoint& checkpoint) {
  return absl::StrCat("step ", checkpoint.step(), ": ", checkpoint.path(), " (",
                      FormatBytes(checkpoint.bytes()), ")");
}

std::string Age(const google::protobuf::Timestamp& ts, absl::Time now) {
  const absl::Time t = ToTime(ts);
  if (t == absl::InfinitePast()) return "-";
  return HumanDuration(now - t);
}

// A deployment's limits as it runs them: the coordinator's defaults (api/limits.h) for 0.
struct DeploymentLimits {
  int64_t max_context;
  int max_batch;
  int max_queued;
};
DeploymentLimits LimitsOf(const v1::DeploymentSpec& d) {
  return {d.max_context() > 0 ? d.max_context() : api::kDefaultMaxContext,
          d.max_batch() > 0 ? d.max_batch() : api::kDefaultMaxBatch,
          d.max_queued() > 0 ? d.max_queued() : api::kDefaultMaxQueued};
}

}  // namespace

std::string StateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_QUEUED:
      return "QUEUED";
    case v1::JOB_STATE_PLACED:
      return "PLACED";
    case v1::JOB_STATE_RUNNING:
      return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED:
      return "SUCCEEDED";
    case v1::JOB_STATE_FAILED:
      return "FAILED";
    case v1::JOB_STATE_CANCELLED:
      return "CANCELLED";
    default:
      return absl::StrCat("UNSPECIFIED(", static_cast<int>(state), ")");
  }
}

std::string WorkerStateName(v1::WorkerState state) {
  switch (state) {
    case v1::WORKER_STATE_READY:
      return "READY";
    case v1::WORKER_STATE_DRAINING:
      return "DRAINING";
    case v1::WORKER_STATE_DEAD:
      return "DEAD";
    default:
      return absl::StrCat("UNSPECIFIED(", static_cast<int>(state), ")");
  }
}

std::string DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
      return "fp16";
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_FP32:
      return "fp32";
    case v1::DTYPE_FP64:
      return "fp64";
    default:
      return "unspecified";
  }
}

std::string ModeName(v1::AttentionMode mode) {
  return mode == v1::ATTENTION_MODE_MIXTURE ? "mixture" : "grouped";
}

std::string HeadOffsetsName(v1::HeadOffsets offsets) {
  return offsets == v1::HEAD_OFFSETS_BLOCKED ? "blocked" : "modulo";
}

std::string PassName(v1::Pass pass) {
  return pass == v1::PASS_FORWARD_BACKWARD ? "fwd-bwd" : "fwd";
}

std::string DeviceName(v1::DevicePreference device) {
  switch (device) {
    case v1::DEVICE_PREFERENCE_CPU:
      return "cpu";
    case v1::DEVICE_PREFERENCE_GPU:
      return "gpu";
    default:
      return "any";
  }
}

std::string WorkKindName(const v1::JobSpec& spec) {
  switch (spec.work_case()) {
    case v1::JobSpec::kAttention:
      return "attention";
    case v1::JobSpec::kTraining:
      return "training";
    default:
      return "-";
  }
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

int64_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
    case v1::DTYPE_BF16:
      return 2;
    case v1::DTYPE_FP32:
      return 4;
    case v1::DTYPE_FP64:
      return 8;
    default:
      return 0;
  }
}

absl::Time ToTime(const google::protobuf::Timestamp& ts) {
  if (ts.seconds() == 0 && ts.nanos() == 0) return absl::InfinitePast();
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}

std::string FormatTimestamp(const google::protobuf::Timestamp& ts) {
  const absl::Time t = ToTime(ts);
  if (t == absl::InfinitePast()) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", t, absl::UTCTimeZone());
}

std::string HumanDuration(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  const int64_t ms = absl::ToInt64Milliseconds(d);
  if (ms < 1000) return absl::StrCat(ms, "ms");
  if (ms < 60 * 1000) return absl::StrFormat("%.1fs", ms / 1000.0);
  const int64_t s = ms / 1000;
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatSeconds(double seconds) {
  if (!std::isfinite(seconds) || seconds <= 0) return absl::StrFormat("%g s", seconds);
  if (seconds < 1e-3) return absl::StrFormat("%.1f us", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.2f ms", seconds * 1e3);
  return absl::StrFormat("%.3f s", seconds);
}

std::string FormatProgress(const v1::JobProgress& progress) {
  if (progress.steps_total() <= 0) return "-";
  return absl::StrCat(progress.steps_done(), "/", progress.steps_total());
}

std::string FormatCount(double value) {
  if (!std::isfinite(value)) return absl::StrFormat("%g", value);
  const double magnitude = std::fabs(value);
  if (magnitude < 1e3) return absl::StrFormat("%.0f", value);
  if (magnitude < 1e6) return absl::StrFormat("%.1fK", value / 1e3);
  if (magnitude < 1e9) return absl::StrFormat("%.2fM", value / 1e6);
  return absl::StrFormat("%.2fG", value / 1e9);
}

std::string FormatEvaluation(const v1::TrainingEvaluation& e) {
  std::vector<std::string> parts;
  if (e.has_validation()) {
    std::string validation = absl::StrCat("validation loss ", Loss(e.validation_loss()));
    if (e.bits_per_byte() > 0) {
      absl::StrAppend(&validation, absl::StrFormat(" (%.4f bits/byte)", e.bits_per_byte()));
    }
    parts.push_back(std::move(validation));
  }
  if (e.retrieval_examples() > 0) {
    parts.push_back(absl::StrCat("retrieval ", Percent(e.retrieval_accuracy()), " exact (",
                                 Percent(e.retrieval_token_accuracy()), " of answer tokens) of ",
                                 e.retrieval_examples(), " examples"));
  }
  if (parts.empty()) parts.push_back("nothing measured");
  return absl::StrCat("step ", e.step(), ": ", absl::StrJoin(parts, ", "));
}

std::string TrainingFigures(const v1::TrainingProgress& p) {
  return absl::StrCat("loss ", Loss(p.loss()), ", lr ", LearningRate(p.learning_rate()), ", ",
                      FormatCount(p.tokens_per_second()), " tokens/s");
}

std::string ProgressBar(int64_t done, int64_t total, int width) {
  int filled = 0;
  if (total > 0) {
    const int64_t clamped = std::min(std::max<int64_t>(done, 0), total);
    filled = static_cast<int>(clamped * width / total);
  }
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '-'), "]");
}

void PrintJob(const v1::Job& job, absl::Time now, bool unicode, std::ostream& out) {
  std::vector<std::pair<std::string, std::string>> fields;
  fields.emplace_back("Job", job.job_id());
  if (!job.spec().name().empty()) fields.emplace_back("Name", job.spec().name());
  fields.emplace_back("Tenant", api::TenantOrDefault(job.spec().tenant()));
  std::string state = StateName(job.state());
  if (job.state() == v1::JOB_STATE_QUEUED && job.queue_position() > 0) {
    absl::StrAppend(&state, " (position ", job.queue_position(), " in the queue)");
  }
  fields.emplace_back("State", state);
  if (!job.state_reason().empty()) fields.emplace_back("Reason", job.state_reason());
  fields.emplace_back("Priority", absl::StrCat(job.spec().priority()));
  if (job.attempt() > 0) fields.emplace_back("Attempt", absl::StrCat(job.attempt()));
  fields.emplace_back("Created", absl::StrCat(FormatTimestamp(job.create_time()), " (",
                                              Age(job.create_time(), now), " ago)"));
  if (job.has_start_time()) fields.emplace_back("Started", FormatTimestamp(job.start_time()));
  if (job.has_end_time()) fields.emplace_back("Ended", FormatTimestamp(job.end_time()));
  if (job.has_expire_time()) {
    // When the coordinator's retention deletes the job, its history and its output.
    fields.emplace_back("Expires", absl::StrCat(FormatTimestamp(job.expire_time()), " (in ",
                                                HumanDuration(ToTime(job.expire_time()) - now),
                                                ", with its output)"));
  }
  const absl::Time created = ToTime(job.create_time());
  if (created != absl::InfinitePast()) {
    const absl::Time until = job.has_end_time() ? ToTime(job.end_time()) : now;
    fields.emplace_back("Elapsed", HumanDuration(until - created));
  }
  if (job.spec().has_deployment()) {
    fields.emplace_back("Serving", DeploymentState(job));
  } else if (job.progress().steps_total() > 0) {
    fields.emplace_back(
        "Progress",
        absl::StrCat(FormatProgress(job.progress()), " steps (",
                     job.progress().steps_done() * 100 / job.progress().steps_total(), "%)"));
  }
  if (job.worker_ids_size() > 0)
    fields.emplace_back("Workers", absl::StrJoin(job.worker_ids(), ", "));
  if (!job.idempotency_key().empty()) fields.emplace_back("Idempotency key", job.idempotency_key());
  if (job.spec().has_attention()) {
    fields.emplace_back("Attention", AttentionSummary(job.spec().attention()));
    fields.emplace_back("Run", RunSummary(job.spec().attention()));
  }
  if (job.spec().has_training()) {
    const v1::TrainingJobSpec& training = job.spec().training();
    fields.emplace_back("Training",
                        absl::StrCat(TrainingSummary(training), MicroBatches(training)));
    fields.emplace_back(
        "Trainer config",
        absl::StrCat(FormatBytes(static_cast<int64_t>(training.config_json().size())),
                     " of JSON (`dattn status --json` shows it)"));
    fields.emplace_back("Checkpoints to", training.checkpoint_dir().empty()
                                              ? "- (no checkpoint_dir: none are written)"
                                              : training.checkpoint_dir());
    if (!training.init_from().empty()) fields.emplace_back("Init from", training.init_from());
  }
  if (job.spec().has_deployment()) {
    const DeploymentLimits limits = LimitsOf(job.spec().deployment());
    const v1::DeploymentStatus& s = job.progress().deployment();
    fields.emplace_back("Model", DeploymentModel(job));
    if (!s.model_source().empty()) fields.emplace_back("Serves", s.model_source());
    fields.emplace_back(
        "Limits", absl::StrCat("max_context ", limits.max_context, ", max_batch ", limits.max_batch,
                               ", max_queued ", limits.max_queued));
    if (job.spec().deployment().ranks() > 1) {
      fields.emplace_back(
          "Ring", absl::StrCat(job.spec().deployment().ranks(), " workers, each keeping 1/",
                               job.spec().deployment().ranks(), " of every sequence's cache"));
    }
    if (!s.device().empty()) fields.emplace_back("Device", s.device());
    if (s.ready()) {
      fields.emplace_back(
          "Loaded",
          absl::StrCat(FormatCount(static_cast<double>(s.parameters())), " parameters, vocabulary ",
                       s.vocab_size(), ", in ", FormatSeconds(s.load_seconds()),
                       "; a sequence's cache ", FormatBytes(s.cache_bytes_per_sequence())));
      fields.emplace_back("Requests", absl::StrCat(s.running(), " running, ", s.queued(),
                                                   " queued, ", s.requests_done(), " finished; ",
                                                   s.tokens_generated(), " tokens generated"));
    }
  }
  if (job.has_requested_spec()) fields.emplace_back("Asked", AskedSummary(job.requested_spec()));
  PrintFields(fields, 0, out);

  if (job.result().has_attention()) {
    out << "\n";
    PrintAttentionResult(job.result().attention(), job.spec().attention().pass(), out);
  }
  if (job.result().has_training()) {
    out << "\n";
    PrintTrainingResult(job.result().training(), job.job_id(), unicode, out);
  } else if (job.progress().has_training()) {
    out << "\n";
    PrintTrainingProgress(job.progress().training(), job.job_id(), out);
  }
  if (job.events_size() > 0) {
    out << "\nEvents\n";
    if (job.events_omitted() > 0) {
      out << "(" << job.events_omitted() << " earlier events not shown: --max-events N shows more, "
          << "`dattn watch " << job.job_id() << "` replays them all)\n";
    }
    EventsTable(job.events()).Print(out);
  }
}

void PrintAttentionResult(const v1::AttentionJobResult& r, v1::Pass pass, std::ostream& out) {
  const bool grads =
      pass == v1::PASS_FORWARD_BACKWARD || r.grad_sum() != 0 || r.grad_sum_squares() != 0;
  std::vector<std::pair<std::string, std::string>> fields;
  fields.emplace_back("Seconds/step", absl::StrCat(FormatSeconds(r.seconds_per_step()),
                                                   " (slowest rank's median step)"));
  fields.emplace_back("TFLOP/s", absl::StrFormat("%.3f", r.tflops()));
  if (r.flops_per_step() > 0)
    fields.emplace_back("FLOPs/step", absl::StrFormat("%.4g", r.flops_per_step()));
  fields.emplace_back("Output sum", Checksum(r.out_sum()));
  fields.emplace_back("Output sum of squares", Checksum(r.out_sum_squares()));
  if (grads) {
    fields.emplace_back("Gradient sum", Checksum(r.grad_sum()));
    fields.emplace_back("Gradient sum of squares", Checksum(r.grad_sum_squares()));
  }
  if (r.has_output_info()) {
    fields.emplace_back("Output tensor",
                        absl::StrCat(DTypeName(r.output_info().dtype()), " [",
                                     absl::StrJoin(r.output_info().shape(), ", "), "], ",
                                     FormatBytes(r.output_info().total_bytes()),
                                     " kept (save it with: dattn output JOB_ID -o FILE.npy)"));
  }
  std::vector<std::string> retried;
  for (const v1::RankResult& rank : r.ranks()) {
    if (rank.out_of_memory_retries() > 0) retried.push_back(absl::StrCat(rank.rank()));
  }
  if (!retried.empty()) {
    fields.emplace_back(
        "Out of memory",
        absl::StrCat(retried.size() == 1 ? "rank " : "ranks ", absl::StrJoin(retried, ", "),
                     " ran out at set-up and fit when retried after the worker released its "
                     "device's caches"));
  }
  out << "Result\n";
  PrintFields(fields, 2, out);
  if (r.ranks_size() == 0) return;
  out << "\n";
  std::vector<std::string> headers = {"RANK",    "WORKER",  "SEC/STEP",  "TOTAL",
                                      "TFLOP/S", "OUT SUM", "OUT SUM SQ"};
  if (grads) {
    headers.push_back("GRAD SUM");
    headers.push_back("GRAD SUM SQ");
  }
  headers.push_back("PEAK MEM");
  Table table(headers);
  for (const v1::RankResult& rank : r.ranks()) {
    std::vector<std::string> row = {absl::StrCat(rank.rank()),
                                    rank.worker_id(),
                                    FormatSeconds(rank.seconds_per_step()),
                                    FormatSeconds(rank.seconds_total()),
                                    absl::StrFormat("%.3f", rank.tflops()),
                                    Checksum(rank.out_sum()),
                                    Checksum(rank.out_sum_squares())};
    if (grads) {
      row.push_back(Checksum(rank.grad_sum()));
      row.push_back(Checksum(rank.grad_sum_squares()));
    }
    row.push_back(FormatBytes(rank.peak_memory_bytes()));
    table.AddRow(std::move(row));
  }
  table.Print(out);
}

void PrintTrainingResult(const v1::TrainingJobResult& r, const std::string& job_id, bool unicode,
                         std::ostream& out) {
  std::vector<std::pair<std::string, std::string>> fields;
  std::string steps = absl::StrCat(r.steps());
  if (r.resumed_from_step() > 0) {
    absl::StrAppend(&steps, " (the last attempt continued from step ", r.resumed_from_step(),
                    ", restored in ", absl::StrFormat("%.2f", r.restore_seconds()), " s)");
  }
  fields.emplace_back("Steps", steps);
  fields.emplace_back("Final loss", Loss(r.final_loss()));
  if (r.has_final_evaluation()) {
    fields.emplace_back("Final evaluation", FormatEvaluation(r.final_evaluation()));
  }
  std::string rate = absl::StrCat(FormatCount(r.tokens_per_second()), " tokens/s");
  std::vector<std::string> how;
  if (r.seconds() > 0)
    how.push_back(absl::StrCat("over ", HumanDuration(absl::Seconds(r.seconds()))));
  if (r.median_step_seconds() > 0) {
    how.push_back(absl::StrFormat("median step %.3f s", r.median_step_seconds()));
  }
  if (!how.empty()) absl::StrAppend(&rate, " (", absl::StrJoin(how, "; "), ")");
  fields.emplace_back("Throughput", rate);
  if (r.mfu() > 0) fields.emplace_back("MFU", Percent(r.mfu()));
  fields.emplace_back("Tokens seen", FormatCount(static_cast<double>(r.tokens_seen())));
  fields.emplace_back(
      "Parameters",
      absl::StrCat(r.parameters(), " (", FormatCount(static_cast<double>(r.parameters())), ")"));
  const int data = std::max(r.data_parallel(), 1);
  const int sequence = std::max(r.sequence_parallel(), 1);
  fields.emplace_back("Parallelism", absl::StrCat(data, " data x ", sequence, " sequence (",
                                                  data * sequence, " ranks)"));
  if (r.flops_per_step() > 0) {
    fields.emplace_back("FLOPs/step", absl::StrFormat("%.4g", r.flops_per_step()));
  }
  if (r.planned_rank_bytes() > 0) {
    std::string memory = absl::StrCat(FormatBytes(r.planned_rank_bytes()), " planned");
    if (r.measured_rank_peak_bytes() > 0) {
      absl::StrAppend(&memory, ", ", FormatBytes(r.measured_rank_peak_bytes()),
                      absl::StrFormat(" measured peak (%.2f of the plan)",
                                      static_cast<double>(r.measured_rank_peak_bytes()) /
                                          static_cast<double>(r.planned_rank_bytes())));
    }
    fields.emplace_back("Memory (rank 0)", memory);
  }
  if (r.skipped_steps() > 0) {
    fields.emplace_back("Skipped steps",
                        absl::StrCat(r.skipped_steps(), " (non-finite gradient norm: no update)"));
  }
  fields.emplace_back("Final checkpoint", r.final_checkpoint().empty() ? "- (no checkpoint_dir)"
                                                                       : r.final_checkpoint());
  if (r.checkpoints_size() > 0) {
    fields.emplace_back("Checkpoints", absl::StrCat(r.checkpoints_size(),
                                                    " complete (`dattn "
                                                    "checkpoints ",
                                                    job_id, "` lists them)"));
  }
  out << "Result\n";
  PrintFields(fields, 2, out);
  const std::vector<std::string> chart = LossChart(r.loss_curve(), 60, 8, unicode);
  if (chart.empty()) return;
  out << "\nLoss curve (training loss by step, " << r.loss_curve_size() << " points)\n";
  for (const std::string& line : chart) out << "  " << line << '\n';
}

void PrintTrainingProgress(const v1::TrainingProgress& p, const std::string& job_id,
                           std::ostream& out) {
  std::vector<std::pair<std::string, std::string>> fields;
  fields.emplace_back("Step", p.steps_total() > 0 ? absl::StrCat(p.step(), " of ", p.steps_total())
                                                  : absl::StrCat(p.step()));
  fields.emplace_back("Loss", Loss(p.loss()));
  fields.emplace_back("Learning rate", LearningRate(p.learning_rate()));
  fields.emplace_back("Gradient norm", absl::StrFormat("%.4g", p.grad_norm()));
  std::string rate = absl::StrCat(FormatCount(p.tokens_per_second()), " tokens/s");
  if (p.step_seconds() > 0) absl::StrAppend(&rate, " (", FormatSeconds(p.step_seconds()), "/step)");
  fields.emplace_back("Throughput", rate);
  if (p.mfu() > 0) fields.emplace_back("MFU", Percent(p.mfu()));
  fields.emplace_back("Tokens seen", FormatCount(static_cast<double>(p.tokens_seen())));
  if (p.skipped_steps() > 0) {
    fields.emplace_back("Skipped steps",
                        absl::StrCat(p.skipped_steps(), " (non-finite gradient norm: no update)"));
  }
  if (p.resumed_from_step() > 0) {
    fields.emplace_back(
        "Resumed",
        absl::StrCat("this attempt continued from the checkpoint of step ", p.resumed_from_step(),
                     ", restored in ", absl::StrFormat("%.2f", p.restore_seconds()), " s"));
  }
  if (p.has_last_evaluation()) {
    fields.emplace_back("Last evaluation", FormatEvaluation(p.last_evaluation()));
  }
  if (p.checkpoints_size() > 0) {
    fields.emplace_back("Newest checkpoint",
                        CheckpointText(p.checkpoints(p.checkpoints_size() - 1)));
    fields.emplace_back("Checkpoints", absl::StrCat(p.checkpoints_size(),
                                                    " complete (`dattn "
                                                    "checkpoints ",
                                                    job_id, "` lists them)"));
  }
  out << "Training\n";
  PrintFields(fields, 2, out);
}

std::vector<std::string> LossChart(const google::protobuf::RepeatedPtrField<v1::LossPoint>& points,
                                   int width, int height, bool unicode) {
  std::vector<const v1::LossPoint*> finite;
  for (const v1::LossPoint& point : points) {
    if (std::isfinite(point.loss())) finite.push_back(&point);
  }
  if (finite.empty() || width < 1 || height < 1) return {};
  const int64_t n = static_cast<int64_t>(finite.size());
  const int columns = static_cast<int>(std::min<int64_t>(width, n));
  // Each column: the mean of its share of the points, in order.
  std::vector<double> values(columns);
  for (int c = 0; c < columns; ++c) {
    const int64_t begin = c * n / columns;
    const int64_t end = (c + 1) * n / columns;
    double sum = 0;
    for (int64_t i = begin; i < end; ++i) sum += finite[i]->loss();
    values[c] = sum / static_cast<double>(end - begin);
  }
  const double lo = *std::min_element(values.begin(), values.end());
  const double hi = *std::max_element(values.begin(), values.end());
  // The height of each column: in eighths of a row (Unicode, at least one eighth) or as the row of
  // its mark from the bottom (ASCII). A flat curve sits in the middle.
  const int eighths = height * 8;
  std::vector<int> level(columns);
  for (int c = 0; c < columns; ++c) {
    const double t = hi > lo ? (values[c] - lo) / (hi - lo) : 0.5;
    level[c] = unicode ? 1 + static_cast<int>(std::lround(t * (eighths - 1)))
                       : static_cast<int>(std::lround(t * (height - 1)));
  }
  const std::string top = Loss(hi);
  const std::string bottom = Loss(lo);
  const size_t label_width = std::max(top.size(), bottom.size());
  static const char* const kBlocks[] = {" ",      "\u2581", "\u2582", "\u2583", "\u2584",
                                        "\u2585", "\u2586", "\u2587", "\u2588"};
  std::vector<std::string> lines;
  for (int row = 0; row < height; ++row) {  // From the top.
    std::string label = row == 0 ? top : row == height - 1 ? bottom : "";
    std::string line = std::string(label_width - label.size(), ' ') + label + " ";
    const bool labelled = !label.empty();
    absl::StrAppend(&line, unicode ? (labelled ? "\u2524" : "\u2502") : "|");
    for (int c = 0; c < columns; ++c) {
      if (unicode) {
        const int fill = std::clamp(level[c] - (height - 1 - row) * 8, 0, 8);
        absl::StrAppend(&line, kBlocks[fill]);
      } else {
        line += level[c] == height - 1 - row ? '*' : ' ';
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    lines.push_back(std::move(line));
  }
  std::string axis = std::string(label_width + 1, ' ');
  if (unicode) {
    absl::StrAppend(&axis, "\u2514");
    for (int c = 0; c < columns; ++c) absl::StrAppend(&axis, "\u2500");
  } else {
    absl::StrAppend(&axis, "+", std::string(columns, '-'));
  }
  lines.push_back(std::move(axis));
  const std::string first = absl::StrCat(finite.front()->step());
  const std::string last = absl::StrCat(finite.back()->step());
  std::string steps = std::string(label_width + 2, ' ');
  if (first.size() + 1 + last.size() <= static_cast<size_t>(columns)) {
    absl::StrAppend(&steps, first, std::string(columns - first.size() - last.size(), ' '), last);
  } else {
    absl::StrAppend(&steps, "steps ", first, "..", last);
  }
  lines.push_back(std::move(steps));
  return lines;
}

Table CheckpointsTable(
    const google::protobuf::RepeatedPtrField<v1::TrainingCheckpoint>& checkpoints) {
  Table table({"STEP", "PATH", "SIZE", "WRITE TIME", "COMMITTED"});
  for (const v1::TrainingCheckpoint& c : checkpoints) {
    table.AddRow({absl::StrCat(c.step()), c.path(), FormatBytes(c.bytes()),
                  FormatSeconds(c.seconds()), FormatTimestamp(c.time())});
  }
  return table;
}

std::string DeploymentState(const v1::Job& job) {
  if (job.state() != v1::JOB_STATE_RUNNING) return StateName(job.state());
  return job.progress().deployment().ready() ? "serving" : "loading";
}

std::string DeploymentModel(const v1::Job& job) {
  const v1::DeploymentSpec& d = job.spec().deployment();
  if (!d.model().empty()) return absl::StrCat(d.model(), ":", d.model_version());
  if (d.training_job_id().empty()) return d.checkpoint();
  const int64_t reported = job.progress().deployment().checkpoint_step();
  const int64_t step = reported > 0 ? reported : d.training_job_step();
  return absl::StrCat(d.training_job_id(), step > 0 ? absl::StrCat(" step ", step) : "",
                      d.training_job_step() == 0 ? " (final)" : "");
}

Table DeploymentsTable(const std::vector<v1::Job>& deployments, absl::Time now) {
  Table table({"DEPLOYMENT", "NAME", "STATE", "MODEL", "MAX CONTEXT", "BATCH", "WORKERS", "DEVICE",
               "REQUESTS", "TOKENS", "AGE"});
  for (const v1::Job& job : deployments) {
    const DeploymentLimits limits = LimitsOf(job.spec().deployment());
    const v1::DeploymentStatus& s = job.progress().deployment();
    table.AddRow({job.job_id(), job.spec().name().empty() ? "-" : job.spec().name(),
                  DeploymentState(job), DeploymentModel(job), absl::StrCat(limits.max_context),
                  absl::StrCat(limits.max_batch),
                  absl::StrCat(std::max(1, job.spec().deployment().ranks())),
                  s.device().empty() ? "-" : s.device(), absl::StrCat(s.requests_done()),
                  absl::StrCat(s.tokens_generated()), Age(job.create_time(), now)});
  }
  return table;
}

Table TrainedModelsTable(const std::vector<v1::Job>& training_jobs) {
  Table table({"TRAINING JOB", "NAME", "STATE", "STEP", "SIZE", "COMMITTED", "DEPLOY WITH"});
  for (const v1::Job& job : training_jobs) {
    // As dattn checkpoints: the result's list once the job has one, else what exists now.
    const bool from_result = job.result().has_training();
    const auto& checkpoints = from_result ? job.result().training().checkpoints()
                                          : job.progress().training().checkpoints();
    const std::string& final_checkpoint = job.result().training().final_checkpoint();
    for (int i = checkpoints.size() - 1; i >= 0; --i) {
      const v1::TrainingCheckpoint& c = checkpoints[i];
      const bool is_final = job.state() == v1::JOB_STATE_SUCCEEDED && !final_checkpoint.empty() &&
                            c.path() == final_checkpoint;
      table.AddRow({job.job_id(), job.spec().name().empty() ? "-" : job.spec().name(),
                    StateName(job.state()), absl::StrCat(c.step(), is_final ? " (final)" : ""),
                    FormatBytes(c.bytes()), FormatTimestamp(c.time()),
                    absl::StrCat("dattn deploy --from-job ", job.job_id(),
                                 is_final ? "" : absl::StrCat(" --step ", c.step()))});
    }
  }
  return table;
}

Table RegisteredModelsTable(const std::vector<v1::RegisteredModel>& models) {
  Table table({"MODEL", "PARAMETERS", "WEIGHTS", "SIZE", "IMPORTED", "SOURCE", "DESCRIPTION"});
  for (const v1::RegisteredModel& m : models) {
    table.AddRow({absl::StrCat(m.name(), ":", m.version()), FormatCount(m.parameters()),
                  m.weights(), FormatBytes(m.bytes()),
                  absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                                   absl::FromUnixMicros(m.create_time_us()), absl::UTCTimeZone()),
                  m.source(), m.description().empty() ? "-" : m.description()});
  }
  return table;
}

Table JobsTable(const std::vector<v1::Job>& jobs, absl::Time now) {
  Table table({"JOB ID", "KIND", "NAME", "TENANT", "STATE", "PRI", "PROGRESS", "AGE"});
  for (const v1::Job& job : jobs) {
    table.AddRow({job.job_id(), WorkKindName(job.spec()),
                  job.spec().name().empty() ? "-" : job.spec().name(),
                  api::TenantOrDefault(job.spec().tenant()), StateName(job.state()),
                  absl::StrCat(job.spec().priority()),
                  job.spec().has_deployment()
                      ? (job.state() == v1::JOB_STATE_RUNNING ? DeploymentState(job) : "-")
                      : FormatProgress(job.progress()),
                  Age(job.create_time(), now)});
  }
  return table;
}

Table WorkersTable(const std::vector<v1::Worker>& workers, absl::Time now) {
  Table table({"WORKER ID", "NAME", "STATE", "DEVICE", "DTYPES", "SLOTS", "MEMORY FREE/TOTAL",
               "HEARTBEAT", "VERSION"});
  for (const v1::Worker& w : workers) {
    const v1::WorkerCapabilities& caps = w.capabilities();
    std::string device =
        caps.is_gpu() ? absl::StrCat("gpu:", caps.device_index()) : std::string("cpu");
    if (!caps.is_gpu() && caps.num_threads() > 0)
      absl::StrAppend(&device, " x", caps.num_threads());
    if (!caps.device_name().empty()) absl::StrAppend(&device, " ", caps.device_name());
    std::vector<std::string> dtypes;
    for (int d : caps.dtypes()) dtypes.push_back(DTypeName(static_cast<v1::DType>(d)));
    const std::string heartbeat =
        w.has_last_heartbeat() ? absl::StrCat(Age(w.last_heartbeat(), now), " ago") : "-";
    // A live worker whose device failed takes no ranks whatever its state says.
    const std::string state = !w.device_error().empty() && w.state() != v1::WORKER_STATE_DEAD
                                  ? "DEVICE FAILED"
                                  : WorkerStateName(w.state());
    table.AddRow({w.worker_id(), w.name(), state, device,
                  dtypes.empty() ? "-" : absl::StrJoin(dtypes, ","),
                  absl::StrCat(w.task_ids_size(), "/", caps.max_ranks()),
                  absl::StrCat(FormatBytes(w.free_memory_bytes()), " / ",
                               FormatBytes(caps.total_memory_bytes())),
                  heartbeat, w.version().empty() ? "-" : w.version()});
  }
  return table;
}

Table EventsTable(const google::protobuf::RepeatedPtrField<v1::JobEvent>& events) {
  Table table({"SEQ", "TIME", "STATE", "EVENT", "PROGRESS", "MESSAGE"});
  for (const v1::JobEvent& e : events) {
    table.AddRow({absl::StrCat(e.seq()), FormatTimestamp(e.time()), StateName(e.state()), e.kind(),
                  e.has_progress() ? FormatProgress(e.progress()) : "", e.message()});
  }
  return table;
}

std::string EventLine(const v1::JobEvent& e) {
  std::string line = absl::StrCat(FormatTimestamp(e.time()), "  #", e.seq(), "  ",
                                  StateName(e.state()), "  ", Printable(e.kind()));
  if (e.has_progress() && e.progress().steps_total() > 0) {
    absl::StrAppend(&line, "  ", FormatProgress(e.progress()), " steps");
  }
  if (!e.message().empty()) {
    absl::StrAppend(&line, "  ", Printable(e.message()));
  } else if (e.kind() == "progress" && e.progress().has_training()) {
    absl::StrAppend(&line, "  ", TrainingFigures(e.progress().training()));
  }
  return line;
}

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  // Serialising a valid message cannot fail; an empty object is the fallback should it ever.
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return "{}";
  while (!json.empty() && json.back() == '\n') json.pop_back();
  return json;
}

}  // namespace client
}  // namespace dattn
