#include "model/corpus.h"

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/file_io.h"
#include "model/token_file.h"

namespace dattn {
namespace model {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return JoinPath(dir != nullptr ? dir : "/tmp", name);
}

void Write(const std::string& path, const std::string& content) {
  ASSERT_TRUE(WriteWholeFile(path, content, false).ok()) << path;
}

void MakeDir(const std::string& path) { ASSERT_EQ(::mkdir(path.c_str(), 0755), 0) << path; }

std::string All(const TokenCorpus& corpus) { return *corpus.ReadBytes(0, corpus.size()); }

// A tree with everything the walk must handle: sorted order across levels, a symbolic link loop,
// a second link to a file, a dangling link, a binary file, an empty file, a hidden file, a FIFO.
std::string MakeTree(const std::string& name) {
  const std::string root = TempPath(name);
  MakeDir(root);
  MakeDir(root + "/b");
  MakeDir(root + "/b/inner");
  Write(root + "/a.txt", "alpha");
  Write(root + "/b/x.txt", "bx");
  Write(root + "/b/inner/deep.txt", "deep");
  Write(root + "/c.txt", "gamma\n");
  Write(root + "/Z.txt", "upper");  // 'Z' < 'a' in byte order.
  Write(root + "/binary.bin", std::string("ab\0cd", 5));
  Write(root + "/control.dat", std::string(100, '\x01') + "text");
  Write(root + "/empty.txt", "");
  Write(root + "/.hidden", "secret");
  EXPECT_EQ(::symlink("..", (root + "/b/inner/up").c_str()), 0);       // A loop.
  EXPECT_EQ(::symlink("a.txt", (root + "/d-link.txt").c_str()), 0);    // The same file twice.
  EXPECT_EQ(::symlink("nowhere", (root + "/e-dangling").c_str()), 0);  // Dangling.
  EXPECT_EQ(::mkfifo((root + "/f.fifo").c_str(), 0600), 0);
  return root;
}

std::string ReasonFor(const CorpusReport& report, const std::string& path) {
  for (const SkippedFile& s : report.skipped) {
    if (s.path == path) return s.reason;
  }
  return "(not skipped)";
}

TEST(CorpusTest, FolderWalkIsSortedRecursiveAndLoopSafe) {
  for (int64_t threshold : {int64_t{0}, int64_t{1} << 20}) {  // All mapped; all read on demand.
    const std::string root = MakeTree(threshold == 0 ? "tree_mapped" : "tree_pread");
    TextCorpusOptions options;
    options.map_threshold_bytes = threshold;
    CorpusReport report;
    absl::StatusOr<TokenCorpus> corpus = TokenCorpus::FromText(root, options, &report);
    ASSERT_TRUE(corpus.ok()) << corpus.status();
    EXPECT_EQ(corpus->vocab_size(), 256);
    EXPECT_EQ(corpus->separator(), 0);
    // Z.txt, a.txt, b/inner/deep.txt, b/x.txt, c.txt, joined by NUL.
    EXPECT_EQ(All(*corpus), std::string("upper\0alpha\0deep\0bx\0gamma\n", 26));
    ASSERT_EQ(corpus->documents().size(), 5u);
    EXPECT_EQ(corpus->documents()[2].name, root + "/b/inner/deep.txt");
    EXPECT_EQ(corpus->documents()[2].begin, 12);
    EXPECT_EQ(corpus->documents()[2].length, 4);
    EXPECT_EQ(report.files, 5);
    EXPECT_EQ(report.bytes, 5 + 5 + 4 + 2 + 6);

    EXPECT_EQ(ReasonFor(report, root + "/binary.bin"), "binary: NUL byte at offset 2");
    EXPECT_NE(ReasonFor(report, root + "/control.dat").find("control characters"),
              std::string::npos);
    EXPECT_EQ(ReasonFor(report, root + "/empty.txt"), "empty");
    EXPECT_EQ(ReasonFor(report, root + "/.hidden"), "hidden (skip_hidden)");
    EXPECT_NE(ReasonFor(report, root + "/b/inner/up").find("already visited"), std::string::npos);
    EXPECT_EQ(ReasonFor(report, root + "/d-link.txt"), "the same file as " + root + "/a.txt");
    EXPECT_EQ(ReasonFor(report, root + "/e-dangling"), "dangling symbolic link");
    EXPECT_NE(ReasonFor(report, root + "/f.fifo").find("not a regular file"), std::string::npos);
    EXPECT_NE(report.ToString().find("5 files used"), std::string::npos);

    // Reads across documents and separators, from any position.
    std::vector<int32_t> window(7);
    ASSERT_TRUE(corpus->Read(3, absl::MakeSpan(window)).ok());
    EXPECT_EQ(window, (std::vector<int32_t>{'e', 'r', 0, 'a', 'l', 'p', 'h'}));
    EXPECT_TRUE(absl::IsOutOfRange(corpus->Read(20, absl::MakeSpan(window))));
  }
}

TEST(CorpusTest, HiddenFilesCanBeIncluded) {
  const std::string root = TempPath("hidden_tree");
  MakeDir(root);
  Write(root + "/.h", "H");
  Write(root + "/v", "V");
  TextCorpusOptions options;
  options.skip_hidden = false;
  absl::StatusOr<TokenCorpus> corpus = TokenCorpus::FromText(root, options);
  ASSERT_TRUE(corpus.ok());
  EXPECT_EQ(All(*corpus), std::string("H\0V", 3));
}

TEST(CorpusTest, SingleFilesAndBadPaths) {
  const std::string file = TempPath("one.txt");
  Write(file, "Hello, world.\n");
  absl::StatusOr<TokenCorpus> corpus = TokenCorpus::FromText(file);
  ASSERT_TRUE(corpus.ok());
  EXPECT_EQ(All(*corpus), "Hello, world.\n");  // One document: no separator.

  const std::string bin = TempPath("one.bin");
  Write(bin, std::string("\x7f"
                         "ELF\0\0",
                         6));
  absl::Status s = TokenCorpus::FromText(bin).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find(bin), std::string::npos) << s;
  EXPECT_NE(s.message().find("NUL byte at offset 4"), std::string::npos) << s;

  s = TokenCorpus::FromText(TempPath("does-not-exist")).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_NE(s.message().find("does-not-exist"), std::string::npos);

  const std::string empty_dir = TempPath("no_text");
  MakeDir(empty_dir);
  Write(empty_dir + "/x.bin", std::string(3, '\0'));
  s = TokenCorpus::FromText(empty_dir).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("no usable text file"), std::string::npos) << s;
  EXPECT_NE(s.message().find("x.bin: binary"), std::string::npos) << s;
}

TEST(CorpusTest, ShrunkFileIsDataLoss) {
  const std::string root = TempPath("shrink");
  MakeDir(root);
  Write(root + "/a", "0123456789");
  Write(root + "/b", "abcdefghij");
  absl::StatusOr<TokenCorpus> corpus = TokenCorpus::FromText(root);  // Small: read on demand.
  ASSERT_TRUE(corpus.ok());
  Write(root + "/b", "abc");
  std::vector<int32_t> out(10);
  absl::Status s = corpus->Read(11, absl::MakeSpan(out));
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find(root + "/b"), std::string::npos) << s;
}

TEST(CorpusTest, TokenFilesJoinWithoutSeparator) {
  const std::string a = TempPath("a.tok"), b = TempPath("b.tok"), c = TempPath("c.tok");
  ASSERT_TRUE(WriteTokenFile(a, {1, 2, 3}, 1000).ok());
  ASSERT_TRUE(WriteTokenFile(b, {999, 0}, 1000).ok());
  ASSERT_TRUE(WriteTokenFile(c, {1}, 500).ok());
  absl::StatusOr<TokenCorpus> corpus = TokenCorpus::FromTokenFiles({a, b});
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ(corpus->size(), 5);
  EXPECT_EQ(corpus->separator(), -1);
  EXPECT_EQ(corpus->vocab_size(), 1000);
  std::vector<int32_t> all(5);
  ASSERT_TRUE(corpus->Read(0, absl::MakeSpan(all)).ok());
  EXPECT_EQ(all, (std::vector<int32_t>{1, 2, 3, 999, 0}));
  absl::Status s = TokenCorpus::FromTokenFiles({a, c}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find(c), std::string::npos) << s;
  EXPECT_NE(s.message().find(a), std::string::npos) << s;
  EXPECT_TRUE(absl::IsInvalidArgument(TokenCorpus::FromTokenFiles({}).status()));
}

TEST(CorpusTest, InMemoryTokens) {
  absl::StatusOr<TokenCorpus> corpus = TokenCorpus::FromTokens({4, 5, 6}, 7);
  ASSERT_TRUE(corpus.ok());
  EXPECT_EQ(corpus->size(), 3);
  absl::Status s = TokenCorpus::FromTokens({4, 7}, 7).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("token 1 is 7"), std::string::npos) << s;
}

TEST(CorpusTest, SplitIsTheContiguousTail) {
  absl::StatusOr<DataSplit> split = SplitTrainValidation(1000, 0.1, 65);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->train.begin, 0);
  EXPECT_EQ(split->train.end, 900);
  EXPECT_EQ(split->validation.begin, 900);
  EXPECT_EQ(split->validation.end, 1000);
  split = SplitTrainValidation(1001, 0.1, 65);  // ceil(100.1) = 101.
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->validation.size(), 101);
  split = SplitTrainValidation(1000, 0.0, 65);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->validation.size(), 0);
  EXPECT_EQ(split->train.size(), 1000);

  absl::Status s = SplitTrainValidation(1000, 0.05, 65).status();  // 50 validation tokens.
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("validation split has 50 tokens"), std::string::npos) << s;
  EXPECT_TRUE(absl::IsInvalidArgument(SplitTrainValidation(1000, 1.0, 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(SplitTrainValidation(100, 0.5, 65).status()));
}

}  // namespace
}  // namespace model
}  // namespace dattn
