#include "api/training_job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "api/limits.h"
#include "api/quote.h"
#include "engine/rank_memory_plan.h"
#include "model/config.h"
#include "model/cuda/training_plan.h"
#include "model/language_model.h"
#include "model/longnet_params.h"
#include "model/training_memory.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace api {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// A folder the workers read or write: absolute, printable, no "." or ".." component (a job names
// its own place, never a way out of it), at most kMaxTrainingPathLength characters.
absl::Status CheckFolder(const std::string& value, const std::string& path) {
  if (value.size() > kMaxTrainingPathLength) {
    return Invalid(
        path, absl::StrCat("at most ", kMaxTrainingPathLength, " characters, got ", value.size()));
  }
  if (value.empty() || value[0] != '/') {
    return Invalid(path, absl::StrCat("must be an absolute path, got ", Quote(value)));
  }
  for (char c : value) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return Invalid(path, absl::StrCat("control characters are not allowed, got ", Quote(value)));
    }
  }
  for (absl::string_view part : absl::StrSplit(value, '/')) {
    if (part == "." || part == "..") {
      return Invalid(
          path, absl::StrCat("\".\" and \"..\" components are not allowed, got ", Quote(value)));
    }
  }
  return absl::OkStatus();
}

// The trainer config without its "device" (the placement decides it; the coordinator's process
// knows no training device but "cpu"), and the device it named, if any.
struct ParsedConfig {
  model::TrainerConfig config;
  std::string named_device;  // "", "cpu" or "cuda".
};

absl::StatusOr<ParsedConfig> ParseConfig(const std::string& text, const std::string& path) {
  if (text.empty()) {
    return Invalid(path,
                   "required: the trainer's configuration as a JSON object (docs/TRAINING.md)");
  }
  if (text.size() > kMaxTrainingConfigBytes) {
    return Invalid(path,
                   absl::StrCat("at most ", kMaxTrainingConfigBytes, " bytes, got ", text.size()));
  }
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Invalid(path, "not valid JSON");
  if (!json.is_object()) return Invalid(path, "must be a JSON object");
  ParsedConfig parsed;
  if (auto it = json.find("device"); it != json.end()) {
    if (!it->is_string() || (*it != "cpu" && *it != "cuda")) {
      return Invalid(path, absl::StrCat("trainer config field \"device\": ", Quote(it->dump()),
                                        " must be \"cpu\" or \"cuda\""));
    }
    parsed.named_device = it->get<std::string>();
    json.erase(it);
  }
  absl::StatusOr<model::TrainerConfig> config = model::ParseTrainerConfigJson(json.dump());
  if (!config.ok()) return Invalid(path, std::string(config.status().message()));
  parsed.config = *std::move(config);
  return parsed;
}

// One device kind for the job with the memory of its largest rank there.
absl::StatusOr<DeviceVariant> PlanVariant(const TrainingJobInfo& info, bool gpu,
                                          const std::string& path) {
  const model::TrainerConfig& c = info.config;
  const int s = info.sequence_parallel;
  DeviceVariant variant;
  variant.gpu = gpu;
  variant.ring_backend = gpu ? "nccl" : "gloo";
  if (!gpu) {
    // Workers differ in thread count; a config that leaves it to them is planned for the most a
    // CPU worker runs (the per-thread part is small: buffers and stacks).
    model::TrainerConfig planned = c;
    if (planned.threads == 0) planned.threads = kCpuPlanThreads;
    absl::StatusOr<model::CpuTrainingRankMemory> plan =
        model::PlanCpuTrainingRankMemory(planned, info.data_parallel, s);
    if (!plan.ok()) return Invalid(path, std::string(plan.status().message()));
    variant.memory_per_rank_bytes = plan->total_bytes;
    variant.memory_plan = plan->breakdown;
    return variant;
  }
  if (absl::Status cuda = model::cuda::CheckCudaConfig(c.model); !cuda.ok()) {
    return Invalid(path + ".config_json",
                   absl::StrCat("trainer config field \"model\" does not run on GPU workers: ",
                                cuda.message()));
  }
  model::cuda::TrainingMemoryOptions options;
  options.arena.checkpoint_activations = c.checkpoint_activations;
  options.arena.recompute_norms = false;
  absl::StatusOr<model::cuda::TrainingMemoryPlan> plan = model::cuda::PlanTrainingRankMemory(
      c.model, info.micro_rows, c.seq_len, info.data_parallel, s, options);
  if (!plan.ok()) return Invalid(path, std::string(plan.status().message()));
  variant.memory_per_rank_bytes = plan->total_bytes;
  variant.memory_plan = plan->DebugString();
  return variant;
}

// TrainingJobSpec.checkpoint_dir without trailing slashes ("/" stays "/").
std::string TrimmedCheckpointRoot(std::string root) {
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return root;
}

}  // namespace

absl::StatusOr<TrainingJobInfo> AnalyzeTrainingJob(const v1::TrainingJobSpec& job,
                                                   const std::string& path) {
  TrainingJobInfo info;
  absl::StatusOr<ParsedConfig> parsed = ParseConfig(job.config_json(), path + ".config_json");
  if (!parsed.ok()) return parsed.status();
  info.config = parsed->config;
  const model::TrainerConfig& c = info.config;

  const std::pair<const char*, int> degrees[] = {{"data_parallel", job.data_parallel()},
                                                 {"sequence_parallel", job.sequence_parallel()}};
  for (const auto& [name, value] : degrees) {
    if (value < 0 || value > kMaxRingRanks) {
      return Invalid(absl::StrCat(path, ".", name),
                     absl::StrCat("must be in 1 .. ", kMaxRingRanks, " (0 means 1), got ", value));
    }
  }
  if (job.auto_data_parallel() && job.data_parallel() != 0) {
    return Invalid(path + ".data_parallel",
                   absl::StrCat("must be 0 with auto_data_parallel (the coordinator picks D), got ",
                                job.data_parallel()));
  }
  // With auto_data_parallel the spec is checked at D = 1 (every D the coordinator may pick passes
  // the checks that depend on D: it divides batch_size / micro_batches).
  info.data_parallel = std::max(1, job.data_parallel());
  info.sequence_parallel = std::max(1, job.sequence_parallel());
  info.world = info.data_parallel * info.sequence_parallel;
  if (info.world > kMaxRingRanks) {
    return Invalid(path + ".data_parallel",
                   absl::StrCat("data_parallel x sequence_parallel = ", info.data_parallel, " x ",
                                info.sequence_parallel, " = ", info.world, " ranks, more than ",
                                kMaxRingRanks));
  }
  // Planning a ring's exchange buffers grows as S^2 H (api/limits.h, kMaxRingPlanWork): the
  // coordinator plans at every submit and restart.
  const int64_t plan_work =
      int64_t{info.sequence_parallel} * info.sequence_parallel * c.model.num_heads;
  if (plan_work > kMaxRingPlanWork) {
    return Invalid(path + ".sequence_parallel",
                   absl::StrCat(info.sequence_parallel, " ranks x ", info.sequence_parallel,
                                " x num_heads ", c.model.num_heads, " = ", plan_work,
                                " is over the planning bound of ", kMaxRingPlanWork));
  }
  if (c.seq_len % info.sequence_parallel != 0) {
    return Invalid(path + ".sequence_parallel",
                   absl::StrCat("must divide the config's seq_len = ", c.seq_len, ", got ",
                                info.sequence_parallel));
  }
  const int64_t group_rows = c.batch_size / c.micro_batches;
  if (group_rows % info.data_parallel != 0) {
    return Invalid(path + ".data_parallel",
                   absl::StrCat("must divide batch_size / micro_batches = ", c.batch_size, " / ",
                                c.micro_batches, " = ", group_rows, ", got ", info.data_parallel));
  }
  info.micro_rows = group_rows / info.data_parallel;
  // What the degrees add beyond the two rules above (the retrieval task's sequence).
  if (absl::Status s = model::CheckParallelDegrees(c, info.data_parallel, info.sequence_parallel);
      !s.ok()) {
    return Invalid(path + ".config_json", std::string(s.message()));
  }
  if (c.checkpoint.keep_last > kMaxKeptCheckpoints) {
    return Invalid(
        path + ".config_json",
        absl::StrCat("trainer config field \"checkpoint.keep_last\": ", c.checkpoint.keep_last,
                     " must be at most ", kMaxKeptCheckpoints, " in a training job"));
  }
  if (!job.checkpoint_dir().empty()) {
    if (absl::Status s = CheckFolder(job.checkpoint_dir(), path + ".checkpoint_dir"); !s.ok()) {
      return s;
    }
    info.checkpoint_root = TrimmedCheckpointRoot(job.checkpoint_dir());
  }
  if (!job.init_from().empty()) {
    if (absl::Status s = CheckFolder(job.init_from(), path + ".init_from"); !s.ok()) return s;
    info.init_from = job.init_from();
  }

  absl::StatusOr<model::ParamLayout> layout = model::BuildParamLayout(c.model);
  if (!layout.ok()) return Invalid(path + ".config_json", std::string(layout.status().message()));
  info.parameters = layout->total();
  const model::ModelFlops flops =
      model::CountFlops(c.model, c.batch_size, c.seq_len, c.checkpoint_activations);
  info.flops_per_step = flops.forward + flops.backward;
  info.tokens_per_step = static_cast<double>(c.batch_size) * static_cast<double>(c.seq_len);

  // Devices, in preference order.
  std::vector<bool> kinds;
  const std::string& named = parsed->named_device;
  switch (job.device()) {
    case v1::DEVICE_PREFERENCE_CPU:
      if (named == "cuda") {
        return Invalid(path + ".device",
                       "DEVICE_PREFERENCE_CPU, but the config's \"device\" is \"cuda\"");
      }
      kinds = {false};
      break;
    case v1::DEVICE_PREFERENCE_GPU:
      if (named == "cpu") {
        return Invalid(path + ".device",
                       "DEVICE_PREFERENCE_GPU, but the config's \"device\" is \"cpu\"");
      }
      kinds = {true};
      break;
    case v1::DEVICE_PREFERENCE_ANY:
      if (named == "cpu") {
        kinds = {false};
      } else if (named == "cuda") {
        kinds = {true};
      } else {
        kinds = {true, false};
      }
      break;
    default:
      return Invalid(path + ".device", absl::StrCat("unknown device preference ", job.device()));
  }
  absl::Status first_error;
  for (bool gpu : kinds) {
    absl::StatusOr<DeviceVariant> variant = PlanVariant(info, gpu, path);
    if (variant.ok()) {
      info.variants.push_back(*std::move(variant));
    } else if (kinds.size() == 1) {
      return variant.status();
    } else if (first_error.ok()) {
      first_error = variant.status();
    }
  }
  if (info.variants.empty()) return first_error;
  return info;
}

std::string TrainingCheckpointDir(const TrainingJobInfo& info, const std::string& job_id) {
  if (info.checkpoint_root.empty()) return "";
  if (info.checkpoint_root == "/") return absl::StrCat("/", job_id);
  return absl::StrCat(info.checkpoint_root, "/", job_id);
}

std::string TrainingCheckpointDir(const v1::TrainingJobSpec& job, const std::string& job_id) {
  TrainingJobInfo info;
  info.checkpoint_root = TrimmedCheckpointRoot(job.checkpoint_dir());
  return TrainingCheckpointDir(info, job_id);
}

v1::TrainingRankPlan PlanTrainingRank(const TrainingJobInfo& info, const DeviceVariant& variant,
                                      int rank, const std::string& job_id) {
  v1::TrainingRankPlan plan;
  plan.set_rank(rank);
  plan.set_data_parallel(info.data_parallel);
  plan.set_sequence_parallel(info.sequence_parallel);
  model::TrainerConfig config = info.config;
  config.device = variant.gpu ? "cuda" : "cpu";
  plan.set_trainer_config_json(model::TrainerConfigToJson(config));
  plan.set_checkpoint_dir(TrainingCheckpointDir(info, job_id));
  plan.set_init_from(info.init_from);
  plan.set_memory_bytes(variant.memory_per_rank_bytes);
  plan.set_memory_plan(variant.memory_plan);
  plan.set_flops_per_step(info.flops_per_step / info.world);
  return plan;
}

std::string SequenceGroupPrefix(const std::string& ring_id, int group) {
  return absl::StrCat(ring_id, "/sp/", group);
}

}  // namespace api
}  // namespace dattn
