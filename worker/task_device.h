// The device a worker runs its ranks on: its identity and memory, and the engine pieces a rank
// uses there.
//
// A worker process serves one device, chosen at start-up by what the host offers: CpuDevice
// (cpu_device.h) on any host, CudaDevice (cuda_device.h, built into dattn-worker-gpu only) for one
// GPU. The worker registers with the device's name, memory and capabilities and heartbeats its free
// memory; each task asks it for tensor memory and either an engine backend (single-rank tasks) or
// ring kernels and a communicator (ranks of a sequence-parallel ring). Everything that differs
// between devices is behind this interface, so the task runner (attention_task.h) is written once.
//
// Thread-safety: every method may be called from any thread at any time. The objects the factories
// return belong to the caller and are driven by one thread at a time (their own contracts).
#ifndef DATTN_WORKER_TASK_DEVICE_H_
#define DATTN_WORKER_TASK_DEVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/attention.h"
#include "engine/comm/communicator.h"
#include "engine/comm/store.h"
#include "engine/ring/block_kernels.h"
#include "model/collective.h"
#include "model/language_model.h"
#include "model/serving_model.h"
#include "model/trainable_model.h"
#include "worker/random_inputs.h"

namespace dattn {
namespace worker {

// Device memory for one tensor; freed when destroyed.
using DeviceBuffer = std::unique_ptr<void, std::function<void(void*)>>;

class TaskDevice {
 public:
  virtual ~TaskDevice() = default;

  // What the engine runs here (dtypes, head dims, and Device::kCpu or kCuda).
  virtual const BackendCaps& caps() const = 0;
  // "NVIDIA H100 80GB HBM3" or the CPU model.
  virtual std::string device_name() const = 0;
  // CUDA ordinal; 0 on CPU.
  virtual int device_index() const = 0;
  // Device memory (GPU) or host memory (CPU) in all.
  virtual int64_t total_memory_bytes() const = 0;
  // Free now: cudaMemGetInfo on a GPU, MemAvailable on the host. UNAVAILABLE if it cannot be read.
  virtual absl::StatusOr<int64_t> FreeMemoryBytes() const = 0;
  // OK while the device can run work; otherwise the error that says why. On a GPU a call into the
  // device's context (cudaMemGetInfo): a sticky error (an illegal address, a launch failure, an
  // uncorrectable ECC error) fails every later call of the process's context, so a failed GPU
  // stays failed until the worker restarts. Always OK on the CPU.
  virtual absl::Status Health() const = 0;
  // Gives back to the device what this process keeps cached for later calls: on a GPU, the free
  // memory of the device's default stream-ordered pool (cudaMemPoolTrimTo; it does not wait for
  // the device, whose other tasks may be waiting on a peer); on the CPU, the C library's free heap
  // pages (malloc_trim). Returns the bytes the device's free figure grew by (0 when nothing was kept, or
  // when another process took memory meanwhile). The worker's first step after an allocation runs
  // out of memory (oom_retry.h), before it retries once. Default: nothing cached, 0.
  virtual absl::StatusOr<int64_t> ReleaseCaches() { return int64_t{0}; }
  // Communicators this device forms rings with ("gloo", "nccl"): those for which it also has ring
  // kernels. Empty: single-rank tasks only.
  virtual std::vector<std::string> ring_backends() const = 0;

  // Whether tensor memory is host memory (outputs are then read in place, without a copy).
  virtual bool host_memory() const = 0;
  // Memory for `bytes` bytes of tensor `what`, 64-byte aligned. RESOURCE_EXHAUSTED naming `what`
  // and the size when the device has no room.
  virtual absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, const std::string& what) = 0;
  // Writes input `tensor` of a job (random_inputs.h: seed, full shape, this rank's positions) into
  // `out`, a contiguous (B, positions.size(), H, D) view of memory from Allocate: in place on the
  // host (`threads` CPU threads), by a kernel on a GPU (no host staging, no copy). Returns once
  // written. INVALID_ARGUMENT naming the value for a shape, range or dtype mismatch; device errors
  // as cuda_status.h maps them.
  virtual absl::Status FillInput(uint64_t seed, InputTensor tensor, const FullShape& full,
                                 PositionRange positions, const TensorView& out, int threads) = 0;
  // Copies between host memory and memory from Allocate; they return once the copy is complete.
  virtual absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) = 0;
  // The sum and the sum of squares, in fp64, of the `count` elements of `dtype` at `data` (memory
  // from Allocate): on the host in row-major order; on a GPU by a kernel in a fixed blocked order
  // (checksum_cuda.h), without reading the tensor back. The task's output checksums.
  struct ElementSums {
    double sum = 0;
    double sum_squares = 0;
  };
  virtual absl::StatusOr<ElementSums> SumElements(const void* data, DType dtype, int64_t count) = 0;
  // Copies between memory from Allocate and a host source or sink that produces or takes bytes
  // piecewise (an Attend call's shared-memory region, read and written with pread and pwrite):
  // FillDevice has `fill` write bytes [offset, offset + length) of the `bytes` at `device_dst`
  // into `host`, DrainDevice has `drain` take them from `host`. `host` is memory the device copies
  // from or to at full speed (page-locked staging buffers on a GPU, overlapped with the copies;
  // the tensor itself on the host). The pieces are disjoint, cover the range, are at most a few
  // MiB, and up to `threads` of them are filled or drained at once from different threads. The
  // first error of a callback or a copy ends the call with it, after every piece in flight ends.
  using HostFill = std::function<absl::Status(int64_t offset, int64_t length, char* host)>;
  using HostDrain = std::function<absl::Status(int64_t offset, int64_t length, const char* host)>;
  virtual absl::Status FillDevice(void* device_dst, int64_t bytes, const HostFill& fill,
                                  int threads) = 0;
  virtual absl::Status DrainDevice(const void* device_src, int64_t bytes, const HostDrain& drain,
                                   int threads) = 0;

  // The single-device engine with `threads` CPU threads (ignored on a GPU).
  virtual absl::StatusOr<std::unique_ptr<AttentionBackend>> NewBackend(int threads) = 0;
  // Waits for the work `backend` (from NewBackend) has queued and returns its first error: a step's
  // time is measured to here. Immediate on the CPU, whose backend returns when done.
  virtual absl::Status Finish(AttentionBackend* backend) = 0;
  // The ring's block kernels for this device. UNIMPLEMENTED where none exist.
  virtual absl::StatusOr<std::unique_ptr<ring::BlockKernels>> NewRingKernels(int threads) = 0;
  // Joins a ring as `rank` of `size` through `store`, over communicator `backend` (one of
  // ring_backends()), with every key under `prefix` and `timeout` the longest wait for a peer.
  // FAILED_PRECONDITION for a backend this device does not form; the communicator's own errors.
  virtual absl::StatusOr<std::unique_ptr<comm::Communicator>> NewCommunicator(
      const std::string& backend, std::shared_ptr<comm::Store> store, int rank, int size,
      const std::string& prefix, absl::Duration timeout) = 0;

  // Training (worker/training_task.h). The LongNet model of `config` on this device
  // (model/trainable_model.h: the CPU model with `threads` threads, or the CUDA model on this GPU).
  // With `sequence_group` (borrowed; from NewCommunicator, it must outlive the model) the model's
  // attention is the ring engine over it on this device's ring kernels
  // (model/ring_sequence_attention.h): a sequence-parallel rank; null: the whole sequence here.
  // UNIMPLEMENTED for what this device cannot train; the model's errors.
  virtual absl::StatusOr<std::unique_ptr<model::TrainableModel>> NewTrainableModel(
      const model::LongNetConfig& config, const model::ModelOptions& options, int threads,
      comm::Communicator* sequence_group) = 0;
  // The data-parallel collective (model/collective.h) over `world` (borrowed, from
  // NewCommunicator) for `model` (borrowed; from NewTrainableModel). UNIMPLEMENTED where none
  // exists.
  virtual absl::StatusOr<std::unique_ptr<model::TrainerCollective>> NewTrainerCollective(
      comm::Communicator* world, model::TrainableModel* model) = 0;
  // Serving (worker/deployment_task.h). The LongNet model of `config` with `params` (host fp32, the
  // config's ParamLayout order), its decoder for `max_context` and a batch generator for
  // `max_batch` sequences (model/serving_model.h): the CPU model in fp32 with `threads` threads,
  // or the CUDA model in bf16 on this GPU. With `ring` (borrowed, from NewCommunicator, more than
  // one rank) this rank's part of a ring deployment; UNIMPLEMENTED where this device has none (a
  // GPU: rings of GPU deployments are not built). The model's and decoder's errors.
  virtual absl::StatusOr<std::unique_ptr<model::ServingModel>> NewServingModel(
      const model::LongNetConfig& config, absl::Span<const float> params, int64_t max_context,
      int64_t max_batch, int threads, comm::Communicator* ring) = 0;
};

// A device that passes every call to another one: derive from it to change a few calls (the
// worker's MeteredDevice counts communicator failures; tests give the host device a health, a
// memory size or gates) without restating the rest. Holds `base` shared; thread-safety is base's.
class ForwardingDevice : public TaskDevice {
 public:
  explicit ForwardingDevice(std::shared_ptr<TaskDevice> base) : base_(std::move(base)) {}

  const BackendCaps& caps() const override { return base_->caps(); }
  std::string device_name() const override { return base_->device_name(); }
  int device_index() const override { return base_->device_index(); }
  int64_t total_memory_bytes() const override { return base_->total_memory_bytes(); }
  absl::StatusOr<int64_t> FreeMemoryBytes() const override { return base_->FreeMemoryBytes(); }
  absl::Status Health() const override { return base_->Health(); }
  absl::StatusOr<int64_t> ReleaseCaches() override { return base_->ReleaseCaches(); }
  std::vector<std::string> ring_backends() const override { return base_->ring_backends(); }
  bool host_memory() const override { return base_->host_memory(); }
  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, const std::string& what) override {
    return base_->Allocate(bytes, what);
  }
  absl::Status FillInput(uint64_t seed, InputTensor tensor, const FullShape& full,
                         PositionRange positions, const TensorView& out, int threads) override {
    return base_->FillInput(seed, tensor, full, positions, out, threads);
  }
  absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override {
    return base_->CopyToDevice(device_dst, host_src, bytes);
  }
  absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override {
    return base_->CopyToHost(host_dst, device_src, bytes);
  }
  absl::StatusOr<ElementSums> SumElements(const void* data, DType dtype, int64_t count) override {
    return base_->SumElements(data, dtype, count);
  }
  absl::Status FillDevice(void* device_dst, int64_t bytes, const HostFill& fill,
                          int threads) override {
    return base_->FillDevice(device_dst, bytes, fill, threads);
  }
  absl::Status DrainDevice(const void* device_src, int64_t bytes, const HostDrain& drain,
                           int threads) override {
    return base_->DrainDevice(device_src, bytes, drain, threads);
  }
  absl::StatusOr<std::unique_ptr<AttentionBackend>> NewBackend(int threads) override {
    return base_->NewBackend(threads);
  }
  absl::Status Finish(AttentionBackend* backend) override { return base_->Finish(backend); }
  absl::StatusOr<std::unique_ptr<ring::BlockKernels>> NewRingKernels(int threads) override {
    return base_->NewRingKernels(threads);
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> NewCommunicator(
      const std::string& backend, std::shared_ptr<comm::Store> store, int rank, int size,
      const std::string& prefix, absl::Duration timeout) override {
    return base_->NewCommunicator(backend, std::move(store), rank, size, prefix, timeout);
  }
  absl::StatusOr<std::unique_ptr<model::TrainableModel>> NewTrainableModel(
      const model::LongNetConfig& config, const model::ModelOptions& options, int threads,
      comm::Communicator* sequence_group) override {
    return base_->NewTrainableModel(config, options, threads, sequence_group);
  }
  absl::StatusOr<std::unique_ptr<model::TrainerCollective>> NewTrainerCollective(
      comm::Communicator* world, model::TrainableModel* model) override {
    return base_->NewTrainerCollective(world, model);
  }
  absl::StatusOr<std::unique_ptr<model::ServingModel>> NewServingModel(
      const model::LongNetConfig& config, absl::Span<const float> params, int64_t max_context,
      int64_t max_batch, int threads, comm::Communicator* ring) override {
    return base_->NewServingModel(config, params, max_context, max_batch, threads, ring);
  }

 protected:
  TaskDevice& base() const { return *base_; }

 private:
  const std::shared_ptr<TaskDevice> base_;
};

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_TASK_DEVICE_H_
