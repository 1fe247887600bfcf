// Text generation on a Decoder (decoder.h): choosing each next token from the model's logits
// (greedy, temperature, top-k, top-p, all seeded) and the loop that stops at max_tokens, at a
// stop sequence or at the decoder's max_context, handing out tokens as they are made.
//
// Sampling (TokenSampler::Next), for one row of logits z over V tokens:
//   - temperature 0: the argmax (the lowest id among equal maxima); top_k, top_p and the seed
//     play no part.
//   - otherwise p_v ∝ exp((z_v - max z) / temperature) in fp64; top_k > 0 keeps the k most
//     probable tokens (ties: lower id first); top_p < 1 then keeps the smallest set of the most
//     probable tokens whose probability (renormalised after top_k) reaches top_p; one draw of
//     u = Rng::Uniform() picks a token from what is kept, walked from the most probable down.
//     The same seed, logits and options give the same tokens on every machine.
// The log-probability reported with a token is that of the model (log softmax of z at
// temperature 1), whatever the sampling options, so that it means the same for every request.
//
// Stop sequences. A stop sequence is a list of token ids. When the generated tokens end with one
// of them, generation stops and the matched tokens are not part of the result. Tokens are handed
// to on_token as soon as no stop sequence can still match them: a token that might begin (or
// continue) a match is held back until it is known not to, so a streaming client never receives
// tokens the final result does not contain.
//
// Thread-safety: as the decoder's (one call at a time). Errors: INVALID_ARGUMENT naming the bad
// option (temperature < 0 or not finite, top_k < 0, top_p outside (0, 1], max_tokens < 0, an
// empty stop sequence or one holding a token outside the vocabulary) or prompt (empty, a token
// outside the vocabulary); OUT_OF_RANGE for a prompt longer than the decoder's max_context; the
// decoder's errors.
#ifndef DATTN_MODEL_GENERATION_H_
#define DATTN_MODEL_GENERATION_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/decoder.h"
#include "model/rng.h"

namespace dattn {
namespace model {

struct SamplingOptions {
  double temperature = 1.0;  // >= 0; 0 is greedy.
  int64_t top_k = 0;         // >= 0; 0 keeps every token.
  double top_p = 1.0;        // (0, 1]; 1 keeps every token.
  uint64_t seed = 0;
};

// INVALID_ARGUMENT naming the first bad field.
absl::Status ValidateSampling(const SamplingOptions& options);

class TokenSampler {
 public:
  // INVALID_ARGUMENT as ValidateSampling, or for vocab_size < 1.
  static absl::StatusOr<TokenSampler> Create(const SamplingOptions& options, int64_t vocab_size);

  // The next token from logits[0, vocab_size) (see above); *logprob (if not null) := its
  // log-probability under the model. Consumes one draw of the generator unless greedy.
  // INTERNAL naming the token when a logit is NaN or infinite (a broken model: no token is
  // chosen from it).
  template <typename T>
  absl::StatusOr<int32_t> Next(const T* logits, double* logprob);

 private:
  TokenSampler(const SamplingOptions& options, int64_t vocab_size);
  SamplingOptions options_;
  int64_t vocab_size_ = 0;
  Rng rng_;
  std::vector<double> probs_;
  std::vector<int32_t> order_;
};

struct GenerateOptions {
  SamplingOptions sampling;
  int64_t max_tokens = 16;  // >= 0: tokens to sample at most (a matched stop sequence's count).
  std::vector<std::vector<int32_t>> stop_sequences;
};

// INVALID_ARGUMENT naming the first bad field (see the file comment).
absl::Status ValidateGenerateOptions(const GenerateOptions& options, int64_t vocab_size);

enum class FinishReason {
  kLength,     // max_tokens generated.
  kStop,       // A stop sequence matched (its tokens are not in the result).
  kContext,    // The sequence reached the decoder's max_context.
  kCancelled,  // on_token returned false.
};
// "length" | "stop" | "context" | "cancelled"
const char* FinishReasonName(FinishReason reason);

struct GeneratedToken {
  int32_t token = 0;
  double logprob = 0;  // Under the model (temperature 1).
};

struct GenerateResult {
  std::vector<GeneratedToken> tokens;
  FinishReason finish = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  int64_t steps = 0;           // Decoder steps run (tokens fed back after the prompt).
  double queue_seconds = 0;    // BatchGenerator: submitted until admitted (wall clock).
  double prefill_seconds = 0;  // The prompt's Prefill (wall clock).
};

// Called with each token once it is final (see "Stop sequences"); returning false stops the
// generation (finish kCancelled; the result holds the tokens handed out).
using TokenCallback = std::function<bool(const GeneratedToken&)>;

// One sequence's generation, fed one row of logits at a time (by Generate below, or by
// BatchGenerator for many sequences at once): samples each token, applies the stop sequences
// (holding back what may still match), hands out final tokens and says when and why it is done.
class TokenStream {
 public:
  // INVALID_ARGUMENT as ValidateGenerateOptions. `on_token` may be null.
  static absl::StatusOr<TokenStream> Create(const GenerateOptions& options, int64_t vocab_size,
                                            int64_t prompt_tokens, TokenCallback on_token);

  // Takes the logits that predict the next token, with the sequence holding `position` tokens
  // of at most `max_context`. Returns true when the sampled token must be fed to the model for
  // another one (next_token()), false when the generation is over (finish() says why). Errors:
  // the sampler's (a non-finite logit); the stream is then over too. Not to be called once over.
  template <typename T>
  absl::StatusOr<bool> Accept(const T* logits, int64_t position, int64_t max_context);

  int32_t next_token() const { return next_token_; }
  bool done() const { return done_; }
  // Ends it now with `reason` (kCancelled: a caller's cancel), handing out nothing more.
  void Stop(FinishReason reason);
  // The tokens handed out so far, the finish reason once done.
  const GenerateResult& result() const { return result_; }

 private:
  TokenStream(const GenerateOptions& options, TokenSampler sampler, int64_t prompt_tokens,
              TokenCallback on_token);
  // Hands out tokens [emitted_, end) (stops early if on_token asks to).
  void Emit(size_t end);
  void Finish(FinishReason reason);

  GenerateOptions options_;
  TokenSampler sampler_;
  TokenCallback on_token_;
  std::vector<GeneratedToken> sampled_;  // Every token sampled; [emitted_, end) is held back.
  size_t emitted_ = 0;
  bool cancelled_ = false;
  bool done_ = false;
  int32_t next_token_ = 0;
  GenerateResult result_;
};

// Prefills `prompt` into a new state of `decoder` and generates up to max_tokens tokens (the
// prompt and every token but the last are fed to the model: the last one's logits would not be
// used). on_token may be null. The result's tokens are exactly those handed to on_token.
template <typename T>
absl::StatusOr<GenerateResult> Generate(Decoder<T>& decoder, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const TokenCallback& on_token);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_GENERATION_H_
