#include "model/retrieval.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/rng.h"

namespace dattn {
namespace model {
namespace {

constexpr char kNeedleA[] = "\nThe pass key of ";
constexpr char kNeedleB[] = " is ";
constexpr char kNeedleC[] = ".\n";
constexpr char kQuestionA[] = "\nWhat is the pass key of ";
constexpr char kQuestionB[] = "? The pass key of ";
constexpr char kQuestionC[] = " is ";

int64_t Len(const char* s) { return static_cast<int64_t>(std::char_traits<char>::length(s)); }

int64_t NeedleLength(const RetrievalOptions& o) {
  return Len(kNeedleA) + o.key_length + Len(kNeedleB) + o.value_length + Len(kNeedleC);
}
int64_t QuestionLength(const RetrievalOptions& o) {
  return Len(kQuestionA) + o.key_length + Len(kQuestionB) + o.key_length + Len(kQuestionC);
}

std::string RandomString(Rng& rng, int64_t length, char first, int64_t alphabet) {
  std::string s(static_cast<size_t>(length), first);
  for (char& c : s) c = static_cast<char>(first + static_cast<char>(rng.Below(alphabet)));
  return s;
}

void AppendText(std::vector<int32_t>* out, const std::string& text) {
  for (unsigned char c : text) out->push_back(c);
}

}  // namespace

int64_t RetrievalTask::min_seq_len() const {
  return (1 + options_.distractors) * NeedleLength(options_) + QuestionLength(options_) +
         options_.value_length - 1;
}

absl::StatusOr<RetrievalTask> RetrievalTask::Create(TokenCorpus corpus, TokenRange range,
                                                    const RetrievalOptions& options) {
  if (corpus.vocab_size() != kByteVocabSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("the retrieval task needs byte-level tokens (vocabulary 256); the corpus has "
                     "vocabulary ",
                     corpus.vocab_size()));
  }
  if (options.key_length < 1 || options.key_length > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("key_length = ", options.key_length, ": need 1..64"));
  }
  if (options.value_length < 1 || options.value_length > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("value_length = ", options.value_length, ": need 1..64"));
  }
  if (options.distractors < 0 || options.distractors > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("distractors = ", options.distractors, ": need 0..1000000"));
  }
  if (std::isnan(options.depth) || options.depth > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("depth = ", options.depth, ": need [0, 1], or < 0 for random"));
  }
  RetrievalTask task;
  task.options_ = options;
  if (options.seq_len < task.min_seq_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len = ", options.seq_len, " cannot hold ", 1 + options.distractors,
                     " needle(s), the question and the answer: need >= ", task.min_seq_len()));
  }
  task.haystack_ = options.seq_len + 1 - (1 + options.distractors) * NeedleLength(options) -
                   QuestionLength(options) - options.value_length;
  if (range.begin < 0 || range.end < range.begin || range.end > corpus.size()) {
    return absl::InvalidArgumentError(absl::StrCat("token range [", range.begin, ", ", range.end,
                                                   ") is not inside the corpus's [0, ",
                                                   corpus.size(), ")"));
  }
  if (range.size() < task.haystack_) {
    return absl::InvalidArgumentError(
        absl::StrCat("token range [", range.begin, ", ", range.end, ") holds ", range.size(),
                     " tokens, fewer than the ", task.haystack_, " of text an example needs"));
  }
  task.corpus_ = std::move(corpus);
  task.range_ = range;
  return task;
}

absl::StatusOr<RetrievalExample> RetrievalTask::Example(int64_t index) const {
  if (index < 0) return absl::InvalidArgumentError(absl::StrCat("example index ", index));
  const RetrievalOptions& o = options_;
  const int64_t h = haystack_;
  Rng rng(HashPair(o.seed, static_cast<uint64_t>(index)));
  RetrievalExample ex;
  ex.text_begin =
      range_.begin + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(range_.size() - h + 1)));
  std::vector<int32_t> text(static_cast<size_t>(h));
  if (absl::Status s = corpus_.Read(ex.text_begin, absl::MakeSpan(text)); !s.ok()) return s;
  ex.key = RandomString(rng, o.key_length, 'a', 26);
  ex.value = RandomString(rng, o.value_length, '0', 10);
  const int64_t p = o.depth >= 0 ? std::llround(o.depth * static_cast<double>(h))
                                 : static_cast<int64_t>(rng.Below(static_cast<uint64_t>(h + 1)));

  struct Needle {
    int64_t at;
    int64_t order;  // 0 for the true needle: it goes first among needles at the same place.
    std::string key, value;
  };
  std::vector<Needle> needles;
  needles.push_back({p, 0, ex.key, ex.value});
  for (int64_t d = 0; d < o.distractors; ++d) {
    std::string key;
    do {
      key = RandomString(rng, o.key_length, 'a', 26);
    } while (key == ex.key);
    std::string value = RandomString(rng, o.value_length, '0', 10);
    const int64_t at = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(h + 1)));
    needles.push_back({at, d + 1, std::move(key), std::move(value)});
  }
  std::sort(needles.begin(), needles.end(), [](const Needle& a, const Needle& b) {
    return a.at != b.at ? a.at < b.at : a.order < b.order;
  });

  ex.tokens.reserve(static_cast<size_t>(o.seq_len + 1));
  int64_t t = 0;
  for (const Needle& n : needles) {
    ex.tokens.insert(ex.tokens.end(), text.begin() + t, text.begin() + n.at);
    t = n.at;
    if (n.order == 0) ex.needle_begin = static_cast<int64_t>(ex.tokens.size());
    AppendText(&ex.tokens, absl::StrCat(kNeedleA, n.key, kNeedleB, n.value, kNeedleC));
  }
  ex.tokens.insert(ex.tokens.end(), text.begin() + t, text.end());
  AppendText(&ex.tokens, absl::StrCat(kQuestionA, ex.key, kQuestionB, ex.key, kQuestionC));
  ex.answer_begin = static_cast<int64_t>(ex.tokens.size());
  AppendText(&ex.tokens, ex.value);
  if (static_cast<int64_t>(ex.tokens.size()) != o.seq_len + 1) {
    return absl::InternalError(absl::StrCat("retrieval example ", index, " has ", ex.tokens.size(),
                                            " tokens, not ", o.seq_len + 1));
  }
  return ex;
}

absl::Status RetrievalTask::MakeBatch(int64_t first, int64_t count, Batch* batch) const {
  if (batch == nullptr) return absl::InvalidArgumentError("RetrievalTask::MakeBatch: null batch");
  if (first < 0 || count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("retrieval batch of ", count, " examples from ", first));
  }
  const int64_t n = options_.seq_len;
  Batch out;
  out.rows = count;
  out.seq_len = n;
  out.first_row = first;
  out.inputs.resize(static_cast<size_t>(count * n));
  out.targets.assign(static_cast<size_t>(count * n), kIgnoreTarget);
  out.starts.resize(static_cast<size_t>(count));
  for (int64_t r = 0; r < count; ++r) {
    absl::StatusOr<RetrievalExample> ex = Example(first + r);
    if (!ex.ok()) return ex.status();
    std::copy(ex->tokens.begin(), ex->tokens.end() - 1, out.inputs.begin() + r * n);
    const int64_t scored_from = options_.score_text ? 0 : n - options_.value_length;
    for (int64_t i = scored_from; i < n; ++i) out.targets[r * n + i] = ex->tokens[i + 1];
    out.starts[r] = ex->text_begin;
  }
  *batch = std::move(out);
  return absl::OkStatus();
}

absl::StatusOr<RetrievalScore> RetrievalTask::Score(const Batch& batch,
                                                    absl::Span<const int32_t> predictions) const {
  const int64_t n = options_.seq_len;
  if (batch.seq_len != n || static_cast<int64_t>(batch.targets.size()) != batch.rows * n) {
    return absl::InvalidArgumentError(absl::StrCat("batch of seq_len ", batch.seq_len, " and ",
                                                   batch.targets.size(),
                                                   " targets: this task has seq_len ", n));
  }
  if (static_cast<int64_t>(predictions.size()) != batch.rows * n) {
    return absl::InvalidArgumentError(
        absl::StrCat(predictions.size(), " predictions for ", batch.rows, " rows of ", n));
  }
  RetrievalScore score;
  for (int64_t r = 0; r < batch.rows; ++r) {
    bool all = true;
    for (int64_t i = n - options_.value_length; i < n; ++i) {
      const bool right = predictions[r * n + i] == batch.targets[r * n + i];
      score.correct_tokens += right;
      all = all && right;
    }
    score.answer_tokens += options_.value_length;
    score.exact += all;
    ++score.examples;
  }
  return score;
}

absl::StatusOr<RetrievalScore> RetrievalTask::ScoreLogits(const Batch& batch,
                                                          absl::Span<const float> logits,
                                                          int64_t vocab_size) const {
  const int64_t n = options_.seq_len;
  if (vocab_size < 1 || static_cast<int64_t>(logits.size()) != batch.rows * n * vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(logits.size(), " logits for ", batch.rows,
                                                   " rows of ", n, " positions and vocabulary ",
                                                   vocab_size));
  }
  std::vector<int32_t> predictions(static_cast<size_t>(batch.rows * n), kIgnoreTarget);
  for (int64_t r = 0; r < batch.rows; ++r) {
    for (int64_t i = n - options_.value_length; i < n; ++i) {
      const float* row = logits.data() + (r * n + i) * vocab_size;
      predictions[r * n + i] = static_cast<int32_t>(std::max_element(row, row + vocab_size) - row);
    }
  }
  return Score(batch, predictions);
}

}  // namespace model
}  // namespace dattn
