// The definitions of batch_generator.h's template, for the files that instantiate it:
// batch_generator.cc (the CPU decoder, fp32 and fp64) and model/cuda's serving model (the GPU
// decoder). Include only there.
#ifndef DATTN_MODEL_BATCH_GENERATOR_IMPL_H_
#define DATTN_MODEL_BATCH_GENERATOR_IMPL_H_

#include <algorithm>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "model/batch_generator.h"

namespace dattn {
namespace model {

template <typename T, typename D>
absl::StatusOr<std::unique_ptr<BatchGenerator<T, D>>> BatchGenerator<T, D>::Create(
    D* decoder, int64_t max_batch) {
  if (decoder == nullptr) return absl::InvalidArgumentError("batch generator: decoder is null");
  if (max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch generator max_batch ", max_batch, " must be >= 1"));
  }
  return std::unique_ptr<BatchGenerator<T, D>>(new BatchGenerator<T, D>(decoder, max_batch));
}

template <typename T, typename D>
BatchGenerator<T, D>::BatchGenerator(D* decoder, int64_t max_batch)
    : decoder_(decoder), max_batch_(max_batch) {}

template <typename T, typename D>
absl::StatusOr<int64_t> BatchGenerator<T, D>::Submit(GenerationRequest request) {
  const LongNetConfig& config = decoder_->config();
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  if (n == 0) return absl::InvalidArgumentError("generate: the prompt has 0 tokens");
  if (n > decoder_->geometry().max_context()) {
    return absl::OutOfRangeError(absl::StrCat("generate: the prompt's ", n,
                                              " tokens pass the deployment's max_context of ",
                                              decoder_->geometry().max_context()));
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = request.prompt[static_cast<size_t>(i)];
    if (t < 0 || t >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("generate: prompt token ", i, " is ", t,
                                                     ", outside [0, ", config.vocab_size, ")"));
    }
  }
  absl::StatusOr<TokenStream> stream =
      TokenStream::Create(request.options, config.vocab_size, n, request.on_token);
  if (!stream.ok()) return stream.status();
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->stream = std::make_unique<TokenStream>(*std::move(stream));
  seq->request = std::move(request);
  seq->submitted = absl::Now();
  const int64_t id = seq->id;
  queue_.push_back(std::move(seq));
  return id;
}

template <typename T, typename D>
void BatchGenerator<T, D>::End(Sequence& seq, absl::Status outcome, TickStats* stats) {
  if (stats != nullptr) ++stats->finished;
  seq.state.reset();  // The cache goes first: the callback may be slow.
  if (!seq.request.on_done) return;
  if (!outcome.ok()) {
    seq.request.on_done(outcome);
    return;
  }
  GenerateResult result = seq.stream->result();
  result.steps = seq.steps;
  result.queue_seconds = seq.queue_seconds;
  result.prefill_seconds = seq.prefill_seconds;
  seq.request.on_done(std::move(result));
}

template <typename T, typename D>
bool BatchGenerator<T, D>::Cancel(int64_t id) {
  for (auto* list : {&queue_, &running_}) {
    for (auto it = list->begin(); it != list->end(); ++it) {
      if ((*it)->id != id) continue;
      std::unique_ptr<Sequence> seq = std::move(*it);
      list->erase(it);
      seq->stream->Stop(FinishReason::kCancelled);
      End(*seq, absl::OkStatus(), nullptr);
      return true;
    }
  }
  return false;
}

template <typename T, typename D>
int64_t BatchGenerator<T, D>::cache_bytes() const {
  int64_t bytes = 0;
  for (const auto& seq : running_) bytes += seq->state != nullptr ? seq->state->cache_bytes() : 0;
  return bytes;
}

template <typename T, typename D>
bool BatchGenerator<T, D>::Sample(Sequence& seq, TickStats* stats) {
  seq.has_logits = false;
  absl::StatusOr<bool> more = seq.stream->Accept(seq.logits.data(), seq.state->position(),
                                                 decoder_->geometry().max_context());
  if (!more.ok()) {
    End(seq,
        absl::Status(more.status().code(),
                     absl::StrCat("request ", seq.id, ": ", more.status().message())),
        stats);
    return false;
  }
  if (!*more) {
    End(seq, absl::OkStatus(), stats);
    return false;
  }
  return true;
}

template <typename T, typename D>
absl::StatusOr<TickStats> BatchGenerator<T, D>::Tick(absl::Time now) {
  TickStats stats;
  const int64_t vocab = decoder_->config().vocab_size;
  // 1. Deadlines.
  for (auto* list : {&queue_, &running_}) {
    for (auto it = list->begin(); it != list->end();) {
      Sequence& seq = **it;
      if (seq.request.deadline > now) {
        ++it;
        continue;
      }
      std::unique_ptr<Sequence> gone = std::move(*it);
      it = list->erase(it);
      gone->stream->Stop(FinishReason::kCancelled);
      End(*gone,
          absl::DeadlineExceededError(
              absl::StrCat("request ", gone->id, ": its deadline passed ",
                           absl::FormatDuration(now - gone->request.deadline), " ago, after ",
                           gone->stream->result().tokens.size(), " tokens",
                           list == &queue_ ? " (still queued)" : "")),
          &stats);
    }
  }
  // 2. The running sequences sample the last step's logits.
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->has_logits && !Sample(**it, &stats)) {
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  // 3. Admission: highest priority first, then the earliest submitted.
  while (running() < max_batch_ && !queue_.empty()) {
    auto best = queue_.begin();
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if ((*it)->request.priority > (*best)->request.priority) best = it;
    }
    std::unique_ptr<Sequence> seq = std::move(*best);
    queue_.erase(best);
    ++stats.admitted;
    const absl::Time admitted = absl::Now();
    seq->queue_seconds = absl::ToDoubleSeconds(admitted - seq->submitted);
    absl::StatusOr<typename D::State> state = decoder_->NewState();
    absl::Status s = state.status();
    if (s.ok()) {
      seq->state = std::make_unique<typename D::State>(*std::move(state));
      seq->logits.resize(static_cast<size_t>(vocab));
      s = decoder_->Prefill(seq->request.prompt.data(),
                            static_cast<int64_t>(seq->request.prompt.size()), seq->state.get(),
                            seq->logits.data());
    }
    seq->prefill_seconds = absl::ToDoubleSeconds(absl::Now() - admitted);
    if (!s.ok()) {
      End(*seq, absl::Status(s.code(), absl::StrCat("request ", seq->id, ": ", s.message())),
          &stats);
      continue;
    }
    if (Sample(*seq, &stats)) running_.push_back(std::move(seq));
  }
  // 4. One batched step for every running sequence.
  if (running_.empty()) return stats;
  std::vector<typename D::State*> states;
  std::vector<int32_t> tokens;
  for (const auto& seq : running_) {
    states.push_back(seq->state.get());
    tokens.push_back(seq->stream->next_token());
  }
  step_logits_.resize(states.size() * static_cast<size_t>(vocab));
  absl::Status s = decoder_->Step(absl::MakeSpan(states), tokens.data(), step_logits_.data());
  ++stats.step_calls;
  if (!s.ok()) {
    for (auto& seq : running_) {
      seq->stream->Stop(FinishReason::kCancelled);
      End(*seq, absl::Status(s.code(), absl::StrCat("request ", seq->id, ": ", s.message())),
          &stats);
    }
    running_.clear();
    return s;
  }
  size_t j = 0;
  for (auto& seq : running_) {
    std::copy(step_logits_.begin() + static_cast<std::ptrdiff_t>(j * vocab),
              step_logits_.begin() + static_cast<std::ptrdiff_t>((j + 1) * vocab),
              seq->logits.begin());
    seq->has_logits = true;
    ++seq->steps;
    ++j;
  }
  stats.stepped = static_cast<int64_t>(running_.size());
  return stats;
}

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_BATCH_GENERATOR_IMPL_H_
