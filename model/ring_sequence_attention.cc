#include "model/ring_sequence_attention.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/ring/cpu_block_kernels.h"

namespace dattn {
namespace model {
namespace {

class RingSequenceAttention final : public SequenceAttention {
 public:
  RingSequenceAttention(comm::Communicator* sp, ring::BlockKernels* kernels,
                        std::unique_ptr<ring::BlockKernels> owned, ring::RingOptions options)
      : sp_(sp),
        kernels_(kernels),
        owned_(std::move(owned)),
        ring_(sp, kernels, std::move(options)) {}

  Device device() const override { return kernels_->caps().device; }

  absl::Status Forward(const AttentionSpec& spec, const SequencePositions& positions,
                       const ForwardArgs& args) override {
    if (absl::Status s = CheckShard(positions, args.q); !s.ok()) return s;
    return ring_.Forward(spec, positions.total, args);
  }

  absl::Status Backward(const AttentionSpec& spec, const SequencePositions& positions,
                        const BackwardArgs& args) override {
    if (absl::Status s = CheckShard(positions, args.q); !s.ok()) return s;
    return ring_.Backward(spec, positions.total, args);
  }

 private:
  absl::Status CheckShard(const SequencePositions& positions, const TensorView& q) const {
    const int64_t p = sp_->size();
    const int64_t rank = sp_->rank();
    const int64_t n = q.rank() == 4 ? q.shape[1] : -1;
    const int64_t total = positions.total;
    if (n < 1 || total < 1 || n * p != total ||
        positions.offset != static_cast<int64_t>(static_cast<__int128>(rank) * total / p)) {
      const int64_t expected = static_cast<int64_t>(static_cast<__int128>(rank) * total / p);
      return absl::InvalidArgumentError(absl::StrCat(
          "ring attention rank ", rank, " of ", p, ": positions start at ", positions.offset,
          " of a sequence of ", total, " positions with ", n,
          " rows of q; this rank's shard must start at rank * N / P = ", expected,
          " and hold N / P rows (", n, " x ", p, " = ", n * p, " must equal ", total, ")"));
    }
    return absl::OkStatus();
  }

  comm::Communicator* const sp_;
  ring::BlockKernels* const kernels_;
  const std::unique_ptr<ring::BlockKernels> owned_;
  ring::RingAttention ring_;
};

}  // namespace

std::unique_ptr<SequenceAttention> NewRingSequenceAttention(comm::Communicator* sp,
                                                            ring::BlockKernels* kernels,
                                                            ring::RingOptions options) {
  return std::make_unique<RingSequenceAttention>(sp, kernels, nullptr, std::move(options));
}

std::unique_ptr<SequenceAttention> NewCpuRingSequenceAttention(comm::Communicator* sp,
                                                               int num_threads,
                                                               ring::RingOptions options) {
  ring::CpuBlockKernelOptions kernel_options;
  kernel_options.num_threads = num_threads;
  std::unique_ptr<ring::BlockKernels> kernels = ring::NewCpuBlockKernels(kernel_options);
  ring::BlockKernels* raw = kernels.get();
  return std::make_unique<RingSequenceAttention>(sp, raw, std::move(kernels), std::move(options));
}

}  // namespace model
}  // namespace dattn
