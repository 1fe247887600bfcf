#include "model/training_memory.h"

#include <algorithm>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/memory_plan.h"
#include "engine/rank_memory_plan.h"
#include "model/checkpoint.h"
#include "model/longnet.h"
#include "model/longnet_params.h"

namespace dattn {
namespace model {
namespace {

using Wide = __int128;

// Slack for safetensors headers and the file writer's buffer (model/file_io.h's OutputFile
// reserves 1 MiB).
constexpr int64_t kFileSlackBytes = (int64_t{1} << 20) + (int64_t{64} << 10);

absl::StatusOr<int64_t> Narrow(Wide bytes, const char* what) {
  if (bytes < 0 || bytes > std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PlanCpuTrainingRankMemory: the ", what, " bytes do not fit in int64"));
  }
  return static_cast<int64_t>(bytes);
}

// The model's buffers for one shape, its token copies, and the attention engine's part.
struct ShapeMemory {
  Wide model = 0;
  int64_t workspace = 0;
  int64_t ring = 0;
};

absl::StatusOr<ShapeMemory> PlanShape(const TrainerConfig& config, int64_t rows, int64_t seq_len,
                                      int sp, int threads) {
  ShapeMemory out;
  ModelOptions options;
  options.checkpoint_activations = config.checkpoint_activations;
  const int64_t n = seq_len / sp;
  out.model = Wide{4} * LongNetLM<float>::BufferElements(config.model, options, rows, n) +
              Wide{8} * rows * n;  // tokens_ and targets_ (int32).
  RankProblem problem;
  problem.spec = config.model.attention_spec();
  problem.batch = rows;
  problem.seq_len = seq_len;
  problem.num_heads = config.model.num_heads;
  problem.head_dim = config.model.head_dim();
  problem.ranks = sp;
  problem.dtype = DType::kFloat32;
  problem.backward = true;
  absl::StatusOr<RankMemoryPlan> plan = PlanLargestRankMemory(problem, BackendKind::kCpu, threads);
  if (!plan.ok()) return plan.status();
  out.workspace = plan->shard.workspace_bytes;
  out.ring = plan->ring_bytes;
  return out;
}

}  // namespace

absl::StatusOr<CpuTrainingRankMemory> PlanCpuTrainingRankMemory(const TrainerConfig& config,
                                                                int data_parallel,
                                                                int sequence_parallel) {
  if (absl::Status s = ValidateTrainerConfig(config); !s.ok()) return s;
  const int dp = data_parallel, sp = sequence_parallel;
  if (dp < 1 || sp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("PlanCpuTrainingRankMemory: ", dp, " x ", sp,
                                                   " ranks: both degrees must be >= 1"));
  }
  if (absl::Status s = CheckParallelDegrees(config, dp, sp); !s.ok()) return s;
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(config.model);
  if (!layout.ok()) return layout.status();
  const Wide world = Wide{dp} * sp;
  const int threads = config.threads > 0
                          ? static_cast<int>(config.threads)
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const Wide p = layout->total();
  const Wide shard = (p + world - 1) / world;
  const int64_t micro_rows = config.batch_size / config.micro_batches / dp;
  const int64_t rank_rows = config.batch_size / dp;
  const int64_t n = config.seq_len;

  CpuTrainingRankMemory m;
  Wide params = 4 * p, grads = 4 * p, moments = 8 * shard;

  // The step: the training micro-batch's buffers, and the retrieval evaluation's when its shape
  // differs (each data-parallel rank evaluates at most micro_rows examples at a time).
  absl::StatusOr<ShapeMemory> train = PlanShape(config, micro_rows, n, sp, threads);
  if (!train.ok()) return train.status();
  Wide activations = train->model;
  int64_t workspace = train->workspace, ring = train->ring;
  const int64_t nr = config.retrieval_seq_len();
  Wide retrieval_batch = 0;
  if (config.retrieval.examples > 0) {
    const int64_t rows = std::min<int64_t>(micro_rows, config.retrieval.examples);
    absl::StatusOr<ShapeMemory> eval = PlanShape(config, rows, nr, sp, threads);
    if (!eval.ok()) return eval.status();
    if (rows != micro_rows || nr != n) activations += eval->model;
    workspace = std::max(workspace, eval->workspace);
    ring = std::max(ring, eval->ring);
    // The examples (inputs, targets), their slices and the predictions.
    retrieval_batch = Wide{8} * rows * nr + Wide{12} * rows * (nr / sp);
  }
  // Host batches: the data-parallel rank's rows (inputs, targets, starts), their slices; the
  // layer ops' per-call scratch (fp64 column sums and gradients of the widest layer).
  const int64_t widest =
      std::max({config.model.d_model, config.model.ffn_dim, config.model.vocab_size});
  const Wide trainer = Wide{8} * rank_rows * n + Wide{8} * rank_rows +
                       Wide{8} * rank_rows * (n / sp) + retrieval_batch +
                       Wide{32} * widest * threads;

  // Checkpoints.
  Wide save = 0;
  if (world == 1) {
    save = 12 * p + 8 * p + kFileSlackBytes;  // Copies of everything; the optimizer file mapped.
  } else {
    Wide range = 0;
    for (const ElementRange& r : WeightsShardRanges(*layout, static_cast<int>(world))) {
      range = std::max<Wide>(range, r.size());
    }
    save = 4 * range + 8 * shard + std::max(4 * range, 8 * shard) + kFileSlackBytes;
  }
  const Wide resume = 4 * p + 8 * shard + std::max(8 * p, 4 * p + 8 * shard) + kFileSlackBytes;

  const Wide runtime = Wide{kRuntimeBaseBytes} + Wide{kRuntimePerThreadBytes} * threads +
                       Wide{kRuntimePerPeerBytes} * ((world - 1) + (sp - 1));
  const Wide step = activations + workspace + ring + trainer;
  const Wide total = params + grads + moments + std::max(step + save, resume) + runtime;

  absl::StatusOr<int64_t> value = Narrow(total, "total");
  if (!value.ok()) return value.status();
  m.total_bytes = *value;
  m.params_bytes = static_cast<int64_t>(params);
  m.grads_bytes = static_cast<int64_t>(grads);
  m.moments_bytes = static_cast<int64_t>(moments);
  m.activation_bytes = static_cast<int64_t>(activations);
  m.attention_bytes = workspace;
  m.ring_bytes = ring;
  m.trainer_bytes = static_cast<int64_t>(trainer);
  m.save_bytes = static_cast<int64_t>(save);
  m.resume_bytes = static_cast<int64_t>(resume);
  m.runtime_bytes = static_cast<int64_t>(runtime);
  m.breakdown = absl::StrCat(
      "params ", FormatBytes(m.params_bytes), " + grads ", FormatBytes(m.grads_bytes),
      " + moments ", FormatBytes(m.moments_bytes), " + max(activations ",
      FormatBytes(m.activation_bytes), " + attention workspace ", FormatBytes(m.attention_bytes),
      " + ring buffers ", FormatBytes(m.ring_bytes), " + batches ", FormatBytes(m.trainer_bytes),
      " + save ", FormatBytes(m.save_bytes), ", resume ", FormatBytes(m.resume_bytes),
      ") + runtime ", FormatBytes(m.runtime_bytes), " = ", FormatBytes(m.total_bytes), " (", dp,
      " x ", sp, " ranks, ", threads, threads == 1 ? " thread" : " threads", ")");
  return m;
}

}  // namespace model
}  // namespace dattn
