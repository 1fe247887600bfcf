#include "base/median.h"

#include "gtest/gtest.h"

namespace dattn {
namespace {

TEST(MedianTest, MiddleValueOrMeanOfTheTwoMiddleOnes) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({3}), 3);
  EXPECT_EQ(Median({5, 1, 3}), 3);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({0.9, 0.1, 0.1, 0.1, 7}), 0.1);
}

}  // namespace
}  // namespace dattn
