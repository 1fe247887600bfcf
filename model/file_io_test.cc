#include "model/file_io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace dattn {
namespace model {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

TEST(FileIoTest, Sha256KnownDigests) {
  // FIPS 180-2 examples.
  EXPECT_EQ(*Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(*Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 pieces;
  pieces.Update("a", 1);
  pieces.Update("bc", 2);
  EXPECT_EQ(HexDigest(*pieces.Finish()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(FileIoTest, WriteMapAndHash) {
  const std::string path = JoinPath(TempDir(), "file_io_test.bin");
  absl::StatusOr<OutputFile> out = OutputFile::Create(path);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->Append("xxxx").ok());
  // A large append bypasses the buffer; order is kept.
  std::string big(3 << 20, 'b');
  ASSERT_TRUE(out->Append(big).ok());
  ASSERT_TRUE(out->Append("tail").ok());
  ASSERT_TRUE(out->WriteAt(0, "head", 4).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(out->WriteAt(out->size(), "x", 1)));
  ASSERT_TRUE(out->Close(true).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(out->Close(true)));

  absl::StatusOr<MappedFile> mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const std::string expected = "head" + big + "tail";
  ASSERT_EQ(mapped->size(), static_cast<int64_t>(expected.size()));
  EXPECT_EQ(mapped->bytes(), expected);
  EXPECT_EQ(*Sha256FileHex(path), *Sha256Hex(expected));
  MappedFile moved = std::move(*mapped);
  EXPECT_EQ(moved.size(), static_cast<int64_t>(expected.size()));
}

TEST(FileIoTest, ErrorsNameThePath) {
  absl::Status missing = MappedFile::Open("/nonexistent/dattn/file").status();
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
  EXPECT_NE(missing.message().find("/nonexistent/dattn/file"), std::string::npos);
  absl::Status dir = MappedFile::Open(TempDir()).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(dir)) << dir;
  const std::string fifo = JoinPath(TempDir(), "file_io_test.fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(MappedFile::Open(fifo).status()));  // And no hang.

  const std::string empty = JoinPath(TempDir(), "file_io_test.empty");
  ASSERT_TRUE(WriteWholeFile(empty, "", false).ok());
  absl::StatusOr<MappedFile> e = MappedFile::Open(empty);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->size(), 0);
  const std::string small = JoinPath(TempDir(), "file_io_test.small");
  ASSERT_TRUE(WriteWholeFile(small, "0123456789", true).ok());
  EXPECT_EQ(*ReadSmallFile(small, 10), "0123456789");
  EXPECT_TRUE(absl::IsFailedPrecondition(ReadSmallFile(small, 9).status()));
  EXPECT_TRUE(FsyncPath(TempDir()).ok());
}

TEST(FileIoTest, Paths) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(ParentDir("a/b/c"), "a/b");
  EXPECT_EQ(ParentDir("a/b/"), "a");
  EXPECT_EQ(ParentDir("c"), ".");
  EXPECT_EQ(ParentDir("/c"), "/");
}

}  // namespace
}  // namespace model
}  // namespace dattn
