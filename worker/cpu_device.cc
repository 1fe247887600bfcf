#include "worker/cpu_device.h"

#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/cpu_backend.h"
#include "engine/memory_plan.h"
#include "engine/ring/cpu_block_kernels.h"
#include "model/comm_collective.h"
#include "model/ring_sequence_attention.h"
#include "model/trainable_model.h"
#include "worker/half_float.h"
#include "worker/host_info.h"
#include "worker/pieces.h"

namespace dattn {
namespace worker {
namespace {

class CpuDevice final : public TaskDevice {
 public:
  static constexpr int64_t kPieceBytes = int64_t{8} << 20;

  CpuDevice(CpuDeviceOptions options, BackendCaps caps, std::string name, int64_t total)
      : options_(std::move(options)),
        caps_(std::move(caps)),
        name_(std::move(name)),
        total_(total) {}

  const BackendCaps& caps() const override { return caps_; }
  std::string device_name() const override { return name_; }
  int device_index() const override { return 0; }
  int64_t total_memory_bytes() const override { return total_; }
  absl::StatusOr<int64_t> FreeMemoryBytes() const override {
    return ReadMeminfoBytes("MemAvailable");
  }
  absl::Status Health() const override { return absl::OkStatus(); }
  absl::StatusOr<int64_t> ReleaseCaches() override {
    absl::StatusOr<int64_t> before = FreeMemoryBytes();
    if (!before.ok()) return before.status();
    malloc_trim(0);  // glibc: free heap pages back to the kernel (large blocks already are).
    absl::StatusOr<int64_t> after = FreeMemoryBytes();
    if (!after.ok()) return after.status();
    return std::max<int64_t>(0, *after - *before);
  }

  std::vector<std::string> ring_backends() const override { return {"gloo"}; }

  bool host_memory() const override { return true; }

  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, const std::string& what) override {
    const size_t rounded = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + 63) & ~size_t{63};
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("allocating ", what, " (", FormatBytes(bytes), ") of host memory failed"));
    }
    return DeviceBuffer(p, [](void* q) { std::free(q); });
  }
  absl::Status FillInput(uint64_t seed, InputTensor tensor, const FullShape& full,
                         PositionRange positions, const TensorView& out, int threads) override {
    return FillStandardNormal(seed, tensor, full, positions, out, threads);
  }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::StatusOr<ElementSums> SumElements(const void* data, DType dtype, int64_t count) override {
    ElementSums acc;
    auto add = [&acc](double x) {
      acc.sum += x;
      acc.sum_squares += x * x;
    };
    switch (dtype) {
      case DType::kFloat32:
        for (int64_t i = 0; i < count; ++i) add(static_cast<const float*>(data)[i]);
        break;
      case DType::kFloat64:
        for (int64_t i = 0; i < count; ++i) add(static_cast<const double*>(data)[i]);
        break;
      case DType::kFloat16:
        for (int64_t i = 0; i < count; ++i) {
          add(HalfBitsToDouble(static_cast<const uint16_t*>(data)[i]));
        }
        break;
      case DType::kBFloat16:
        for (int64_t i = 0; i < count; ++i) {
          add(BFloat16BitsToDouble(static_cast<const uint16_t*>(data)[i]));
        }
        break;
    }
    return acc;
  }
  // The tensor is host memory: the callbacks fill and drain it in place.
  absl::Status FillDevice(void* dst, int64_t bytes, const HostFill& fill, int threads) override {
    char* base = static_cast<char*>(dst);
    return ForEachPiece(bytes, kPieceBytes, threads, [&](int64_t offset, int64_t length, int) {
      return fill(offset, length, base + offset);
    });
  }
  absl::Status DrainDevice(const void* src, int64_t bytes, const HostDrain& drain,
                           int threads) override {
    const char* base = static_cast<const char*>(src);
    return ForEachPiece(bytes, kPieceBytes, threads, [&](int64_t offset, int64_t length, int) {
      return drain(offset, length, base + offset);
    });
  }

  absl::StatusOr<std::unique_ptr<AttentionBackend>> NewBackend(int threads) override {
    CpuBackendOptions options;
    options.num_threads = threads;
    return NewCpuBackend(options);
  }
  absl::Status Finish(AttentionBackend*) override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<ring::BlockKernels>> NewRingKernels(int threads) override {
    ring::CpuBlockKernelOptions options;
    options.num_threads = threads;
    return ring::NewCpuBlockKernels(options);
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> NewCommunicator(
      const std::string& backend, std::shared_ptr<comm::Store> store, int rank, int size,
      const std::string& prefix, absl::Duration timeout) override {
    if (backend != "gloo") {
      return absl::FailedPreconditionError(
          absl::StrCat("a CPU worker forms gloo rings only; the ring asks for \"", backend, "\""));
    }
    comm::GlooOptions options;
    options.hostname = options_.ring_address;
    options.timeout = timeout;
    options.prefix = prefix;
    return comm::CreateGlooCommunicator(std::move(store), rank, size, options);
  }
  absl::StatusOr<std::unique_ptr<model::TrainableModel>> NewTrainableModel(
      const model::LongNetConfig& config, const model::ModelOptions& options, int threads,
      comm::Communicator* sequence_group) override {
    if (sequence_group == nullptr) return model::NewCpuTrainableModel(config, options, threads);
    return model::NewCpuTrainableModel(config, options, threads,
                                       model::NewCpuRingSequenceAttention(sequence_group, threads));
  }
  absl::StatusOr<std::unique_ptr<model::TrainerCollective>> NewTrainerCollective(
      comm::Communicator* world, model::TrainableModel*) override {
    // The CPU model's buffers are host memory, which the Gloo communicator reads and writes.
    return model::NewCommunicatorCollective(world);
  }
  absl::StatusOr<std::unique_ptr<model::ServingModel>> NewServingModel(
      const model::LongNetConfig& config, absl::Span<const float> params, int64_t max_context,
      int64_t max_batch, int threads, comm::Communicator* ring) override {
    return model::NewCpuServingModel(config, params, max_context, max_batch, threads, ring);
  }

 private:
  const CpuDeviceOptions options_;
  const BackendCaps caps_;
  const std::string name_;
  const int64_t total_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TaskDevice>> NewCpuDevice(const CpuDeviceOptions& options) {
  absl::StatusOr<int64_t> total = ReadMeminfoBytes("MemTotal");
  if (!total.ok()) return total.status();
  const BackendCaps caps = NewCpuBackend(CpuBackendOptions{1})->caps();
  return std::unique_ptr<TaskDevice>(
      std::make_unique<CpuDevice>(options, caps, ReadCpuModel(), *total));
}

}  // namespace worker
}  // namespace dattn
