#include "model/retrieval.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dattn {
namespace model {
namespace {

TokenCorpus Text() {
  std::string text;
  for (int i = 0; i < 200; ++i) {
    text += "In the beginning was the word, and the word was number " + std::to_string(i) + ". ";
  }
  std::vector<int32_t> tokens(text.begin(), text.end());
  return *TokenCorpus::FromTokens(std::move(tokens), 256, "text");
}

std::string AsString(const std::vector<int32_t>& tokens, int64_t begin, int64_t end) {
  std::string s;
  for (int64_t i = begin; i < end; ++i) s.push_back(static_cast<char>(tokens[i]));
  return s;
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

TEST(RetrievalTest, ExampleHasNeedleQuestionAndAnswer) {
  TokenCorpus corpus = Text();
  RetrievalOptions options;
  options.seq_len = 512;
  options.seed = 3;
  absl::StatusOr<RetrievalTask> task =
      RetrievalTask::Create(corpus, TokenRange{0, corpus.size()}, options);
  ASSERT_TRUE(task.ok()) << task.status();
  absl::StatusOr<RetrievalExample> ex = task->Example(17);
  ASSERT_TRUE(ex.ok()) << ex.status();
  ASSERT_EQ(ex->tokens.size(), 513u);
  EXPECT_EQ(ex->key.size(), 6u);
  EXPECT_EQ(ex->value.size(), 6u);
  for (char c : ex->key) EXPECT_TRUE(c >= 'a' && c <= 'z');
  for (char c : ex->value) EXPECT_TRUE(c >= '0' && c <= '9');
  const std::string all = AsString(ex->tokens, 0, 513);
  const std::string needle = "\nThe pass key of " + ex->key + " is " + ex->value + ".\n";
  EXPECT_EQ(all.substr(ex->needle_begin, needle.size()), needle);
  const std::string tail =
      "\nWhat is the pass key of " + ex->key + "? The pass key of " + ex->key + " is " + ex->value;
  EXPECT_EQ(all.substr(all.size() - tail.size()), tail);
  EXPECT_EQ(ex->answer_begin, 513 - 6);
  // The text around the needle is the corpus's.
  const std::string text = *corpus.ReadBytes(ex->text_begin, ex->needle_begin);
  EXPECT_EQ(all.substr(0, ex->needle_begin), text);

  // Deterministic per index, different across indices.
  absl::StatusOr<RetrievalExample> again = task->Example(17);
  EXPECT_EQ(again->tokens, ex->tokens);
  absl::StatusOr<RetrievalExample> other = task->Example(18);
  EXPECT_NE(other->key + other->value, ex->key + ex->value);
}

TEST(RetrievalTest, DepthPlacesTheNeedle) {
  TokenCorpus corpus = Text();
  RetrievalOptions options;
  options.seq_len = 1000;
  options.depth = 0;
  RetrievalTask at_start = *RetrievalTask::Create(corpus, {0, corpus.size()}, options);
  EXPECT_EQ(at_start.Example(0)->needle_begin, 0);
  options.depth = 1;
  RetrievalTask at_end = *RetrievalTask::Create(corpus, {0, corpus.size()}, options);
  absl::StatusOr<RetrievalExample> ex = at_end.Example(0);
  const int64_t question =
      1001 - 6 -
      static_cast<int64_t>(std::string("\nWhat is the pass key of abcdef? The pass key of "
                                       "abcdef is ")
                               .size());
  const int64_t needle =
      static_cast<int64_t>(std::string("\nThe pass key of abcdef is 123456.\n").size());
  EXPECT_EQ(ex->needle_begin + needle, question);
  options.depth = 0.5;
  RetrievalTask middle = *RetrievalTask::Create(corpus, {0, corpus.size()}, options);
  const int64_t h = 1001 - needle - (1001 - question);
  EXPECT_EQ(middle.Example(0)->needle_begin, (h + 1) / 2);
}

TEST(RetrievalTest, DistractorsHaveOtherKeys) {
  TokenCorpus corpus = Text();
  RetrievalOptions options;
  options.seq_len = 2000;
  options.distractors = 5;
  options.key_length = 1;  // Few keys: the rule "never K" is exercised.
  RetrievalTask task = *RetrievalTask::Create(corpus, {0, corpus.size()}, options);
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<RetrievalExample> ex = task.Example(i);
    ASSERT_TRUE(ex.ok());
    const std::string all = AsString(ex->tokens, 0, 2001);
    EXPECT_EQ(Count(all, "\nThe pass key of "), 6);
    EXPECT_EQ(Count(all, "\nThe pass key of " + ex->key + " is "), 1) << all;
  }
}

TEST(RetrievalTest, BatchScoresTheAnswerOnly) {
  TokenCorpus corpus = Text();
  RetrievalOptions options;
  options.seq_len = 300;
  options.value_length = 4;
  RetrievalTask task = *RetrievalTask::Create(corpus, {0, corpus.size()}, options);
  Batch batch;
  ASSERT_TRUE(task.MakeBatch(10, 3, &batch).ok());
  EXPECT_EQ(batch.rows, 3);
  EXPECT_EQ(batch.first_row, 10);
  EXPECT_EQ(batch.scored(), 3 * 4);
  for (int64_t r = 0; r < 3; ++r) {
    absl::StatusOr<RetrievalExample> ex = task.Example(10 + r);
    for (int64_t i = 0; i < 300; ++i) {
      EXPECT_EQ(batch.inputs[r * 300 + i], ex->tokens[i]);
      EXPECT_EQ(batch.targets[r * 300 + i], i >= 296 ? ex->tokens[i + 1] : kIgnoreTarget);
    }
  }
  // Perfect predictions, then one wrong digit in row 1.
  std::vector<int32_t> predictions = batch.targets;
  absl::StatusOr<RetrievalScore> score = task.Score(batch, predictions);
  ASSERT_TRUE(score.ok());
  EXPECT_EQ(score->exact, 3);
  EXPECT_EQ(score->correct_tokens, 12);
  predictions[1 * 300 + 298] = 'x';
  score = task.Score(batch, predictions);
  EXPECT_EQ(score->exact, 2);
  EXPECT_EQ(score->correct_tokens, 11);
  EXPECT_DOUBLE_EQ(score->token_accuracy(), 11.0 / 12.0);
  EXPECT_TRUE(absl::IsInvalidArgument(task.Score(batch, {1, 2, 3}).status()));

  // From logits: one-hot on the target, except row 2's last position.
  std::vector<float> logits(3 * 300 * 256, 0.0f);
  for (int64_t p = 0; p < 3 * 300; ++p) {
    if (batch.targets[p] != kIgnoreTarget) logits[p * 256 + batch.targets[p]] = 1.0f;
  }
  logits[(2 * 300 + 299) * 256 + 'z'] = 5.0f;
  score = task.ScoreLogits(batch, logits, 256);
  ASSERT_TRUE(score.ok());
  EXPECT_EQ(score->exact, 2);
  EXPECT_TRUE(absl::IsInvalidArgument(task.ScoreLogits(batch, logits, 255).status()));

  options.score_text = true;
  RetrievalTask lm = *RetrievalTask::Create(corpus, {0, corpus.size()}, options);
  ASSERT_TRUE(lm.MakeBatch(0, 2, &batch).ok());
  EXPECT_EQ(batch.scored(), 2 * 300);
}

TEST(RetrievalTest, BadOptionsAreRefused) {
  TokenCorpus corpus = Text();
  RetrievalOptions options;
  options.seq_len = 50;
  absl::Status s = RetrievalTask::Create(corpus, {0, corpus.size()}, options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("need >= 99"), std::string::npos) << s;
  options.seq_len = 99;  // No text at all: needle 35 + question 59 + answer 6 = 100 tokens.
  absl::StatusOr<RetrievalTask> tight = RetrievalTask::Create(corpus, {0, corpus.size()}, options);
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_EQ(tight->Example(0)->tokens.size(), 100u);
  options.seq_len = 512;
  options.depth = 1.5;
  EXPECT_TRUE(
      absl::IsInvalidArgument(RetrievalTask::Create(corpus, {0, corpus.size()}, options).status()));
  options.depth = -1;
  options.key_length = 0;
  EXPECT_TRUE(
      absl::IsInvalidArgument(RetrievalTask::Create(corpus, {0, corpus.size()}, options).status()));
  options.key_length = 6;
  EXPECT_TRUE(absl::IsInvalidArgument(RetrievalTask::Create(corpus, {0, 100}, options).status()));
  TokenCorpus words = *TokenCorpus::FromTokens(std::vector<int32_t>(5000, 7), 50257);
  s = RetrievalTask::Create(words, {0, 5000}, options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("vocabulary 50257"), std::string::npos) << s;
}

}  // namespace
}  // namespace model
}  // namespace dattn
