#include "model/token_file.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/file_io.h"

namespace dattn {
namespace model {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return JoinPath(dir != nullptr ? dir : "/tmp", name);
}

std::string ReadAll(const std::string& path) { return *ReadSmallFile(path, 1 << 30); }

void Expect(const absl::Status& s, absl::StatusCode code, const std::string& path,
            const std::string& words) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find(words), std::string::npos) << s;
}

TEST(TokenFileTest, WriteThenReadBack) {
  const std::string path = TempPath("roundtrip.tok");
  std::vector<int32_t> tokens;
  for (int i = 0; i < 1000; ++i) tokens.push_back((i * 7919) % 50257);
  ASSERT_TRUE(WriteTokenFile(path, tokens, 50257).ok());
  absl::StatusOr<TokenFile> file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->vocab_size(), 50257);
  EXPECT_EQ(file->size(), 1000);
  std::vector<int32_t> back(1000);
  ASSERT_TRUE(file->Read(0, absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, tokens);
  std::vector<int32_t> some(3);
  ASSERT_TRUE(file->Read(997, absl::MakeSpan(some)).ok());
  EXPECT_EQ(some, std::vector<int32_t>(tokens.end() - 3, tokens.end()));
  EXPECT_TRUE(absl::IsOutOfRange(file->Read(998, absl::MakeSpan(some))));

  // The header's bytes, as documented.
  const std::string bytes = ReadAll(path);
  ASSERT_EQ(bytes.size(), 64u + 2000u);
  EXPECT_EQ(bytes.substr(0, 8), "DATTNTOK");
  uint32_t fields[4];
  std::memcpy(fields, bytes.data() + 8, 16);
  EXPECT_EQ(fields[0], 1u);
  EXPECT_EQ(fields[1], 64u);
  EXPECT_EQ(fields[2], 50257u);
  EXPECT_EQ(fields[3], 2u);
  uint64_t count;
  std::memcpy(&count, bytes.data() + 24, 8);
  EXPECT_EQ(count, 1000u);
  EXPECT_EQ(file->sha256_hex(), *Sha256Hex(absl::string_view(bytes).substr(64)));
}

TEST(TokenFileTest, StreamingWriterAndEmptyFile) {
  const std::string path = TempPath("stream.tok");
  absl::StatusOr<TokenFileWriter> w = TokenFileWriter::Create(path, 300);
  ASSERT_TRUE(w.ok());
  const std::vector<uint16_t> a = {1, 2, 299};
  const std::vector<int32_t> b = {0, 5};
  ASSERT_TRUE(w->Append(absl::MakeConstSpan(a)).ok());
  absl::Status bad = w->Append(std::vector<int32_t>{4, 300});
  Expect(bad, absl::StatusCode::kInvalidArgument, path, "token 4 is 300");
  ASSERT_TRUE(w->Append(absl::MakeConstSpan(b)).ok());
  ASSERT_TRUE(w->Finish().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(w->Finish()));
  absl::StatusOr<TokenFile> file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), 5);
  EXPECT_EQ(file->at(2), 299);
  EXPECT_EQ(file->at(4), 5);
  // The temporary is gone.
  EXPECT_TRUE(absl::IsNotFound(MappedFile::Open(path + ".tmp").status()));

  const std::string empty = TempPath("empty.tok");
  ASSERT_TRUE(WriteTokenFile(empty, {}, 10).ok());
  absl::StatusOr<TokenFile> e = TokenFile::Open(empty);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->size(), 0);

  EXPECT_TRUE(absl::IsInvalidArgument(TokenFileWriter::Create(path, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TokenFileWriter::Create(path, 65537).status()));
  {
    absl::StatusOr<TokenFileWriter> abandoned = TokenFileWriter::Create(TempPath("gone.tok"), 9);
    ASSERT_TRUE(abandoned.ok());
  }
  EXPECT_TRUE(absl::IsNotFound(MappedFile::Open(TempPath("gone.tok.tmp")).status()));
}

// Each way a token file can be wrong is refused with the file's name and what is wrong.
TEST(TokenFileTest, BadFilesAreClearErrors) {
  const std::string good = TempPath("good.tok");
  ASSERT_TRUE(WriteTokenFile(good, {1, 2, 3, 4}, 8).ok());
  const std::string bytes = ReadAll(good);
  const std::string path = TempPath("bad.tok");
  auto write = [&](const std::string& content) {
    ASSERT_TRUE(WriteWholeFile(path, content, false).ok());
  };

  std::string b = bytes;
  b[0] = 'X';
  write(b);
  Expect(TokenFile::Open(path).status(), absl::StatusCode::kInvalidArgument, path,
         "not a dattn token file");
  write("hello world, a text file");
  Expect(TokenFile::Open(path).status(), absl::StatusCode::kInvalidArgument, path,
         "not a dattn token file");

  b = bytes;
  b[8] = 2;
  write(b);
  Expect(TokenFile::Open(path).status(), absl::StatusCode::kInvalidArgument, path, "version 2");

  b = bytes;
  b[20] = 4;
  write(b);
  Expect(TokenFile::Open(path).status(), absl::StatusCode::kInvalidArgument, path,
         "token_bytes = 4");

  b = bytes;
  std::memset(&b[16], 0, 4);
  write(b);
  Expect(TokenFile::Open(path).status(), absl::StatusCode::kInvalidArgument, path,
         "vocab_size = 0");

  write(bytes.substr(0, 40));
  Expect(TokenFile::Open(path).status(), absl::StatusCode::kDataLoss, path, "truncated: 40 bytes");

  write(bytes.substr(0, bytes.size() - 1));
  Expect(TokenFile::Open(path).status(), absl::StatusCode::kDataLoss, path,
         "truncated: the header says 4 tokens");

  write(bytes + "xx");
  Expect(TokenFile::Open(path).status(), absl::StatusCode::kDataLoss, path, "size mismatch");

  b = bytes;
  b[64 + 2] ^= 0x01;  // Token 1: 2 -> 3; still < vocab, but the checksum catches it.
  write(b);
  Expect(TokenFile::Open(path).status(), absl::StatusCode::kDataLoss, path, "checksum mismatch");
  EXPECT_TRUE(TokenFile::Open(path, /*verify=*/false).ok());

  // A token >= vocab with a matching checksum (a writer that ignored the vocabulary).
  b = bytes;
  b[64 + 4] = 9;
  const std::string digest_hex = *Sha256Hex(absl::string_view(b).substr(64));
  for (int i = 0; i < 32; ++i) {
    b[32 + i] = static_cast<char>(std::stoi(digest_hex.substr(2 * i, 2), nullptr, 16));
  }
  write(b);
  Expect(TokenFile::Open(path).status(), absl::StatusCode::kDataLoss, path,
         "token 2 is 9, not below vocab_size 8");

  EXPECT_TRUE(absl::IsNotFound(TokenFile::Open(TempPath("missing.tok")).status()));
}

}  // namespace
}  // namespace model
}  // namespace dattn
