// The built-in long-range retrieval task ("pass key" retrieval): a key and its value are hidden at
// a chosen depth of N tokens of real text, a question naming the key comes at the end, and only
// the answer (the value) is scored. A model that answers correctly far more often than chance
// (10^-value_length) at depth 0 of a long sequence has learned to use context that far back.
//
// One example is a sequence S of seq_len + 1 byte tokens (inputs S[0, N), targets S[1, N + 1)):
//
//   S = text[0, p) + NEEDLE(K, V) + text[p, H) + QUESTION(K) + V
//   NEEDLE(K, V) = "\nThe pass key of " K " is " V ".\n"
//   QUESTION(K)  = "\nWhat is the pass key of " K "? The pass key of " K " is "
//
// K is key_length random lower-case letters, V value_length random decimal digits. `text` is H
// consecutive tokens of the corpus range starting at a random position (real text, document
// separators included), H being whatever length makes S exactly N + 1 tokens; p = round(depth *
// H), so depth 0 puts the needle at the very start (the farthest from the question) and depth 1
// just before the question. With `distractors` > 0, that many more needles with other keys (never
// K) and other values are inserted at random places of the text, so copying the last-seen value
// is not enough. The targets are kIgnoreTarget everywhere except the value_length positions that
// predict V (the last value_length targets of the row), unless score_text also scores the text
// (the model then learns language modelling on the haystack as well; the score still counts the
// answer only).
//
// Everything random in example i (text position, K, V, depth when random, distractors) comes from
// Rng(HashPair(seed, i)): example i is the same whoever builds it, in whatever order, so a batch
// is (first example, count), and a data-parallel rank builds only its rows.
//
// The task needs byte-level tokens (a corpus of vocabulary 256): its needle and question are text.
//
// Threads: a RetrievalTask is immutable; any number of threads may build examples at once.
#ifndef DATTN_MODEL_RETRIEVAL_H_
#define DATTN_MODEL_RETRIEVAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/corpus.h"
#include "model/sampler.h"

namespace dattn {
namespace model {

struct RetrievalOptions {
  int64_t seq_len = 0;       // N.
  double depth = -1;         // In [0, 1]: where the needle goes; < 0: uniform at random.
  int64_t key_length = 6;    // 1..64 letters.
  int64_t value_length = 6;  // 1..64 digits.
  int64_t distractors = 0;   // >= 0 extra needles.
  bool score_text = false;
  uint64_t seed = 0;
};

// One example, with where its parts are (for tests, logs and depth sweeps).
struct RetrievalExample {
  std::vector<int32_t> tokens;  // N + 1 tokens.
  int64_t text_begin = 0;       // Corpus position of the haystack's first token.
  int64_t needle_begin = 0;     // Position in `tokens` of the true needle's first byte.
  int64_t answer_begin = 0;     // Position in `tokens` of V's first digit (= N + 1 - value_length).
  std::string key;
  std::string value;
};

// Answers scored: `exact` counts examples whose every answer token was right.
struct RetrievalScore {
  int64_t examples = 0;
  int64_t exact = 0;
  int64_t answer_tokens = 0;
  int64_t correct_tokens = 0;
  double exact_rate() const { return examples > 0 ? static_cast<double>(exact) / examples : 0; }
  double token_accuracy() const {
    return answer_tokens > 0 ? static_cast<double>(correct_tokens) / answer_tokens : 0;
  }
};

class RetrievalTask {
 public:
  // INVALID_ARGUMENT naming the value for: a corpus whose vocabulary is not 256; key_length or
  // value_length outside 1..64; distractors < 0; depth > 1 or NaN; a seq_len too short to hold the
  // needles, the question and the answer (the message gives the minimum); a range outside the
  // corpus or shorter than the haystack.
  static absl::StatusOr<RetrievalTask> Create(TokenCorpus corpus, TokenRange range,
                                              const RetrievalOptions& options);

  // Example `index` (>= 0). Errors from the corpus's Read.
  absl::StatusOr<RetrievalExample> Example(int64_t index) const;

  // Examples [first, first + count) as the rows of a batch (starts holds each row's text_begin,
  // first_row = first). INVALID_ARGUMENT for first < 0 or count < 1.
  absl::Status MakeBatch(int64_t first, int64_t count, Batch* batch) const;

  // Scores a batch this task built: predictions[r * N + i] is the model's choice (argmax) for
  // target i of row r; only the answer positions are read. INVALID_ARGUMENT when the sizes do not
  // match the batch.
  absl::StatusOr<RetrievalScore> Score(const Batch& batch,
                                       absl::Span<const int32_t> predictions) const;
  // The same from logits, rows * N * vocab_size floats (argmax per position; ties go to the
  // lower id).
  absl::StatusOr<RetrievalScore> ScoreLogits(const Batch& batch, absl::Span<const float> logits,
                                             int64_t vocab_size) const;

  // The shortest seq_len these options allow (no text at all).
  int64_t min_seq_len() const;
  const RetrievalOptions& options() const { return options_; }

 private:
  RetrievalTask() = default;
  TokenCorpus corpus_;
  TokenRange range_;
  RetrievalOptions options_;
  int64_t haystack_ = 0;  // H.
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_RETRIEVAL_H_
