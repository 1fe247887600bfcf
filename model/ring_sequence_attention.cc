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
    absl::StatusOr<int64_t> ring_n = RingLength(spec, positions, args.q);
    if (!ring_n.ok()) return ring_n.status();
    return ring_.Forward(spec, *ring_n, args);
  }

  absl::Status Backward(const AttentionSpec& spec, const SequencePositions& positions,
                        const BackwardArgs& args) override {
    absl::StatusOr<int64_t> ring_n = RingLength(spec, positions, args.q);
    if (!ring_n.ok()) return ring_n.status();
    return ring_.Backward(spec, *ring_n, args);
  }

 private:
  // The N of the ring's call: `total` when the ranks' shards cover the whole sequence; with causal
  // attention also n * P < total, the first n * P positions of a longer sequence (a prompt whose
  // rotary positions are planned for the context it will grow to: decoder.h). No row of a causal
  // prefix sees a later one, and the segments of the prefix start where the whole sequence's do
  // (a segment longer than the prefix is cut to it, as one longer than the sequence is), so the
  // ring over the prefix computes exactly those rows of the whole sequence's attention.
  absl::StatusOr<int64_t> RingLength(const AttentionSpec& spec, const SequencePositions& positions,
                                     const TensorView& q) const {
    const int64_t p = sp_->size();
    const int64_t rank = sp_->rank();
    const int64_t n = q.rank() == 4 ? q.shape[1] : -1;
    const int64_t total = positions.total;
    const bool whole = n >= 1 && total >= 1 && n * p == total;
    const bool prefix = spec.causal && n >= 1 && n * p < total;
    if (!(whole || prefix) || positions.offset != rank * n) {
      const int64_t expected = static_cast<int64_t>(static_cast<__int128>(rank) * total / p);
      return absl::InvalidArgumentError(absl::StrCat(
          "ring attention rank ", rank, " of ", p, ": positions start at ", positions.offset,
          " of a sequence of ", total, " positions with ", n,
          " rows of q; this rank's shard must start at rank * N / P = ", expected,
          " and hold N / P rows (", n, " x ", p, " = ", n * p, " must equal ", total,
          spec.causal ? ", or with causal attention be at most it: a prefix of the sequence" : "",
          ")"));
    }
    return n * p;
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
