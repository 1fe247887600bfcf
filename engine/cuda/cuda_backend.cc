#include "engine/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "engine/cuda/attention_kernels.h"
#include "engine/cuda/block_calls.h"
#include "engine/cuda/call_views.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/cudnn_sdpa.h"
#include "engine/cuda/device_scope.h"
#include "engine/cuda/dilated_kernels.h"
#include "engine/cuda/hopper_attention.h"
#include "engine/cuda/hopper_backward.h"
#include "engine/cuda/stream_scratch.h"
#include "engine/validate.h"

namespace dattn {
namespace {

using cuda::BlockCall;
using cuda::CallPlan;
using cuda::CallRole;
using cuda::CallRowsOf;
using cuda::CallScratch;
using cuda::CudnnReadable;
using cuda::DeviceScope;
using cuda::ElemType;
using cuda::ElemTypeOf;
using cuda::HeadRule;
using cuda::IsHalfType;
using cuda::KernelTensor;
using cuda::PackedTensor;
using cuda::PlannedCall;
using cuda::ProblemDims;
using cuda::RowSpace;
using cuda::StridesOf;
using cuda::ViewTensor;

// Full segments of different batch items share one call only if every tensor's batch stride is N
// times its position stride.
bool CanFoldBatches(const std::vector<const TensorView*>& tensors, int64_t seq_len) {
  for (const TensorView* t : tensors) {
    if (t->strides[0] != seq_len * t->strides[1]) return false;
  }
  return true;
}

HeadRule GroupRule(const AttentionSpec& spec, int pattern, int64_t num_heads) {
  const dilation::HeadRange range = dilation::GroupHeads(num_heads, spec.num_patterns(), pattern);
  HeadRule rule;
  rule.kind = HeadRule::kFixed;
  rule.head_begin = range.begin;
  rule.head_end = range.end;
  rule.segment = spec.segment_lengths[pattern];
  rule.rate = spec.dilation_rates[pattern];
  rule.fixed_offset = pattern % rule.rate;
  return rule;
}

HeadRule MixtureRule(const AttentionSpec& spec, int pattern, int64_t num_heads) {
  HeadRule rule;
  rule.kind = spec.head_offsets == HeadOffsets::kBlocked ? HeadRule::kBlocked : HeadRule::kModulo;
  rule.head_begin = 0;
  rule.head_end = num_heads;
  rule.segment = spec.segment_lengths[pattern];
  rule.rate = spec.dilation_rates[pattern];
  rule.block = num_heads / rule.rate + (num_heads % rule.rate != 0 ? 1 : 0);
  return rule;
}

// One call's device scratch: one block from the pool (cuda::StreamScratch) holding the parts a
// cuda::CallScratch layout places at offsets.
class Workspace {
 public:
  Workspace(cudaMemPool_t pool, cudaStream_t stream) : scratch_(pool, stream) {}
  absl::Status Reserve(int64_t bytes) {
    if (bytes <= 0) return absl::OkStatus();  // a call that needs none takes none
    absl::StatusOr<char*> p = scratch_.Take(bytes);
    if (!p.ok()) return p.status();
    base_ = *p;
    return absl::OkStatus();
  }
  // The part at `offset` of the scratch slot at `slot`; nullptr for a part the layout lacks (a
  // negative offset).
  template <typename T>
  T* At(int64_t offset, int64_t slot = 0) const {
    return offset < 0 ? nullptr : reinterpret_cast<T*>(base_ + slot + offset);
  }
  int64_t bytes() const { return scratch_.taken_bytes(); }

 private:
  cuda::StreamScratch scratch_;
  char* base_ = nullptr;
};

// How one planned call runs: which engine and where its scratch lies.
struct CallExec {
  const PlannedCall* planned = nullptr;
  bool cudnn = false;
  bool own_hopper = false;  // our own Hopper kernel(s) (else cuDNN or the CUDA-core kernel)
  // Grouped mode, own Hopper kernel: the unselected rows around this call's rows, which the kernel
  // clears when it can for every call of the pattern (zeros_ok); otherwise `zeros` is emptied and a
  // fill pass clears the pattern's rows.
  cuda::UnselectedRows zeros;
  bool zeros_ok = false;
  CallScratch scratch;
};

// Where one call's work goes (CudaBackendOptions::overlap_calls): its stream, the item counter of
// our Hopper kernels on that stream, and the offset of its scratch slot in the workspace.
struct CallSlot {
  cudaStream_t stream = nullptr;
  unsigned* counter = nullptr;
  int64_t base = 0;
};

class CudaBackendImpl : public CudaAttentionBackend {
 public:
  struct Resources {
    cudaStream_t stream = nullptr;
    bool owns_stream = false;
    cudaStream_t aux = nullptr;
    cudaEvent_t fork = nullptr;
    cudaEvent_t join = nullptr;
    // The second stream of overlapping calls, with its fork and join events.
    cudaStream_t calls2 = nullptr;
    cudaEvent_t fork2 = nullptr;
    cudaEvent_t join2 = nullptr;
    cudaMemPool_t pool = nullptr;
    std::unique_ptr<cuda::CudnnSdpa> sdpa;
    // Device: the own Hopper kernels' work counters, one per calls stream; null where those
    // kernels do not run.
    unsigned* item_counter = nullptr;
    unsigned* item_counter2 = nullptr;
  };

  CudaBackendImpl(const CudaBackendOptions& options, Resources r)
      : options_(options),
        caps_(CudaBackendCaps()),
        stream_(r.stream),
        owns_stream_(r.owns_stream),
        aux_(r.aux),
        fork_(r.fork),
        join_(r.join),
        calls2_(r.calls2),
        fork2_(r.fork2),
        join2_(r.join2),
        pool_(r.pool),
        sdpa_(std::move(r.sdpa)),
        item_counter_(r.item_counter),
        item_counter2_(r.item_counter2) {}

  ~CudaBackendImpl() override {
    DeviceScope guard;
    (void)guard.Enter(options_.device);
    cudaStreamSynchronize(stream_);
    cudaStreamSynchronize(aux_);
    cudaStreamSynchronize(calls2_);
    sdpa_.reset();
    cudaMemPoolDestroy(pool_);
    cudaFree(item_counter_);
    cudaFree(item_counter2_);
    cudaEventDestroy(fork_);
    cudaEventDestroy(join_);
    cudaEventDestroy(fork2_);
    cudaEventDestroy(join2_);
    for (cudaEvent_t e : pattern_events_) cudaEventDestroy(e);
    cudaStreamDestroy(aux_);
    cudaStreamDestroy(calls2_);
    if (owns_stream_) cudaStreamDestroy(stream_);
  }

  const BackendCaps& caps() const override { return caps_; }
  cudaStream_t stream() const override { return stream_; }
  cudaMemPool_t pool() const override { return pool_; }
  std::string last_fallback_reason() const override { return last_fallback_; }

  CudaBackendStats stats() const override {
    CudaBackendStats s = stats_;
    if (sdpa_ != nullptr) {
      s.cudnn_plans_built = sdpa_->counters().plans_built;
      s.max_library_workspace = sdpa_->counters().max_workspace;
    }
    return s;
  }

  absl::Status Synchronize() override {
    DeviceScope guard;
    DATTN_RETURN_IF_ERROR(guard.Enter(options_.device));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  absl::Status TrimPool() override {
    DATTN_RETURN_IF_ERROR(Synchronize());
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemPoolTrimTo(pool_, 0));
    return absl::OkStatus();
  }

  absl::Status Forward(const AttentionSpec& spec, const ForwardArgs& args) override {
    DATTN_RETURN_IF_ERROR(ValidateForward(spec, args, caps_));
    DATTN_RETURN_IF_ERROR(CheckDevice(args.q));
    DeviceScope guard;
    DATTN_RETURN_IF_ERROR(guard.Enter(options_.device));

    const ProblemDims dims{args.q.shape[0], args.q.shape[1], args.q.shape[2], args.q.shape[3]};
    const DType dtype = args.q.dtype;
    const bool cudnn = sdpa_ != nullptr && IsHalfType(dtype);
    cuda::PlanInputs in;
    in.dtype = dtype;
    in.backward = false;
    in.use_cudnn = cudnn;
    in.fold_batches = CanFoldBatches({&args.q, &args.k, &args.v, &args.out}, dims.seq_len);
    in.workspace_limit = options_.workspace_limit_bytes;
    const int g = spec.num_patterns();
    const bool grouped = spec.mode == AttentionMode::kGrouped;
    using ForwardKernel = CudaBackendOptions::ForwardKernel;
    const bool own_hopper =
        item_counter_ != nullptr && IsHalfType(dtype) &&
        (options_.forward_kernel == ForwardKernel::kOwnHopper ||
         (options_.forward_kernel == ForwardKernel::kAuto && options_.use_cudnn));
    in.hopper = own_hopper && (dims.head_dim == 64 || dims.head_dim == 128);
    in.overlap_calls = options_.overlap_calls;
    const CallPlan plan = cuda::PlanBlockCalls(spec, dims, in);
    const float scale = static_cast<float>(spec.ScaleFor(dims.head_dim));

    // Grouped mode's 1/G: in our own Hopper kernel's epilogue where it runs (calls it cannot take
    // get a pass over their own rows); else in the fused call (probabilities scaled before P V)
    // when cuDNN takes that graph; otherwise a pass over each pattern's selected rows.
    const bool scale_per_call = grouped && g > 1 && own_hopper;
    float p_scale = 1.0f;
    if (grouped && g > 1 && !own_hopper &&
        options_.group_scale != CudaBackendOptions::GroupScale::kPass) {
      if (cudnn && p_scale_state_ == PScale::kUnknown && !plan.calls.empty()) {
        ProbePScale(spec, args, dims, plan.calls.front(), scale, 1.0f / g);
      }
      if (p_scale_state_ != PScale::kUnsupported) p_scale = 1.0f / g;
    }
    const bool scale_pass = grouped && g > 1 && p_scale == 1.0f && !scale_per_call;

    // Engines and scratch of every call first (plans are built here, on the host), so that the
    // workspace is taken once, at its final size.
    std::vector<CallExec> execs;
    int64_t slot_bytes = plan.slot_bytes;
    for (const PlannedCall& pc : plan.calls) {
      CallExec e;
      e.planned = &pc;
      cuda::SdpaForwardArgs a = SdpaForward(spec, args, dims, pc, scale, p_scale);
      if (own_hopper) {
        // The scratch pointers are not known yet; placeholders let the check see them.
        char* const placeholder = reinterpret_cast<char*>(uintptr_t{256});
        const cuda::KernelForwardArgs k =
            KernelForward(spec, args, dims, pc, scale, 1.0f, placeholder, nullptr);
        e.own_hopper = cuda::HopperForwardSupported(k);
        if (e.own_hopper && grouped && pc.role == CallRole::kDirect && pc.call.rate > 1) {
          e.zeros = GroupZeros(pc.call, dims.seq_len, k.o.seq);
          e.zeros_ok = cuda::HopperForwardSupported(k, e.zeros);
        }
      }
      if (e.own_hopper) {
        e.scratch = cuda::LayoutCallScratch(pc.call, pc.role, false, false, dtype, dims.head_dim, 0,
                                            false, /*hopper=*/true);
      } else if (cudnn && ForwardReadable(args, dims, pc)) {
        absl::StatusOr<int64_t> library = sdpa_->ForwardWorkspace(a);
        if (library.ok()) {
          e.cudnn = true;
          e.scratch = cuda::LayoutCallScratch(pc.call, pc.role, false, true, dtype, dims.head_dim,
                                              *library);
        } else {
          NoteFallback(library.status());
        }
      }
      if (!e.cudnn && !e.own_hopper) {
        e.scratch =
            cuda::LayoutCallScratch(pc.call, pc.role, false, false, dtype, dims.head_dim, 0);
      }
      slot_bytes = std::max(slot_bytes, e.scratch.total);
      execs.push_back(e);
    }
    const std::vector<bool> kernel_zeros =
        grouped && own_hopper ? KernelZeroPatterns(spec, dims, execs) : std::vector<bool>(g, false);
    Workspace ws(pool_, stream_);
    DATTN_RETURN_IF_ERROR(ws.Reserve(plan.slots * slot_bytes));
    const bool overlap = Overlaps(plan, execs);

    const RowSpace space{dims.batch, dims.seq_len, dims.num_heads, dims.head_dim};
    const ElemType et = ElemTypeOf(dtype);
    float* lse = static_cast<float*>(args.lse.data);
    // The fills touch only rows (and lse entries) the fused calls do not write, so they run on the
    // second stream meanwhile; mixture merges read them, so they join before the first merge.
    cudaStream_t fills = options_.overlap_fills ? aux_ : stream_;
    DATTN_RETURN_IF_ERROR(Fork(fills));
    if (grouped) {
      for (int i = 0; i < g; ++i) {
        const HeadRule rule = GroupRule(spec, i, dims.num_heads);
        // Rate 1 selects every position: nothing to clear.
        if (!scale_pass && !kernel_zeros[i] && rule.rate > 1) {
          DATTN_CUDA_RETURN_IF_ERROR(
              cuda::LaunchFillRows(args.out.data, et, space, rule, false, 1.0f, fills));
        }
        DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchFillLse(lse, space, rule, fills));
      }
    } else {
      // Rows the directly written pattern does not select start empty; the others merge in.
      const HeadRule rule = MixtureRule(spec, plan.direct_pattern, dims.num_heads);
      DATTN_CUDA_RETURN_IF_ERROR(
          cuda::LaunchFillRows(args.out.data, et, space, rule, false, 1.0f, fills));
      DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchFillLse(lse, space, rule, fills));
    }
    bool joined = false;
    // calls2_ joins the main stream on every way out (an error return too), before the workspace
    // goes back to the pool on the main stream.
    if (overlap) DATTN_RETURN_IF_ERROR(ForkCalls());
    absl::Cleanup join_calls = [this, overlap] {
      if (overlap) (void)JoinCalls();
    };
    for (size_t i = 0; i < execs.size(); ++i) {
      const CallExec& e = execs[i];
      if (!joined && e.planned->role == CallRole::kMerge) {
        DATTN_RETURN_IF_ERROR(Join(fills));
        joined = true;
      }
      if (overlap && NewPattern(execs, i)) DATTN_RETURN_IF_ERROR(CrossWaitCalls());
      DATTN_RETURN_IF_ERROR(EnqueueForward(spec, args, dims, e, scale,
                                           scale_per_call && e.own_hopper ? 1.0f / g : p_scale, ws,
                                           SlotOf(i, overlap, slot_bytes)));
      if (scale_per_call && !e.own_hopper) {
        DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchScaleRows(
            args.out.data, 1.0f / g, et, CallRowsOf(e.planned->call), space, stream_));
      }
      const int pattern = e.planned->call.pattern;
      const bool pattern_done =
          i + 1 == execs.size() || execs[i + 1].planned->call.pattern != pattern;
      if (scale_pass && pattern_done) {
        // The pattern's fused calls wrote A; grouped mode wants A / G there and 0 on the group's
        // other rows. That pass runs on the fill stream once this pattern is done, meanwhile the
        // next patterns attend (patterns come largest first, so the last pass is the smallest).
        DATTN_RETURN_IF_ERROR(After(fills, pattern));
        DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchFillRows(args.out.data, et, space,
                                                        GroupRule(spec, pattern, dims.num_heads),
                                                        true, 1.0f / g, fills));
      }
    }
    if (scale_pass) {
      // Groups whose pattern selected nothing had no call; their rows are all zero.
      std::vector<bool> seen(g, false);
      for (const CallExec& e : execs) seen[e.planned->call.pattern] = true;
      for (int i = 0; i < g; ++i) {
        if (seen[i]) continue;
        DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchFillRows(
            args.out.data, et, space, GroupRule(spec, i, dims.num_heads), false, 1.0f, fills));
      }
      ++stats_.p_scale_passes;
    }
    if (!joined) DATTN_RETURN_IF_ERROR(Join(fills));
    std::move(join_calls).Cancel();
    if (overlap) DATTN_RETURN_IF_ERROR(JoinCalls());
    stats_.last_workspace_bytes = ws.bytes();
    if (options_.synchronize) return Synchronize();
    return absl::OkStatus();
  }

  absl::Status Backward(const AttentionSpec& spec, const BackwardArgs& args) override {
    DATTN_RETURN_IF_ERROR(ValidateBackward(spec, args, caps_));
    DATTN_RETURN_IF_ERROR(CheckDevice(args.q));
    DeviceScope guard;
    DATTN_RETURN_IF_ERROR(guard.Enter(options_.device));

    const ProblemDims dims{args.q.shape[0], args.q.shape[1], args.q.shape[2], args.q.shape[3]};
    const DType dtype = args.q.dtype;
    const bool cudnn = sdpa_ != nullptr && IsHalfType(dtype);
    cuda::PlanInputs in;
    in.dtype = dtype;
    in.backward = true;
    in.use_cudnn = cudnn;
    in.fold_batches = CanFoldBatches(
        {&args.q, &args.k, &args.v, &args.out, &args.dout, &args.dq, &args.dk, &args.dv},
        dims.seq_len);
    in.workspace_limit = options_.workspace_limit_bytes;
    using BackwardKernel = CudaBackendOptions::BackwardKernel;
    const bool own_hopper =
        item_counter_ != nullptr && IsHalfType(dtype) &&
        (dims.head_dim == 64 || dims.head_dim == 128) &&
        (options_.backward_kernel == BackwardKernel::kOwnHopper ||
         (options_.backward_kernel == BackwardKernel::kAuto && options_.use_cudnn));
    in.hopper = own_hopper;
    in.overlap_calls = options_.overlap_calls;
    const CallPlan plan = cuda::PlanBlockCalls(spec, dims, in);
    const int g = spec.num_patterns();
    const bool grouped = spec.mode == AttentionMode::kGrouped;
    const bool scaled_out = cuda::NeedsScaledOut(spec, true, cudnn);

    std::vector<CallExec> execs;
    int64_t slot_bytes = plan.slot_bytes;
    for (const PlannedCall& pc : plan.calls) {
      CallExec e;
      e.planned = &pc;
      if (own_hopper) {
        // The scratch pointers are not known yet; placeholders let the check see them.
        float* const placeholder = reinterpret_cast<float*>(uintptr_t{256});
        const cuda::KernelBackwardArgs k = KernelBackward(
            spec, args, dims, pc, DirectGrads(args, dims, pc), placeholder, placeholder);
        e.own_hopper = cuda::HopperBackwardSupported(k);
        if (e.own_hopper && grouped && pc.call.rate > 1) {
          e.zeros = GroupZeros(pc.call, dims.seq_len, k.dq.seq);
          e.zeros_ok = cuda::HopperBackwardSupported(k, e.zeros);
        }
      }
      if (e.own_hopper) {
        e.scratch = cuda::LayoutCallScratch(pc.call, pc.role, true, false, dtype, dims.head_dim, 0,
                                            false, /*hopper=*/true);
      } else if (cudnn && BackwardReadable(args, dims, pc)) {
        absl::StatusOr<int64_t> library =
            sdpa_->BackwardWorkspace(SdpaBackward(spec, args, dims, pc));
        if (library.ok()) {
          e.cudnn = true;
          e.scratch = cuda::LayoutCallScratch(pc.call, pc.role, true, true, dtype, dims.head_dim,
                                              *library, scaled_out);
        } else {
          NoteFallback(library.status());
        }
      }
      if (!e.cudnn && !e.own_hopper) {
        e.scratch = cuda::LayoutCallScratch(pc.call, pc.role, true, false, dtype, dims.head_dim, 0);
      }
      slot_bytes = std::max(slot_bytes, e.scratch.total);
      execs.push_back(e);
    }
    // Grouped: the groups whose zeros our kernels write next to their rows need no fill.
    const std::vector<bool> kernel_zeros =
        grouped && own_hopper ? KernelZeroPatterns(spec, dims, execs) : std::vector<bool>(g, false);
    Workspace ws(pool_, stream_);
    DATTN_RETURN_IF_ERROR(ws.Reserve(plan.slots * slot_bytes));
    const bool overlap = Overlaps(plan, execs);

    const RowSpace space{dims.batch, dims.seq_len, dims.num_heads, dims.head_dim};
    const ElemType et = ElemTypeOf(dtype);
    void* grads[3] = {args.dq.data, args.dk.data, args.dv.data};
    // Rows of dq, dk, dv that the directly written calls leave alone are cleared meanwhile on the
    // second stream; accumulation (mixture) joins first.
    cudaStream_t fills = options_.overlap_fills ? aux_ : stream_;
    DATTN_RETURN_IF_ERROR(Fork(fills));
    for (int i = 0; i < (grouped ? g : 1); ++i) {
      if (kernel_zeros[i]) continue;
      const HeadRule rule = grouped ? GroupRule(spec, i, dims.num_heads)
                                    : MixtureRule(spec, plan.direct_pattern, dims.num_heads);
      for (void* grad : grads) {
        DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchFillRows(grad, et, space, rule, false, 1.0f, fills));
      }
    }
    bool joined = false;
    // calls2_ joins the main stream on every way out (an error return too), before the workspace
    // goes back to the pool on the main stream.
    if (overlap) DATTN_RETURN_IF_ERROR(ForkCalls());
    absl::Cleanup join_calls = [this, overlap] {
      if (overlap) (void)JoinCalls();
    };
    for (size_t i = 0; i < execs.size(); ++i) {
      const CallExec& e = execs[i];
      if (!joined && e.planned->role == CallRole::kMerge) {
        DATTN_RETURN_IF_ERROR(Join(fills));
        joined = true;
      }
      if (overlap && NewPattern(execs, i)) DATTN_RETURN_IF_ERROR(CrossWaitCalls());
      DATTN_RETURN_IF_ERROR(
          EnqueueBackward(spec, args, dims, e, ws, SlotOf(i, overlap, slot_bytes)));
    }
    if (!joined) DATTN_RETURN_IF_ERROR(Join(fills));
    std::move(join_calls).Cancel();
    if (overlap) DATTN_RETURN_IF_ERROR(JoinCalls());
    stats_.last_workspace_bytes = ws.bytes();
    if (options_.synchronize) return Synchronize();
    return absl::OkStatus();
  }

 private:
  enum class PScale { kUnknown, kSupported, kUnsupported };

  absl::Status CheckDevice(const TensorView& q) const {
    if (q.device_index != options_.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "q is on cuda:", q.device_index, " but this CUDA backend runs on cuda:", options_.device,
          "; create one backend per device"));
    }
    return absl::OkStatus();
  }

  // Grouped mode: whether our Hopper kernels write the zeros of pattern i's group, i.e. every call
  // of the pattern clears its own unselected rows (zeros_ok) and every segment has a call (a
  // segment whose selection is empty has none). The other calls' zeros are emptied: their
  // patterns get a fill pass.
  static std::vector<bool> KernelZeroPatterns(const AttentionSpec& spec, const ProblemDims& dims,
                                              std::vector<CallExec>& execs) {
    const int g = spec.num_patterns();
    std::vector<bool> kernel_zeros(g, false);
    for (int i = 0; i < g; ++i) {
      const int64_t w = spec.segment_lengths[i], r = spec.dilation_rates[i], o = i % r;
      const int64_t partial = dims.seq_len % w;
      bool all = r > 1 && w > o && (partial == 0 || partial > o);
      bool any = false;
      for (const CallExec& e : execs) {
        if (e.planned->call.pattern != i) continue;
        any = true;
        all = all && e.zeros_ok;
      }
      kernel_zeros[i] = all && any;
    }
    for (CallExec& e : execs) {
      if (!kernel_zeros[e.planned->call.pattern]) e.zeros = cuda::UnselectedRows();
    }
    return kernel_zeros;
  }

  // Orders `fills` after the work enqueued so far on the main stream.
  absl::Status Fork(cudaStream_t fills) {
    if (fills == stream_) return absl::OkStatus();
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, stream_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(fills, fork_, 0));
    return absl::OkStatus();
  }

  // Orders `fills` after the work enqueued so far on the main stream, with the event of `pattern`
  // (one event per pattern, so that the fill stream can wait on several points of one call).
  absl::Status After(cudaStream_t fills, int pattern) {
    if (fills == stream_) return absl::OkStatus();
    while (static_cast<int>(pattern_events_.size()) <= pattern) {
      cudaEvent_t e = nullptr;
      DATTN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      pattern_events_.push_back(e);
    }
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventRecord(pattern_events_[pattern], stream_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(fills, pattern_events_[pattern], 0));
    return absl::OkStatus();
  }

  // Orders the main stream after the work enqueued so far on `fills`.
  absl::Status Join(cudaStream_t fills) {
    if (fills == stream_) return absl::OkStatus();
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_, fills));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, join_, 0));
    return absl::OkStatus();
  }

  // Whether consecutive calls go to two streams in turn: the plan gave them two scratch slots
  // (overlap_calls) and every call runs on our Hopper kernels (cuDNN's handle and the CUDA-core
  // kernel's calls stay on the main stream; cuDNN's mixture merges also share a tile).
  bool Overlaps(const CallPlan& plan, const std::vector<CallExec>& execs) const {
    if (plan.slots < 2 || item_counter2_ == nullptr) return false;
    for (const CallExec& e : execs) {
      if (!e.own_hopper) return false;
    }
    return true;
  }

  // Call i's stream, item counter and scratch slot: odd calls on calls2_ when overlapping (counted
  // in second_stream_calls).
  CallSlot SlotOf(size_t i, bool overlap, int64_t slot_bytes) {
    if (overlap && i % 2 == 1) {
      ++stats_.second_stream_calls;
      return {calls2_, item_counter2_, slot_bytes};
    }
    return {stream_, item_counter_, 0};
  }

  // Orders calls2_ after the work enqueued so far on the main stream.
  absl::Status ForkCalls() {
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork2_, stream_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(calls2_, fork2_, 0));
    return absl::OkStatus();
  }

  // Mixture mode: whether call i is the first of a pattern after another pattern's calls, which
  // added into the same rows (the fills joined just before the first merge are ordered too: they
  // are on the main stream by then).
  static bool NewPattern(const std::vector<CallExec>& execs, size_t i) {
    return i > 0 && execs[i].planned->role == CallRole::kMerge &&
           execs[i].planned->call.pattern != execs[i - 1].planned->call.pattern;
  }

  // Orders both calls streams after the work enqueued so far on either.
  absl::Status CrossWaitCalls() {
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork2_, stream_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventRecord(join2_, calls2_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(calls2_, fork2_, 0));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, join2_, 0));
    return absl::OkStatus();
  }

  // Orders the main stream after the work enqueued so far on calls2_ (before the workspace goes
  // back to the pool on the main stream).
  absl::Status JoinCalls() {
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventRecord(join2_, calls2_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, join2_, 0));
    return absl::OkStatus();
  }

  void NoteFallback(const absl::Status& why) {
    ++stats_.cudnn_fallbacks;
    last_fallback_ = std::string(why.message());
  }

  bool ForwardReadable(const ForwardArgs& args, const ProblemDims& dims, const PlannedCall& pc) {
    const BlockCall& c = pc.call;
    return CudnnReadable(ViewTensor(args.q, c, dims.seq_len)) &&
           CudnnReadable(ViewTensor(args.k, c, dims.seq_len)) &&
           CudnnReadable(ViewTensor(args.v, c, dims.seq_len)) &&
           (pc.role == CallRole::kMerge || CudnnReadable(ViewTensor(args.out, c, dims.seq_len)));
  }

  bool BackwardReadable(const BackwardArgs& args, const ProblemDims& dims, const PlannedCall& pc) {
    const BlockCall& c = pc.call;
    bool ok = true;
    for (const TensorView* t : {&args.q, &args.k, &args.v, &args.out, &args.dout}) {
      ok = ok && CudnnReadable(ViewTensor(*t, c, dims.seq_len));
    }
    if (pc.role == CallRole::kDirect) {
      for (const TensorView* t : {&args.dq, &args.dk, &args.dv}) {
        ok = ok && CudnnReadable(ViewTensor(*t, c, dims.seq_len));
      }
    }
    return ok;
  }

  // Whether cuDNN takes the forward graph with the probabilities scaled by 1/G; remembered for the
  // life of the backend (it depends on the cuDNN version, not on shapes).
  void ProbePScale(const AttentionSpec& spec, const ForwardArgs& args, const ProblemDims& dims,
                   const PlannedCall& pc, float scale, float p_scale) {
    if (!ForwardReadable(args, dims, pc)) return;
    cuda::SdpaForwardArgs a = SdpaForward(spec, args, dims, pc, scale, p_scale);
    if (sdpa_->ForwardWorkspace(a).ok()) {
      p_scale_state_ = PScale::kSupported;
      return;
    }
    a.p_scale = 1.0f;
    if (sdpa_->ForwardWorkspace(a).ok()) p_scale_state_ = PScale::kUnsupported;
  }

  // The cuDNN arguments of a forward call, without the scratch pointers (stats, tile).
  cuda::SdpaForwardArgs SdpaForward(const AttentionSpec& spec, const ForwardArgs& args,
                                    const ProblemDims& dims, const PlannedCall& pc, float scale,
                                    float p_scale) const {
    const BlockCall& c = pc.call;
    const KernelTensor q = ViewTensor(args.q, c, dims.seq_len);
    const KernelTensor k = ViewTensor(args.k, c, dims.seq_len);
    const KernelTensor v = ViewTensor(args.v, c, dims.seq_len);
    const KernelTensor o = pc.role == CallRole::kMerge
                               ? PackedTensor(nullptr, c.group.heads, c.rows, dims.head_dim)
                               : ViewTensor(args.out, c, dims.seq_len);
    cuda::SdpaForwardArgs a = cuda::SdpaForwardOn(
        {args.q.dtype, c.count, c.group.heads, c.rows, dims.head_dim, spec.causal}, q, k, v, o,
        scale);
    a.p_scale = p_scale;
    return a;
  }

  // Grouped mode: the unselected rows around a direct call's blocks (the offset before the first
  // selected row, the rate - 1 after each one, up to the segment's end; a steps_batches call holds
  // each batch item's partial last segment).
  static cuda::UnselectedRows GroupZeros(const BlockCall& c, int64_t seq_len, int64_t out_seq) {
    const int64_t seg_len = c.steps_batches ? seq_len - (seq_len / c.segment) * c.segment
                                            : std::min(c.segment, seq_len);
    cuda::UnselectedRows z;
    z.rate = c.rate;
    z.lead = c.group.offset;
    z.span = seg_len - c.group.offset;
    z.pos_stride = out_seq / c.rate;
    return z;
  }

  // The arguments of our own kernels for a forward call: stats (and, for a merge call, the packed
  // tile it writes) in the call's scratch; tile null: o is the out view also for a merge call (our
  // Hopper kernel merges in place).
  cuda::KernelForwardArgs KernelForward(const AttentionSpec& spec, const ForwardArgs& args,
                                        const ProblemDims& dims, const PlannedCall& pc, float scale,
                                        float p_scale, void* stats, void* tile) const {
    const BlockCall& c = pc.call;
    cuda::KernelForwardArgs a;
    a.type = ElemTypeOf(args.q.dtype);
    a.q = ViewTensor(args.q, c, dims.seq_len);
    a.k = ViewTensor(args.k, c, dims.seq_len);
    a.v = ViewTensor(args.v, c, dims.seq_len);
    a.o = pc.role == CallRole::kMerge && tile != nullptr
              ? PackedTensor(tile, c.group.heads, c.rows, dims.head_dim)
              : ViewTensor(args.out, c, dims.seq_len);
    a.stats = static_cast<float*>(stats);
    a.count = c.count;
    a.heads = c.group.heads;
    a.rows = c.rows;
    a.head_dim = dims.head_dim;
    a.scale = scale;
    a.p_scale = p_scale;
    a.causal = spec.causal;
    return a;
  }

  // The views of dq, dk, dv a backward call writes.
  struct Grads {
    KernelTensor t[3];
  };
  static Grads DirectGrads(const BackwardArgs& args, const ProblemDims& dims,
                           const PlannedCall& pc) {
    const BlockCall& c = pc.call;
    return {{ViewTensor(args.dq, c, dims.seq_len), ViewTensor(args.dk, c, dims.seq_len),
             ViewTensor(args.dv, c, dims.seq_len)}};
  }

  // The arguments of our own kernels for a backward call writing `grads`, with the gathered lse
  // in `stats` and the row terms in `delta`. Grouped: out = A / G, so P is normalised by
  // lse + log G (gathered so) and the row sums are taken with o = A = G * out.
  static cuda::KernelBackwardArgs KernelBackward(const AttentionSpec& spec,
                                                 const BackwardArgs& args, const ProblemDims& dims,
                                                 const PlannedCall& pc, const Grads& grads,
                                                 float* stats, float* delta) {
    const BlockCall& c = pc.call;
    cuda::KernelBackwardArgs a;
    a.type = ElemTypeOf(args.q.dtype);
    a.q = ViewTensor(args.q, c, dims.seq_len);
    a.k = ViewTensor(args.k, c, dims.seq_len);
    a.v = ViewTensor(args.v, c, dims.seq_len);
    a.o = ViewTensor(args.out, c, dims.seq_len);
    a.dout = ViewTensor(args.dout, c, dims.seq_len);
    a.dq = grads.t[0];
    a.dk = grads.t[1];
    a.dv = grads.t[2];
    a.stats = stats;
    a.delta = delta;
    a.count = c.count;
    a.heads = c.group.heads;
    a.rows = c.rows;
    a.head_dim = dims.head_dim;
    a.scale = static_cast<float>(spec.ScaleFor(dims.head_dim));
    a.delta_scale =
        spec.mode == AttentionMode::kGrouped ? static_cast<float>(spec.num_patterns()) : 1.0f;
    a.causal = spec.causal;
    return a;
  }

  // The cuDNN arguments of a backward call, without the scratch pointers.
  cuda::SdpaBackwardArgs SdpaBackward(const AttentionSpec& spec, const BackwardArgs& args,
                                      const ProblemDims& dims, const PlannedCall& pc) const {
    const BlockCall& c = pc.call;
    const bool merge = pc.role == CallRole::kMerge;
    const KernelTensor packed = PackedTensor(nullptr, c.group.heads, c.rows, dims.head_dim);
    cuda::SdpaBackwardArgs a;
    a.shape = {args.q.dtype, c.count, c.group.heads, c.rows, dims.head_dim, spec.causal};
    const KernelTensor q = ViewTensor(args.q, c, dims.seq_len);
    const KernelTensor k = ViewTensor(args.k, c, dims.seq_len);
    const KernelTensor v = ViewTensor(args.v, c, dims.seq_len);
    const KernelTensor o = ViewTensor(args.out, c, dims.seq_len);
    const KernelTensor d_o = ViewTensor(args.dout, c, dims.seq_len);
    a.q_strides = StridesOf(q);
    a.k_strides = StridesOf(k);
    a.v_strides = StridesOf(v);
    a.o_strides = cuda::NeedsScaledOut(spec, true, true) ? StridesOf(packed) : StridesOf(o);
    a.do_strides = StridesOf(d_o);
    a.dq_strides = merge ? StridesOf(packed) : StridesOf(ViewTensor(args.dq, c, dims.seq_len));
    a.dk_strides = merge ? StridesOf(packed) : StridesOf(ViewTensor(args.dk, c, dims.seq_len));
    a.dv_strides = merge ? StridesOf(packed) : StridesOf(ViewTensor(args.dv, c, dims.seq_len));
    a.q = q.ptr;
    a.k = k.ptr;
    a.v = v.ptr;
    a.o = o.ptr;
    a.dout = d_o.ptr;
    a.scale = static_cast<float>(spec.ScaleFor(dims.head_dim));
    return a;
  }

  absl::Status EnqueueForward(const AttentionSpec& spec, const ForwardArgs& args,
                              const ProblemDims& dims, const CallExec& e, float scale,
                              float p_scale, Workspace& ws, const CallSlot& slot) {
    const PlannedCall& pc = *e.planned;
    const BlockCall& c = pc.call;
    const bool merge = pc.role == CallRole::kMerge;
    const DType dtype = args.q.dtype;
    const RowSpace space{dims.batch, dims.seq_len, dims.num_heads, dims.head_dim};
    const cuda::CallRows rows = CallRowsOf(c);
    const CallScratch& s = e.scratch;
    float* lse = static_cast<float*>(args.lse.data);
    const KernelTensor tile =
        PackedTensor(ws.At<void>(s.tile, slot.base), c.group.heads, c.rows, dims.head_dim);
    if (e.own_hopper) {
      // A merge call combines into out and the rows' lse (gathered here, scattered back after) in
      // the kernel's epilogue: no tile, no merge pass.
      float* stats = ws.At<float>(s.stats, slot.base);
      if (merge) {
        DATTN_CUDA_RETURN_IF_ERROR(
            cuda::LaunchGatherStats(lse, stats, 0.0f, rows, space, slot.stream));
      }
      const cuda::KernelForwardArgs a =
          KernelForward(spec, args, dims, pc, scale, p_scale, stats, nullptr);
      DATTN_CUDA_RETURN_IF_ERROR(
          cuda::LaunchHopperForward(a, merge, e.zeros, slot.counter, slot.stream));
      ++stats_.own_hopper_calls;
      DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchScatterStats(stats, lse, rows, space, slot.stream));
      return absl::OkStatus();
    }
    if (e.cudnn) {
      cuda::SdpaForwardArgs a = SdpaForward(spec, args, dims, pc, scale, p_scale);
      if (merge) a.o = tile.ptr;
      a.stats = ws.At<float>(s.stats, slot.base);
      DATTN_RETURN_IF_ERROR(sdpa_->Forward(a, ws.At<void>(s.library, slot.base)));
      ++stats_.cudnn_calls;
    } else {
      const cuda::KernelForwardArgs a = KernelForward(spec, args, dims, pc, scale, p_scale,
                                                      ws.At<float>(s.stats, slot.base), tile.ptr);
      DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchAttentionForward(a, slot.stream));
      ++stats_.kernel_calls;
    }
    if (merge) {
      DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchMergeTile(tile.ptr, ws.At<float>(s.stats, slot.base),
                                                       args.out.data, lse, ElemTypeOf(dtype), rows,
                                                       space, slot.stream));
    } else {
      DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchScatterStats(ws.At<float>(s.stats, slot.base), lse,
                                                          rows, space, slot.stream));
    }
    return absl::OkStatus();
  }

  absl::Status EnqueueBackward(const AttentionSpec& spec, const BackwardArgs& args,
                               const ProblemDims& dims, const CallExec& e, Workspace& ws,
                               const CallSlot& slot) {
    const PlannedCall& pc = *e.planned;
    const BlockCall& c = pc.call;
    const bool merge = pc.role == CallRole::kMerge;
    const bool grouped = spec.mode == AttentionMode::kGrouped;
    const int g = spec.num_patterns();
    const DType dtype = args.q.dtype;
    const ElemType et = ElemTypeOf(dtype);
    const int64_t esize = static_cast<int64_t>(DTypeSize(dtype));
    const RowSpace space{dims.batch, dims.seq_len, dims.num_heads, dims.head_dim};
    const cuda::CallRows rows = CallRowsOf(c);
    const CallScratch& s = e.scratch;
    const int64_t tile_bytes = c.count * c.group.heads * c.rows * dims.head_dim * esize;
    // Our Hopper kernels add a merge call's gradients in place; the others write a tile that is
    // added afterwards.
    const bool tiles = merge && !e.own_hopper;
    Grads grads = DirectGrads(args, dims, pc);
    if (tiles) {
      for (int i = 0; i < 3; ++i) {
        grads.t[i] = PackedTensor(ws.At<char>(s.tile, slot.base) + i * tile_bytes, c.group.heads,
                                  c.rows, dims.head_dim);
      }
    }
    // Grouped: out = A / G. P is normalised by lse + log G (so dV comes out for A / G), and the row
    // sums rowsum(dout * o) must be taken with o = A = G * out: cuDNN reads a G * out tile, our
    // kernel scales its row sums by G. Mixture: P is normalised by the row's total lse, o = out.
    const float lse_add = grouped ? std::log(static_cast<float>(g)) : 0.0f;
    DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchGatherStats(static_cast<const float*>(args.lse.data),
                                                       ws.At<float>(s.stats, slot.base), lse_add,
                                                       rows, space, slot.stream));
    if (e.cudnn) {
      cuda::SdpaBackwardArgs a = SdpaBackward(spec, args, dims, pc);
      if (s.out_tile >= 0) {
        DATTN_CUDA_RETURN_IF_ERROR(
            cuda::LaunchGatherRows(args.out.data, ws.At<void>(s.out_tile, slot.base),
                                   static_cast<float>(g), et, rows, space, slot.stream));
        a.o = ws.At<void>(s.out_tile, slot.base);
      }
      a.dq = grads.t[0].ptr;
      a.dk = grads.t[1].ptr;
      a.dv = grads.t[2].ptr;
      a.stats = ws.At<float>(s.stats, slot.base);
      a.softmax_sum = ws.At<float>(s.delta, slot.base);
      a.dq_accum = ws.At<float>(s.dq_accum, slot.base);
      DATTN_RETURN_IF_ERROR(sdpa_->Backward(a, ws.At<void>(s.library, slot.base)));
      ++stats_.cudnn_calls;
    } else {
      const cuda::KernelBackwardArgs a =
          KernelBackward(spec, args, dims, pc, grads, ws.At<float>(s.stats, slot.base),
                         ws.At<float>(s.delta, slot.base));
      if (e.own_hopper) {
        DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchHopperBackward(a, /*accumulate=*/merge, e.zeros,
                                                              slot.counter, slot.stream));
        ++stats_.own_hopper_backward_calls;
      } else {
        DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchAttentionBackward(a, slot.stream));
        ++stats_.kernel_calls;
      }
    }
    if (tiles) {
      DATTN_CUDA_RETURN_IF_ERROR(
          cuda::LaunchAccumulateTiles(ws.At<void>(s.tile, slot.base), args.dq.data, args.dk.data,
                                      args.dv.data, et, rows, space, slot.stream));
    }
    return absl::OkStatus();
  }

  const CudaBackendOptions options_;
  const BackendCaps caps_;
  cudaStream_t stream_;
  bool owns_stream_;
  cudaStream_t aux_;
  cudaEvent_t fork_;
  cudaEvent_t join_;
  cudaStream_t calls2_;
  cudaEvent_t fork2_;
  cudaEvent_t join2_;
  cudaMemPool_t pool_;
  std::unique_ptr<cuda::CudnnSdpa> sdpa_;
  unsigned* const item_counter_;   // null where our Hopper kernels do not run
  unsigned* const item_counter2_;  // the same, for calls on calls2_
  CudaBackendStats stats_;
  PScale p_scale_state_ = PScale::kUnknown;
  std::string last_fallback_;
  std::vector<cudaEvent_t> pattern_events_;
};

}  // namespace

BackendCaps CudaBackendCaps() {
  BackendCaps caps;
  caps.name = "cuda";
  caps.device = Device::kCuda;
  caps.dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32};
  for (int64_t d = 8; d <= 256; d += 8) caps.head_dims.push_back(d);
  return caps;
}

absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> NewCudaBackend(
    const CudaBackendOptions& options) {
  DATTN_RETURN_IF_ERROR(cuda::CheckHopperDevice(options.device, "the CUDA backend"));
  DeviceScope guard;
  DATTN_RETURN_IF_ERROR(guard.Enter(options.device));
  // Everything created so far is released if a later step fails.
  struct Partial {
    CudaBackendImpl::Resources r;
    ~Partial() {
      r.sdpa.reset();
      if (r.pool != nullptr) cudaMemPoolDestroy(r.pool);
      if (r.item_counter != nullptr) cudaFree(r.item_counter);
      if (r.item_counter2 != nullptr) cudaFree(r.item_counter2);
      if (r.fork != nullptr) cudaEventDestroy(r.fork);
      if (r.join != nullptr) cudaEventDestroy(r.join);
      if (r.fork2 != nullptr) cudaEventDestroy(r.fork2);
      if (r.join2 != nullptr) cudaEventDestroy(r.join2);
      if (r.aux != nullptr) cudaStreamDestroy(r.aux);
      if (r.calls2 != nullptr) cudaStreamDestroy(r.calls2);
      if (r.owns_stream && r.stream != nullptr) cudaStreamDestroy(r.stream);
    }
  } partial;
  CudaBackendImpl::Resources& r = partial.r;
  r.stream = options.stream;
  if (r.stream == nullptr) {
    // A blocking stream: ordered after work on the legacy default stream (cudaMemcpy, cudaMemset),
    // as callers that fill their tensors there expect.
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.stream, cudaStreamDefault));
    r.owns_stream = true;
  }
  // The fill stream has the highest priority: its small memory-bound blocks are scheduled as soon
  // as blocks of a running fused attention retire, instead of waiting for the whole grid.
  int least_priority = 0, greatest_priority = 0;
  DATTN_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));
  DATTN_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&r.aux, cudaStreamDefault, greatest_priority));
  DATTN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&r.fork, cudaEventDisableTiming));
  DATTN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&r.join, cudaEventDisableTiming));
  DATTN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.calls2, cudaStreamNonBlocking));
  DATTN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&r.fork2, cudaEventDisableTiming));
  DATTN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&r.join2, cudaEventDisableTiming));
  DATTN_CUDA_RETURN_IF_ERROR(cuda::NewHopperItemCounter(options.device, &r.item_counter));
  DATTN_CUDA_RETURN_IF_ERROR(cuda::NewHopperItemCounter(options.device, &r.item_counter2));
  absl::StatusOr<cudaMemPool_t> pool = cuda::NewScratchPool(options.device);
  if (!pool.ok()) return pool.status();
  r.pool = *pool;
  if (options.use_cudnn) {
    absl::StatusOr<std::unique_ptr<cuda::CudnnSdpa>> made = cuda::CudnnSdpa::Create(r.stream);
    if (!made.ok()) return made.status();
    r.sdpa = std::move(*made);
  }
  auto backend = std::unique_ptr<CudaAttentionBackend>(new CudaBackendImpl(options, std::move(r)));
  r = CudaBackendImpl::Resources();  // now owned by the backend
  return backend;
}

}  // namespace dattn
