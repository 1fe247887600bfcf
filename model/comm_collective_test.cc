// The communicator collective (comm_collective.h) on Gloo ranks as threads: the reduce-scatter is
// the rank-order fp32 sum bit for bit (over several chunks, with shards of unequal size), the
// parameter all-gather moves unequal shards exactly, the fp64 and byte all-gathers, the barrier,
// and the argument errors.
#include "model/comm_collective.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/rng.h"
#include "model/testing/gloo_ranks.h"

namespace dattn {
namespace model {
namespace {

using testing::RunRanks;

void ExpectAllOk(const std::vector<absl::Status>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  }
}

// Rank r's gradient: values of very different magnitudes and signs, so that fp32 addition in
// another order gives other bits.
std::vector<float> Gradient(int rank, int64_t n) {
  Rng rng(HashPair(1234, static_cast<uint64_t>(rank)));
  std::vector<float> g(static_cast<size_t>(n));
  for (float& x : g) {
    const double magnitude = std::ldexp(1.0, static_cast<int>(rng.Below(40)) - 20);
    x = static_cast<float>((rng.Uniform() - 0.5) * magnitude);
  }
  return g;
}

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

TEST(CommCollectiveTest, ReduceScatterIsTheRankOrderSumBitForBit) {
  // n is prime, so shards differ in size; max_temp_bytes forces many chunks per shard.
  constexpr int64_t kN = 10007;
  for (int w : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("world ", w));
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < w; ++r) inputs.push_back(Gradient(r, kN));
    // The documented order, and the reverse (to show that the check can see the order).
    std::vector<float> expected(kN), reversed(kN);
    for (int64_t i = 0; i < kN; ++i) {
      float acc = inputs[0][static_cast<size_t>(i)];
      for (int r = 1; r < w; ++r) acc += inputs[static_cast<size_t>(r)][static_cast<size_t>(i)];
      expected[static_cast<size_t>(i)] = acc;
      float rev = inputs[static_cast<size_t>(w - 1)][static_cast<size_t>(i)];
      for (int r = w - 2; r >= 0; --r)
        rev += inputs[static_cast<size_t>(r)][static_cast<size_t>(i)];
      reversed[static_cast<size_t>(i)] = rev;
    }
    if (w > 2) {
      int64_t differ = 0;
      for (int64_t i = 0; i < kN; ++i) differ += Bits(expected[i]) != Bits(reversed[i]);
      EXPECT_GT(differ, 100) << "the inputs do not make the order of addition visible";
    }
    const std::vector<ShardRange> shards = ShardRanges(kN, w);
    for (int64_t temp : {int64_t{64} << 20, int64_t{4096} * w}) {
      SCOPED_TRACE(absl::StrCat("max_temp_bytes ", temp));
      ExpectAllOk(RunRanks(w, 1, [&](int rank, comm::Communicator& world, comm::Communicator*) {
        CommCollectiveOptions options;
        options.max_temp_bytes = temp;
        std::unique_ptr<TrainerCollective> c = NewCommunicatorCollective(&world, options);
        if (c->rank() != rank || c->world() != w) return absl::InternalError("identity");
        std::vector<float> grads = inputs[static_cast<size_t>(rank)];
        absl::Status s = c->ReduceScatterGradients(grads.data(), kN, shards);
        if (!s.ok()) return s;
        const ShardRange mine = shards[static_cast<size_t>(rank)];
        for (int64_t i = mine.begin; i < mine.end; ++i) {
          if (Bits(grads[static_cast<size_t>(i)]) != Bits(expected[static_cast<size_t>(i)])) {
            return absl::InternalError(absl::StrCat("element ", i, ": ", grads[i], " against ",
                                                    expected[i], " (rank-order sum)"));
          }
        }
        return absl::OkStatus();
      }));
    }
  }
}

TEST(CommCollectiveTest, AllGatherParametersMovesUnequalShardsExactly) {
  constexpr int64_t kN = 1001;
  for (int w : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world ", w));
    const std::vector<ShardRange> shards = ShardRanges(kN, w);
    const std::vector<float> truth = Gradient(99, kN);
    ExpectAllOk(RunRanks(w, 1, [&](int rank, comm::Communicator& world, comm::Communicator*) {
      std::unique_ptr<TrainerCollective> c = NewCommunicatorCollective(&world);
      std::vector<float> params(kN, std::nanf(""));
      const ShardRange mine = shards[static_cast<size_t>(rank)];
      for (int64_t i = mine.begin; i < mine.end; ++i) params[i] = truth[i];
      absl::Status s = c->AllGatherParameters(params.data(), kN, shards);
      if (!s.ok()) return s;
      for (int64_t i = 0; i < kN; ++i) {
        if (Bits(params[i]) != Bits(truth[i])) return absl::InternalError(absl::StrCat("at ", i));
      }
      return absl::OkStatus();
    }));
  }
}

TEST(CommCollectiveTest, AllGathersAndBarrier) {
  constexpr int kW = 3;
  ExpectAllOk(RunRanks(kW, 1, [&](int rank, comm::Communicator& world, comm::Communicator*) {
    std::unique_ptr<TrainerCollective> c = NewCommunicatorCollective(&world);
    absl::StatusOr<std::vector<double>> d = c->AllGather({rank + 0.25, -1.0 * rank});
    if (!d.ok()) return d.status();
    for (int r = 0; r < kW; ++r) {
      if ((*d)[2 * r] != r + 0.25 || (*d)[2 * r + 1] != -1.0 * r) {
        return absl::InternalError("AllGather");
      }
    }
    // Messages of different lengths, one empty, with bytes of every value.
    std::string mine;
    for (int i = 0; i < rank * 13; ++i) mine.push_back(static_cast<char>(i * 37 + rank));
    absl::StatusOr<std::vector<std::string>> b = c->AllGatherBytes(mine);
    if (!b.ok()) return b.status();
    for (int r = 0; r < kW; ++r) {
      std::string theirs;
      for (int i = 0; i < r * 13; ++i) theirs.push_back(static_cast<char>(i * 37 + r));
      if ((*b)[static_cast<size_t>(r)] != theirs) {
        return absl::InternalError(absl::StrCat("AllGatherBytes from rank ", r));
      }
    }
    absl::StatusOr<std::vector<std::string>> empty = c->AllGatherBytes("");
    if (!empty.ok()) return empty.status();
    if (empty->size() != kW || !(*empty)[0].empty()) return absl::InternalError("empty bytes");
    return c->Barrier();
  }));
}

TEST(CommCollectiveTest, RefusesShardsThatDoNotTileTheBuffer) {
  ExpectAllOk(RunRanks(2, 1, [&](int, comm::Communicator& world, comm::Communicator*) {
    std::unique_ptr<TrainerCollective> c = NewCommunicatorCollective(&world);
    std::vector<float> g(10);
    absl::Status s = c->ReduceScatterGradients(g.data(), 10, ShardRanges(10, 3));
    if (s.code() != absl::StatusCode::kInvalidArgument ||
        s.message().find("3 shards for 2 ranks") == absl::string_view::npos) {
      return absl::InternalError(absl::StrCat("3 shards: ", s.ToString()));
    }
    s = c->AllGatherParameters(g.data(), 10, ShardRanges(9, 2));
    if (s.code() != absl::StatusCode::kInvalidArgument ||
        s.message().find("end at 9, the buffer has 10") == absl::string_view::npos) {
      return absl::InternalError(absl::StrCat("9 of 10: ", s.ToString()));
    }
    std::vector<ShardRange> gap = {{0, 4}, {5, 10}};
    s = c->ReduceScatterGradients(g.data(), 10, gap);
    if (s.code() != absl::StatusCode::kInvalidArgument ||
        s.message().find("shard 1 is [5, 10)") == absl::string_view::npos) {
      return absl::InternalError(absl::StrCat("gap: ", s.ToString()));
    }
    // The communicator is still healthy: argument errors communicate nothing.
    return c->Barrier();
  }));
}

}  // namespace
}  // namespace model
}  // namespace dattn
