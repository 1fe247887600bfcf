// A TrainableModel that passes every call to another one, for tests that change one call (NaN in
// the gradients from some step on, a poisoned gradient on the GPU) without restating the rest.
// Owns `inner`; thread-safety is inner's.
#ifndef DATTN_MODEL_TESTING_FORWARDING_MODEL_H_
#define DATTN_MODEL_TESTING_FORWARDING_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "model/trainable_model.h"

namespace dattn {
namespace model {

class ForwardingModel : public TrainableModel {
 public:
  explicit ForwardingModel(std::unique_ptr<TrainableModel> inner) : inner_(std::move(inner)) {}

  const LongNetConfig& config() const override { return inner_->config(); }
  const ParamLayout& layout() const override { return inner_->layout(); }
  bool checkpoint_activations() const override { return inner_->checkpoint_activations(); }
  std::string description() const override { return inner_->description(); }
  double TrainingFlops(int64_t b, int64_t n) const override { return inner_->TrainingFlops(b, n); }
  double NominalPeakFlops() const override { return inner_->NominalPeakFlops(); }
  absl::Status InitParams(uint64_t seed) override { return inner_->InitParams(seed); }
  absl::StatusOr<LossResult> ForwardBackward(const TokenBatch& batch,
                                             const BackwardOptions& options) override {
    return inner_->ForwardBackward(batch, options);
  }
  absl::StatusOr<LossResult> Evaluate(const TokenBatch& batch,
                                      absl::Span<int32_t> predictions) override {
    return inner_->Evaluate(batch, predictions);
  }
  float* params() override { return inner_->params(); }
  float* grads() override { return inner_->grads(); }
  absl::Status ReadParams(int64_t begin, absl::Span<float> out) override {
    return inner_->ReadParams(begin, out);
  }
  absl::Status WriteParams(int64_t begin, absl::Span<const float> in) override {
    return inner_->WriteParams(begin, in);
  }
  absl::StatusOr<std::unique_ptr<ShardOptimizer>> NewOptimizer(const AdamW& adamw, int64_t begin,
                                                               int64_t end) override {
    return inner_->NewOptimizer(adamw, begin, end);
  }

 protected:
  TrainableModel& inner() const { return *inner_; }

 private:
  std::unique_ptr<TrainableModel> inner_;
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TESTING_FORWARDING_MODEL_H_
