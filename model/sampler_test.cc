#include "model/sampler.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace dattn {
namespace model {
namespace {

// A corpus whose token at position i is i mod 251 (so windows are easy to check).
TokenCorpus Counting(int64_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(i % 251);
  return *TokenCorpus::FromTokens(std::move(tokens), 256);
}

TEST(SamplerTest, FeistelIsABijection) {
  for (uint64_t n : {1u, 2u, 3u, 4u, 5u, 16u, 17u, 1000u, 4097u}) {
    FeistelPermutation perm(n, 12345);
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t x = perm(i);
      ASSERT_LT(x, n);
      ASSERT_FALSE(seen[x]) << "n=" << n << " i=" << i;
      seen[x] = true;
    }
  }
  // Not the identity, and the key matters.
  FeistelPermutation a(1000, 1), b(1000, 2);
  int fixed = 0, same = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    fixed += a(i) == i;
    same += a(i) == b(i);
  }
  EXPECT_LT(fixed, 20);
  EXPECT_LT(same, 20);
}

TEST(SamplerTest, WindowsAreInputsAndShiftedTargets) {
  TokenCorpus corpus = Counting(10000);
  absl::StatusOr<WindowSampler> sampler =
      WindowSampler::Create(corpus, TokenRange{100, 9000}, {64, 8, 42, true});
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  Batch batch;
  ASSERT_TRUE(sampler->Next(&batch).ok());
  EXPECT_EQ(batch.rows, 8);
  EXPECT_EQ(batch.seq_len, 64);
  EXPECT_EQ(batch.scored(), 8 * 64);
  for (int64_t r = 0; r < 8; ++r) {
    const int64_t s = batch.starts[r];
    EXPECT_GE(s, 100);
    EXPECT_LE(s + 65, 9000);
    for (int64_t i = 0; i < 64; ++i) {
      EXPECT_EQ(batch.inputs[r * 64 + i], (s + i) % 251);
      EXPECT_EQ(batch.targets[r * 64 + i], (s + i + 1) % 251);
    }
  }
}

TEST(SamplerTest, EachEpochVisitsEveryWindowOnce) {
  TokenCorpus corpus = Counting(5000);
  const TokenRange range{0, 5000};
  absl::StatusOr<WindowSampler> sampler = WindowSampler::Create(corpus, range, {100, 7, 9, true});
  ASSERT_TRUE(sampler.ok());
  std::set<int64_t> offsets;
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    const int64_t w = sampler->WindowsInEpoch(epoch);
    const int64_t offset = sampler->WindowStart(epoch, 0) % 100;
    offsets.insert(offset);
    EXPECT_EQ(w, (5000 - 1 - offset) / 100);
    std::set<int64_t> starts;
    for (int64_t p = 0; p < w; ++p) {
      const int64_t s = sampler->WindowStart(epoch, p);
      EXPECT_EQ((s - offset) % 100, 0);
      EXPECT_LE(s + 101, 5000);
      starts.insert(s);
    }
    EXPECT_EQ(static_cast<int64_t>(starts.size()), w);  // A permutation.
  }
  EXPECT_GT(offsets.size(), 1u);  // The alignment changes between epochs.

  // Batches walk that order, rolling into the next epoch mid-batch.
  std::vector<int64_t> expected;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (int64_t p = 0; p < sampler->WindowsInEpoch(epoch); ++p) {
      expected.push_back(sampler->WindowStart(epoch, p));
    }
  }
  std::vector<int64_t> got;
  Batch batch;
  while (got.size() + 7 <= expected.size()) {
    ASSERT_TRUE(sampler->Next(&batch).ok());
    got.insert(got.end(), batch.starts.begin(), batch.starts.end());
  }
  expected.resize(got.size());
  EXPECT_EQ(got, expected);
  EXPECT_GE(sampler->cursor().epoch, 2);
}

TEST(SamplerTest, UnshuffledIsCorpusOrder) {
  TokenCorpus corpus = Counting(1000);
  absl::StatusOr<WindowSampler> sampler =
      WindowSampler::Create(corpus, TokenRange{500, 1000}, {100, 2, 0, false});
  ASSERT_TRUE(sampler.ok());
  EXPECT_EQ(sampler->WindowsInEpoch(0), 4);  // (500 - 1) / 100.
  Batch batch;
  ASSERT_TRUE(sampler->Next(&batch).ok());
  EXPECT_EQ(batch.starts, (std::vector<int64_t>{500, 600}));
  ASSERT_TRUE(sampler->Next(&batch).ok());
  EXPECT_EQ(batch.starts, (std::vector<int64_t>{700, 800}));
  EXPECT_EQ(sampler->cursor().epoch, 1);
  EXPECT_EQ(sampler->cursor().position, 0);
  ASSERT_TRUE(sampler->Next(&batch).ok());
  EXPECT_EQ(batch.starts, (std::vector<int64_t>{500, 600}));
}

TEST(SamplerTest, ResumeFromCursorSeesTheSameBatches) {
  TokenCorpus corpus = Counting(3000);
  const SamplerOptions options{50, 6, 77, true};
  absl::StatusOr<WindowSampler> straight = WindowSampler::Create(corpus, {0, 3000}, options);
  ASSERT_TRUE(straight.ok());
  std::vector<Batch> reference(25);
  SamplerCursor saved;
  for (int i = 0; i < 25; ++i) {
    if (i == 11) saved = straight->cursor();
    ASSERT_TRUE(straight->Next(&reference[i]).ok());
  }
  // A new process: a fresh sampler, restored from the saved cursor.
  absl::StatusOr<WindowSampler> resumed = WindowSampler::Create(corpus, {0, 3000}, options);
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE(resumed->Restore(saved).ok());
  for (int i = 11; i < 25; ++i) {
    Batch b;
    ASSERT_TRUE(resumed->Next(&b).ok());
    EXPECT_EQ(b.inputs, reference[i].inputs) << i;
    EXPECT_EQ(b.targets, reference[i].targets) << i;
    EXPECT_EQ(b.starts, reference[i].starts) << i;
  }
  EXPECT_EQ(resumed->cursor(), straight->cursor());

  // Another seed is another order.
  absl::StatusOr<WindowSampler> other = WindowSampler::Create(corpus, {0, 3000}, {50, 6, 78, true});
  Batch b;
  ASSERT_TRUE(other->Next(&b).ok());
  EXPECT_NE(b.starts, reference[0].starts);
}

TEST(SamplerTest, RanksShareTheGlobalBatch) {
  TokenCorpus corpus = Counting(4000);
  const SamplerOptions options{32, 8, 5, true};
  absl::StatusOr<WindowSampler> single = WindowSampler::Create(corpus, {0, 4000}, options);
  ASSERT_TRUE(single.ok());
  std::vector<WindowSampler> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(*WindowSampler::Create(corpus, {0, 4000}, options));
  for (int step = 0; step < 5; ++step) {
    Batch global;
    ASSERT_TRUE(single->Next(&global).ok());
    std::vector<int32_t> joined;
    std::vector<int64_t> starts;
    for (int r = 0; r < 4; ++r) {
      Batch share;
      ASSERT_TRUE(ranks[r].Next(&share, r, 4).ok());
      EXPECT_EQ(share.rows, 2);
      EXPECT_EQ(share.first_row, 2 * r);
      joined.insert(joined.end(), share.inputs.begin(), share.inputs.end());
      starts.insert(starts.end(), share.starts.begin(), share.starts.end());
      EXPECT_EQ(ranks[r].cursor(), single->cursor());
    }
    EXPECT_EQ(joined, global.inputs);
    EXPECT_EQ(starts, global.starts);
  }
  Batch b;
  EXPECT_TRUE(absl::IsInvalidArgument(single->Next(&b, 0, 3)));  // 8 % 3 != 0.
  EXPECT_TRUE(absl::IsInvalidArgument(single->Next(&b, 4, 4)));
  EXPECT_TRUE(absl::IsInvalidArgument(single->Next(&b, -1, 4)));
}

TEST(SamplerTest, BadOptionsAndForeignCursorsAreRefused) {
  TokenCorpus corpus = Counting(100);
  absl::Status s = WindowSampler::Create(corpus, {0, 100}, {100, 1, 0, true}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("seq_len + 1 = 101"), std::string::npos) << s;
  EXPECT_TRUE(
      absl::IsInvalidArgument(WindowSampler::Create(corpus, {0, 100}, {0, 1, 0, true}).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(WindowSampler::Create(corpus, {0, 100}, {10, 0, 0, true}).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(WindowSampler::Create(corpus, {50, 101}, {10, 1, 0, true}).status()));
  // Exactly one window fits.
  absl::StatusOr<WindowSampler> one = WindowSampler::Create(corpus, {0, 11}, {10, 3, 0, true});
  ASSERT_TRUE(one.ok());
  Batch b;
  ASSERT_TRUE(one->Next(&b).ok());
  EXPECT_EQ(b.starts, (std::vector<int64_t>{0, 0, 0}));

  absl::StatusOr<WindowSampler> sampler = WindowSampler::Create(corpus, {0, 100}, {10, 2, 1, true});
  ASSERT_TRUE(sampler.ok());
  SamplerCursor c = sampler->cursor();
  c.seed = 2;
  s = sampler->Restore(c);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("seed = 2"), std::string::npos) << s;
  c = sampler->cursor();
  c.seq_len = 11;
  EXPECT_TRUE(absl::IsInvalidArgument(sampler->Restore(c)));
  c = sampler->cursor();
  c.range_end = 99;
  EXPECT_TRUE(absl::IsInvalidArgument(sampler->Restore(c)));
  c = sampler->cursor();
  c.position = 1000;
  s = sampler->Restore(c);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("position 1000"), std::string::npos) << s;
  c = sampler->cursor();
  c.epoch = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(sampler->Restore(c)));
}

}  // namespace
}  // namespace model
}  // namespace dattn
