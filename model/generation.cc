#include "model/generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dattn {
namespace model {

absl::Status ValidateSampling(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling temperature ", o.temperature, " must be finite and >= 0"));
  }
  if (o.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling top_k ", o.top_k, " must be >= 0 (0: every token)"));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling top_p ", o.top_p, " must be in (0, 1] (1: every token)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenSampler> TokenSampler::Create(const SamplingOptions& options,
                                                  int64_t vocab_size) {
  absl::Status s = ValidateSampling(options);
  if (!s.ok()) return s;
  if (vocab_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler vocab_size ", vocab_size, " must be >= 1"));
  }
  return TokenSampler(options, vocab_size);
}

TokenSampler::TokenSampler(const SamplingOptions& options, int64_t vocab_size)
    : options_(options),
      vocab_size_(vocab_size),
      rng_(options.seed),
      probs_(static_cast<size_t>(vocab_size)),
      order_(static_cast<size_t>(vocab_size)) {}

template <typename T>
absl::StatusOr<int32_t> TokenSampler::Next(const T* logits, double* logprob) {
  const int64_t v = vocab_size_;
  double max_z = -INFINITY;
  int32_t argmax = 0;
  for (int64_t i = 0; i < v; ++i) {
    const double z = static_cast<double>(logits[i]);
    if (!std::isfinite(z)) {
      return absl::InternalError(
          absl::StrCat("the model's logit of token ", i, " is ", z, ": no token is chosen"));
    }
    if (z > max_z) {
      max_z = z;
      argmax = static_cast<int32_t>(i);
    }
  }
  double sum = 0;
  for (int64_t i = 0; i < v; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_z);
  const double lse = max_z + std::log(sum);
  int32_t token = argmax;
  if (options_.temperature > 0) {
    for (int64_t i = 0; i < v; ++i) {
      probs_[static_cast<size_t>(i)] =
          std::exp((static_cast<double>(logits[i]) - max_z) / options_.temperature);
    }
    std::iota(order_.begin(), order_.end(), 0);
    std::stable_sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
      return probs_[static_cast<size_t>(a)] > probs_[static_cast<size_t>(b)];
    });
    size_t keep = order_.size();
    if (options_.top_k > 0) keep = std::min(keep, static_cast<size_t>(options_.top_k));
    if (options_.top_p < 1) {
      double kept = 0;
      for (size_t i = 0; i < keep; ++i) kept += probs_[static_cast<size_t>(order_[i])];
      double cumulative = 0;
      for (size_t i = 0; i < keep; ++i) {
        cumulative += probs_[static_cast<size_t>(order_[i])] / kept;
        if (cumulative >= options_.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += probs_[static_cast<size_t>(order_[i])];
    const double u = rng_.Uniform() * total;
    double walked = 0;
    token = order_[keep - 1];  // Rounding can leave u at the very end of the walk.
    for (size_t i = 0; i < keep; ++i) {
      walked += probs_[static_cast<size_t>(order_[i])];
      if (u < walked) {
        token = order_[i];
        break;
      }
    }
  }
  if (logprob != nullptr) *logprob = static_cast<double>(logits[token]) - lse;
  return token;
}

template absl::StatusOr<int32_t> TokenSampler::Next<float>(const float*, double*);
template absl::StatusOr<int32_t> TokenSampler::Next<double>(const double*, double*);

absl::Status ValidateGenerateOptions(const GenerateOptions& options, int64_t vocab_size) {
  absl::Status s = ValidateSampling(options.sampling);
  if (!s.ok()) return s;
  if (options.max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("generate max_tokens ", options.max_tokens, " must be >= 0"));
  }
  for (size_t i = 0; i < options.stop_sequences.size(); ++i) {
    const std::vector<int32_t>& stop = options.stop_sequences[i];
    if (stop.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("generate stop sequence ", i, " is empty"));
    }
    for (size_t j = 0; j < stop.size(); ++j) {
      if (stop[j] < 0 || stop[j] >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("generate stop sequence ", i, " token ", j,
                                                       ": ", stop[j], " is outside [0, ",
                                                       vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

namespace {

// Whether tokens [begin, end) of `all` are a prefix of `stop` (full: equal to it).
bool IsPrefixOf(const std::vector<GeneratedToken>& all, size_t begin,
                const std::vector<int32_t>& stop, bool full) {
  const size_t n = all.size() - begin;
  if (n > stop.size() || (full && n != stop.size())) return false;
  for (size_t i = 0; i < n; ++i) {
    if (all[begin + i].token != stop[i]) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<TokenStream> TokenStream::Create(const GenerateOptions& options, int64_t vocab_size,
                                                int64_t prompt_tokens, TokenCallback on_token) {
  absl::Status s = ValidateGenerateOptions(options, vocab_size);
  if (!s.ok()) return s;
  absl::StatusOr<TokenSampler> sampler = TokenSampler::Create(options.sampling, vocab_size);
  if (!sampler.ok()) return sampler.status();
  return TokenStream(options, *std::move(sampler), prompt_tokens, std::move(on_token));
}

TokenStream::TokenStream(const GenerateOptions& options, TokenSampler sampler,
                         int64_t prompt_tokens, TokenCallback on_token)
    : options_(options), sampler_(std::move(sampler)), on_token_(std::move(on_token)) {
  result_.prompt_tokens = prompt_tokens;
}

void TokenStream::Emit(size_t end) {
  for (; emitted_ < end && !cancelled_; ++emitted_) {
    if (on_token_ && !on_token_(sampled_[emitted_])) cancelled_ = true;
    result_.tokens.push_back(sampled_[emitted_]);
  }
}

void TokenStream::Finish(FinishReason reason) {
  result_.finish = cancelled_ ? FinishReason::kCancelled : reason;
  done_ = true;
}

void TokenStream::Stop(FinishReason reason) {
  result_.finish = reason;
  done_ = true;
}

template <typename T>
absl::StatusOr<bool> TokenStream::Accept(const T* logits, int64_t position, int64_t max_context) {
  const int64_t sampled = static_cast<int64_t>(sampled_.size());
  if (sampled == options_.max_tokens) {
    Finish(FinishReason::kLength);
    return false;
  }
  GeneratedToken next;
  absl::StatusOr<int32_t> token = sampler_.Next(logits, &next.logprob);
  if (!token.ok()) {
    done_ = true;
    return token.status();
  }
  next.token = *token;
  sampled_.push_back(next);
  // A stop sequence that the held-back tokens end with: the earliest-starting one wins.
  for (size_t begin = emitted_; begin < sampled_.size(); ++begin) {
    for (const std::vector<int32_t>& stop : options_.stop_sequences) {
      if (IsPrefixOf(sampled_, begin, stop, /*full=*/true)) {
        Emit(begin);
        Finish(FinishReason::kStop);
        return false;
      }
    }
  }
  // Hand out what no stop sequence can still match: everything before the earliest suffix that
  // is a (proper) prefix of one.
  size_t keep_from = sampled_.size();
  for (size_t begin = emitted_; begin < sampled_.size() && keep_from == sampled_.size(); ++begin) {
    for (const std::vector<int32_t>& stop : options_.stop_sequences) {
      if (IsPrefixOf(sampled_, begin, stop, /*full=*/false)) {
        keep_from = begin;
        break;
      }
    }
  }
  Emit(keep_from);
  std::optional<FinishReason> over;
  if (cancelled_) {
    over = FinishReason::kCancelled;
  } else if (sampled + 1 == options_.max_tokens) {
    over = FinishReason::kLength;
  } else if (position >= max_context) {
    over = FinishReason::kContext;
  }
  if (over.has_value()) {
    // No token can come any more: what was held back is final.
    Emit(sampled_.size());
    Finish(*over);
    return false;
  }
  next_token_ = next.token;
  return true;
}

template absl::StatusOr<bool> TokenStream::Accept<float>(const float*, int64_t, int64_t);
template absl::StatusOr<bool> TokenStream::Accept<double>(const double*, int64_t, int64_t);

template <typename T>
absl::StatusOr<GenerateResult> Generate(Decoder<T>& decoder, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const TokenCallback& on_token) {
  absl::StatusOr<TokenStream> stream = TokenStream::Create(
      options, decoder.config().vocab_size, static_cast<int64_t>(prompt.size()), on_token);
  if (!stream.ok()) return stream.status();
  absl::StatusOr<DecodeState<T>> state = decoder.NewState();
  if (!state.ok()) return state.status();
  std::vector<T> logits(static_cast<size_t>(decoder.config().vocab_size));
  const absl::Time prefill_start = absl::Now();
  absl::Status s =
      decoder.Prefill(prompt.data(), static_cast<int64_t>(prompt.size()), &*state, logits.data());
  if (!s.ok()) return s;
  const double prefill_seconds = absl::ToDoubleSeconds(absl::Now() - prefill_start);
  int64_t steps = 0;
  while (true) {
    absl::StatusOr<bool> more =
        stream->Accept(logits.data(), state->position(), decoder.geometry().max_context());
    if (!more.ok()) return more.status();
    if (!*more) break;
    const int32_t token = stream->next_token();
    DecodeState<T>* states[] = {&*state};
    s = decoder.Step(absl::MakeSpan(states), &token, logits.data());
    if (!s.ok()) return s;
    ++steps;
  }
  GenerateResult result = stream->result();
  result.steps = steps;
  result.prefill_seconds = prefill_seconds;
  return result;
}

template absl::StatusOr<GenerateResult> Generate<float>(Decoder<float>&,
                                                        const std::vector<int32_t>&,
                                                        const GenerateOptions&,
                                                        const TokenCallback&);
template absl::StatusOr<GenerateResult> Generate<double>(Decoder<double>&,
                                                         const std::vector<int32_t>&,
                                                         const GenerateOptions&,
                                                         const TokenCallback&);

}  // namespace model
}  // namespace dattn
