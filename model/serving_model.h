// What a deployment serves with (worker/deployment_task.h): a LongNet model loaded on one device,
// its decoder and the batch generator that runs many generations at once; or one rank of a ring of
// them. The seam between the serving loop (written once) and the device that computes: the CPU
// (NewCpuServingModel, here: fp32, model/decoder.h, on one worker or a Gloo ring) and a GPU
// (model/cuda/cuda_serving_model.h: bf16, model/cuda/cuda_decoder.h, one GPU).
//
// Ownership: a serving model owns its model, decoder and generator; a ring's communicator is
// borrowed (it must outlive the serving model). Thread-safety: one thread at a time (the serving
// loop's); callbacks of requests run on it (batch_generator.h).
// Errors: those of the decoder and the generator, as their headers state.
#ifndef DATTN_MODEL_SERVING_MODEL_H_
#define DATTN_MODEL_SERVING_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/comm/communicator.h"
#include "model/batch_generator.h"
#include "model/config.h"

namespace dattn {
namespace model {

class ServingModel {
 public:
  virtual ~ServingModel() = default;

  // "cpu fp32" or "cuda bf16": what computes, for status lines.
  virtual std::string device() const = 0;
  virtual int64_t parameters() const = 0;
  // Bytes of one sequence's whole cache (every rank's share together), in the decoder's type.
  virtual int64_t cache_bytes_per_sequence() const = 0;

  // Decoder::Score: logprobs[i] := log p(tokens[i + 1] | tokens[0..i]), i < n - 1.
  virtual absl::Status Score(const int32_t* tokens, int64_t n, double* logprobs) = 0;

  // The batch generator (batch_generator.h): Submit, Cancel, Tick and its counts.
  virtual absl::StatusOr<int64_t> Submit(GenerationRequest request) = 0;
  virtual bool Cancel(int64_t id) = 0;
  virtual absl::StatusOr<TickStats> Tick(absl::Time now) = 0;
  virtual int64_t running() const = 0;
  virtual int64_t queued() const = 0;

  // A ring's rank (Decoder::Lead, Follow, KeepAlive, Release: decoder.h). On one device Lead,
  // KeepAlive and Release return OK at once (nothing to lead) and Follow is FAILED_PRECONDITION.
  virtual absl::Status Lead() = 0;
  virtual absl::Status Follow() = 0;
  virtual absl::Status KeepAlive(absl::Duration interval) = 0;
  virtual absl::Status Release() = 0;
};

// A serving model of either device: M is the model, D its decoder (Decoder<float>, or the GPU's
// cuda::CudaDecoder) and the batch generator over it, all three owned (the decoder borrows the
// model, the generator the decoder: destroyed generator first, then decoder, then model); the ring
// calls are the decoder's. `device` names what computes; `cache_bytes` is one sequence's cache,
// every rank's share together.
template <typename M, typename D>
class DecoderServingModel final : public ServingModel {
 public:
  DecoderServingModel(std::unique_ptr<M> lm, std::unique_ptr<D> decoder,
                      std::unique_ptr<BatchGenerator<float, D>> generator, std::string device,
                      int64_t cache_bytes)
      : lm_(std::move(lm)),
        decoder_(std::move(decoder)),
        generator_(std::move(generator)),
        device_(std::move(device)),
        cache_bytes_(cache_bytes) {}

  std::string device() const override { return device_; }
  int64_t cache_bytes_per_sequence() const override { return cache_bytes_; }
  int64_t parameters() const override { return lm_->layout().total(); }
  absl::Status Score(const int32_t* tokens, int64_t n, double* logprobs) override {
    return decoder_->Score(tokens, n, logprobs);
  }
  absl::StatusOr<int64_t> Submit(GenerationRequest request) override {
    return generator_->Submit(std::move(request));
  }
  bool Cancel(int64_t id) override { return generator_->Cancel(id); }
  absl::StatusOr<TickStats> Tick(absl::Time now) override { return generator_->Tick(now); }
  int64_t running() const override { return generator_->running(); }
  int64_t queued() const override { return generator_->queued(); }
  absl::Status Lead() override { return decoder_->Lead(); }
  absl::Status Follow() override { return decoder_->Follow(); }
  absl::Status KeepAlive(absl::Duration interval) override { return decoder_->KeepAlive(interval); }
  absl::Status Release() override { return decoder_->Release(); }

 private:
  const std::unique_ptr<M> lm_;
  const std::unique_ptr<D> decoder_;
  const std::unique_ptr<BatchGenerator<float, D>> generator_;
  const std::string device_;
  const int64_t cache_bytes_;
};

// The CPU model in fp32 with `params` (host, the config's ParamLayout order) and `threads` OpenBLAS
// threads (0: every core); with `ring` (more than one rank, host memory) the model's attention is
// the ring's and the decoder holds this rank's share of every cache. max_batch sequences at once.
// Errors: the model's, the decoder's and the generator's creation errors.
absl::StatusOr<std::unique_ptr<ServingModel>> NewCpuServingModel(const LongNetConfig& config,
                                                                 absl::Span<const float> params,
                                                                 int64_t max_context,
                                                                 int64_t max_batch, int threads,
                                                                 comm::Communicator* ring);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_SERVING_MODEL_H_
