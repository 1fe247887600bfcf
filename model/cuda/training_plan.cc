#include "model/cuda/training_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/cuda/cuda_memory_plan.h"
#include "engine/rank_memory_plan.h"
#include "model/cuda/launch_geometry.h"
#include "model/longnet_params.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

constexpr int64_t kAlignElements = 128;  // bf16 working copy: 256 bytes
constexpr int64_t kAlignBytes = 256;     // arena
constexpr int64_t kMallocGranule = 2ll << 20;
// sizeof(EmbeddingItem) and sizeof(RotaryConsts) (model_kernels.h), kept here so that this library
// needs no CUDA header; cuda_longnet.cc static_asserts they agree.
constexpr int64_t kEmbeddingItemBytes = 16;
constexpr int64_t kEmbeddingItemRows = 256;

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// A bump allocator of offsets; tracks whether anything passed 2^62 bytes.
class Bump {
 public:
  explicit Bump(int64_t align) : align_(align) {}
  int64_t Take(double count, double unit) {
    const double bytes = count * unit;
    if (!(bytes >= 0) || bytes > 4.0e18 || static_cast<double>(cursor_) + bytes > 4.0e18) {
      overflow_ = true;
      return 0;
    }
    const int64_t at = RoundUp(cursor_, align_);
    cursor_ = at + static_cast<int64_t>(bytes);
    return at;
  }
  int64_t size() const { return RoundUp(cursor_, align_); }
  bool overflow() const { return overflow_; }

 private:
  int64_t align_;
  int64_t cursor_ = 0;
  bool overflow_ = false;
};

}  // namespace

absl::Status CheckCudaConfig(const LongNetConfig& c) {
  absl::Status valid = ValidateConfig(c);
  if (!valid.ok()) return valid;
  auto field = [](const char* name, int64_t value, const char* rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field \"", name, "\": ", value, " ", rule, " (the CUDA model)"));
  };
  if (c.d_model % 8 != 0 || c.d_model > kMaxRowWidth) {
    return field("d_model", c.d_model, "must be a multiple of 8 and at most 16384");
  }
  if (c.ffn_dim % 8 != 0 || c.ffn_dim > kMaxRowWidth) {
    return field("ffn_dim", c.ffn_dim, "must be a multiple of 8 and at most 16384");
  }
  if (c.head_dim() % 8 != 0 || c.head_dim() > 256) {
    return field("d_model / num_heads", c.head_dim(), "must be a multiple of 8 and at most 256");
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkingCopyLayout> LayoutWorkingCopy(const LongNetConfig& config,
                                                    const ParamLayout& layout) {
  absl::Status ok = CheckCudaConfig(config);
  if (!ok.ok()) return ok;
  absl::StatusOr<ModelOffsets> offsets = ResolveOffsets(config, layout);
  if (!offsets.ok()) return offsets.status();
  const int64_t d = config.d_model, f = config.ffn_dim, v = config.vocab_size;
  WorkingCopyLayout w;
  int64_t cursor = 0;
  auto take = [&](int64_t n) {
    const int64_t at = RoundUp(cursor, kAlignElements);
    cursor = at + n;
    return at;
  };
  auto copy = [&](int64_t src, int64_t dst, int64_t n) {
    w.segments.push_back(WorkingCopyLayout::Segment{src, dst, n});
  };
  w.embedding = take(v * d);
  copy(offsets->token_embedding, w.embedding, v * d);
  if (config.tie_embeddings) {
    w.head = w.embedding;
  } else {
    w.head = take(v * d);
    copy(offsets->lm_head, w.head, v * d);
  }
  for (const BlockOffsets& o : offsets->blocks) {
    WorkingBlock b;
    b.wqkv = take(3 * d * d);
    copy(o.q_proj.weight, b.wqkv, d * d);
    copy(o.k_proj.weight, b.wqkv + d * d, d * d);
    copy(o.v_proj.weight, b.wqkv + 2 * d * d, d * d);
    b.bqkv = take(3 * d);
    copy(o.q_proj.bias, b.bqkv, d);
    copy(o.k_proj.bias, b.bqkv + d, d);
    copy(o.v_proj.bias, b.bqkv + 2 * d, d);
    b.wo = take(d * d);
    copy(o.out_proj.weight, b.wo, d * d);
    b.bo = take(d);
    copy(o.out_proj.bias, b.bo, d);
    b.w1 = take(f * d);
    copy(o.fc1.weight, b.w1, f * d);
    b.b1 = take(f);
    copy(o.fc1.bias, b.b1, f);
    b.w2 = take(d * f);
    copy(o.fc2.weight, b.w2, d * f);
    b.b2 = take(d);
    copy(o.fc2.bias, b.b2, d);
    w.blocks.push_back(b);
  }
  w.size = RoundUp(cursor, kAlignElements);
  return w;
}

absl::StatusOr<ArenaLayout> LayoutArena(const LongNetConfig& config, int64_t batch, int64_t seq_len,
                                        const ArenaOptions& options) {
  absl::Status ok = CheckCudaConfig(config);
  if (!ok.ok()) return ok;
  if (batch < 1 || seq_len < 1 || options.num_sms < 1) {
    return absl::InvalidArgumentError(absl::StrCat("activation arena: batch ", batch, ", seq_len ",
                                                   seq_len, " and num_sms ", options.num_sms,
                                                   " must be >= 1"));
  }
  const double m = static_cast<double>(batch) * static_cast<double>(seq_len);
  if (m > 4.0e18) return absl::InvalidArgumentError("activation arena: batch x seq_len overflows");
  const double d = static_cast<double>(config.d_model), f = static_cast<double>(config.ffn_dim),
               v = static_cast<double>(config.vocab_size),
               h = static_cast<double>(config.num_heads);
  const int64_t layers = config.num_layers;
  ArenaLayout a;
  a.rows = batch * seq_len;
  Bump arena(kAlignBytes);
  for (int64_t i = 0; i <= layers; ++i) a.xs.push_back(arena.Take(m * d, 2));
  if (options.recompute_norms) a.norm_scratch = arena.Take(m * d, 2);
  a.big = arena.Take(m * std::max(f, 3 * d), 2);
  const int64_t sets = options.checkpoint_activations ? 1 : layers;
  for (int64_t i = 0; i < sets; ++i) {
    BlockSlots s;
    s.qkv = arena.Take(3 * m * d, 2);
    s.attn = arena.Take(m * d, 2);
    s.x_mid = arena.Take(m * d, 2);
    s.h = arena.Take(m * f, 2);
    if (options.recompute_norms) {
      s.ln1 = s.sub1 = s.ln2 = a.norm_scratch;
      s.sub2 = a.big;
    } else {
      s.ln1 = arena.Take(m * d, 2);
      s.sub1 = arena.Take(m * d, 2);
      s.ln2 = arena.Take(m * d, 2);
      s.sub2 = arena.Take(m * f, 2);
    }
    s.ln1_stats = arena.Take(2 * m, 4);
    s.sub1_stats = arena.Take(2 * m, 4);
    s.ln2_stats = arena.Take(2 * m, 4);
    s.sub2_stats = arena.Take(2 * m, 4);
    s.lse = arena.Take(h * m, 4);
    a.sets.push_back(s);
  }
  a.xf = arena.Take(m * d, 2);
  a.xf_stats = arena.Take(2 * m, 4);
  a.logits = arena.Take(m * v, 4);
  a.row_lse = arena.Take(m, 4);
  a.dlogits = arena.Take(m * v, 2);
  a.dres32 = arena.Take(m * d, 4);
  a.dres = arena.Take(m * d, 2);
  a.dqkv = arena.Take(3 * m * d, 2);
  a.tmp = arena.Take(m * d, 2);
  const RowLaunch lf = RowLaunchFor(a.rows, config.ffn_dim, options.num_sms);
  const RowLaunch ld = RowLaunchFor(a.rows, config.d_model, options.num_sms);
  a.part_ctas_ffn = lf.ctas;
  a.part_ctas_d = ld.ctas;
  const double cf = static_cast<double>(lf.ctas), cd = static_cast<double>(ld.ctas);
  a.part_ffn = arena.Take(3 * cf * f, 4);
  a.part_ln2 = arena.Take(3 * cd * d, 4);
  a.part_sub1 = arena.Take(3 * cd * d, 4);
  a.part_rope = arena.Take(3 * cd * d, 4);
  a.part_ln1 = arena.Take(3 * cd * d, 4);
  a.tokens = arena.Take(m, 4);
  a.targets = arena.Take(m, 4);
  a.emb_order = arena.Take(m, 8);
  a.emb_max_items = a.rows / kEmbeddingItemRows + config.vocab_size + 1;
  a.emb_items = arena.Take(static_cast<double>(a.emb_max_items), kEmbeddingItemBytes);
  a.emb_token_items = arena.Take(v + 1, 8);
  a.emb_partial = arena.Take(static_cast<double>(a.emb_max_items) * d, 4);
  a.ce_partials = arena.Take(static_cast<double>(CrossEntropyPartials(a.rows)), 8);
  a.loss = arena.Take(1, 8);
  if (arena.overflow()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation arena of batch ", batch, " x seq_len ", seq_len, " overflows int64 bytes"));
  }
  a.bytes = arena.size();
  return a;
}

std::string TrainingMemoryPlan::DebugString() const {
  auto mib = [](int64_t b) { return absl::StrFormat("%.1f", static_cast<double>(b) / 1048576.0); };
  return absl::StrCat(
      "total ", mib(total_bytes), " MiB = params ", mib(params_bytes), " + grads ",
      mib(grads_bytes), " + bf16 copy ", mib(working_copy_bytes), " + AdamW ", mib(optimizer_bytes),
      " + activations ", mib(activations_bytes), " + scratch ", mib(scratch_bytes),
      " + attention workspace ", mib(attention_workspace_bytes), " + GEMM workspace ",
      mib(gemm_workspace_bytes), " + libraries ", mib(library_bytes),
      ring_bytes > 0 ? absl::StrCat(" + ring buffers ", mib(ring_bytes)) : std::string(),
      collective_bytes > 0 ? absl::StrCat(" + collective ", mib(collective_bytes)) : std::string(),
      nccl_bytes > 0 ? absl::StrCat(" + NCCL ", mib(nccl_bytes)) : std::string());
}

int64_t CollectiveChunkElements(int64_t largest_shard, int world, int64_t max_temp_bytes) {
  const int64_t peers = std::max(1, world - 1);
  const int64_t budget = std::max<int64_t>(max_temp_bytes, 0) / 4 / peers;
  return std::max<int64_t>(1, std::min(largest_shard, std::max<int64_t>(1024, budget)));
}

int64_t CollectiveDeviceBytes(int64_t total, int world, const CudaCollectiveOptions& options) {
  if (world <= 1 || total < 1) return 0;
  const int64_t largest = (total + world - 1) / world;  // ShardRanges' largest shard
  const int64_t chunk = CollectiveChunkElements(largest, world, options.max_temp_bytes);
  return RoundUp((world - 1) * chunk * 4, kMallocGranule) +
         RoundUp(kCollectiveStagingBytes, kMallocGranule);
}

int64_t ShardOptimizerBytes(int64_t total, int64_t shard_elements) {
  auto rounded = [](int64_t bytes) { return RoundUp(std::max<int64_t>(bytes, 1), kMallocGranule); };
  // CudaAdamW: m and v of the shard, one decay bit per element of the layout, the sum of squares'
  // SumOfSquaresPartials() (1024) + 1 doubles.
  return 2 * rounded(4 * shard_elements) + rounded((total + 31) / 32 * 4) + rounded(1025 * 8);
}

absl::StatusOr<TrainingMemoryPlan> PlanTrainingMemory(const LongNetConfig& config, int64_t batch,
                                                      int64_t seq_len,
                                                      const TrainingMemoryOptions& options) {
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(config);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<WorkingCopyLayout> working = LayoutWorkingCopy(config, *layout);
  if (!working.ok()) return working.status();
  absl::StatusOr<ArenaLayout> arena = LayoutArena(config, batch, seq_len, options.arena);
  if (!arena.ok()) return arena.status();
  absl::StatusOr<::dattn::cuda::CudaMemoryPlan> attention =
      ::dattn::cuda::PlanCudaMemory(config.attention_spec(), batch, seq_len, config.num_heads,
                                    config.head_dim(), DType::kBFloat16, /*backward=*/true);
  if (!attention.ok()) return attention.status();
  const int64_t p = layout->total();
  auto rounded = [](int64_t bytes) { return RoundUp(std::max<int64_t>(bytes, 1), kMallocGranule); };
  TrainingMemoryPlan plan;
  plan.params_bytes = rounded(4 * p);
  plan.grads_bytes = rounded(4 * p);
  // The copy, its fill table, the rotary constants and the column-sum job tables.
  plan.working_copy_bytes = rounded(2 * working->size) +
                            rounded(static_cast<int64_t>(working->segments.size()) * 24) +
                            rounded(4096) + rounded((config.num_layers + 1) * 16 * 40);
  if (options.include_optimizer) plan.optimizer_bytes = ShardOptimizerBytes(p, p);
  const ArenaLayout& a = *arena;
  // Saved activations: from the first residual-stream buffer to the end of the row lse, less the
  // scratch laid out among them (norm_scratch and big come before the sets).
  const int64_t saved_end = a.dlogits;
  int64_t scratch_inside = 0;
  if (a.norm_scratch >= 0) scratch_inside += a.big - a.norm_scratch;
  scratch_inside += (a.sets.empty() ? a.xf : a.sets.front().qkv) - a.big;
  plan.activations_bytes = saved_end - scratch_inside;
  plan.scratch_bytes = rounded(a.bytes) - plan.activations_bytes;
  plan.attention_workspace_bytes = attention->workspace_bytes;
  plan.gemm_workspace_bytes = rounded(options.gemm_workspace_bytes);
  plan.library_bytes = options.library_allowance_bytes;
  plan.total_bytes = plan.params_bytes + plan.grads_bytes + plan.working_copy_bytes +
                     plan.optimizer_bytes + plan.activations_bytes + plan.scratch_bytes +
                     plan.attention_workspace_bytes + plan.gemm_workspace_bytes +
                     plan.library_bytes;
  return plan;
}

absl::StatusOr<TrainingMemoryPlan> PlanTrainingRankMemory(const LongNetConfig& config,
                                                          int64_t micro_rows, int64_t seq_len,
                                                          int data_parallel, int sequence_parallel,
                                                          const TrainingMemoryOptions& options) {
  if (data_parallel < 1 || sequence_parallel < 1) {
    return absl::InvalidArgumentError(absl::StrCat("training rank memory plan: data_parallel ",
                                                   data_parallel, " and sequence_parallel ",
                                                   sequence_parallel, " must be >= 1"));
  }
  if (micro_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("training rank memory plan: micro_rows ", micro_rows, " must be >= 1"));
  }
  if (seq_len < 1 || seq_len % sequence_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat("training rank memory plan: sequence_parallel ",
                                                   sequence_parallel, " does not divide seq_len ",
                                                   seq_len));
  }
  const int64_t world = static_cast<int64_t>(data_parallel) * sequence_parallel;
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(config);
  if (!layout.ok()) return layout.status();
  const int64_t p = layout->total();
  if (world > p) {
    return absl::InvalidArgumentError(
        absl::StrCat("training rank memory plan: ", p, " parameters cannot be sharded over ", world,
                     " ranks (", data_parallel, " x ", sequence_parallel, ")"));
  }
  TrainingMemoryOptions step = options;
  step.include_optimizer = false;
  absl::StatusOr<TrainingMemoryPlan> plan =
      PlanTrainingMemory(config, micro_rows, seq_len / sequence_parallel, step);
  if (!plan.ok()) return plan.status();
  if (options.include_optimizer) {
    plan->optimizer_bytes = ShardOptimizerBytes(p, (p + world - 1) / world);
  }
  if (sequence_parallel > 1) {
    RankProblem ring;
    ring.spec = config.attention_spec();
    ring.batch = micro_rows;
    ring.seq_len = seq_len;
    ring.num_heads = config.num_heads;
    ring.head_dim = config.head_dim();
    ring.ranks = sequence_parallel;
    ring.dtype = DType::kBFloat16;
    ring.backward = true;
    absl::StatusOr<RankMemoryPlan> rank =
        PlanLargestRankMemory(ring, BackendKind::kCuda, /*cpu_threads=*/0);
    if (!rank.ok()) return rank.status();
    plan->attention_workspace_bytes = rank->shard.workspace_bytes;
    plan->ring_bytes = rank->ring_bytes;
  }
  plan->collective_bytes = CollectiveDeviceBytes(p, static_cast<int>(world), options.collective);
  if (world > 1) plan->nccl_bytes = options.nccl_world_allowance_bytes;
  if (sequence_parallel > 1) plan->nccl_bytes += options.nccl_group_allowance_bytes;
  plan->total_bytes = plan->params_bytes + plan->grads_bytes + plan->working_copy_bytes +
                      plan->optimizer_bytes + plan->activations_bytes + plan->scratch_bytes +
                      plan->attention_workspace_bytes + plan->gemm_workspace_bytes +
                      plan->library_bytes + plan->ring_bytes + plan->collective_bytes +
                      plan->nccl_bytes;
  return plan;
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
