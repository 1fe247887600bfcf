// Many generations at once on one Decoder: a queue with priorities and deadlines, and rounds
// ("ticks") in which every running sequence advances by one token through a single Decoder::Step,
// so that the linear layers of concurrent requests run as one matrix. What a deployment's serving
// loop drives; each request behaves exactly as Generate (generation.h) would run it alone
// (batch_generator_test: the same tokens, fp64).
//
// A tick (Tick(now)):
//   1. requests whose deadline has passed end: queued ones and running ones, with
//      DEADLINE_EXCEEDED (their caches are freed at once);
//   2. each running sequence samples its next token from the logits of the last tick's step
//      (and hands out what is final);
//   3. queued requests are admitted while fewer than max_batch run, highest priority first, then
//      in the order submitted; each admitted request's prompt is prefilled (Decoder::Prefill)
//      and its first token sampled;
//   4. every running sequence feeds its token, all in one Decoder::Step; the logits are sampled
//      in the next tick.
// A request ends when its TokenStream does (max_tokens, a stop sequence, the context limit, its
// callback), when cancelled, when its deadline passes, or on an error of its own (a non-finite
// logit: INTERNAL); on_done is then called once, on the ticking thread, and its state is freed.
// A failed batched Step fails every request in it (their on_done get the error) and Tick returns
// the error too; the others carry on.
//
// Memory: at most max_batch caches at once (Decoder::geometry().ElementsPerSequence() values of
// T each), plus the decoder's step buffers for max_batch rows.
// Thread-safety: none; one thread submits, cancels and ticks (a deployment's serving loop).
// Callbacks run on that thread and must not call back into the generator.
#ifndef DATTN_MODEL_BATCH_GENERATOR_H_
#define DATTN_MODEL_BATCH_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/decoder.h"
#include "model/generation.h"

namespace dattn {
namespace model {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // >= 1 token, each in the vocabulary, at most max_context.
  GenerateOptions options;
  int priority = 0;  // Higher is admitted first.
  absl::Time deadline = absl::InfiniteFuture();
  TokenCallback on_token;  // Each final token (may be null); false cancels the request.
  // Called once when the request ends: its result (finish says why), or DEADLINE_EXCEEDED,
  // INTERNAL or a decoder error naming the request.
  std::function<void(absl::StatusOr<GenerateResult>)> on_done;
};

// What one tick did.
struct TickStats {
  int64_t admitted = 0;    // Requests prefilled.
  int64_t stepped = 0;     // Sequences advanced by the batched step.
  int64_t step_calls = 0;  // Decoder::Step calls (0 or 1).
  int64_t finished = 0;    // Requests that ended (any way).
};

// D is the decoder: Decoder<T> (this file's), or another with the same calls (config(),
// geometry(), NewState(), Prefill, Step and a State type with position() and cache_bytes()): the
// GPU decoder, model/cuda/cuda_decoder.h, whose instantiation lives with it
// (batch_generator_impl.h holds the definitions).
template <typename T, typename D = Decoder<T>>
class BatchGenerator {
 public:
  // Borrows `decoder` (it must outlive the generator). INVALID_ARGUMENT for max_batch < 1.
  static absl::StatusOr<std::unique_ptr<BatchGenerator>> Create(D* decoder, int64_t max_batch);

  // Queues a request; returns its id (1, 2, ...). Checked at once, nothing queued on error:
  // INVALID_ARGUMENT naming the bad option or prompt token, or an empty prompt; OUT_OF_RANGE for
  // a prompt longer than the decoder's max_context.
  absl::StatusOr<int64_t> Submit(GenerationRequest request);

  // Ends request `id` (queued or running) with finish kCancelled and the tokens handed out so
  // far; its cache is freed at once. False when no such request is queued or running.
  bool Cancel(int64_t id);

  // One round (see the file comment) at time `now`. Errors: a failed batched Step (see above).
  absl::StatusOr<TickStats> Tick(absl::Time now);

  int64_t queued() const { return static_cast<int64_t>(queue_.size()); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  // Bytes of the running requests' caches.
  int64_t cache_bytes() const;

 private:
  struct Sequence {
    int64_t id = 0;
    GenerationRequest request;
    std::unique_ptr<TokenStream> stream;
    std::unique_ptr<typename D::State> state;
    std::vector<T> logits;  // Ready to be sampled when `has_logits`.
    bool has_logits = false;
    int64_t steps = 0;
    absl::Time submitted;  // Wall clock, for GenerateResult's queue and prefill times.
    double queue_seconds = 0;
    double prefill_seconds = 0;
  };

  BatchGenerator(D* decoder, int64_t max_batch);
  // Ends `seq` (on_done with `outcome`, or with its stream's result when `outcome` is OK).
  void End(Sequence& seq, absl::Status outcome, TickStats* stats);
  // Samples seq's logits: false when it ended.
  bool Sample(Sequence& seq, TickStats* stats);

  D* const decoder_;
  const int64_t max_batch_;
  int64_t next_id_ = 1;
  std::list<std::unique_ptr<Sequence>> queue_;    // In submission order.
  std::list<std::unique_ptr<Sequence>> running_;  // In admission order.
  std::vector<T> step_logits_;
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_BATCH_GENERATOR_H_
