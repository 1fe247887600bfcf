#include "model/cuda/serving_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/cuda/training_plan.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

constexpr int64_t kGranule = 2ll << 20;    // cudaMalloc's allocation granule
constexpr int64_t kDecodeChunkRows = 256;  // decode_kernels.h's kDecodeChunk

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

std::string MiB(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

DecodeStepLayout LayoutDecodeStep(const LongNetConfig& c, int64_t slots, int64_t max_chunks,
                                  int64_t rows, int shards) {
  DecodeStepLayout l;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t here = at;
    at += RoundUp(bytes, 256);
    return here;
  };
  const int64_t d = c.d_model, f = c.ffn_dim, v = c.vocab_size, dh = c.head_dim();
  const int64_t s = std::max<int64_t>(slots, 1);
  l.tokens = take(rows * 4);
  l.positions = take(rows * 8);
  l.k_cache = take(rows * 8);
  l.v_cache = take(rows * 8);
  l.slot_rows = take(rows * s * 4);
  l.append_rows = shards > 1 ? take(rows * s * 4) : l.slot_rows;
  l.merge_rows = shards > 1 ? take(rows * s * 4) : l.slot_rows;
  l.upload_bytes = at;
  l.x = take(rows * d * 2);
  l.x_next = take(rows * d * 2);
  l.ln = take(rows * d * 2);
  l.qkv = take(rows * 3 * d * 2);
  l.attn = take(rows * d * 2);
  l.sub = take(rows * d * 2);
  l.x_mid = take(rows * d * 2);
  l.h = take(rows * f * 2);
  l.sub2 = take(rows * f * 2);
  l.xf = take(rows * d * 2);
  l.stats = take(rows * 2 * 4);
  l.logits = take(rows * v * 4);
  l.partial_floats = rows * s * std::max<int64_t>(max_chunks, 1) * (dh + 2);
  l.partials = take(l.partial_floats * 4);
  l.gathered = shards > 1 ? take(shards * l.partial_floats * 4) : l.partials;
  l.bytes = at;
  return l;
}

int64_t DecodeMaxChunks(const KvCacheGeometry& geometry) {
  int64_t largest = 1;
  for (const KvCacheGeometry::Slot& slot : geometry.slots()) {
    // Shard 0's rows (it holds the most of every slot): every rank of a ring lays its partials
    // out alike, so that they can be gathered and merged.
    largest = std::max(largest, (slot.capacity + geometry.shards() - 1) / geometry.shards());
  }
  return (largest + kDecodeChunkRows - 1) / kDecodeChunkRows;
}

std::string ServingMemoryPlan::DebugString() const {
  return absl::StrCat("model ", MiB(model_bytes), " + prefill ", MiB(prefill_bytes),
                      ring_bytes > 0 ? absl::StrCat(" + ring ", MiB(ring_bytes)) : "", " + caches ",
                      MiB(cache_bytes), " + step buffers ", MiB(step_bytes), " = ",
                      MiB(total_bytes));
}

absl::StatusOr<ServingMemoryPlan> PlanCudaServingMemory(const LongNetConfig& config,
                                                        int64_t max_context, int64_t max_batch,
                                                        int ranks) {
  if (absl::Status s = CheckCudaConfig(config); !s.ok()) return s;
  if (max_context < 1 || max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("GPU serving plan: max_context ", max_context,
                                                   " and max_batch ", max_batch, " must be >= 1"));
  }
  if (ranks < 1 || max_context % ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU serving plan: ", ranks, " ranks must be >= 1 and divide max_context ", max_context));
  }
  // Rank 0's share: it holds row 0 of every slot, so the most rows.
  absl::StatusOr<KvCacheGeometry> geometry = KvCacheGeometry::Make(config, max_context, ranks, 0);
  if (!geometry.ok()) return geometry.status();
  TrainingMemoryOptions options;
  options.arena.checkpoint_activations = true;
  options.arena.recompute_norms = true;
  options.include_optimizer = false;
  // One GPU: the whole prompt's forward pass. A ring: a rank's shard of it, with the ring's
  // workspace and exchange buffers (the plan counts the backward's too: a bound).
  absl::StatusOr<TrainingMemoryPlan> model =
      ranks == 1 ? PlanTrainingMemory(config, 1, max_context, options)
                 : PlanTrainingRankMemory(config, 1, max_context, 1, ranks, options);
  if (!model.ok()) return model.status();
  ServingMemoryPlan p;
  p.model_bytes = model->params_bytes + model->grads_bytes + model->working_copy_bytes +
                  model->gemm_workspace_bytes + model->library_bytes;
  p.prefill_bytes =
      model->activations_bytes + model->scratch_bytes + model->attention_workspace_bytes;
  // A ring's one communicator (no trainer's collective): its buffers and NCCL's own memory.
  p.ring_bytes = ranks > 1 ? model->ring_bytes + options.nccl_world_allowance_bytes : 0;
  // ElementsPerSequence counts K and V; bf16.
  p.cache_bytes_per_sequence = RoundUp(geometry->ElementsPerSequence() * 2, kGranule);
  p.cache_bytes = max_batch * p.cache_bytes_per_sequence;
  const int64_t slots = static_cast<int64_t>(geometry->slots().size());
  const DecodeStepLayout step =
      LayoutDecodeStep(config, slots, DecodeMaxChunks(*geometry), max_batch, ranks);
  // The step buffers, and the decoder's tables (rotary constants, slots, prefill jobs): one
  // granule each.
  p.step_bytes = RoundUp(step.bytes, kGranule) + 4 * kGranule;
  p.total_bytes = p.model_bytes + p.prefill_bytes + p.ring_bytes + p.cache_bytes + p.step_bytes;
  return p;
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
