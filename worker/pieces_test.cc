#include "worker/pieces.h"

#include <atomic>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace dattn {
namespace worker {
namespace {

TEST(ForEachPieceTest, CoversTheRangeOnceInPiecesSpreadOverThreads) {
  for (int threads : {1, 3, 8}) {
    std::mutex mu;
    std::vector<std::tuple<int64_t, int64_t, int>> seen;
    ASSERT_TRUE(ForEachPiece(25, 4, threads, [&](int64_t offset, int64_t length, int thread) {
                  std::lock_guard<std::mutex> lock(mu);
                  seen.emplace_back(offset, length, thread);
                  return absl::OkStatus();
                }).ok());
    ASSERT_EQ(seen.size(), 7u);
    std::set<int> used_threads;
    std::vector<int> covered(25, 0);
    for (auto [offset, length, thread] : seen) {
      EXPECT_EQ(offset % 4, 0);
      EXPECT_EQ(length, offset == 24 ? 1 : 4);
      EXPECT_EQ(thread, (offset / 4) % std::min(threads, 7));  // Piece p on thread p mod T.
      used_threads.insert(thread);
      for (int64_t i = offset; i < offset + length; ++i) ++covered[static_cast<size_t>(i)];
    }
    EXPECT_EQ(static_cast<int>(used_threads.size()), std::min(threads, 7));
    for (int c : covered) EXPECT_EQ(c, 1);
  }
  EXPECT_TRUE(ForEachPiece(0, 4, 4, [](int64_t, int64_t, int) {
                return absl::InternalError("called");
              }).ok());
}

TEST(ForEachPieceTest, TheFirstErrorStopsNewPiecesAndIsReturned) {
  std::atomic<int> calls{0};
  absl::Status s = ForEachPiece(1000, 1, 4, [&](int64_t offset, int64_t, int) {
    ++calls;
    return offset == 5 ? absl::DataLossError("piece 5") : absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(s.message(), "piece 5");
  EXPECT_LT(calls.load(), 1000);
}

}  // namespace
}  // namespace worker
}  // namespace dattn
