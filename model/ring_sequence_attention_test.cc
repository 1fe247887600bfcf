// A sequence-parallel rank's model (NewCpuTrainableModel over NewCpuRingSequenceAttention) on S
// Gloo ranks as threads: the ranks' loss sums and gradients, each computed on its slice of
// positions with loss_scale = its targets / all targets, add up to the single-device model's on
// the whole sequence; positions that are not the rank's shard are refused by name.
#include "model/ring_sequence_attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/rng.h"
#include "model/testing/gloo_ranks.h"
#include "model/trainable_model.h"

namespace dattn {
namespace model {
namespace {

using testing::RunRanks;

constexpr int64_t kBatch = 2;
constexpr int64_t kSeqLen = 64;

// Both modes are covered by longnet_test; here grouped, segments spanning ranks (32 > 64 / 4) and
// local ones (16), a dilated pattern, XPOS (absolute positions matter).
LongNetConfig TinyModel() {
  LongNetConfig c;
  c.vocab_size = 256;
  c.d_model = 32;
  c.num_layers = 2;
  c.num_heads = 2;
  c.ffn_dim = 64;
  c.segment_lengths = {16, 32};
  c.dilation_rates = {1, 2};
  c.xpos = true;
  return c;
}

struct Tokens {
  std::vector<int32_t> tokens, targets;
};

Tokens MakeTokens() {
  Rng rng(5);
  Tokens t;
  for (int64_t i = 0; i < kBatch * kSeqLen; ++i) {
    t.tokens.push_back(static_cast<int32_t>(rng.Below(256)));
    // Some ignored targets, so that the ranks' target counts differ.
    t.targets.push_back(rng.Below(5) == 0 ? kIgnoreTarget : static_cast<int32_t>(rng.Below(256)));
  }
  return t;
}

// Rows' positions [begin, end) of a [kBatch, kSeqLen] array.
std::vector<int32_t> Slice(const std::vector<int32_t>& full, int64_t begin, int64_t end) {
  std::vector<int32_t> out;
  for (int64_t r = 0; r < kBatch; ++r) {
    out.insert(out.end(), full.begin() + r * kSeqLen + begin, full.begin() + r * kSeqLen + end);
  }
  return out;
}

TEST(RingSequenceAttentionTest, SlicesOfTheRingAddUpToTheWholeSequence) {
  const LongNetConfig config = TinyModel();
  const Tokens t = MakeTokens();
  int64_t global_targets = 0;
  for (int32_t x : t.targets) global_targets += x != kIgnoreTarget;

  absl::StatusOr<std::unique_ptr<TrainableModel>> whole = NewCpuTrainableModel(config, {}, 1);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE((*whole)->InitParams(3).ok());
  TokenBatch tb;
  tb.tokens = t.tokens.data();
  tb.targets = t.targets.data();
  tb.batch = kBatch;
  tb.seq_len = kSeqLen;
  absl::StatusOr<LossResult> reference = (*whole)->ForwardBackward(tb, {});
  ASSERT_TRUE(reference.ok()) << reference.status();
  const int64_t total = (*whole)->layout().total();
  const std::vector<float> expected((*whole)->grads(), (*whole)->grads() + total);
  float largest = 0;
  for (float g : expected) largest = std::max(largest, std::abs(g));

  for (int s : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(s, " sequence ranks"));
    std::vector<std::vector<float>> grads(static_cast<size_t>(s));
    std::vector<double> loss_sums(static_cast<size_t>(s));
    std::vector<int64_t> counts(static_cast<size_t>(s));
    const std::vector<absl::Status> results =
        RunRanks(s, s, [&](int rank, comm::Communicator&, comm::Communicator* sp) -> absl::Status {
          absl::StatusOr<std::unique_ptr<TrainableModel>> model =
              NewCpuTrainableModel(config, {}, 1, NewCpuRingSequenceAttention(sp, 1));
          if (!model.ok()) return model.status();
          if (absl::Status st = (*model)->InitParams(3); !st.ok()) return st;
          const int64_t n = kSeqLen / s, begin = rank * n;
          const std::vector<int32_t> tokens = Slice(t.tokens, begin, begin + n);
          const std::vector<int32_t> targets = Slice(t.targets, begin, begin + n);
          int64_t mine = 0;
          for (int32_t x : targets) mine += x != kIgnoreTarget;
          TokenBatch slice;
          slice.tokens = tokens.data();
          slice.targets = targets.data();
          slice.batch = kBatch;
          slice.seq_len = n;
          slice.positions = {begin, kSeqLen};
          BackwardOptions bo;
          bo.loss_scale = static_cast<double>(mine) / static_cast<double>(global_targets);
          absl::StatusOr<LossResult> loss = (*model)->ForwardBackward(slice, bo);
          if (!loss.ok()) return loss.status();
          loss_sums[static_cast<size_t>(rank)] = loss->loss_sum;
          counts[static_cast<size_t>(rank)] = loss->num_targets;
          grads[static_cast<size_t>(rank)].assign((*model)->grads(), (*model)->grads() + total);
          return absl::OkStatus();
        });
    for (size_t r = 0; r < results.size(); ++r) ASSERT_TRUE(results[r].ok()) << results[r];
    double loss_sum = 0;
    int64_t targets = 0;
    for (int r = 0; r < s; ++r) {
      loss_sum += loss_sums[static_cast<size_t>(r)];
      targets += counts[static_cast<size_t>(r)];
    }
    EXPECT_EQ(targets, reference->num_targets);
    EXPECT_NEAR(loss_sum, reference->loss_sum, 1e-5 * std::abs(reference->loss_sum));
    double worst = 0;
    for (int64_t i = 0; i < total; ++i) {
      float sum = 0;
      for (int r = 0; r < s; ++r) sum += grads[static_cast<size_t>(r)][static_cast<size_t>(i)];
      worst = std::max(worst, static_cast<double>(std::abs(sum - expected[i])));
    }
    std::printf(
        "[ parity ] %d sequence ranks: loss sum %.9g vs %.9g, worst gradient %.3g of %.3g\n", s,
        loss_sum, reference->loss_sum, worst, largest);
    // fp32 sums of the same terms in another grouping (attention merges blocks by log-sum-exp).
    EXPECT_LT(worst, 1e-5 * largest);
  }
}

TEST(RingSequenceAttentionTest, RefusesPositionsThatAreNotTheRanksShard) {
  const LongNetConfig config = TinyModel();
  const Tokens t = MakeTokens();
  const std::vector<absl::Status> results =
      RunRanks(2, 2, [&](int rank, comm::Communicator&, comm::Communicator* sp) -> absl::Status {
        absl::StatusOr<std::unique_ptr<TrainableModel>> model =
            NewCpuTrainableModel(config, {}, 1, NewCpuRingSequenceAttention(sp, 1));
        if (!model.ok()) return model.status();
        if (absl::Status st = (*model)->InitParams(3); !st.ok()) return st;
        const std::vector<int32_t> tokens = Slice(t.tokens, 0, 32);
        TokenBatch slice;
        slice.tokens = tokens.data();
        slice.batch = kBatch;
        slice.seq_len = 32;
        // Every rank's offset is wrong (so no rank enters the ring and waits for another).
        slice.positions = {rank == 0 ? 1 : 16, 64};
        absl::Status s = (*model)->Evaluate(slice, {}).status();
        const std::string want =
            absl::StrCat("positions start at ", slice.positions.offset,
                         " of a sequence of 64 positions with 32 rows of q; this rank's shard must "
                         "start at rank * N / P = ",
                         rank * 32);
        if (s.code() != absl::StatusCode::kInvalidArgument ||
            s.message().find(want) == absl::string_view::npos) {
          return absl::InternalError(absl::StrCat("wrong offset: ", s.ToString()));
        }
        // 32 rows on each of 2 ranks are 64 positions, more than 48 (fewer than the sequence's
        // are a causal prefix of it, which a decoder's prompt is: ring_decoder_test).
        slice.positions = {rank * 8, 48};
        s = (*model)->Evaluate(slice, {}).status();
        if (s.code() != absl::StatusCode::kInvalidArgument ||
            s.message().find("32 x 2 = 64 must equal 48, or with causal attention be at most it") ==
                absl::string_view::npos) {
          return absl::InternalError(absl::StrCat("wrong total: ", s.ToString()));
        }
        return sp->health();
      });
  for (size_t r = 0; r < results.size(); ++r) EXPECT_TRUE(results[r].ok()) << results[r];
}

}  // namespace
}  // namespace model
}  // namespace dattn
