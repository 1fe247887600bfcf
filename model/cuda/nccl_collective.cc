#include "model/cuda/nccl_collective.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/cuda/cuda_status.h"
#include "model/comm_collective.h"
#include "model/cuda/collective_kernels.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

using comm::P2POp;
using comm::Stream;

absl::Status Prefixed(const absl::Status& s, absl::string_view call) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(call, ": ", s.message()));
}

// A device buffer that grows (never shrinks) on demand. Plain cudaMalloc / cudaFree: the buffer
// does not depend on the stream's lifetime (the trainer owns the model, and so its stream, but
// borrows the collective, which may therefore outlive both).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  bool Holds(int64_t bytes) const { return bytes <= bytes_; }
  // At least `bytes`. The caller has made sure that no queued work uses the old buffer.
  absl::Status Reserve(int64_t bytes, const char* what) {
    if (Holds(bytes)) return absl::OkStatus();
    if (ptr_ != nullptr) DATTN_CUDA_RETURN_IF_ERROR(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
    const cudaError_t e = cudaMalloc(&ptr_, static_cast<size_t>(bytes));
    if (e != cudaSuccess) {
      ptr_ = nullptr;
      cudaGetLastError();
      if (e == cudaErrorMemoryAllocation) {
        return absl::ResourceExhaustedError(
            absl::StrCat("the CUDA collective could not allocate ", bytes, " bytes for ", what));
      }
      return ::dattn::cuda::CudaErrorStatus(e, "cudaMalloc", __FILE__, __LINE__);
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

class CudaCollective final : public TrainerCollective {
 public:
  CudaCollective(comm::Communicator* comm, cudaStream_t stream, int device,
                 const CudaCollectiveOptions& options)
      : comm_(comm), stream_(stream), device_(device), options_(options) {}

  ~CudaCollective() override {
    cudaSetDevice(device_);  // Then the buffers are freed there.
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (reduce_stream_ != nullptr) cudaStreamDestroy(reduce_stream_);
  }

  absl::Status Init() {
    DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&reduce_stream_, cudaStreamNonBlocking));
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    return staging_.Reserve(kCollectiveStagingBytes, "host values");
  }

  int rank() const override { return comm_->rank(); }
  int world() const override { return comm_->size(); }
  bool reduces_ranges_early() const override { return world() > 1; }

  absl::Status ReduceScatterGradients(float* grads, int64_t n,
                                      absl::Span<const ShardRange> shards) override {
    constexpr char kCall[] = "ReduceScatterGradients";
    DATTN_RETURN_IF_ERROR(Check(kCall, grads, n, shards));
    if (world() == 1) return absl::OkStatus();
    DATTN_RETURN_IF_ERROR(Enter(kCall));
    DATTN_RETURN_IF_ERROR(Prefixed(ReduceRange(grads, 0, n, shards, stream_), kCall));
    return Finish(kCall);
  }

  absl::Status AllGatherParameters(float* params, int64_t n,
                                   absl::Span<const ShardRange> shards) override {
    constexpr char kCall[] = "AllGatherParameters";
    DATTN_RETURN_IF_ERROR(Check(kCall, params, n, shards));
    const int w = world();
    const int me = rank();
    if (w == 1) return absl::OkStatus();
    DATTN_RETURN_IF_ERROR(Enter(kCall));
    const std::vector<P2POp> ops = AllGatherShardOps(params, shards, me);
    if (!ops.empty()) DATTN_RETURN_IF_ERROR(Prefixed(Exchange(ops, stream_), kCall));
    return Finish(kCall);
  }

  absl::StatusOr<std::vector<double>> AllGather(absl::Span<const double> values) override {
    constexpr char kCall[] = "AllGather";
    const int64_t k = static_cast<int64_t>(values.size());
    std::vector<double> out(static_cast<size_t>(k) * static_cast<size_t>(world()));
    if (k == 0) return out;
    DATTN_RETURN_IF_ERROR(Enter(kCall));
    DATTN_RETURN_IF_ERROR(Prefixed(GatherWords(values.data(), k, out.data()), kCall));
    return out;
  }

  absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string& bytes) override {
    constexpr char kCall[] = "AllGatherBytes";
    DATTN_RETURN_IF_ERROR(Enter(kCall));
    return AllGatherBytesAsWords(bytes, world(),
                                 [this, &kCall](const double* send, int64_t k, double* out) {
                                   return Prefixed(GatherWords(send, k, out), kCall);
                                 });
  }

  absl::Status Barrier() override {
    DATTN_RETURN_IF_ERROR(Enter("Barrier"));
    return Prefixed(comm_->Barrier(), "Barrier");
  }

 protected:
  // A range handed while the backward runs: its reduction goes on the collective's own stream,
  // after the work queued on the model's stream so far (the backward up to this range).
  absl::Status ReduceGradientRange(float* grads, int64_t begin, int64_t end,
                                   absl::Span<const ShardRange> shards) override {
    constexpr char kCall[] = "GradientsFinal";
    DATTN_RETURN_IF_ERROR(Enter(kCall));
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_, stream_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(reduce_stream_, ready_, 0));
    return Prefixed(ReduceRange(grads, begin, end, shards, reduce_stream_),
                    absl::StrCat(kCall, " [", begin, ", ", end, ")"));
  }

  // The model's stream waits for every range's reduction (an event), then the usual end.
  absl::Status FinishGradientRanges() override {
    constexpr char kCall[] = "FinishGradientReduction";
    DATTN_RETURN_IF_ERROR(Enter(kCall));
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, reduce_stream_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, done_, 0));
    return Finish(kCall);
  }

 private:
  // Makes the stream's device current on this thread; the communicator's sticky error, if any.
  absl::Status Enter(const char* call) {
    DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return Prefixed(comm_->health(), call);
  }

  // The end of a reduction: a bounded host wait when asked (see the header).
  absl::Status Finish(const char* call) {
    if (!options_.wait_on_host) return absl::OkStatus();
    return Prefixed(comm_->Synchronize(Stream{stream_}), call);
  }

  absl::Status Check(const char* call, const float* buffer, int64_t n,
                     absl::Span<const ShardRange> shards) const {
    return CheckShardArguments(call, buffer, n, shards, world());
  }

  // Reduces [begin, end) of the gradient, in order on `stream`: rank r's part of it is the range
  // intersected with shard r, moved in rounds of at most `chunk` elements per shard (round j: the
  // j-th chunk of every shard's part), each round one group of point-to-point operations (every
  // rank sends each other rank its copy of that rank's part, receives its own part from every
  // other rank into the receive slots) and the add in rank order on `stream`. Sender and receiver
  // compute the same parts from (range, shards), so every send meets its receive; [0, n) is the
  // whole reduce-scatter. Each element's sum is the same whichever range carries it.
  absl::Status ReduceRange(float* grads, int64_t begin, int64_t end,
                           absl::Span<const ShardRange> shards, cudaStream_t stream) {
    const int w = world();
    const int me = rank();
    int64_t largest = 0;
    for (const ShardRange& s : shards) largest = std::max(largest, s.size());
    const int64_t chunk = CollectiveChunkElements(largest, w, options_.max_temp_bytes);
    // Rank p's part: its shard cut to [begin, end).
    std::vector<ShardRange> parts(static_cast<size_t>(w));
    int64_t longest = 0;
    for (int p = 0; p < w; ++p) {
      const ShardRange& s = shards[static_cast<size_t>(p)];
      const int64_t lo = std::max(begin, s.begin);
      parts[static_cast<size_t>(p)] = ShardRange{lo, std::max(lo, std::min(end, s.end))};
      longest = std::max(longest, parts[static_cast<size_t>(p)].size());
    }
    const ShardRange mine = parts[static_cast<size_t>(me)];
    // Slot p (p != me, packed: slot(p) = p < me ? p : p - 1) receives peer p's copy of this
    // round's chunk of my part. Sized for a whole shard, so every range fits the same buffer.
    const int64_t slot = std::min(chunk, shards[static_cast<size_t>(me)].size());
    if (!temp_.Holds((w - 1) * slot * 4)) {
      // Once per run (the first call, or a larger buffer): earlier adds may still read the old one.
      DATTN_RETURN_IF_ERROR(comm_->Synchronize(Stream{stream_}));
      DATTN_RETURN_IF_ERROR(comm_->Synchronize(Stream{reduce_stream_}));
      DATTN_RETURN_IF_ERROR(
          temp_.Reserve((w - 1) * slot * 4, "the reduce-scatter's receive buffer"));
    }
    float* received = temp_.as<float>();
    auto slot_of = [&](int p) {
      return received + static_cast<int64_t>(p < me ? p : p - 1) * slot;
    };
    const int64_t rounds = (longest + chunk - 1) / chunk;
    std::vector<P2POp> ops;
    for (int64_t round = 0; round < rounds; ++round) {
      const int64_t lo = mine.begin + round * chunk;
      const int64_t len = ReduceScatterRoundOps(grads, parts, me, round, chunk, slot_of, &ops);
      // The group starts after everything queued on `stream`, the previous round's add included
      // (so the receive slots are free again).
      if (!ops.empty()) DATTN_RETURN_IF_ERROR(Exchange(ops, stream));
      if (len == 0) continue;
      // The documented order: ((g_0 + g_1) + g_2) + ... in fp32, element by element, in place.
      DATTN_CUDA_RETURN_IF_ERROR(
          SumInRankOrder(received, slot, grads + lo, me, w, len, grads + lo, stream));
    }
    return absl::OkStatus();
  }

  // One group of point-to-point ops, ordered after the work queued on `stream`, whose later work
  // waits for it (an event: no host wait).
  absl::Status Exchange(const std::vector<P2POp>& ops, cudaStream_t stream) {
    absl::StatusOr<std::unique_ptr<comm::Work>> work = comm_->StartGroup(ops, Stream{stream});
    if (!work.ok()) return work.status();
    return (*work)->Wait(Stream{stream});
  }

  // out[r * k + i] := rank r's send[i], for host arrays of k fp64 words per rank. Waits for the
  // work queued on the stream first (bounded, Communicator::Synchronize): the copy from pageable
  // host memory would otherwise wait for it without a deadline.
  absl::Status GatherWords(const double* send, int64_t k, double* out) {
    const int64_t w = world();
    DATTN_RETURN_IF_ERROR(comm_->Synchronize(Stream{stream_}));
    DATTN_RETURN_IF_ERROR(staging_.Reserve((w + 1) * k * 8, "host values"));
    double* dev = staging_.as<double>();
    DATTN_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dev, send, static_cast<size_t>(k) * 8, cudaMemcpyHostToDevice, stream_));
    DATTN_RETURN_IF_ERROR(comm_->AllGather(dev, dev + k, k, DType::kFloat64, Stream{stream_}));
    DATTN_RETURN_IF_ERROR(comm_->Synchronize(Stream{stream_}));
    // The stream is idle but for this copy, which a pageable destination makes synchronous.
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, dev + k, static_cast<size_t>(w * k) * 8,
                                               cudaMemcpyDeviceToHost, stream_));
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  comm::Communicator* const comm_;
  const cudaStream_t stream_;
  const int device_;
  const CudaCollectiveOptions options_;
  cudaStream_t reduce_stream_ = nullptr;  // Ranges handed while the backward runs.
  cudaEvent_t ready_ = nullptr;           // The model's stream up to a handed range.
  cudaEvent_t done_ = nullptr;            // Every handed range reduced.
  DeviceBuffer temp_;                     // The reductions' receive slots
  DeviceBuffer staging_;                  // host values: k words sent, then w x k received
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerCollective>> NewCudaCollective(
    comm::Communicator* world, cudaStream_t stream, const CudaCollectiveOptions& options) {
  if (world == nullptr) {
    return absl::InvalidArgumentError("NewCudaCollective: the communicator is null");
  }
  if (world->device() != Device::kCuda) {
    return absl::FailedPreconditionError(
        absl::StrCat("NewCudaCollective: the collective works on CUDA device memory; this ",
                     world->name(), " communicator's buffers are on ", DeviceName(world->device()),
                     " (comm_collective.h's NewCommunicatorCollective is the host-memory one)"));
  }
  if (stream == nullptr) {
    return absl::InvalidArgumentError(
        "NewCudaCollective: the stream is null; pass the model's stream "
        "(CudaTrainableModelStream)");
  }
  int device = 0;
  DATTN_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(stream, &device));
  auto collective = std::make_unique<CudaCollective>(world, stream, device, options);
  DATTN_RETURN_IF_ERROR(collective->Init());
  return std::unique_ptr<TrainerCollective>(std::move(collective));
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
