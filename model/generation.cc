#include "model/generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

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

template <typename T>
absl::StatusOr<GenerateResult> Generate(Decoder<T>& decoder, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const TokenCallback& on_token) {
  const int64_t vocab = decoder.config().vocab_size;
  absl::Status s = ValidateGenerateOptions(options, vocab);
  if (!s.ok()) return s;
  absl::StatusOr<TokenSampler> sampler = TokenSampler::Create(options.sampling, vocab);
  if (!sampler.ok()) return sampler.status();
  absl::StatusOr<DecodeState<T>> state = decoder.NewState();
  if (!state.ok()) return state.status();
  std::vector<T> logits(static_cast<size_t>(vocab));
  s = decoder.Prefill(prompt.data(), static_cast<int64_t>(prompt.size()), &*state, logits.data());
  if (!s.ok()) return s;

  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  std::vector<GeneratedToken> all;  // Every sampled token; [emitted, end) is held back.
  size_t emitted = 0;
  bool cancelled = false;
  // Hands out tokens [emitted, end).
  auto emit = [&](size_t end) {
    for (; emitted < end && !cancelled; ++emitted) {
      if (on_token && !on_token(all[emitted])) cancelled = true;
      result.tokens.push_back(all[emitted]);
    }
  };
  int64_t sampled = 0;
  while (true) {
    if (sampled == options.max_tokens) {
      result.finish = FinishReason::kLength;
      break;
    }
    GeneratedToken next;
    absl::StatusOr<int32_t> token = sampler->Next(logits.data(), &next.logprob);
    if (!token.ok()) return token.status();
    next.token = *token;
    all.push_back(next);
    ++sampled;
    // A stop sequence that the held-back tokens end with: the earliest-starting one wins.
    bool stopped = false;
    for (size_t begin = emitted; begin < all.size() && !stopped; ++begin) {
      for (const std::vector<int32_t>& stop : options.stop_sequences) {
        if (IsPrefixOf(all, begin, stop, /*full=*/true)) {
          emit(begin);
          stopped = true;
          break;
        }
      }
    }
    if (stopped) {
      result.finish = cancelled ? FinishReason::kCancelled : FinishReason::kStop;
      return result;
    }
    // Hand out what no stop sequence can still match: everything before the earliest suffix that
    // is a (proper) prefix of one.
    size_t keep_from = all.size();
    for (size_t begin = emitted; begin < all.size() && keep_from == all.size(); ++begin) {
      for (const std::vector<int32_t>& stop : options.stop_sequences) {
        if (IsPrefixOf(all, begin, stop, /*full=*/false)) {
          keep_from = begin;
          break;
        }
      }
    }
    emit(keep_from);
    if (cancelled) {
      result.finish = FinishReason::kCancelled;
      return result;
    }
    if (sampled == options.max_tokens) {
      result.finish = FinishReason::kLength;
      break;
    }
    if (state->position() >= decoder.geometry().max_context()) {
      result.finish = FinishReason::kContext;
      break;
    }
    DecodeState<T>* states[] = {&*state};
    s = decoder.Step(absl::MakeSpan(states), &next.token, logits.data());
    if (!s.ok()) return s;
    ++result.steps;
  }
  // No token can come any more: what was held back is final.
  emit(all.size());
  if (cancelled) result.finish = FinishReason::kCancelled;
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
