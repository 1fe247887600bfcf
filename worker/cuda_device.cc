#include "worker/cuda_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/comm/nccl_communicator.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_status.h"
#include "engine/memory_plan.h"
#include "engine/ring/cuda_block_kernels.h"
#include "model/cuda/cuda_serving_model.h"
#include "model/cuda/cuda_trainable_model.h"
#include "model/cuda/nccl_collective.h"
#include "worker/checksum_cuda.h"
#include "worker/normal_generator.h"
#include "worker/pieces.h"
#include "worker/random_inputs_cuda.h"

namespace dattn {
namespace worker {
namespace {

// The GPU kernels' element type of `dtype`; INVALID_ARGUMENT naming `what` for fp64 (the CUDA
// backend takes none).
absl::StatusOr<GpuElem> ElemOf(DType dtype, const char* what) {
  switch (dtype) {
    case DType::kFloat32:
      return GpuElem::kF32;
    case DType::kFloat16:
      return GpuElem::kF16;
    case DType::kBFloat16:
      return GpuElem::kBF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dtype ", DTypeName(dtype), " is not handled on a GPU"));
  }
}

class CudaDevice final : public TaskDevice {
 public:
  CudaDevice(int device, std::string name, int64_t total)
      : device_(device), caps_(CudaBackendCaps()), name_(std::move(name)), total_(total) {}
  ~CudaDevice() override {
    cudaSetDevice(device_);
    for (const Staging& st : staging_) {
      cudaStreamDestroy(st.stream);
      cudaFreeHost(st.host);
    }
  }

  const BackendCaps& caps() const override { return caps_; }
  std::string device_name() const override { return name_; }
  int device_index() const override { return device_; }
  int64_t total_memory_bytes() const override { return total_; }

  absl::StatusOr<int64_t> FreeMemoryBytes() const override {
    DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    size_t free_bytes = 0, total_bytes = 0;
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<int64_t>(free_bytes);
  }

  absl::Status Health() const override { return FreeMemoryBytes().status(); }
  absl::StatusOr<int64_t> ReleaseCaches() override {
    absl::StatusOr<int64_t> before = FreeMemoryBytes();
    if (!before.ok()) return before.status();
    // The default pool (cudaMallocAsync's) gives back the memory it keeps and no stream still
    // uses. No device synchronize first: another task's collective may be waiting for a dead peer
    // until its ring's timeout, and this must not wait with it. The engine's workspace pools
    // belong to live backends (each task's own, gone with it), the staging buffers are host
    // memory: neither is a cache to drop here.
    cudaMemPool_t pool = nullptr;
    DATTN_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemPoolTrimTo(pool, 0));
    absl::StatusOr<int64_t> after = FreeMemoryBytes();
    if (!after.ok()) return after.status();
    return std::max<int64_t>(0, *after - *before);
  }

  std::vector<std::string> ring_backends() const override { return {"nccl"}; }

  bool host_memory() const override { return false; }

  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, const std::string& what) override {
    DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    const cudaError_t code = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (code != cudaSuccess) {
      cudaGetLastError();  // cudaMalloc's error is not sticky; clear it for the next call.
      absl::Status s = cuda::CudaErrorStatus(code, "cudaMalloc", __FILE__, __LINE__);
      return absl::Status(s.code(), absl::StrCat("allocating ", what, " (", FormatBytes(bytes),
                                                 ") on GPU ", device_, ": ", s.message()));
    }
    const int device = device_;
    return DeviceBuffer(p, [device](void* q) {
      cudaSetDevice(device);
      cudaFree(q);
    });
  }
  absl::Status FillInput(uint64_t seed, InputTensor tensor, const FullShape& full,
                         PositionRange positions, const TensorView& out, int /*threads*/) override {
    const std::vector<int64_t> want = {full.batch, positions.size(), full.num_heads, full.head_dim};
    if (out.shape != want || !out.IsContiguous() || out.data == nullptr ||
        out.device != Device::kCuda || out.device_index != device_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "random inputs: ", out.DebugString(), " must be a contiguous (", full.batch, ", ",
          positions.size(), ", ", full.num_heads, ", ", full.head_dim, ") view on cuda:", device_));
    }
    if (positions.begin < 0 || positions.end > full.seq_len || positions.begin > positions.end) {
      return absl::InvalidArgumentError(absl::StrCat("random inputs: positions [", positions.begin,
                                                     ", ", positions.end, ") outside [0, ",
                                                     full.seq_len, ")"));
    }
    absl::StatusOr<GpuElem> elem = ElemOf(out.dtype, "random inputs");
    if (!elem.ok()) return elem.status();
    const GpuElem type = *elem;
    DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // A stream of its own: the legacy default stream would also wait for other tasks' work.
    cudaStream_t stream = nullptr;
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaError_t code = LaunchFillStandardNormal(
        normal_generator::StreamKey(seed, static_cast<uint32_t>(tensor)), full.batch, full.seq_len,
        positions.begin, positions.size(), full.num_heads * full.head_dim, type, out.data, stream);
    const cudaError_t synced = cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    if (code == cudaSuccess) code = synced;
    DATTN_CUDA_RETURN_IF_ERROR(code);
    return absl::OkStatus();
  }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    DATTN_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    DATTN_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }
  absl::StatusOr<ElementSums> SumElements(const void* data, DType dtype, int64_t count) override {
    absl::StatusOr<GpuElem> type = ElemOf(dtype, "checksums");
    if (!type.ok()) return type.status();
    DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaStream_t stream = nullptr;
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    double* partial = nullptr;
    std::vector<double> host(2 * kChecksumBlocks);
    cudaError_t code =
        cudaMallocAsync(reinterpret_cast<void**>(&partial), host.size() * sizeof(double), stream);
    if (code == cudaSuccess) code = LaunchChecksum(data, count, *type, partial, stream);
    if (code == cudaSuccess) {
      code = cudaMemcpyAsync(host.data(), partial, host.size() * sizeof(double),
                             cudaMemcpyDeviceToHost, stream);
    }
    if (partial != nullptr) cudaFreeAsync(partial, stream);
    const cudaError_t synced = cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    if (code == cudaSuccess) code = synced;
    DATTN_CUDA_RETURN_IF_ERROR(code);
    ElementSums acc;
    for (int b = 0; b < kChecksumBlocks; ++b) {  // In block order (checksum_cuda.h).
      acc.sum += host[static_cast<size_t>(2 * b)];
      acc.sum_squares += host[static_cast<size_t>(2 * b + 1)];
    }
    return acc;
  }
  // Each thread fills (drains) a page-locked staging buffer and copies it to (from) the device on
  // its own stream: one thread's copy overlaps the others' fills, and the copies run at the bus's
  // page-locked rate rather than through the driver's pageable path.
  absl::Status FillDevice(void* dst, int64_t bytes, const HostFill& fill, int threads) override {
    char* base = static_cast<char*>(dst);
    return Staged(bytes, threads, [&](int64_t offset, int64_t length, const Staging& st) {
      if (absl::Status s = fill(offset, length, st.host); !s.ok()) return s;
      DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          base + offset, st.host, static_cast<size_t>(length), cudaMemcpyHostToDevice, st.stream));
      DATTN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st.stream));
      return absl::OkStatus();
    });
  }
  absl::Status DrainDevice(const void* src, int64_t bytes, const HostDrain& drain,
                           int threads) override {
    const char* base = static_cast<const char*>(src);
    return Staged(bytes, threads, [&](int64_t offset, int64_t length, const Staging& st) {
      DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          st.host, base + offset, static_cast<size_t>(length), cudaMemcpyDeviceToHost, st.stream));
      DATTN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st.stream));
      return drain(offset, length, st.host);
    });
  }

  absl::StatusOr<std::unique_ptr<AttentionBackend>> NewBackend(int) override {
    CudaBackendOptions options;
    options.device = device_;
    absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> backend = NewCudaBackend(options);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<AttentionBackend>(std::move(*backend));
  }

  absl::Status Finish(AttentionBackend* backend) override {
    auto* cuda_backend = dynamic_cast<CudaAttentionBackend*>(backend);
    if (cuda_backend == nullptr) {
      return absl::InvalidArgumentError("CudaDevice::Finish: not a backend of this device");
    }
    return cuda_backend->Synchronize();
  }

  absl::StatusOr<std::unique_ptr<ring::BlockKernels>> NewRingKernels(int) override {
    ring::CudaBlockKernelOptions options;
    options.device = device_;
    absl::StatusOr<std::unique_ptr<ring::CudaBlockKernels>> kernels =
        ring::NewCudaBlockKernels(options);
    if (!kernels.ok()) return kernels.status();
    return std::unique_ptr<ring::BlockKernels>(std::move(*kernels));
  }

  absl::StatusOr<std::unique_ptr<comm::Communicator>> NewCommunicator(
      const std::string& backend, std::shared_ptr<comm::Store> store, int rank, int size,
      const std::string& prefix, absl::Duration timeout) override {
    if (backend != "nccl") {
      return absl::FailedPreconditionError(
          absl::StrCat("a GPU worker forms nccl rings only; the ring asks for \"", backend, "\""));
    }
    comm::NcclOptions options;
    options.device = device_;
    options.timeout = timeout;
    options.prefix = prefix;
    return comm::CreateNcclCommunicator(std::move(store), rank, size, options);
  }
  absl::StatusOr<std::unique_ptr<model::TrainableModel>> NewTrainableModel(
      const model::LongNetConfig& config, const model::ModelOptions& options, int,
      comm::Communicator* sequence_group) override {
    model::cuda::CudaModelOptions cuda_options;
    cuda_options.device = device_;
    // With a sequence group, the ring's CUDA kernels run on the model's own stream.
    return model::cuda::NewCudaTrainableModel(config, options, cuda_options, sequence_group);
  }
  absl::StatusOr<std::unique_ptr<model::TrainerCollective>> NewTrainerCollective(
      comm::Communicator* world, model::TrainableModel* model) override;
  absl::StatusOr<std::unique_ptr<model::ServingModel>> NewServingModel(
      const model::LongNetConfig& config, absl::Span<const float> params, int64_t max_context,
      int64_t max_batch, int threads, comm::Communicator* ring) override;

 private:
  static constexpr int64_t kStagingBytes = int64_t{8} << 20;
  static constexpr int kMaxStagingThreads = 8;
  // A page-locked buffer of kStagingBytes and a stream: one copying thread's, kept for reuse.
  struct Staging {
    char* host = nullptr;
    cudaStream_t stream = nullptr;
  };

  // Runs `piece` for each piece of [0, bytes) on up to `threads` threads, each with a staging
  // buffer from the pool (taken at its first piece, returned at the end).
  absl::Status Staged(int64_t bytes, int threads,
                      const std::function<absl::Status(int64_t, int64_t, const Staging&)>& piece) {
    const int n = std::clamp(threads, 1, kMaxStagingThreads);
    std::vector<Staging> taken(static_cast<size_t>(n));
    absl::Status status =
        ForEachPiece(bytes, kStagingBytes, n, [&](int64_t offset, int64_t length, int t) {
          Staging& st = taken[static_cast<size_t>(t)];
          if (st.host == nullptr) {
            DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
            absl::StatusOr<Staging> got = TakeStaging();
            if (!got.ok()) return got.status();
            st = *got;
          }
          return piece(offset, length, st);
        });
    std::lock_guard<std::mutex> lock(staging_mu_);
    for (const Staging& st : taken) {
      if (st.host != nullptr) staging_.push_back(st);
    }
    return status;
  }
  absl::StatusOr<Staging> TakeStaging() {
    {
      std::lock_guard<std::mutex> lock(staging_mu_);
      if (!staging_.empty()) {
        Staging st = staging_.back();
        staging_.pop_back();
        return st;
      }
    }
    Staging st;
    void* host = nullptr;
    DATTN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, kStagingBytes, cudaHostAllocPortable));
    st.host = static_cast<char*>(host);
    const cudaError_t code = cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking);
    if (code != cudaSuccess) {
      cudaFreeHost(host);
      DATTN_CUDA_RETURN_IF_ERROR(code);
    }
    return st;
  }

  const int device_;
  const BackendCaps caps_;
  const std::string name_;
  const int64_t total_;
  std::mutex staging_mu_;
  std::vector<Staging> staging_;  // Free staging buffers (guarded by staging_mu_).
};

absl::StatusOr<std::unique_ptr<model::TrainerCollective>> CudaDevice::NewTrainerCollective(
    comm::Communicator* world, model::TrainableModel* model) {
  // The collective's work is ordered on the model's stream: after the backward pass that wrote the
  // gradients, before the optimizer that reads them.
  absl::StatusOr<cudaStream_t> stream = model::cuda::CudaTrainableModelStream(*model);
  if (!stream.ok()) return stream.status();
  return model::cuda::NewCudaCollective(world, *stream);
}

absl::StatusOr<std::unique_ptr<model::ServingModel>> CudaDevice::NewServingModel(
    const model::LongNetConfig& config, absl::Span<const float> params, int64_t max_context,
    int64_t max_batch, int, comm::Communicator* ring) {
  return model::cuda::NewCudaServingModel(config, params, max_context, max_batch, device_, ring);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TaskDevice>> NewCudaDevice(const CudaDeviceOptions& options) {
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess || count == 0) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device: cudaGetDeviceCount returned ",
                     code != cudaSuccess
                         ? absl::StrCat(cudaGetErrorName(code), " (", cudaGetErrorString(code), ")")
                         : std::string("0 devices")));
  }
  if (options.device < 0 || options.device >= count) {
    return absl::UnavailableError(absl::StrCat("GPU ", options.device,
                                               " does not exist: CUDA sees ", count,
                                               count == 1 ? " device" : " devices"));
  }
  DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  // The trainer checks a config's "device" against the process's training devices: this process
  // trains on its GPU (through NewTrainableModel below, on this device), so "cuda" is one.
  static std::once_flag registered;
  std::call_once(registered, [] { (void)model::cuda::RegisterCudaTrainingDevice(); });
  cudaDeviceProp props{};
  DATTN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props, options.device));
  return std::unique_ptr<TaskDevice>(std::make_unique<CudaDevice>(
      options.device, props.name, static_cast<int64_t>(props.totalGlobalMem)));
}

}  // namespace worker
}  // namespace dattn
