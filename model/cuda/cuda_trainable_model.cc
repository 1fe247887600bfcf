#include "model/cuda/cuda_trainable_model.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/cuda/cuda_status.h"
#include "model/cuda/cuda_adamw.h"
#include "model/cuda/cuda_sequence_attention.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

absl::Status CheckRange(const char* what, int64_t begin, int64_t n, int64_t total) {
  if (begin < 0 || n < 0 || begin > total || n > total - begin) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": elements [", begin, ", ", begin, " + ",
                                                   n, ") do not lie in [0, ", total, ")"));
  }
  return absl::OkStatus();
}

// AdamW::Update's argument rules (optimizer.h), checked before anything is enqueued.
absl::Status CheckStepArgs(const AdamWStepArgs& a) {
  if (a.t < 1) return absl::InvalidArgumentError(absl::StrCat("AdamW t = ", a.t, ": need >= 1"));
  if (!(a.lr >= 0 && std::isfinite(a.lr))) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW lr = ", a.lr, ": need finite >= 0"));
  }
  if (!(a.grad_scale > 0 && std::isfinite(a.grad_scale))) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW grad_scale = ", a.grad_scale, ": need finite > 0"));
  }
  return absl::OkStatus();
}

class CudaShardOptimizer : public ShardOptimizer {
 public:
  CudaShardOptimizer(std::unique_ptr<CudaAdamW> adamw, CudaLongNetLM* lm)
      : adamw_(std::move(adamw)), lm_(lm) {}

  int64_t begin() const override { return adamw_->begin(); }
  int64_t end() const override { return adamw_->end(); }

  absl::StatusOr<double> GradSumOfSquares() override {
    return adamw_->SumOfSquares(lm_->grads(), begin(), end());
  }

  absl::Status Update(const AdamWStepArgs& args) override {
    DATTN_RETURN_IF_ERROR(CheckStepArgs(args));
    return adamw_->Update(args.t, args.lr, args.grad_scale, begin(), end(), lm_->params(),
                          lm_->grads());
  }

  absl::Status ReadMoments(absl::Span<float> m, absl::Span<float> v) override {
    DATTN_RETURN_IF_ERROR(CheckSpans("ReadMoments", m.size(), v.size()));
    return adamw_->CopyMomentsToHost(m.data(), v.data());
  }

  absl::Status WriteMoments(absl::Span<const float> m, absl::Span<const float> v) override {
    DATTN_RETURN_IF_ERROR(CheckSpans("WriteMoments", m.size(), v.size()));
    return adamw_->CopyMomentsFromHost(m.data(), v.data());
  }

 private:
  absl::Status CheckSpans(const char* what, size_t m, size_t v) const {
    const size_t n = static_cast<size_t>(end() - begin());
    if (m != n || v != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": spans of ", m, " and ", v, " elements for a shard of ", n));
    }
    return absl::OkStatus();
  }

  const std::unique_ptr<CudaAdamW> adamw_;
  CudaLongNetLM* const lm_;
};

class CudaTrainableModel : public TrainableModel {
 public:
  CudaTrainableModel(std::unique_ptr<CudaLongNetLM> lm, std::string device_description,
                     double peak_flops)
      : lm_(std::move(lm)),
        device_description_(std::move(device_description)),
        peak_flops_(peak_flops) {}

  const LongNetConfig& config() const override { return lm_->config(); }
  const ParamLayout& layout() const override { return lm_->layout(); }
  bool checkpoint_activations() const override { return lm_->options().checkpoint_activations; }
  std::string description() const override {
    return absl::StrCat("cuda bf16 on fp32 master weights, ", device_description_,
                        checkpoint_activations() ? ", activation checkpointing" : "");
  }

  double TrainingFlops(int64_t batch, int64_t seq_len) const override {
    const ModelFlops f = CountFlops(config(), batch, seq_len, checkpoint_activations());
    return f.forward + f.backward;
  }

  double NominalPeakFlops() const override { return peak_flops_; }

  absl::Status InitParams(uint64_t seed) override { return lm_->InitParams(seed); }

  absl::StatusOr<LossResult> ForwardBackward(const TokenBatch& batch,
                                             const BackwardOptions& options) override {
    if (batch.targets == nullptr) {
      return absl::InvalidArgumentError("ForwardBackward: the batch has no targets");
    }
    absl::StatusOr<LossResult> loss = lm_->Forward(batch);
    if (!loss.ok()) return loss.status();
    DATTN_RETURN_IF_ERROR(lm_->Backward(options));
    return loss;
  }

  absl::StatusOr<LossResult> Evaluate(const TokenBatch& batch,
                                      absl::Span<int32_t> predictions) override {
    const int64_t m = batch.batch * batch.seq_len;
    if (!predictions.empty() && static_cast<int64_t>(predictions.size()) != m) {
      return absl::InvalidArgumentError(absl::StrCat("Evaluate: ", predictions.size(),
                                                     " predictions for ", batch.batch, " x ",
                                                     batch.seq_len, " positions"));
    }
    absl::StatusOr<LossResult> loss = lm_->Forward(batch);
    if (!loss.ok()) return loss.status();
    if (predictions.empty()) {
      DATTN_RETURN_IF_ERROR(lm_->Synchronize());  // Without targets nothing waited yet.
      return loss;
    }
    const int64_t v = config().vocab_size;
    logits_.resize(static_cast<size_t>(m * v));
    DATTN_RETURN_IF_ERROR(lm_->CopyLogitsToHost(logits_.data()));
    for (int64_t t = 0; t < m; ++t) {
      const float* row = logits_.data() + t * v;
      predictions[static_cast<size_t>(t)] =
          static_cast<int32_t>(std::max_element(row, row + v) - row);
    }
    return loss;
  }

  float* params() override { return lm_->params(); }
  float* grads() override { return lm_->grads(); }
  cudaStream_t stream() const { return lm_->stream(); }

  absl::Status ReadParams(int64_t begin, absl::Span<float> out) override {
    const int64_t n = static_cast<int64_t>(out.size());
    DATTN_RETURN_IF_ERROR(CheckRange("ReadParams", begin, n, layout().total()));
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), lm_->params() + begin,
                                               static_cast<size_t>(n) * sizeof(float),
                                               cudaMemcpyDeviceToHost, lm_->stream()));
    return lm_->Synchronize();
  }

  absl::Status WriteParams(int64_t begin, absl::Span<const float> in) override {
    const int64_t n = static_cast<int64_t>(in.size());
    DATTN_RETURN_IF_ERROR(CheckRange("WriteParams", begin, n, layout().total()));
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(lm_->params() + begin, in.data(),
                                               static_cast<size_t>(n) * sizeof(float),
                                               cudaMemcpyHostToDevice, lm_->stream()));
    return lm_->Synchronize();
  }

  absl::StatusOr<std::unique_ptr<ShardOptimizer>> NewOptimizer(const AdamW& adamw, int64_t begin,
                                                               int64_t end) override {
    if (adamw.total() != layout().total()) {
      return absl::InvalidArgumentError(absl::StrCat("NewOptimizer: AdamW made for ", adamw.total(),
                                                     " elements, the model has ",
                                                     layout().total()));
    }
    if (begin < 0 || end <= begin || end > adamw.total()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer shard [", begin, ", ", end, ") is empty or outside [0, ", adamw.total(), ")"));
    }
    const AdamWConfig& c = adamw.config();
    AdamWOptions options;
    options.beta1 = c.beta1;
    options.beta2 = c.beta2;
    options.epsilon = c.epsilon;
    options.weight_decay = c.weight_decay;
    // The trainer's choice, entry by entry (AdamW decides per entry, so its first element
    // speaks for the entry).
    auto decay = [&adamw](const ParamEntry& e) { return e.numel > 0 && adamw.Decays(e.offset); };
    absl::StatusOr<std::unique_ptr<CudaAdamW>> opt =
        CudaAdamW::CreateShard(layout(), options, lm_->stream(), decay, begin, end);
    if (!opt.ok()) return opt.status();
    return std::unique_ptr<ShardOptimizer>(new CudaShardOptimizer(*std::move(opt), lm_.get()));
  }

 private:
  const std::unique_ptr<CudaLongNetLM> lm_;
  const std::string device_description_;
  const double peak_flops_;
  std::vector<float> logits_;  // Host copy for Evaluate's predictions.
};

}  // namespace

double NominalBf16PeakFlops(const std::string& device_name, int major, int minor) {
  if (major != 9 || minor != 0) return 0;
  if (device_name.find("PCIe") != std::string::npos) return 756e12;
  if (device_name.find("NVL") != std::string::npos) return 835e12;
  return 989.4e12;
}

absl::StatusOr<std::unique_ptr<TrainableModel>> NewCudaTrainableModel(
    const LongNetConfig& config, const ModelOptions& options,
    const CudaModelOptions& cuda_options) {
  absl::StatusOr<std::unique_ptr<CudaLongNetLM>> lm =
      CudaLongNetLM::Create(config, options, cuda_options);
  if (!lm.ok()) return lm.status();
  cudaDeviceProp props;
  DATTN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props, cuda_options.device));
  const std::string description = absl::StrFormat("%s (device %d, sm_%d%d)", props.name,
                                                  cuda_options.device, props.major, props.minor);
  return std::unique_ptr<TrainableModel>(new CudaTrainableModel(
      *std::move(lm), description, NominalBf16PeakFlops(props.name, props.major, props.minor)));
}

absl::StatusOr<std::unique_ptr<TrainableModel>> NewCudaTrainableModel(
    const LongNetConfig& config, const ModelOptions& options, const CudaModelOptions& cuda_options,
    comm::Communicator* sp, const ring::RingOptions& ring_options) {
  if (sp == nullptr || sp->size() == 1) return NewCudaTrainableModel(config, options, cuda_options);
  if (cuda_options.attention_factory) {
    return absl::InvalidArgumentError(
        "NewCudaTrainableModel: both a sequence-parallel communicator and "
        "CudaModelOptions::attention_factory were given; pass one");
  }
  CudaModelOptions ring_model = cuda_options;
  const int device = cuda_options.device;
  ring_model.attention_factory = [sp, device, ring_options](cudaStream_t stream) {
    return NewCudaRingSequenceAttention(sp, stream, device, ring_options);
  };
  return NewCudaTrainableModel(config, options, ring_model);
}

absl::StatusOr<cudaStream_t> CudaTrainableModelStream(TrainableModel& model) {
  const CudaTrainableModel* cuda = dynamic_cast<const CudaTrainableModel*>(&model);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("CudaTrainableModelStream: the model (",
                                                   model.description(),
                                                   ") is not one NewCudaTrainableModel made"));
  }
  return cuda->stream();
}

absl::Status RegisterCudaTrainingDevice() {
  return RegisterTrainingDevice(
      "cuda", [](const LongNetConfig& config, const ModelOptions& options, int /*num_threads*/) {
        return NewCudaTrainableModel(config, options);
      });
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
