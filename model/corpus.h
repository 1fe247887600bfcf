// A corpus: one long sequence of token ids that the sampler and the retrieval task cut windows
// from, built from text (byte-level tokens, vocabulary 256), from token files (model/token_file.h),
// or from tokens in memory.
//
// Byte-level text. A path is a text file or a folder. A folder is walked recursively in a fixed
// order: the entries of each folder sorted by their names' bytes (strcmp), depth first, so a
// sub-folder's files come at the sub-folder's place in its parent's order. Symbolic links are
// followed; a folder reached a second time (a link loop, or two links to one folder) and a file
// reached a second time are skipped, so a loop cannot recurse forever and no file counts twice.
// Every file becomes one document; documents are joined with the separator token 0 (the NUL byte)
// between consecutive documents (not after the last). NUL can never come from the text itself:
// a file holding a NUL byte is treated as binary and skipped. Skipped, each with its reason in
// the CorpusReport: binary-looking files (a NUL byte anywhere, or more than 10% control bytes
// other than \t \n \v \f \r \b and ESC in the first 4096 bytes), empty files, files or folders
// that cannot be opened, dangling links, FIFOs, sockets and devices, and (unless
// skip_hidden is false) names that start with '.' below the given path. A single file given as the
// path is never skipped: an error says why it cannot be used.
//
// Memory. Files of at least map_threshold_bytes are memory-mapped; smaller files are read with
// pread when a window needs them (mapping every file of a large source tree would run into the
// kernel's limit of about 65530 mappings per process). Nothing is copied into memory as a whole.
// Files must not change while a corpus uses them: a file that shrank is a DATA_LOSS error at Read
// (a mapped file that shrank raises SIGBUS, as with any mapping).
//
// Token files are joined in the order given, with no separator (the tokenizer's own end-of-text id
// separates documents); all must have the same vocabulary size.
//
// Threads: a TokenCorpus is immutable after it is built and cheap to copy (copies share the files);
// Read may be called from any number of threads at once.
#ifndef DATTN_MODEL_CORPUS_H_
#define DATTN_MODEL_CORPUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dattn {
namespace model {

// The separator between the documents of a byte-level corpus.
inline constexpr int32_t kByteDocumentSeparator = 0;
inline constexpr int32_t kByteVocabSize = 256;

struct TextCorpusOptions {
  bool skip_hidden = true;
  int64_t map_threshold_bytes = int64_t{1} << 20;
};

struct SkippedFile {
  std::string path;
  std::string reason;  // e.g. "binary: NUL byte at offset 812", "dangling symbolic link".
};

// What building a corpus from text found.
struct CorpusReport {
  int64_t files = 0;  // Documents used.
  int64_t bytes = 0;  // Their bytes (tokens, separators excluded).
  std::vector<SkippedFile> skipped;
  // One line per skipped entry, "path: reason", then a total line.
  std::string ToString() const;
};

struct CorpusDocument {
  std::string name;    // The file's path (as reached by the walk), or the name given.
  int64_t begin = 0;   // First token in the corpus.
  int64_t length = 0;  // Tokens of the document, separator excluded.
};

// A half-open range of token positions [begin, end).
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

class TokenCorpus {
 public:
  // Byte-level tokens from a text file or a folder (see above). `report` (optional) receives what
  // was used and skipped. NOT_FOUND for a path that does not exist; INVALID_ARGUMENT for a single
  // file that is binary-looking, empty, or not a regular file, or for a folder in which no usable
  // file was found (the message holds the first skipped entries and their reasons).
  static absl::StatusOr<TokenCorpus> FromText(const std::string& path,
                                              const TextCorpusOptions& options = {},
                                              CorpusReport* report = nullptr);

  // The token files joined in order. Errors from TokenFile::Open (each naming its file);
  // INVALID_ARGUMENT for no paths or differing vocabulary sizes (naming both files).
  static absl::StatusOr<TokenCorpus> FromTokenFiles(const std::vector<std::string>& paths,
                                                    bool verify_checksums = true);

  // Tokens held in memory, one document named `name`. INVALID_ARGUMENT for a vocab_size < 1 or
  // a token outside [0, vocab_size) (its index and value).
  static absl::StatusOr<TokenCorpus> FromTokens(std::vector<int32_t> tokens, int32_t vocab_size,
                                                const std::string& name = "memory");

  TokenCorpus() = default;

  int64_t size() const;  // Tokens, separators included.
  int32_t vocab_size() const;
  // The document separator, or -1 when documents follow each other without one.
  int32_t separator() const;
  const std::vector<CorpusDocument>& documents() const;

  // Copies tokens [begin, begin + out.size()) into `out`. OUT_OF_RANGE for a range outside [0,
  // size()); DATA_LOSS naming the file when a file is shorter than when the corpus was built;
  // file-system errors naming the file for a file that can no longer be opened.
  absl::Status Read(int64_t begin, absl::Span<int32_t> out) const;
  // Tokens [begin, begin + count) as bytes (each id must be < 256): for logs and tests.
  absl::StatusOr<std::string> ReadBytes(int64_t begin, int64_t count) const;

  struct Impl;

 private:
  explicit TokenCorpus(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// The held-out validation split: the last ceil(validation_fraction * size) tokens of the corpus
// are validation, everything before them is training. Contiguous, so no training window can
// overlap a validation window; for a folder corpus the validation tokens are the last files in the
// walk's order. validation_fraction = 0 gives an empty validation range.
struct DataSplit {
  TokenRange train;
  TokenRange validation;
};
// INVALID_ARGUMENT naming the values unless 0 <= validation_fraction < 1 and both parts (the
// validation part only when validation_fraction > 0) hold at least min_tokens tokens (a window is
// seq_len + 1 tokens, so pass that).
absl::StatusOr<DataSplit> SplitTrainValidation(int64_t corpus_size, double validation_fraction,
                                               int64_t min_tokens);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CORPUS_H_
