#include "model/trainable_model.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "model/cpu_layer_ops.h"

namespace dattn {
namespace model {
namespace {

absl::Status CheckRange(const char* what, int64_t begin, int64_t n, int64_t total) {
  if (begin < 0 || n < 0 || begin > total || n > total - begin) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": elements [", begin, ", ", begin, " + ",
                                                   n, ") do not lie in [0, ", total, ")"));
  }
  return absl::OkStatus();
}

class HostShardOptimizer : public ShardOptimizer {
 public:
  HostShardOptimizer(const AdamW& adamw, float* params, const float* grads, int64_t begin,
                     int64_t end)
      : adamw_(adamw),
        params_(params),
        grads_(grads),
        begin_(begin),
        end_(end),
        m_(static_cast<size_t>(end - begin), 0.0f),
        v_(static_cast<size_t>(end - begin), 0.0f) {}

  int64_t begin() const override { return begin_; }
  int64_t end() const override { return end_; }

  absl::StatusOr<double> GradSumOfSquares() override {
    return SumOfSquares(absl::MakeConstSpan(grads_ + begin_, static_cast<size_t>(end_ - begin_)));
  }

  absl::Status Update(const AdamWStepArgs& args) override {
    const size_t n = static_cast<size_t>(end_ - begin_);
    return adamw_.Update(args, begin_, end_, absl::MakeSpan(params_ + begin_, n),
                         absl::MakeConstSpan(grads_ + begin_, n), absl::MakeSpan(m_),
                         absl::MakeSpan(v_));
  }

  absl::Status ReadMoments(absl::Span<float> m, absl::Span<float> v) override {
    if (m.size() != m_.size() || v.size() != v_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("ReadMoments: spans of ", m.size(), " and ",
                                                     v.size(), " elements for a shard of ",
                                                     m_.size()));
    }
    std::copy(m_.begin(), m_.end(), m.begin());
    std::copy(v_.begin(), v_.end(), v.begin());
    return absl::OkStatus();
  }

  absl::Status WriteMoments(absl::Span<const float> m, absl::Span<const float> v) override {
    if (m.size() != m_.size() || v.size() != v_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("WriteMoments: spans of ", m.size(), " and ",
                                                     v.size(), " elements for a shard of ",
                                                     m_.size()));
    }
    std::copy(m.begin(), m.end(), m_.begin());
    std::copy(v.begin(), v.end(), v_.begin());
    return absl::OkStatus();
  }

 private:
  const AdamW adamw_;
  float* const params_;
  const float* const grads_;
  const int64_t begin_, end_;
  std::vector<float> m_, v_;
};

class CpuTrainableModel : public TrainableModel {
 public:
  CpuTrainableModel(std::unique_ptr<LongNetLM<float>> lm, int num_threads)
      : lm_(std::move(lm)), num_threads_(num_threads) {}

  const LongNetConfig& config() const override { return lm_->config(); }
  const ParamLayout& layout() const override { return lm_->layout(); }
  bool checkpoint_activations() const override { return lm_->options().checkpoint_activations; }
  std::string description() const override {
    return absl::StrCat("cpu fp32, ", num_threads_, num_threads_ == 1 ? " thread" : " threads",
                        checkpoint_activations() ? ", activation checkpointing" : "");
  }

  double TrainingFlops(int64_t batch, int64_t seq_len) const override {
    const ModelFlops f = CountFlops(config(), batch, seq_len, checkpoint_activations());
    return f.forward + f.backward;
  }

  absl::Status InitParams(uint64_t seed) override { return lm_->InitParams(seed); }

  absl::StatusOr<LossResult> ForwardBackward(const TokenBatch& batch,
                                             const BackwardOptions& options) override {
    if (batch.targets == nullptr) {
      return absl::InvalidArgumentError("ForwardBackward: the batch has no targets");
    }
    absl::StatusOr<LossResult> loss = lm_->Forward(batch);
    if (!loss.ok()) return loss.status();
    absl::Status s = lm_->Backward(options);
    if (!s.ok()) return s;
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
    if (!predictions.empty()) {
      const int64_t v = config().vocab_size;
      const float* logits = lm_->logits();  // Host memory on the CPU.
      for (int64_t t = 0; t < m; ++t) {
        const float* row = logits + t * v;
        predictions[static_cast<size_t>(t)] =
            static_cast<int32_t>(std::max_element(row, row + v) - row);
      }
    }
    return loss;
  }

  float* params() override { return lm_->params(); }
  float* grads() override { return lm_->grads(); }

  absl::Status ReadParams(int64_t begin, absl::Span<float> out) override {
    const int64_t n = static_cast<int64_t>(out.size());
    absl::Status s = CheckRange("ReadParams", begin, n, layout().total());
    if (!s.ok()) return s;
    std::copy(lm_->params() + begin, lm_->params() + begin + n, out.begin());
    return absl::OkStatus();
  }

  absl::Status WriteParams(int64_t begin, absl::Span<const float> in) override {
    const int64_t n = static_cast<int64_t>(in.size());
    absl::Status s = CheckRange("WriteParams", begin, n, layout().total());
    if (!s.ok()) return s;
    std::copy(in.begin(), in.end(), lm_->params() + begin);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<ShardOptimizer>> NewOptimizer(const AdamW& adamw, int64_t begin,
                                                               int64_t end) override {
    if (adamw.total() != layout().total()) {
      return absl::InvalidArgumentError(absl::StrCat("NewOptimizer: AdamW made for ", adamw.total(),
                                                     " elements, the model has ",
                                                     layout().total()));
    }
    return NewHostShardOptimizer(adamw, lm_->params(), lm_->grads(), begin, end);
  }

 private:
  const std::unique_ptr<LongNetLM<float>> lm_;
  const int num_threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ShardOptimizer>> NewHostShardOptimizer(const AdamW& adamw,
                                                                      float* params,
                                                                      const float* grads,
                                                                      int64_t begin, int64_t end) {
  if (params == nullptr || grads == nullptr) {
    return absl::InvalidArgumentError("NewHostShardOptimizer: null buffers");
  }
  if (begin < 0 || end <= begin || end > adamw.total()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer shard [", begin, ", ", end, ") is empty or outside [0, ", adamw.total(), ")"));
  }
  return std::unique_ptr<ShardOptimizer>(new HostShardOptimizer(adamw, params, grads, begin, end));
}

absl::StatusOr<std::unique_ptr<TrainableModel>> NewCpuTrainableModel(const LongNetConfig& config,
                                                                     const ModelOptions& options,
                                                                     int num_threads) {
  return NewCpuTrainableModel(config, options, num_threads, NewCpuLocalAttention(num_threads));
}

absl::StatusOr<std::unique_ptr<TrainableModel>> NewCpuTrainableModel(
    const LongNetConfig& config, const ModelOptions& options, int num_threads,
    std::unique_ptr<SequenceAttention> attention) {
  CpuLayerOpsOptions ops_options;
  ops_options.num_threads = num_threads;
  absl::StatusOr<std::unique_ptr<LongNetLM<float>>> lm = LongNetLM<float>::Create(
      config, options, NewCpuLayerOps<float>(ops_options), std::move(attention));
  if (!lm.ok()) return lm.status();
  const int threads = num_threads > 0
                          ? num_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::unique_ptr<TrainableModel>(new CpuTrainableModel(*std::move(lm), threads));
}

namespace {

// The devices registered by this process's binary (RegisterTrainingDevice), in order.
struct DeviceRegistry {
  absl::Mutex mu;
  std::vector<std::pair<std::string, TrainableModelFactory>> devices ABSL_GUARDED_BY(mu);
};

DeviceRegistry& Registry() {
  static DeviceRegistry* registry = new DeviceRegistry();
  return *registry;
}

}  // namespace

absl::Status RegisterTrainingDevice(const std::string& name, TrainableModelFactory factory) {
  if (name.empty() || name == "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterTrainingDevice: \"", name, "\" cannot be registered"));
  }
  if (!factory) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterTrainingDevice: \"", name, "\" has no factory"));
  }
  DeviceRegistry& r = Registry();
  absl::MutexLock lock(&r.mu);
  for (const auto& [known, unused] : r.devices) {
    if (known == name) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterTrainingDevice: \"", name, "\" is already registered"));
    }
  }
  r.devices.emplace_back(name, std::move(factory));
  return absl::OkStatus();
}

std::vector<std::string> TrainingDevices() {
  std::vector<std::string> names = {"cpu"};
  DeviceRegistry& r = Registry();
  absl::MutexLock lock(&r.mu);
  for (const auto& [name, unused] : r.devices) names.push_back(name);
  return names;
}

std::string UnavailableDeviceMessage(const std::string& device) {
  std::string message = absl::StrCat("\"", device, "\" is not available in this build (",
                                     absl::StrJoin(TrainingDevices(), ", "), ")");
  if (device == "cuda") {
    absl::StrAppend(&message,
                    ": this binary links no CUDA library; GPU training is dattn-train-gpu "
                    "(//trainer:dattn-train-gpu, the same flags)");
  }
  return message;
}

absl::StatusOr<std::unique_ptr<TrainableModel>> NewTrainableModel(const std::string& device,
                                                                  const LongNetConfig& config,
                                                                  const ModelOptions& options,
                                                                  int num_threads) {
  if (device == "cpu") return NewCpuTrainableModel(config, options, num_threads);
  TrainableModelFactory factory;
  {
    DeviceRegistry& r = Registry();
    absl::MutexLock lock(&r.mu);
    for (const auto& [name, f] : r.devices) {
      if (name == device) factory = f;
    }
  }
  if (!factory) {
    return absl::InvalidArgumentError(absl::StrCat("device ", UnavailableDeviceMessage(device)));
  }
  return factory(config, options, num_threads);
}

}  // namespace model
}  // namespace dattn
