#include "model/sequence_attention.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cpu_backend.h"

namespace dattn {
namespace model {
namespace {

class LocalAttention final : public SequenceAttention {
 public:
  LocalAttention(AttentionBackend* backend, std::unique_ptr<AttentionBackend> owned)
      : backend_(backend), owned_(std::move(owned)) {}

  Device device() const override { return backend_->caps().device; }

  absl::Status Forward(const AttentionSpec& spec, const SequencePositions& positions,
                       const ForwardArgs& args) override {
    absl::Status s = CheckWhole(spec, positions, args.q);
    if (!s.ok()) return s;
    return backend_->Forward(spec, args);
  }

  absl::Status Backward(const AttentionSpec& spec, const SequencePositions& positions,
                        const BackwardArgs& args) override {
    absl::Status s = CheckWhole(spec, positions, args.q);
    if (!s.ok()) return s;
    return backend_->Backward(spec, args);
  }

 private:
  // The whole sequence, or with causal attention its first n positions (which see no later one).
  static absl::Status CheckWhole(const AttentionSpec& spec, const SequencePositions& positions,
                                 const TensorView& q) {
    const int64_t n = q.rank() == 4 ? q.shape[1] : -1;
    const bool whole = positions.total == n;
    const bool prefix = spec.causal && n >= 0 && n <= positions.total;
    if (positions.offset != 0 || !(whole || prefix)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "local attention holds the whole sequence (or, causal, its first rows): positions "
          "start at ",
          positions.offset, " (must be 0) and the sequence has ", positions.total,
          " positions against ", n, " rows of q ", q.DebugString(),
          spec.causal ? "" : " (not causal: the rows must be the whole sequence)"));
    }
    return absl::OkStatus();
  }

  AttentionBackend* const backend_;
  const std::unique_ptr<AttentionBackend> owned_;
};

}  // namespace

std::unique_ptr<SequenceAttention> NewLocalAttention(AttentionBackend* backend) {
  return std::make_unique<LocalAttention>(backend, nullptr);
}

std::unique_ptr<SequenceAttention> NewCpuLocalAttention(int num_threads) {
  CpuBackendOptions options;
  options.num_threads = num_threads;
  std::unique_ptr<AttentionBackend> backend = NewCpuBackend(options);
  AttentionBackend* raw = backend.get();
  return std::make_unique<LocalAttention>(raw, std::move(backend));
}

}  // namespace model
}  // namespace dattn
