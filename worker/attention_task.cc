#include "worker/attention_task.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "api/limits.h"
#include "base/median.h"
#include "engine/memory_plan.h"
#include "engine/ring/ring_attention.h"
#include "engine/validate.h"
#include "worker/ring_join.h"
#include "worker/shared_memory.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "returned tensors are copied as raw bytes, which the API defines as little-endian"
#endif

namespace dattn {
namespace worker {
namespace {

// Threads that copy a shard between a shared-memory region and the device (more when the task has
// more engine threads, at most twice this): each reads the region into its own staging buffer
// while the others' buffers go to the device.
constexpr int kRegionCopyThreads = 4;

}  // namespace

absl::StatusOr<AttentionTaskPlan> PlanAttentionTask(const v1::TaskAssignment& task,
                                                    const BackendCaps& caps) {
  if (!task.spec().has_attention()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", task.task_id(), " has no attention work in its JobSpec"));
  }
  if (!task.has_attention_plan()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task ", task.task_id(),
        " carries no attention_plan (the coordinator plans every rank; is it older than this "
        "worker?)"));
  }
  const v1::AttentionJobSpec& job = task.spec().attention();
  const v1::AttentionRankPlan& rank_plan = task.attention_plan();
  AttentionTaskPlan plan;
  absl::StatusOr<AttentionSpec> spec = ToEngineSpec(job.attention());
  if (!spec.ok()) return spec.status();
  plan.spec = *std::move(spec);
  absl::StatusOr<DType> dtype = ToEngineDType(job.dtype());
  if (!dtype.ok()) return dtype.status();
  plan.dtype = *dtype;
  plan.full = FullShape{job.shape().batch(), job.shape().seq_len(), job.shape().num_heads(),
                        job.shape().head_dim()};
  // This device must run the problem; the coordinator checked the job against a generic device of
  // its kind, not against this one.
  absl::Status valid = ValidateSpec(plan.spec);
  if (valid.ok()) {
    valid = ValidateProblem(plan.spec, plan.full.batch, plan.full.seq_len, plan.full.num_heads,
                            plan.full.head_dim, plan.dtype, caps);
  }
  if (!valid.ok()) return valid;

  // The plan must be this rank's of this job: a wrong one would compute a wrong shard silently.
  plan.num_ranks = rank_plan.num_ranks();
  plan.rank = task.rank();
  const int64_t n = plan.full.seq_len;
  if (plan.num_ranks < 1 || n % plan.num_ranks != 0 || plan.rank < 0 ||
      plan.rank >= plan.num_ranks || rank_plan.position_begin() != n / plan.num_ranks * plan.rank ||
      rank_plan.position_end() != n / plan.num_ranks * (plan.rank + 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", task.task_id(), ": its plan (rank ", plan.rank, " of ",
                     plan.num_ranks, ", positions [", rank_plan.position_begin(), ", ",
                     rank_plan.position_end(), ")) is not a rank's share of N = ", n));
  }
  if (rank_plan.iterations() < 1 || rank_plan.iterations() > api::kMaxIterations) {
    return absl::InvalidArgumentError(absl::StrCat("task ", task.task_id(), ": iterations ",
                                                   rank_plan.iterations(), " outside 1 .. ",
                                                   api::kMaxIterations));
  }
  if (rank_plan.memory_bytes() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("task ", task.task_id(), ": planned memory ",
                                                   rank_plan.memory_bytes(), " must be > 0"));
  }
  const v1::RingInfo& ring = task.ring();
  if (plan.num_ranks == 1 ? ring.size() > 1
                          : (ring.size() != plan.num_ranks || ring.rank() != plan.rank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task ", task.task_id(), " of a ", plan.num_ranks, "-rank job has rank ", plan.rank,
        " and ring (rank ", ring.rank(), ", size ", ring.size(), "); they must agree"));
  }
  plan.positions = RankPositions(n, plan.rank, plan.num_ranks);
  plan.iterations = rank_plan.iterations();
  plan.backward = rank_plan.backward();
  plan.seed = job.seed();
  plan.return_output = job.return_output();
  plan.streamed = job.streamed();
  if (plan.streamed && plan.iterations != 1) {
    return absl::InvalidArgumentError(absl::StrCat("task ", task.task_id(),
                                                   ": a streamed job runs one step, its plan says ",
                                                   plan.iterations));
  }
  if (job.has_shared_memory()) {
    const int64_t whole = plan.full.batch * plan.full.seq_len * plan.full.num_heads *
                          plan.full.head_dim * static_cast<int64_t>(DTypeSize(plan.dtype));
    absl::StatusOr<api::SharedMemoryLayout> layout =
        api::CheckSharedMemory(job.shared_memory(), whole, plan.backward,
                               absl::StrCat("task ", task.task_id(), ": shared_memory"));
    if (!layout.ok()) return layout.status();
    if (!plan.streamed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "task ", task.task_id(), ": shared memory is only for a streamed job (an Attend call)"));
    }
    plan.shared_memory = *std::move(layout);
  }
  plan.memory_bytes = rank_plan.memory_bytes();
  plan.memory_plan = rank_plan.memory_plan();
  plan.flops_per_step = rank_plan.flops_per_step();
  // ValidateProblem has checked that the byte counts of the whole tensors fit in int64.
  plan.tensor_bytes = plan.full.batch * plan.positions.size() * plan.full.num_heads *
                      plan.full.head_dim * static_cast<int64_t>(DTypeSize(plan.dtype));
  plan.lse_bytes = plan.full.batch * plan.full.num_heads * plan.positions.size() *
                   static_cast<int64_t>(DTypeSize(LseDType(plan.dtype)));
  return plan;
}

namespace {

// The rank's tensors on the device, and host views of them.
struct RankTensors {
  std::optional<SharedMemoryFile> region;  // A shared-memory call's region, while the task runs.
  std::vector<DeviceBuffer> buffers;
  int64_t allocated_bytes = 0;  // Planned bytes of `buffers` (reported to on_allocated).
  TensorView inputs[4];         // q, k, v, dout
  TensorView outputs[4];        // out, dq, dk, dv
  TensorView lse;
};

// Copies the rank's shard of tensor `index` (0 .. 3: q, k, v, dout to the device; out, dq, dk, dv
// from it) between the call's shared-memory region and `data`: for each batch row, the rank's
// N/P rows, a contiguous slab both in the region's (B, N, H, D) tensor and in the (B, N/P, H, D)
// shard.
absl::Status CopyRegion(const AttentionTaskPlan& plan, TaskDevice* device,
                        const AttentionTaskOptions& options, const SharedMemoryFile& region,
                        int index, bool to_device, void* data) {
  const int64_t row =
      plan.full.num_heads * plan.full.head_dim * static_cast<int64_t>(DTypeSize(plan.dtype));
  const int64_t slab = plan.positions.size() * row;
  const int tensor = to_device ? v1::ATTEND_TENSOR_Q + index : v1::ATTEND_TENSOR_OUT + index;
  const int64_t base = plan.shared_memory->offset[static_cast<size_t>(tensor)];
  const int threads = std::clamp(options.num_threads, kRegionCopyThreads, 2 * kRegionCopyThreads);
  for (int64_t b = 0; b < plan.full.batch; ++b) {
    const int64_t at = base + b * plan.full.seq_len * row + plan.positions.begin * row;
    char* shard = static_cast<char*>(data) + b * slab;
    absl::Status s = to_device ? device->FillDevice(
                                     shard, slab,
                                     [&](int64_t offset, int64_t length, char* host) {
                                       return region.Read(at + offset, length, host);
                                     },
                                     threads)
                               : device->DrainDevice(
                                     shard, slab,
                                     [&](int64_t offset, int64_t length, const char* host) {
                                       return region.Write(at + offset, length, host);
                                     },
                                     threads);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status PrepareTensors(const AttentionTaskPlan& plan, TaskDevice* device,
                            const AttentionTaskOptions& options, const std::string& task_id,
                            RankTensors* t) {
  const BackendCaps& caps = device->caps();
  const std::vector<int64_t> shape = {plan.full.batch, plan.positions.size(), plan.full.num_heads,
                                      plan.full.head_dim};
  auto make = [&](DType dtype, std::vector<int64_t> dims, int64_t bytes,
                  const char* what) -> absl::StatusOr<TensorView> {
    absl::StatusOr<DeviceBuffer> buffer = device->Allocate(bytes, what);
    if (!buffer.ok()) return buffer.status();
    if (options.on_allocated) options.on_allocated(bytes);
    t->allocated_bytes += bytes;
    t->buffers.push_back(*std::move(buffer));
    return TensorView::Contiguous(t->buffers.back().get(), dtype, std::move(dims), caps.device,
                                  device->device_index());
  };
  const char* kNames[] = {"q", "k", "v", "dout"};
  const int num_inputs = plan.backward ? 4 : 3;
  for (int i = 0; i < num_inputs; ++i) {
    if (options.is_cancelled && options.is_cancelled()) {
      return absl::CancelledError(
          absl::StrCat("task ", task_id, " cancelled before its first step"));
    }
    absl::StatusOr<TensorView> view = make(plan.dtype, shape, plan.tensor_bytes, kNames[i]);
    if (!view.ok()) return view.status();
    t->inputs[i] = *view;
    if (plan.streamed) continue;  // Written below, as the caller's chunks come.
    absl::Status filled = device->FillInput(plan.seed, static_cast<InputTensor>(i), plan.full,
                                            plan.positions, *view, options.num_threads);
    if (!filled.ok()) return filled;
  }
  if (plan.shared_memory.has_value()) {
    absl::StatusOr<SharedMemoryFile> file = SharedMemoryFile::Open(*plan.shared_memory);
    if (!file.ok()) return file.status();
    t->region.emplace(*std::move(file));
    for (int i = 0; i < num_inputs; ++i) {
      if (absl::Status s = CopyRegion(plan, device, options, *t->region, i, /*to_device=*/true,
                                      t->inputs[i].data);
          !s.ok()) {
        return s;
      }
    }
  } else if (plan.streamed) {
    // The caller's chunks of this shard, each tensor in order and whole: anything else would
    // leave part of an input unwritten.
    int tensor = 0;
    int64_t offset = 0;
    absl::Status read = options.read_inputs([&](const v1::AttendChunk& chunk) -> absl::Status {
      const int64_t size = static_cast<int64_t>(chunk.data().size());
      if (tensor >= num_inputs || chunk.tensor() != v1::ATTEND_TENSOR_Q + tensor ||
          chunk.offset() != offset || size == 0 || offset + size > plan.tensor_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "task ", task_id, ": input chunk of tensor ", static_cast<int>(chunk.tensor()),
            " at offset ", chunk.offset(), " with ", size, " bytes; expected input ", tensor,
            " at offset ", offset, " of its ", plan.tensor_bytes, " bytes"));
      }
      char* base = static_cast<char*>(t->inputs[tensor].data);
      if (absl::Status s = device->CopyToDevice(base + offset, chunk.data().data(), size);
          !s.ok()) {
        return s;
      }
      offset += size;
      if (offset == plan.tensor_bytes) {
        ++tensor;
        offset = 0;
      }
      return absl::OkStatus();
    });
    if (!read.ok()) return read;
    if (tensor < num_inputs) {
      return absl::DataLossError(absl::StrCat("task ", task_id, ": its input stream ended with ",
                                              kNames[tensor], " at ", offset, " of its ",
                                              plan.tensor_bytes, " bytes"));
    }
  }
  const char* kOutNames[] = {"out", "dq", "dk", "dv"};
  const int num_outputs = plan.backward ? 4 : 1;
  for (int i = 0; i < num_outputs; ++i) {
    absl::StatusOr<TensorView> view = make(plan.dtype, shape, plan.tensor_bytes, kOutNames[i]);
    if (!view.ok()) return view.status();
    t->outputs[i] = *view;
  }
  absl::StatusOr<TensorView> lse =
      make(LseDType(plan.dtype), {plan.full.batch, plan.full.num_heads, plan.positions.size()},
           plan.lse_bytes, "lse");
  if (!lse.ok()) return lse.status();
  t->lse = *lse;
  return absl::OkStatus();
}

// Checksums of outputs [first, last) together (TaskDevice::SumElements).
absl::StatusOr<TaskDevice::ElementSums> SumOutputs(TaskDevice* device, const RankTensors& t,
                                                   int first, int last) {
  TaskDevice::ElementSums acc;
  for (int i = first; i < last; ++i) {
    absl::StatusOr<TaskDevice::ElementSums> sums =
        device->SumElements(t.outputs[i].data, t.outputs[i].dtype, t.outputs[i].NumElements());
    if (!sums.ok()) return sums.status();
    acc.sum += sums->sum;
    acc.sum_squares += sums->sum_squares;
  }
  return acc;
}

// One step's engine calls: the single-device backend, or the ring driver.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual absl::Status Step(const AttentionTaskPlan& plan, const ForwardArgs& fwd,
                            const BackwardArgs& bwd) = 0;
};

class SingleDeviceSteps final : public StepRunner {
 public:
  SingleDeviceSteps(TaskDevice* device, std::unique_ptr<AttentionBackend> backend)
      : device_(device), backend_(std::move(backend)) {}
  absl::Status Step(const AttentionTaskPlan& plan, const ForwardArgs& fwd,
                    const BackwardArgs& bwd) override {
    absl::Status s = backend_->Forward(plan.spec, fwd);
    if (s.ok() && plan.backward) s = backend_->Backward(plan.spec, bwd);
    const absl::Status finished = device_->Finish(backend_.get());
    return s.ok() ? finished : s;
  }

 private:
  TaskDevice* const device_;
  std::unique_ptr<AttentionBackend> backend_;
};

class RingSteps final : public StepRunner {
 public:
  RingSteps(comm::Communicator* comm, std::unique_ptr<ring::BlockKernels> kernels)
      : kernels_(std::move(kernels)), ring_(comm, kernels_.get()) {}
  absl::Status Step(const AttentionTaskPlan& plan, const ForwardArgs& fwd,
                    const BackwardArgs& bwd) override {
    absl::Status s = ring_.Forward(plan.spec, plan.full.seq_len, fwd);
    if (s.ok() && plan.backward) s = ring_.Backward(plan.spec, plan.full.seq_len, bwd);
    return s;
  }

 private:
  std::unique_ptr<ring::BlockKernels> kernels_;
  ring::RingAttention ring_;
};

}  // namespace

absl::StatusOr<AttentionTaskResult> RunAttentionTask(const v1::TaskAssignment& task,
                                                     TaskDevice* device,
                                                     const AttentionTaskOptions& options) {
  absl::StatusOr<AttentionTaskPlan> planned = PlanAttentionTask(task, device->caps());
  if (!planned.ok()) return planned.status();
  const AttentionTaskPlan& plan = *planned;
  if (plan.streamed && !plan.shared_memory.has_value() &&
      (!options.read_inputs || !options.upload_output)) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", task.task_id(),
                     " is streamed, but this runner reads no input "
                     "stream (AttentionTaskOptions.read_inputs, upload_output)"));
  }
  const bool on_ring = plan.num_ranks > 1;
  auto phase = [&](v1::RankPhase p) {
    if (options.on_phase) options.on_phase(p);
  };
  auto cancelled = [&] { return options.is_cancelled && options.is_cancelled(); };
  phase(v1::RANK_PHASE_PREPARING);

  int64_t available = options.available_memory_bytes;
  if (available < 0) {
    absl::StatusOr<int64_t> free_bytes = options.reserve_memory
                                             ? options.reserve_memory(plan.memory_bytes)
                                             : device->FreeMemoryBytes();
    if (!free_bytes.ok()) return free_bytes.status();
    available = *free_bytes;
  }
  if (plan.memory_bytes > available) {
    return absl::ResourceExhaustedError(
        absl::StrCat("task ", task.task_id(), " needs ", plan.memory_plan, " but only ",
                     FormatBytes(available), " of ", device->caps().name, " memory is free"));
  }

  // The wall time of each phase, for the log.
  std::string timeline;
  auto lap = [&timeline, last = std::chrono::steady_clock::now()](const char* phase) mutable {
    const auto now = std::chrono::steady_clock::now();
    absl::StrAppend(&timeline, timeline.empty() ? "" : ", ", phase, " ",
                    absl::SixDigits(std::chrono::duration<double>(now - last).count()), " s");
    last = now;
  };
  RankTensors t;
  // Out of memory at any of the tensors: what was allocated goes back (claimed again for this
  // task), the device's caches are released and the tensors allocated once more (oom_retry.h).
  // Nothing is read from a caller's stream before this (a shared-memory region is read again).
  OomRetry oom;
  absl::Status prepared = RetryOnceOutOfMemory(
      device, [&] { return PrepareTensors(plan, device, options, task.task_id(), &t); },
      [&] {
        const int64_t held = t.allocated_bytes;
        t = RankTensors();
        if (options.on_allocated && held > 0) options.on_allocated(-held);
      },
      &oom);
  if (oom.retries > 0 && options.on_out_of_memory_retry) options.on_out_of_memory_retry(oom);
  if (!prepared.ok()) return prepared;
  lap(plan.streamed ? "inputs" : "allocation and inputs");

  // The engine. A ring rank gets its kernels before it joins, so that a device without ring
  // kernels fails at once rather than after its peers have waited for it.
  std::unique_ptr<StepRunner> runner;
  RingMembership membership;
  auto forget_comm = absl::MakeCleanup([&] {
    if (membership.comm != nullptr && options.on_communicator) {
      options.on_communicator(nullptr, membership.formation_seconds);
    }
  });
  std::string where = absl::StrCat("task ", task.task_id());
  if (on_ring) {
    absl::StatusOr<std::unique_ptr<ring::BlockKernels>> kernels =
        device->NewRingKernels(options.num_threads);
    if (!kernels.ok()) return kernels.status();
    phase(v1::RANK_PHASE_FORMING_RING);
    RingJoinOptions join;
    join.member_name = options.member_name;
    join.default_comm_timeout = options.default_comm_timeout;
    join.store_tls = options.store_tls;
    join.is_cancelled = options.is_cancelled;
    absl::StatusOr<RingMembership> joined = JoinRing(task.ring(), device, join);
    if (!joined.ok()) return joined.status();
    membership = *std::move(joined);
    if (options.on_communicator) {
      options.on_communicator(membership.comm.get(), membership.formation_seconds);
    }
    runner = std::make_unique<RingSteps>(membership.comm.get(), *std::move(kernels));
    where =
        absl::StrCat("ring ", task.ring().ring_id(), " rank ", plan.rank, " of ", plan.num_ranks);
  } else {
    absl::StatusOr<std::unique_ptr<AttentionBackend>> backend =
        device->NewBackend(options.num_threads);
    if (!backend.ok()) return backend.status();
    runner = std::make_unique<SingleDeviceSteps>(device, *std::move(backend));
  }

  ForwardArgs fwd;
  fwd.q = t.inputs[0];
  fwd.k = t.inputs[1];
  fwd.v = t.inputs[2];
  fwd.out = t.outputs[0];
  fwd.lse = t.lse;
  BackwardArgs bwd;
  if (plan.backward) {
    bwd.q = t.inputs[0];
    bwd.k = t.inputs[1];
    bwd.v = t.inputs[2];
    bwd.out = t.outputs[0];
    bwd.lse = t.lse;
    bwd.dout = t.inputs[3];
    bwd.dq = t.outputs[1];
    bwd.dk = t.outputs[2];
    bwd.dv = t.outputs[3];
  }

  lap(on_ring ? "engine and ring set-up" : "engine set-up");
  if (options.on_started) options.on_started();
  phase(v1::RANK_PHASE_RUNNING);
  std::vector<double> step_seconds;
  step_seconds.reserve(static_cast<size_t>(std::min<int64_t>(plan.iterations, 1 << 20)));
  using Clock = std::chrono::steady_clock;
  const Clock::time_point first = Clock::now();
  Clock::time_point last = first;
  for (int64_t step = 0; step < plan.iterations; ++step) {
    if (cancelled()) {
      return absl::CancelledError(absl::StrCat("task ", task.task_id(), " cancelled after ", step,
                                               " of ", plan.iterations, " steps"));
    }
    const Clock::time_point begin = Clock::now();
    absl::Status status = runner->Step(plan, fwd, bwd);
    last = Clock::now();
    if (!status.ok()) {
      // A cancel aborts the ring's communicator, which fails the step in progress: that is the
      // cancel, not a failure.
      if (cancelled()) {
        return absl::CancelledError(absl::StrCat("task ", task.task_id(), " cancelled during step ",
                                                 step + 1, " of ", plan.iterations));
      }
      if (!on_ring) return status;
      return absl::Status(status.code(), absl::StrCat(where, ", step ", step + 1, " of ",
                                                      plan.iterations, ": ", status.message()));
    }
    step_seconds.push_back(std::chrono::duration<double>(last - begin).count());
    if (options.on_progress) options.on_progress(step + 1, plan.iterations);
  }

  lap("steps");
  AttentionTaskResult result;
  result.steps_done = plan.iterations;
  result.flops_per_step = plan.flops_per_step;
  result.ring_formation_seconds = membership.formation_seconds;
  v1::RankResult& rank = result.rank_result;
  rank.set_rank(plan.rank);
  rank.set_seconds_total(std::chrono::duration<double>(last - first).count());
  const double median = Median(step_seconds);
  rank.set_seconds_per_step(median);
  rank.set_tflops(median > 0 ? plan.flops_per_step / median / 1e12 : 0.0);
  rank.set_ring_formation_seconds(membership.formation_seconds);
  rank.set_out_of_memory_retries(oom.retries);
  absl::StatusOr<TaskDevice::ElementSums> out_sum = SumOutputs(device, t, 0, 1);
  if (!out_sum.ok()) return out_sum.status();
  rank.set_out_sum(out_sum->sum);
  rank.set_out_sum_squares(out_sum->sum_squares);
  if (plan.backward) {
    absl::StatusOr<TaskDevice::ElementSums> grad_sum = SumOutputs(device, t, 1, 4);
    if (!grad_sum.ok()) return grad_sum.status();
    rank.set_grad_sum(grad_sum->sum);
    rank.set_grad_sum_squares(grad_sum->sum_squares);
  }
  lap("checksums");
  // The planned bytes beyond the inputs: outputs, lse, the engine's workspace, ring buffers.
  rank.set_peak_memory_bytes(plan.memory_bytes - (plan.backward ? 4 : 3) * plan.tensor_bytes);
  if (plan.shared_memory.has_value()) {
    for (int i = 0; i < (plan.backward ? 4 : 1); ++i) {
      if (absl::Status s = CopyRegion(plan, device, options, *t.region, i, /*to_device=*/false,
                                      t.outputs[i].data);
          !s.ok()) {
        return s;
      }
    }
  } else if (plan.streamed) {
    // Every output back to the caller, read from the device a chunk at a time.
    v1::TensorHeader header;
    header.set_dtype(ToApiDType(plan.dtype));
    for (int64_t d : t.outputs[0].shape) header.add_shape(d);
    header.set_total_bytes(plan.tensor_bytes);
    for (int i = 0; i < (plan.backward ? 4 : 1); ++i) {
      const char* base = static_cast<const char*>(t.outputs[i].data);
      absl::Status sent = options.upload_output(
          static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_OUT + i), header,
          [&](int64_t offset, int64_t length, char* dst) -> absl::Status {
            if (offset < 0 || length < 0 || offset + length > plan.tensor_bytes) {
              return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + length,
                                                        ") of a ", plan.tensor_bytes,
                                                        "-byte shard"));
            }
            return device->CopyToHost(dst, base + offset, length);
          });
      if (!sent.ok()) return sent;
    }
  }
  if (plan.streamed) lap("outputs");
  result.timeline = std::move(timeline);
  if (plan.return_output) {
    result.has_output = true;
    result.output.set_dtype(ToApiDType(plan.dtype));
    for (int64_t d : t.outputs[0].shape) result.output.add_shape(d);
    std::string* data = result.output.mutable_data();
    data->resize(static_cast<size_t>(plan.tensor_bytes));
    if (absl::Status s = device->CopyToHost(data->data(), t.outputs[0].data, plan.tensor_bytes);
        !s.ok()) {
      return s;
    }
  }
  return result;
}

}  // namespace worker
}  // namespace dattn
