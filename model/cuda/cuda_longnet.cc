#include "model/cuda/cuda_longnet.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/attention_spec.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device_scope.h"
#include "model/cuda/gemm.h"
#include "model/cuda/model_kernels.h"
#include "model/sequence_attention.h"

namespace dattn {
namespace model {
namespace cuda {

static_assert(sizeof(EmbeddingItem) == 16, "training_plan.cc's kEmbeddingItemBytes");
static_assert(kEmbeddingItemRows == 256, "training_plan.cc's kEmbeddingItemRows");

namespace {

constexpr int64_t kMaxJobsPerBatch = 16;

// A kernel launcher's cudaError_t as a Status naming the call.
#define MODEL_CUDA(expr) DATTN_CUDA_RETURN_IF_ERROR(expr)

absl::Status Malloc(void** p, int64_t bytes, const char* what) {
  const cudaError_t e = cudaMalloc(p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return absl::ResourceExhaustedError(absl::StrCat("CUDA model: cudaMalloc of ", bytes,
                                                     " bytes for ", what, " failed (", free_bytes,
                                                     " of ", total, " bytes free)"));
  }
  if (e != cudaSuccess) {
    return ::dattn::cuda::CudaErrorStatus(e, "cudaMalloc", __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

}  // namespace

struct CudaLongNetLM::Impl {
  std::unique_ptr<Gemm> gemm;
  std::unique_ptr<CudaAttentionBackend> backend;
  std::unique_ptr<SequenceAttention> attention;
  bf16_t* working = nullptr;
  PackSegment* segments = nullptr;
  int num_segments = 0;
  RotaryConsts* rotary = nullptr;  // device
  ColumnSumJob* jobs = nullptr;    // device: (L + 1) batches of kMaxJobsPerBatch
  std::vector<int> job_counts;     // per batch
  int64_t job_max_n = 0;
  char* arena = nullptr;
  ArenaLayout layout;
  double* pinned_loss = nullptr;
  std::unique_ptr<RotaryPlan> rotary_plan;
  int64_t rotary_block = -1;  // the block W the device constants hold
  int64_t fixed_bytes = 0;

  template <typename T>
  T* At(int64_t offset) const {
    return reinterpret_cast<T*>(arena + offset);
  }
};

CudaLongNetLM::CudaLongNetLM(const LongNetConfig& config, const ModelOptions& options,
                             const CudaModelOptions& cuda_options, ParamLayout layout,
                             ModelOffsets offsets, WorkingCopyLayout working)
    : config_(config),
      options_(options),
      cuda_options_(cuda_options),
      layout_(std::move(layout)),
      offsets_(std::move(offsets)),
      working_(std::move(working)),
      impl_(std::make_unique<Impl>()) {}

CudaLongNetLM::~CudaLongNetLM() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  impl_->attention.reset();
  impl_->backend.reset();
  impl_->gemm.reset();
  for (void* p : {static_cast<void*>(impl_->working), static_cast<void*>(impl_->segments),
                  static_cast<void*>(impl_->rotary), static_cast<void*>(impl_->jobs),
                  static_cast<void*>(impl_->arena), static_cast<void*>(params_),
                  static_cast<void*>(grads_)}) {
    if (p != nullptr) cudaFree(p);
  }
  if (impl_->pinned_loss != nullptr) cudaFreeHost(impl_->pinned_loss);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<CudaLongNetLM>> CudaLongNetLM::Create(
    const LongNetConfig& config, const ModelOptions& options,
    const CudaModelOptions& cuda_options) {
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(config);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<ModelOffsets> offsets = ResolveOffsets(config, *layout);
  if (!offsets.ok()) return offsets.status();
  absl::StatusOr<WorkingCopyLayout> working = LayoutWorkingCopy(config, *layout);
  if (!working.ok()) return working.status();
  DATTN_RETURN_IF_ERROR(::dattn::cuda::CheckHopperDevice(cuda_options.device, "the CUDA model"));
  std::unique_ptr<CudaLongNetLM> model(new CudaLongNetLM(
      config, options, cuda_options, *std::move(layout), *std::move(offsets), *std::move(working)));
  DATTN_RETURN_IF_ERROR(model->Init());
  return model;
}

absl::Status CudaLongNetLM::Init() {
  MODEL_CUDA(cudaSetDevice(cuda_options_.device));
  MODEL_CUDA(
      cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, cuda_options_.device));
  MODEL_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const int64_t p = layout_.total();
  DATTN_RETURN_IF_ERROR(Malloc(reinterpret_cast<void**>(&params_), 4 * p, "parameters"));
  DATTN_RETURN_IF_ERROR(Malloc(reinterpret_cast<void**>(&grads_), 4 * p, "gradients"));
  DATTN_RETURN_IF_ERROR(
      Malloc(reinterpret_cast<void**>(&impl_->working), 2 * working_.size, "bf16 weights"));
  std::vector<PackSegment> segments;
  for (const WorkingCopyLayout::Segment& s : working_.segments) {
    segments.push_back(PackSegment{s.src, s.dst, s.n});
  }
  impl_->num_segments = static_cast<int>(segments.size());
  DATTN_RETURN_IF_ERROR(Malloc(reinterpret_cast<void**>(&impl_->segments),
                               static_cast<int64_t>(segments.size() * sizeof(PackSegment)),
                               "weight copy table"));
  MODEL_CUDA(cudaMemcpyAsync(impl_->segments, segments.data(),
                             segments.size() * sizeof(PackSegment), cudaMemcpyHostToDevice,
                             stream_));
  // The working copy's gaps (alignment padding) are never read; zero them once anyway.
  MODEL_CUDA(cudaMemsetAsync(impl_->working, 0, static_cast<size_t>(2 * working_.size), stream_));
  DATTN_RETURN_IF_ERROR(
      Malloc(reinterpret_cast<void**>(&impl_->rotary), sizeof(RotaryConsts), "rotary constants"));
  const int64_t job_slots = (config_.num_layers + 1) * kMaxJobsPerBatch;
  DATTN_RETURN_IF_ERROR(Malloc(reinterpret_cast<void**>(&impl_->jobs),
                               job_slots * static_cast<int64_t>(sizeof(ColumnSumJob)),
                               "column-sum jobs"));
  MODEL_CUDA(cudaMallocHost(reinterpret_cast<void**>(&impl_->pinned_loss), sizeof(double)));
  absl::StatusOr<std::unique_ptr<Gemm>> gemm =
      Gemm::Create(stream_, cuda_options_.gemm_workspace_bytes);
  if (!gemm.ok()) return gemm.status();
  impl_->gemm = *std::move(gemm);
  if (cuda_options_.attention_factory) {
    absl::StatusOr<std::unique_ptr<SequenceAttention>> attention =
        cuda_options_.attention_factory(stream_);
    if (!attention.ok()) return attention.status();
    if (*attention == nullptr || (*attention)->device() != Device::kCuda) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaModelOptions::attention_factory made ",
                       *attention == nullptr
                           ? std::string("no attention (null)")
                           : absl::StrCat("an attention on ", DeviceName((*attention)->device())),
                       "; the CUDA model needs one on CUDA device ", cuda_options_.device));
    }
    impl_->attention = *std::move(attention);
  } else {
    CudaBackendOptions backend_options;
    backend_options.device = cuda_options_.device;
    backend_options.stream = stream_;
    absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> backend = NewCudaBackend(backend_options);
    if (!backend.ok()) return backend.status();
    impl_->backend = *std::move(backend);
    impl_->attention = NewLocalAttention(impl_->backend.get());
  }
  impl_->fixed_bytes = 8 * p + 2 * working_.size +
                       static_cast<int64_t>(segments.size() * sizeof(PackSegment)) +
                       static_cast<int64_t>(sizeof(RotaryConsts)) +
                       job_slots * static_cast<int64_t>(sizeof(ColumnSumJob));
  MODEL_CUDA(cudaMemsetAsync(grads_, 0, static_cast<size_t>(4 * p), stream_));
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::Synchronize() {
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

CudaModelMemory CudaLongNetLM::memory() const {
  CudaModelMemory m;
  m.params_grads_copy = impl_->fixed_bytes;
  m.arena = impl_->arena != nullptr ? impl_->layout.bytes : 0;
  m.arena_capacity = impl_->arena != nullptr ? arena_capacity_ : 0;
  m.gemm_workspace = impl_->gemm != nullptr ? impl_->gemm->workspace_bytes() : 0;
  if (impl_->backend != nullptr) {
    uint64_t high = 0;
    if (cudaMemPoolGetAttribute(impl_->backend->pool(), cudaMemPoolAttrReservedMemHigh, &high) ==
        cudaSuccess) {
      m.attention_pool_reserved_high = static_cast<int64_t>(high);
    }
  }
  return m;
}

absl::Status CudaLongNetLM::InitParams(uint64_t seed) {
  std::vector<double> values(static_cast<size_t>(layout_.total()));
  DATTN_RETURN_IF_ERROR(InitMagneto(config_, layout_, seed, values.data()));
  std::vector<float> rounded(values.begin(), values.end());
  return CopyParamsFromHost(rounded.data());
}

absl::Status CudaLongNetLM::CopyParamsFromHost(const float* host) {
  MODEL_CUDA(cudaMemcpyAsync(params_, host, static_cast<size_t>(layout_.total()) * 4,
                             cudaMemcpyHostToDevice, stream_));
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::CopyParamsToHost(float* host) {
  MODEL_CUDA(cudaMemcpyAsync(host, params_, static_cast<size_t>(layout_.total()) * 4,
                             cudaMemcpyDeviceToHost, stream_));
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::CopyGradsToHost(float* host) {
  MODEL_CUDA(cudaMemcpyAsync(host, grads_, static_cast<size_t>(layout_.total()) * 4,
                             cudaMemcpyDeviceToHost, stream_));
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::CopyLogitsToHost(float* host) {
  if (!logits_valid_) {
    return absl::FailedPreconditionError("CopyLogitsToHost: no Forward has run");
  }
  const int64_t m = batch_ * seq_len_;
  MODEL_CUDA(cudaMemcpyAsync(host, impl_->At<float>(impl_->layout.logits),
                             static_cast<size_t>(m * config_.vocab_size) * 4,
                             cudaMemcpyDeviceToHost, stream_));
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::CopyLogitsToHost(float* host, int64_t first_row, int64_t rows) {
  if (!logits_valid_) {
    return absl::FailedPreconditionError("CopyLogitsToHost: no Forward has run");
  }
  const int64_t m = batch_ * seq_len_;
  if (first_row < 0 || rows < 0 || first_row + rows > m) {
    return absl::InvalidArgumentError(absl::StrCat("CopyLogitsToHost: rows [", first_row, ", ",
                                                   first_row + rows, ") are outside the ", m,
                                                   " of the last Forward"));
  }
  const int64_t v = config_.vocab_size;
  MODEL_CUDA(cudaMemcpyAsync(host, impl_->At<float>(impl_->layout.logits) + first_row * v,
                             static_cast<size_t>(rows * v) * 4, cudaMemcpyDeviceToHost, stream_));
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::CopyTargetLogProbsToHost(float* host) {
  if (!logits_valid_ || !has_targets_) {
    return absl::FailedPreconditionError(
        "CopyTargetLogProbsToHost: no Forward with targets has run");
  }
  const ArenaLayout& a = impl_->layout;
  const int64_t m = batch_ * seq_len_;
  // The target log-probabilities go where the backward pass's fp32 residual gradient goes ([M, d],
  // at least M floats, unread until a Backward, which rewrites it).
  float* out = impl_->At<float>(a.dres32);
  MODEL_CUDA(TargetLogProbs(impl_->At<float>(a.logits), impl_->At<float>(a.row_lse),
                            impl_->At<int32_t>(a.targets), m, config_.vocab_size, out, stream_));
  MODEL_CUDA(
      cudaMemcpyAsync(host, out, static_cast<size_t>(m) * 4, cudaMemcpyDeviceToHost, stream_));
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::RefreshWorkingCopy() {
  MODEL_CUDA(CastPackParams(params_, impl_->segments, impl_->num_segments, working_.size,
                            impl_->working, stream_));
  return absl::OkStatus();
}

const bf16_t* CudaLongNetLM::working_copy() const { return impl_->working; }

Gemm& CudaLongNetLM::gemm() { return *impl_->gemm; }

absl::Status CudaLongNetLM::ReserveActivations(int64_t batch, int64_t seq_len) {
  if (batch < 1 || seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ReserveActivations: batch ", batch,
                                                   " and seq_len ", seq_len, " must be >= 1"));
  }
  DATTN_RETURN_IF_ERROR(EnsureArena(batch, seq_len));
  arena_reserved_ = true;
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::EnsureArena(int64_t batch, int64_t seq_len) {
  if (impl_->arena != nullptr && batch == batch_ && seq_len == seq_len_) return absl::OkStatus();
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  if (impl_->arena != nullptr && !arena_reserved_) {
    // Freed first: the norms' kAuto choice below counts the device's free memory.
    MODEL_CUDA(cudaFree(impl_->arena));
    impl_->arena = nullptr;
    arena_capacity_ = 0;
  }
  batch_ = seq_len_ = 0;
  logits_valid_ = false;
  bool recompute = cuda_options_.norms == CudaModelOptions::Norms::kRecompute;
  if (cuda_options_.norms == CudaModelOptions::Norms::kAuto) {
    TrainingMemoryOptions plan_options;
    plan_options.arena.checkpoint_activations = options_.checkpoint_activations;
    plan_options.arena.recompute_norms = false;
    plan_options.arena.num_sms = num_sms_;
    plan_options.gemm_workspace_bytes = cuda_options_.gemm_workspace_bytes;
    absl::StatusOr<TrainingMemoryPlan> keep =
        PlanTrainingMemory(config_, batch, seq_len, plan_options);
    if (!keep.ok()) return keep.status();
    size_t free_bytes = 0, total = 0;
    MODEL_CUDA(cudaMemGetInfo(&free_bytes, &total));
    // What the plan counts that is already allocated: parameters, gradients, working copy, GEMM
    // workspace (the optimizer may or may not exist yet: counted as if not).
    const int64_t already = keep->params_bytes + keep->grads_bytes + keep->working_copy_bytes +
                            keep->gemm_workspace_bytes;
    const int64_t need = keep->total_bytes - already;
    recompute = need > static_cast<int64_t>(free_bytes) - (1ll << 30);
  }
  ArenaOptions arena_options;
  arena_options.checkpoint_activations = options_.checkpoint_activations;
  arena_options.recompute_norms = recompute;
  arena_options.num_sms = num_sms_;
  absl::StatusOr<ArenaLayout> layout = LayoutArena(config_, batch, seq_len, arena_options);
  if (!layout.ok()) return layout.status();
  // A reserved arena (ReserveActivations) serves every shape it holds; otherwise each shape gets
  // an arena of its own size (an unreserved one was freed above).
  const bool reuse = impl_->arena != nullptr && layout->bytes <= arena_capacity_;
  if (!reuse) {
    if (impl_->arena != nullptr) {
      MODEL_CUDA(cudaFree(impl_->arena));
      impl_->arena = nullptr;
      arena_capacity_ = 0;
    }
    DATTN_RETURN_IF_ERROR(Malloc(reinterpret_cast<void**>(&impl_->arena), layout->bytes,
                                 absl::StrCat("the activations of batch ", batch, " x ", seq_len,
                                              recompute ? " (norms recomputed)" : "")
                                     .c_str()));
    arena_capacity_ = layout->bytes;
  }
  impl_->layout = *std::move(layout);
  recompute_norms_ = recompute;
  const ArenaLayout& a = impl_->layout;
  // The column-sum jobs of every block's backward pass (batch i: block i; batch L: the head).
  const int64_t d = config_.d_model, f = config_.ffn_dim, layers = config_.num_layers;
  std::vector<ColumnSumJob> jobs(static_cast<size_t>((layers + 1) * kMaxJobsPerBatch));
  impl_->job_counts.assign(static_cast<size_t>(layers + 1), 0);
  impl_->job_max_n = std::max(d, f);
  auto add = [&](int64_t batch_index, int64_t region, int64_t group, int64_t width, int64_t ctas,
                 int64_t dst) {
    ColumnSumJob j;
    j.src = impl_->At<float>(region) + group * width;
    j.dst = grads_ + dst;
    j.n = width;
    j.stride = 3 * width;
    j.ctas = ctas;
    int& count = impl_->job_counts[static_cast<size_t>(batch_index)];
    jobs[static_cast<size_t>(batch_index * kMaxJobsPerBatch + count)] = j;
    ++count;
  };
  for (int64_t i = 0; i < layers; ++i) {
    const BlockOffsets& o = offsets_.blocks[static_cast<size_t>(i)];
    add(i, a.part_ffn, 0, f, a.part_ctas_ffn, o.ffn_sub_norm.weight);
    add(i, a.part_ffn, 1, f, a.part_ctas_ffn, o.ffn_sub_norm.bias);
    add(i, a.part_ffn, 2, f, a.part_ctas_ffn, o.fc1.bias);
    add(i, a.part_ln2, 0, d, a.part_ctas_d, o.ffn_norm.weight);
    add(i, a.part_ln2, 1, d, a.part_ctas_d, o.ffn_norm.bias);
    add(i, a.part_ln2, 2, d, a.part_ctas_d, o.out_proj.bias);
    add(i, a.part_sub1, 0, d, a.part_ctas_d, o.attn_sub_norm.weight);
    add(i, a.part_sub1, 1, d, a.part_ctas_d, o.attn_sub_norm.bias);
    add(i, a.part_rope, 0, d, a.part_ctas_d, o.q_proj.bias);
    add(i, a.part_rope, 1, d, a.part_ctas_d, o.k_proj.bias);
    add(i, a.part_rope, 2, d, a.part_ctas_d, o.v_proj.bias);
    add(i, a.part_ln1, 0, d, a.part_ctas_d, o.attn_norm.weight);
    add(i, a.part_ln1, 1, d, a.part_ctas_d, o.attn_norm.bias);
    if (i > 0) add(i, a.part_ln1, 2, d, a.part_ctas_d, offsets_.blocks[i - 1].fc2.bias);
  }
  add(layers, a.part_ln1, 0, d, a.part_ctas_d, offsets_.final_norm.weight);
  add(layers, a.part_ln1, 1, d, a.part_ctas_d, offsets_.final_norm.bias);
  add(layers, a.part_ln1, 2, d, a.part_ctas_d, offsets_.blocks[layers - 1].fc2.bias);
  MODEL_CUDA(cudaMemcpyAsync(impl_->jobs, jobs.data(), jobs.size() * sizeof(ColumnSumJob),
                             cudaMemcpyHostToDevice, stream_));
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  batch_ = batch;
  seq_len_ = seq_len;
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::PoisonArena() {
  // 0xFF bytes are NaN in bf16 and fp32; integer buffers (tokens, the embedding's tables) are
  // rewritten by every Forward before use, and the cross-entropy's partials too.
  MODEL_CUDA(
      cudaMemsetAsync(impl_->arena, 0xFF, static_cast<size_t>(impl_->layout.tokens), stream_));
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::UploadTokens(const TokenBatch& b) {
  const ArenaLayout& a = impl_->layout;
  const int64_t m = b.batch * b.seq_len, v = config_.vocab_size;
  MODEL_CUDA(cudaMemcpyAsync(impl_->At<int32_t>(a.tokens), b.tokens, static_cast<size_t>(m) * 4,
                             cudaMemcpyHostToDevice, stream_));
  if (b.targets != nullptr) {
    MODEL_CUDA(cudaMemcpyAsync(impl_->At<int32_t>(a.targets), b.targets, static_cast<size_t>(m) * 4,
                               cudaMemcpyHostToDevice, stream_));
  }
  // The embedding's backward pass: positions grouped by id (ascending), cut into items.
  std::vector<int64_t> count(static_cast<size_t>(v + 1), 0);
  for (int64_t t = 0; t < m; ++t) ++count[static_cast<size_t>(b.tokens[t]) + 1];
  for (int64_t i = 0; i < v; ++i) count[i + 1] += count[i];
  std::vector<int64_t> order(static_cast<size_t>(m));
  {
    std::vector<int64_t> next(count.begin(), count.end() - 1);
    for (int64_t t = 0; t < m; ++t) order[static_cast<size_t>(next[b.tokens[t]]++)] = t;
  }
  std::vector<EmbeddingItem> items;
  std::vector<int64_t> token_items(static_cast<size_t>(v + 1), 0);
  for (int64_t id = 0; id < v; ++id) {
    token_items[static_cast<size_t>(id)] = static_cast<int64_t>(items.size());
    for (int64_t at = count[id]; at < count[id + 1]; at += kEmbeddingItemRows) {
      EmbeddingItem it;
      it.begin = at;
      it.count = static_cast<int32_t>(std::min(kEmbeddingItemRows, count[id + 1] - at));
      it.token = static_cast<int32_t>(id);
      items.push_back(it);
    }
  }
  token_items[static_cast<size_t>(v)] = static_cast<int64_t>(items.size());
  if (static_cast<int64_t>(items.size()) > a.emb_max_items) {
    return absl::InternalError(
        absl::StrCat("embedding items ", items.size(), " > ", a.emb_max_items));
  }
  MODEL_CUDA(cudaMemcpyAsync(impl_->At<int64_t>(a.emb_order), order.data(),
                             order.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream_));
  if (!items.empty()) {
    MODEL_CUDA(cudaMemcpyAsync(impl_->At<EmbeddingItem>(a.emb_items), items.data(),
                               items.size() * sizeof(EmbeddingItem), cudaMemcpyHostToDevice,
                               stream_));
  }
  MODEL_CUDA(cudaMemcpyAsync(impl_->At<int64_t>(a.emb_token_items), token_items.data(),
                             token_items.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                             stream_));
  emb_num_items_ = static_cast<int64_t>(items.size());
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::PoisonScratch() {
  const ArenaLayout& a = impl_->layout;
  // dlogits .. the last partial-sum region are contiguous; then big and the norm scratch.
  MODEL_CUDA(cudaMemsetAsync(impl_->arena + a.dlogits, 0xFF,
                             static_cast<size_t>(a.tokens - a.dlogits), stream_));
  const int64_t m = a.rows;
  MODEL_CUDA(cudaMemsetAsync(
      impl_->arena + a.big, 0xFF,
      static_cast<size_t>(m * std::max(config_.ffn_dim, 3 * config_.d_model) * 2), stream_));
  if (a.norm_scratch >= 0) {
    MODEL_CUDA(cudaMemsetAsync(impl_->arena + a.norm_scratch, 0xFF,
                               static_cast<size_t>(m * config_.d_model * 2), stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::UploadRotary(const RotaryPlan& plan) {
  if (plan.block() == impl_->rotary_block) return absl::OkStatus();
  RotaryConsts c;
  c.pairs = static_cast<int>(plan.head_dim() / 2);
  c.block = plan.block();
  c.xpos = plan.xpos();
  for (int j = 0; j < c.pairs; ++j) {
    c.inv_freq[j] = plan.inv_freq()[static_cast<size_t>(j)];
    c.log2_zeta_over_base[j] =
        plan.log_zeta()[static_cast<size_t>(j)] / plan.scale_base() / std::log(2.0);
  }
  MODEL_CUDA(cudaMemcpyAsync(impl_->rotary, &c, sizeof(c), cudaMemcpyHostToDevice, stream_));
  MODEL_CUDA(cudaStreamSynchronize(stream_));
  impl_->rotary_block = plan.block();
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::Attention(int64_t set, bool backward) {
  const ArenaLayout& a = impl_->layout;
  const BlockSlots& s = a.sets[static_cast<size_t>(set)];
  const int64_t b = batch_, n = seq_len_, h = config_.num_heads, dh = config_.head_dim();
  const int64_t d = config_.d_model;
  const int dev = cuda_options_.device;
  auto view = [&](void* data, int64_t row) {
    TensorView t;
    t.data = data;
    t.dtype = DType::kBFloat16;
    t.device = Device::kCuda;
    t.device_index = dev;
    t.shape = {b, n, h, dh};
    t.strides = {n * row, row, dh, 1};
    return t;
  };
  bf16_t* qkv = impl_->At<bf16_t>(s.qkv);
  const TensorView lse = TensorView::Contiguous(impl_->At<float>(s.lse), DType::kFloat32, {b, h, n},
                                                Device::kCuda, dev);
  if (!backward) {
    ForwardArgs f;
    f.q = view(qkv, 3 * d);
    f.k = view(qkv + d, 3 * d);
    f.v = view(qkv + 2 * d, 3 * d);
    f.out = view(impl_->At<bf16_t>(s.attn), d);
    f.lse = lse;
    return impl_->attention->Forward(config_.attention_spec(), positions_, f);
  }
  const int64_t md = a.rows * d;
  bf16_t* big = impl_->At<bf16_t>(a.big);
  BackwardArgs g;
  g.q = view(qkv, 3 * d);
  g.k = view(qkv + d, 3 * d);
  g.v = view(qkv + 2 * d, 3 * d);
  g.out = view(impl_->At<bf16_t>(s.attn), d);
  g.lse = lse;
  g.dout = view(impl_->At<bf16_t>(a.tmp), d);
  g.dq = view(big, d);
  g.dk = view(big + md, d);
  g.dv = view(big + 2 * md, d);
  return impl_->attention->Backward(config_.attention_spec(), positions_, g);
}

absl::Status CudaLongNetLM::BlockForward(int64_t i, int64_t set, const void* x_in_v,
                                         void* x_out_v) {
  const ArenaLayout& a = impl_->layout;
  const BlockSlots& s = a.sets[static_cast<size_t>(set)];
  const WorkingBlock& w = working_.blocks[static_cast<size_t>(i)];
  const BlockOffsets& o = offsets_.blocks[static_cast<size_t>(i)];
  const int64_t m = a.rows, d = config_.d_model, f = config_.ffn_dim;
  const float eps = static_cast<float>(config_.layer_norm_eps);
  const bf16_t* x_in = static_cast<const bf16_t*>(x_in_v);
  bf16_t* x_out = static_cast<bf16_t*>(x_out_v);
  bf16_t* wk = impl_->working;
  Gemm& gemm = *impl_->gemm;
  auto stats = [&](int64_t off) { return impl_->At<float>(off); };
  // Attention branch.
  MODEL_CUDA(LayerNormForward(x_in, m, d, params_ + o.attn_norm.weight, params_ + o.attn_norm.bias,
                              eps, false, false, impl_->At<bf16_t>(s.ln1), stats(s.ln1_stats),
                              stats(s.ln1_stats) + m, num_sms_, stream_));
  GemmArgs qkv;
  qkv.op = GemmOp::kNT;
  qkv.rows = m, qkv.cols = 3 * d, qkv.k = d;
  qkv.a = impl_->At<bf16_t>(s.ln1), qkv.lda = d;
  qkv.b = wk + w.wqkv, qkv.ldb = d;
  qkv.c = impl_->At<bf16_t>(s.qkv), qkv.ldc = 3 * d;
  qkv.bias = wk + w.bqkv;
  DATTN_RETURN_IF_ERROR(gemm.Run(qkv));
  MODEL_CUDA(RotaryForward(impl_->At<bf16_t>(s.qkv), m, 3 * d, seq_len_, positions_.offset, d,
                           config_.head_dim(), impl_->rotary, num_sms_, stream_));
  if (qkv_observer_ && !in_backward_) {
    DATTN_RETURN_IF_ERROR(qkv_observer_(i, impl_->At<bf16_t>(s.qkv)));
  }
  DATTN_RETURN_IF_ERROR(Attention(set, /*backward=*/false));
  MODEL_CUDA(LayerNormForward(impl_->At<bf16_t>(s.attn), m, d, params_ + o.attn_sub_norm.weight,
                              params_ + o.attn_sub_norm.bias, eps, false, false,
                              impl_->At<bf16_t>(s.sub1), stats(s.sub1_stats),
                              stats(s.sub1_stats) + m, num_sms_, stream_));
  GemmArgs out;
  out.op = GemmOp::kNT;
  out.rows = m, out.cols = d, out.k = d;
  out.a = impl_->At<bf16_t>(s.sub1), out.lda = d;
  out.b = wk + w.wo, out.ldb = d;
  out.c = impl_->At<bf16_t>(s.x_mid), out.ldc = d;
  out.bias = wk + w.bo;
  out.residual = x_in;
  out.beta = 1.0f;
  DATTN_RETURN_IF_ERROR(gemm.Run(out));
  // Feed-forward branch.
  MODEL_CUDA(LayerNormForward(impl_->At<bf16_t>(s.x_mid), m, d, params_ + o.ffn_norm.weight,
                              params_ + o.ffn_norm.bias, eps, false, false,
                              impl_->At<bf16_t>(s.ln2), stats(s.ln2_stats), stats(s.ln2_stats) + m,
                              num_sms_, stream_));
  GemmArgs fc1;
  fc1.op = GemmOp::kNT;
  fc1.rows = m, fc1.cols = f, fc1.k = d;
  fc1.a = impl_->At<bf16_t>(s.ln2), fc1.lda = d;
  fc1.b = wk + w.w1, fc1.ldb = d;
  fc1.c = impl_->At<bf16_t>(s.h), fc1.ldc = f;
  fc1.bias = wk + w.b1;
  DATTN_RETURN_IF_ERROR(gemm.Run(fc1));
  MODEL_CUDA(LayerNormForward(impl_->At<bf16_t>(s.h), m, f, params_ + o.ffn_sub_norm.weight,
                              params_ + o.ffn_sub_norm.bias, eps, /*gelu=*/true, false,
                              impl_->At<bf16_t>(s.sub2), stats(s.sub2_stats),
                              stats(s.sub2_stats) + m, num_sms_, stream_));
  GemmArgs fc2;
  fc2.op = GemmOp::kNT;
  fc2.rows = m, fc2.cols = d, fc2.k = f;
  fc2.a = impl_->At<bf16_t>(s.sub2), fc2.lda = f;
  fc2.b = wk + w.w2, fc2.ldb = f;
  fc2.c = x_out, fc2.ldc = d;
  fc2.bias = wk + w.b2;
  fc2.residual = impl_->At<bf16_t>(s.x_mid);
  fc2.beta = 1.0f;
  return gemm.Run(fc2);
}

// which: 0 ln1 (from the block input), 1 sub1 (from the attention output), 2 ln2 (from x_mid),
// 3 sub2 (from h, through GELU): the forward's output recomputed from its saved statistics.
absl::Status CudaLongNetLM::RecomputeNorms(int64_t i, int64_t set, int which) {
  const ArenaLayout& a = impl_->layout;
  const BlockSlots& s = a.sets[static_cast<size_t>(set)];
  const BlockOffsets& o = offsets_.blocks[static_cast<size_t>(i)];
  const int64_t m = a.rows, d = config_.d_model, f = config_.ffn_dim;
  const float eps = static_cast<float>(config_.layer_norm_eps);
  struct Job {
    int64_t x, y, stats, n;
    NormOffsets norm;
    bool gelu;
  };
  const Job jobs[] = {
      {a.xs[static_cast<size_t>(i)], s.ln1, s.ln1_stats, d, o.attn_norm, false},
      {s.attn, s.sub1, s.sub1_stats, d, o.attn_sub_norm, false},
      {s.x_mid, s.ln2, s.ln2_stats, d, o.ffn_norm, false},
      {s.h, s.sub2, s.sub2_stats, f, o.ffn_sub_norm, true},
  };
  const Job& j = jobs[which];
  MODEL_CUDA(LayerNormForward(impl_->At<bf16_t>(j.x), m, j.n, params_ + j.norm.weight,
                              params_ + j.norm.bias, eps, j.gelu, /*use_saved_stats=*/true,
                              impl_->At<bf16_t>(j.y), impl_->At<float>(j.stats),
                              impl_->At<float>(j.stats) + m, num_sms_, stream_));
  return absl::OkStatus();
}

absl::Status CudaLongNetLM::BlockBackward(int64_t i, int64_t set, const void* x_in_v) {
  const ArenaLayout& a = impl_->layout;
  const BlockSlots& s = a.sets[static_cast<size_t>(set)];
  const WorkingBlock& w = working_.blocks[static_cast<size_t>(i)];
  const BlockOffsets& o = offsets_.blocks[static_cast<size_t>(i)];
  const int64_t m = a.rows, d = config_.d_model, f = config_.ffn_dim;
  const bf16_t* x_in = static_cast<const bf16_t*>(x_in_v);
  bf16_t* wk = impl_->working;
  Gemm& gemm = *impl_->gemm;
  bf16_t* dres = impl_->At<bf16_t>(a.dres);
  float* dres32 = impl_->At<float>(a.dres32);
  bf16_t* big = impl_->At<bf16_t>(a.big);
  bf16_t* tmp = impl_->At<bf16_t>(a.tmp);
  bf16_t* dqkv = impl_->At<bf16_t>(a.dqkv);
  auto stats = [&](int64_t off) { return impl_->At<float>(off); };
  // A weight gradient: dW[rows = out, cols = in] += dy[m, out]^T x[m, in].
  auto weight_grad = [&](const bf16_t* dy, int64_t ld_dy, const bf16_t* x, int64_t in, int64_t out,
                         int64_t grad_offset) {
    GemmArgs g;
    g.op = GemmOp::kTN;
    g.rows = out, g.cols = in, g.k = m;
    g.a = dy, g.lda = ld_dy;
    g.b = x, g.ldb = in;
    g.c = grads_ + grad_offset, g.ldc = in;
    g.c_fp32 = true;
    g.beta = 1.0f;
    return gemm.Run(g);
  };
  // An input gradient: dx[m, in] := dy[m, out] W[out, in].
  auto input_grad = [&](const bf16_t* dy, int64_t ld_dy, const bf16_t* weight, int64_t in,
                        int64_t out, bf16_t* dx) {
    GemmArgs g;
    g.op = GemmOp::kNN;
    g.rows = m, g.cols = in, g.k = out;
    g.a = dy, g.lda = ld_dy;
    g.b = weight, g.ldb = in;
    g.c = dx, g.ldc = in;
    return gemm.Run(g);
  };
  auto norm_backward = [&](const bf16_t* dy, const bf16_t* x, int64_t stats_off, int64_t n,
                           int64_t gain, bool gelu, NormGradOut out, bf16_t* out_bf16,
                           int64_t partials, bool bias_sums) {
    LayerNormBackwardArgs args;
    args.dy = dy;
    args.x = x;
    args.mean = stats(stats_off);
    args.rstd = stats(stats_off) + m;
    args.gain = params_ + gain;
    args.rows = m;
    args.n = n;
    args.gelu = gelu;
    args.out = out;
    args.out_bf16 = out_bf16;
    args.residual = dres32;
    args.partials = impl_->At<float>(partials);
    args.bias_sums = bias_sums;
    MODEL_CUDA(LayerNormBackward(args, num_sms_, stream_));
    return absl::OkStatus();
  };
  // Feed-forward branch: x_out = x_mid + fc2(sub2); dres holds d x_out.
  if (recompute_norms_) DATTN_RETURN_IF_ERROR(RecomputeNorms(i, set, 3));
  DATTN_RETURN_IF_ERROR(weight_grad(dres, d, impl_->At<bf16_t>(s.sub2), f, d, o.fc2.weight));
  DATTN_RETURN_IF_ERROR(input_grad(dres, d, wk + w.w2, f, d, big));
  DATTN_RETURN_IF_ERROR(norm_backward(big, impl_->At<bf16_t>(s.h), s.sub2_stats, f,
                                      o.ffn_sub_norm.weight, /*gelu=*/true, NormGradOut::kBf16, big,
                                      a.part_ffn, /*bias_sums=*/true));
  if (recompute_norms_) DATTN_RETURN_IF_ERROR(RecomputeNorms(i, set, 2));
  DATTN_RETURN_IF_ERROR(weight_grad(big, f, impl_->At<bf16_t>(s.ln2), d, f, o.fc1.weight));
  DATTN_RETURN_IF_ERROR(input_grad(big, f, wk + w.w1, d, f, tmp));
  DATTN_RETURN_IF_ERROR(norm_backward(tmp, impl_->At<bf16_t>(s.x_mid), s.ln2_stats, d,
                                      o.ffn_norm.weight, false, NormGradOut::kResidualAdd, dres,
                                      a.part_ln2, /*bias_sums=*/true));
  // Attention branch: x_mid = x_in + out_proj(sub1); dres holds d x_mid.
  if (recompute_norms_) DATTN_RETURN_IF_ERROR(RecomputeNorms(i, set, 1));
  DATTN_RETURN_IF_ERROR(weight_grad(dres, d, impl_->At<bf16_t>(s.sub1), d, d, o.out_proj.weight));
  DATTN_RETURN_IF_ERROR(input_grad(dres, d, wk + w.wo, d, d, tmp));
  DATTN_RETURN_IF_ERROR(norm_backward(tmp, impl_->At<bf16_t>(s.attn), s.sub1_stats, d,
                                      o.attn_sub_norm.weight, false, NormGradOut::kBf16, tmp,
                                      a.part_sub1, /*bias_sums=*/false));
  DATTN_RETURN_IF_ERROR(Attention(set, /*backward=*/true));
  const int64_t md = m * d;
  MODEL_CUDA(RotaryBackward(big, big + md, big + 2 * md, m, seq_len_, positions_.offset, d,
                            config_.head_dim(), impl_->rotary, dqkv, impl_->At<float>(a.part_rope),
                            num_sms_, stream_));
  if (recompute_norms_) DATTN_RETURN_IF_ERROR(RecomputeNorms(i, set, 0));
  const int64_t proj[3] = {o.q_proj.weight, o.k_proj.weight, o.v_proj.weight};
  for (int j = 0; j < 3; ++j) {
    DATTN_RETURN_IF_ERROR(
        weight_grad(dqkv + j * d, 3 * d, impl_->At<bf16_t>(s.ln1), d, d, proj[j]));
  }
  DATTN_RETURN_IF_ERROR(input_grad(dqkv, 3 * d, wk + w.wqkv, d, 3 * d, tmp));
  DATTN_RETURN_IF_ERROR(norm_backward(tmp, x_in, s.ln1_stats, d, o.attn_norm.weight, false,
                                      NormGradOut::kResidualAdd, dres, a.part_ln1,
                                      /*bias_sums=*/i > 0));
  MODEL_CUDA(ColumnSums(impl_->jobs + i * kMaxJobsPerBatch,
                        impl_->job_counts[static_cast<size_t>(i)], impl_->job_max_n, stream_));
  return absl::OkStatus();
}

absl::StatusOr<LossResult> CudaLongNetLM::Forward(const TokenBatch& b) {
  ready_for_backward_ = false;
  DATTN_RETURN_IF_ERROR(CheckTokenBatch(config_, b, 4));
  const SequencePositions positions =
      b.positions.total == 0 ? SequencePositions{0, b.seq_len} : b.positions;
  absl::StatusOr<RotaryPlan> rotary = RotaryPlan::Make(config_, positions.total);
  if (!rotary.ok()) return rotary.status();
  DATTN_RETURN_IF_ERROR(EnsureArena(b.batch, b.seq_len));
  DATTN_RETURN_IF_ERROR(UploadRotary(*rotary));
  positions_ = positions;
  logits_valid_ = false;
  const ArenaLayout& a = impl_->layout;
  const int64_t m = a.rows, d = config_.d_model, v = config_.vocab_size;
  const int64_t layers = config_.num_layers;
  if (options_.poison_scratch) DATTN_RETURN_IF_ERROR(PoisonArena());
  DATTN_RETURN_IF_ERROR(UploadTokens(b));
  has_targets_ = b.targets != nullptr;
  num_targets_ = 0;
  if (has_targets_) {
    for (int64_t t = 0; t < m; ++t) num_targets_ += b.targets[t] != kIgnoreTarget ? 1 : 0;
  }
  MODEL_CUDA(CastPackParams(params_, impl_->segments, impl_->num_segments, working_.size,
                            impl_->working, stream_));
  MODEL_CUDA(EmbeddingForward(impl_->At<int32_t>(a.tokens), m, impl_->working + working_.embedding,
                              d, impl_->At<bf16_t>(a.xs[0]), stream_));
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t set = options_.checkpoint_activations ? 0 : i;
    DATTN_RETURN_IF_ERROR(BlockForward(i, set, impl_->At<bf16_t>(a.xs[static_cast<size_t>(i)]),
                                       impl_->At<bf16_t>(a.xs[static_cast<size_t>(i + 1)])));
  }
  MODEL_CUDA(LayerNormForward(
      impl_->At<bf16_t>(a.xs[static_cast<size_t>(layers)]), m, d,
      params_ + offsets_.final_norm.weight, params_ + offsets_.final_norm.bias,
      static_cast<float>(config_.layer_norm_eps), false, false, impl_->At<bf16_t>(a.xf),
      impl_->At<float>(a.xf_stats), impl_->At<float>(a.xf_stats) + m, num_sms_, stream_));
  GemmArgs head;
  head.op = GemmOp::kNT;
  head.rows = m, head.cols = v, head.k = d;
  head.a = impl_->At<bf16_t>(a.xf), head.lda = d;
  head.b = impl_->working + working_.head, head.ldb = d;
  head.c = impl_->At<float>(a.logits), head.ldc = v;
  head.c_fp32 = true;
  DATTN_RETURN_IF_ERROR(impl_->gemm->Run(head));
  logits_valid_ = true;
  LossResult result;
  if (has_targets_) {
    MODEL_CUDA(CrossEntropyForward(impl_->At<float>(a.logits), impl_->At<int32_t>(a.targets), m, v,
                                   impl_->At<float>(a.row_lse), impl_->At<double>(a.ce_partials),
                                   impl_->At<double>(a.loss), stream_));
    MODEL_CUDA(cudaMemcpyAsync(impl_->pinned_loss, impl_->At<double>(a.loss), sizeof(double),
                               cudaMemcpyDeviceToHost, stream_));
    MODEL_CUDA(cudaStreamSynchronize(stream_));
    result.num_targets = num_targets_;
    result.loss_sum = num_targets_ > 0 ? *impl_->pinned_loss : 0.0;
    result.loss = num_targets_ > 0 ? result.loss_sum / static_cast<double>(num_targets_) : 0.0;
    ready_for_backward_ = true;
  }
  return result;
}

absl::Status CudaLongNetLM::Backward(const BackwardOptions& options) {
  if (!ready_for_backward_) {
    return absl::FailedPreconditionError(
        "Backward needs a successful Forward with targets since the last failure or creation");
  }
  if (!std::isfinite(options.loss_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Backward: loss_scale ", options.loss_scale, " is not finite"));
  }
  ready_for_backward_ = false;
  // The checkpointed blocks' recomputation below is not a Forward: the qkv observer stays quiet.
  in_backward_ = true;
  const absl::Status status = RunBackward(options);
  in_backward_ = false;
  return status;
}

absl::Status CudaLongNetLM::RunBackward(const BackwardOptions& options) {
  const ArenaLayout& a = impl_->layout;
  const int64_t m = a.rows, d = config_.d_model, v = config_.vocab_size;
  const int64_t layers = config_.num_layers;
  if (options_.poison_scratch) DATTN_RETURN_IF_ERROR(PoisonScratch());
  if (options.grads == Accumulate::kOverwrite) {
    MODEL_CUDA(cudaMemsetAsync(grads_, 0, static_cast<size_t>(layout_.total()) * 4, stream_));
  }
  // Each range of the gradient is handed to options.on_grads_final once the work that finishes
  // it is enqueued (later work on the stream sees it; nothing later in this pass writes it).
  const std::vector<ElementRange> finish = BackwardFinishOrder(offsets_, layout_.total());
  auto finished = [&](int64_t k) {
    if (!options.on_grads_final) return absl::OkStatus();
    const ElementRange& r = finish[static_cast<size_t>(k)];
    return options.on_grads_final(r.begin, r.end);
  };
  const double scale =
      num_targets_ > 0 ? options.loss_scale / static_cast<double>(num_targets_) : 0.0;
  bf16_t* dlogits = impl_->At<bf16_t>(a.dlogits);
  MODEL_CUDA(CrossEntropyBackward(impl_->At<float>(a.logits), impl_->At<float>(a.row_lse),
                                  impl_->At<int32_t>(a.targets), m, v, static_cast<float>(scale),
                                  dlogits, stream_));
  const int64_t head = config_.tie_embeddings ? offsets_.token_embedding : offsets_.lm_head;
  GemmArgs dw;
  dw.op = GemmOp::kTN;
  dw.rows = v, dw.cols = d, dw.k = m;
  dw.a = dlogits, dw.lda = v;
  dw.b = impl_->At<bf16_t>(a.xf), dw.ldb = d;
  dw.c = grads_ + head, dw.ldc = d;
  dw.c_fp32 = true;
  dw.beta = 1.0f;
  DATTN_RETURN_IF_ERROR(impl_->gemm->Run(dw));
  GemmArgs dx;
  dx.op = GemmOp::kNN;
  dx.rows = m, dx.cols = d, dx.k = v;
  dx.a = dlogits, dx.lda = v;
  dx.b = impl_->working + working_.head, dx.ldb = d;
  dx.c = impl_->At<bf16_t>(a.tmp), dx.ldc = d;
  DATTN_RETURN_IF_ERROR(impl_->gemm->Run(dx));
  LayerNormBackwardArgs fin;
  fin.dy = impl_->At<bf16_t>(a.tmp);
  fin.x = impl_->At<bf16_t>(a.xs[static_cast<size_t>(layers)]);
  fin.mean = impl_->At<float>(a.xf_stats);
  fin.rstd = impl_->At<float>(a.xf_stats) + m;
  fin.gain = params_ + offsets_.final_norm.weight;
  fin.rows = m;
  fin.n = d;
  fin.out = NormGradOut::kResidualSet;
  fin.out_bf16 = impl_->At<bf16_t>(a.dres);
  fin.residual = impl_->At<float>(a.dres32);
  fin.partials = impl_->At<float>(a.part_ln1);
  fin.bias_sums = true;
  MODEL_CUDA(LayerNormBackward(fin, num_sms_, stream_));
  MODEL_CUDA(ColumnSums(impl_->jobs + layers * kMaxJobsPerBatch,
                        impl_->job_counts[static_cast<size_t>(layers)], impl_->job_max_n, stream_));
  // The final norm's sums are in (and the untied head's GEMM); the last block's fc2 bias too,
  // which is the block's range, handed after its backward.
  DATTN_RETURN_IF_ERROR(finished(0));
  for (int64_t i = layers - 1; i >= 0; --i) {
    const bf16_t* x_in = impl_->At<bf16_t>(a.xs[static_cast<size_t>(i)]);
    int64_t set = i;
    if (options_.checkpoint_activations) {
      // Recompute the block's activations from its saved input; its output xs[i + 1] is
      // rewritten with the same bits (block i + 1's backward, its last reader, is done).
      set = 0;
      DATTN_RETURN_IF_ERROR(
          BlockForward(i, 0, x_in, impl_->At<bf16_t>(a.xs[static_cast<size_t>(i + 1)])));
    }
    // Block i's sums (ColumnSums of batch i) also finish block i - 1's fc2 bias, which is in
    // block i - 1's range, handed after that block.
    DATTN_RETURN_IF_ERROR(BlockBackward(i, set, x_in));
    DATTN_RETURN_IF_ERROR(finished(layers - i));
  }
  MODEL_CUDA(EmbeddingBackward(
      impl_->At<int64_t>(a.emb_order), impl_->At<EmbeddingItem>(a.emb_items), emb_num_items_,
      impl_->At<int64_t>(a.emb_token_items), v, impl_->At<float>(a.dres32), d,
      impl_->At<float>(a.emb_partial), grads_ + offsets_.token_embedding, stream_));
  DATTN_RETURN_IF_ERROR(finished(layers + 1));
  ready_for_backward_ = true;
  return absl::OkStatus();
}

#undef MODEL_CUDA

}  // namespace cuda
}  // namespace model
}  // namespace dattn
