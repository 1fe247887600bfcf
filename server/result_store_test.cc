#include "server/result_store.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace server {
namespace {

using ::testing::HasSubstr;

std::string TestDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/result_store_test/", info->name());
  std::filesystem::remove_all(dir);
  return dir;
}

absl::Status Store(ResultStore* store, const std::string& job, int attempt, int rank,
                   const std::string& data, int64_t chunk) {
  absl::StatusOr<std::unique_ptr<ResultStore::ShardWriter>> w =
      store->BeginShard(job, attempt, rank, static_cast<int64_t>(data.size()));
  if (!w.ok()) return w.status();
  for (int64_t offset = 0; offset < static_cast<int64_t>(data.size()); offset += chunk) {
    if (absl::Status s = (*w)->Append(offset, data.substr(offset, chunk)); !s.ok()) return s;
  }
  return (*w)->Finish();
}

// Rank r's rows of every block go between the other ranks' rows of that block, in rank order; the
// stream never carries more than the chunk size.
TEST(ResultStoreTest, ReadsTheShardsBackInterleavedByBlock) {
  auto store = ResultStore::Open(TestDir());
  ASSERT_TRUE(store.ok()) << store.status();
  OutputLayout layout;
  layout.ranks = 3;
  layout.blocks = 2;
  layout.rank_block_bytes = 5;
  layout.header.set_dtype(v1::DTYPE_FP32);
  layout.header.set_total_bytes(30);
  std::vector<std::string> shards = {"aaaaaAAAAA", "bbbbbBBBBB", "cccccCCCCC"};
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(Store(store->get(), "j-1", 2, r, shards[r], 3).ok());
  std::string got;
  int chunks = 0;
  absl::Status s = (*store)->Read("j-1", 2, layout, 2, [&](const v1::TensorChunk& c) {
    if (chunks++ == 0) {
      EXPECT_TRUE(c.has_header());
      EXPECT_EQ(c.header().total_bytes(), 30);
    }
    EXPECT_EQ(c.offset(), static_cast<int64_t>(got.size()));
    EXPECT_LE(c.data().size(), 2u);
    got += c.data();
    return true;
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got, "aaaaabbbbbcccccAAAAABBBBBCCCCC");
  // Files are private.
  struct stat st {};
  ASSERT_EQ(::stat(((*store)->dir() + "/j-1/2/rank-0.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((*store)->dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(ResultStoreTest, UnfinishedOrMissingShardsAreNeverRead) {
  auto store = ResultStore::Open(TestDir());
  ASSERT_TRUE(store.ok());
  {
    auto w = (*store)->BeginShard("j-2", 1, 0, 10);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(0, "12345").ok());
    EXPECT_EQ((*w)->Append(7, "x").code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*w)->Append(5, "123456").code(), absl::StatusCode::kInvalidArgument);
    absl::Status short_shard = (*w)->Finish();
    EXPECT_EQ(short_shard.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(short_shard.message()), HasSubstr("after 5 of its 10 bytes"));
  }  // Dropped unfinished: nothing stays.
  EXPECT_FALSE((*store)->HasShard("j-2", 1, 0, 10));
  OutputLayout layout;
  layout.ranks = 1;
  layout.blocks = 1;
  layout.rank_block_bytes = 10;
  absl::Status s = (*store)->Read("j-2", 1, layout, 4, [](const v1::TensorChunk&) { return true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank-0.bin is missing"));
}

TEST(ResultStoreTest, DiscardKeepsOnlyTheNamedAttempt) {
  auto store = ResultStore::Open(TestDir());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(Store(store->get(), "j-3", 1, 0, "old", 8).ok());
  ASSERT_TRUE(Store(store->get(), "j-3", 2, 0, "new!", 8).ok());
  EXPECT_EQ((*store)->Discard("j-3", 2), 3);
  EXPECT_FALSE((*store)->HasShard("j-3", 1, 0, 3));
  EXPECT_TRUE((*store)->HasShard("j-3", 2, 0, 4));
  EXPECT_EQ((*store)->Jobs(), std::vector<std::string>({"j-3"}));
  EXPECT_EQ((*store)->Discard("j-3", -1), 4);
  EXPECT_TRUE((*store)->Jobs().empty());
  EXPECT_EQ((*store)->Discard("j-none", -1), 0);
}

}  // namespace
}  // namespace server
}  // namespace dattn
