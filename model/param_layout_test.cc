#include "model/param_layout.h"

#include "gtest/gtest.h"

namespace dattn {
namespace model {
namespace {

TEST(ParamLayoutTest, EntriesFollowEachOther) {
  ParamLayout layout;
  ASSERT_TRUE(layout.Add("a", {2, 3}).ok());
  ASSERT_TRUE(layout.Add("b", {5}).ok());
  ASSERT_EQ(layout.entries().size(), 2u);
  EXPECT_EQ(layout.entries()[0].offset, 0);
  EXPECT_EQ(layout.entries()[0].numel, 6);
  EXPECT_EQ(layout.entries()[1].offset, 6);
  EXPECT_EQ(layout.entries()[1].numel, 5);
  EXPECT_EQ(layout.total(), 11);
  absl::StatusOr<const ParamEntry*> b = layout.Find("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->offset, 6);
  EXPECT_TRUE(absl::IsNotFound(layout.Find("c").status()));
}

TEST(ParamLayoutTest, BadEntriesAreRefusedByName) {
  ParamLayout layout;
  ASSERT_TRUE(layout.Add("w", {4}).ok());
  absl::Status dup = layout.Add("w", {4});
  EXPECT_TRUE(absl::IsInvalidArgument(dup));
  EXPECT_NE(dup.message().find("\"w\""), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(layout.Add("", {1})));
  EXPECT_TRUE(absl::IsInvalidArgument(layout.Add("e", {})));
  absl::Status zero = layout.Add("z", {3, 0});
  EXPECT_TRUE(absl::IsInvalidArgument(zero));
  EXPECT_NE(zero.message().find("[3, 0]"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(layout.Add("big", {int64_t{1} << 40, int64_t{1} << 40})));
  EXPECT_EQ(layout.total(), 4);  // Nothing refused was added.
}

}  // namespace
}  // namespace model
}  // namespace dattn
