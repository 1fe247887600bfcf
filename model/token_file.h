// Token files: a corpus already tokenized by the user's own tokenizer, as uint16 token ids.
//
// Layout (all integers little-endian; docs/TRAINING_DATA.md has the same table and a Python
// writer):
//
//   offset  bytes  field
//   0       8      magic, the ASCII bytes "DATTNTOK"
//   8       4      version, uint32 = 1
//   12      4      header_bytes, uint32 = 64 (where the tokens start)
//   16      4      vocab_size, uint32, 1..65536: every token id is < vocab_size
//   20      4      token_bytes, uint32 = 2 (uint16 ids)
//   24      8      token_count, uint64
//   32      32     SHA-256 of the token bytes (bytes 64 .. end of file)
//   64      2*n    the tokens, uint16 each
//
// The file holds one stream of tokens; separating documents is the tokenizer's business (an
// end-of-text id between them, as GPT-2's tokenizer does). Several token files can be joined into
// one corpus (model/corpus.h).
//
// Errors from Open, each naming the file:
//   INVALID_ARGUMENT  not a token file (the magic differs: the first bytes are shown), or a
//                     version, header size, token width or vocabulary this reader does not know.
//   DATA_LOSS         shorter than its header; fewer or more token bytes than token_count says
//                     (truncated or appended to); a checksum that does not match; a token id >=
//                     vocab_size (the first one's index and value).
//   others            from the file system (NOT_FOUND, PERMISSION_DENIED, ...).
//
// Threads: an open TokenFile is read-only; any number of threads may read it. A TokenFileWriter is
// used by one thread.
#ifndef DATTN_MODEL_TOKEN_FILE_H_
#define DATTN_MODEL_TOKEN_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/file_io.h"

namespace dattn {
namespace model {

inline constexpr char kTokenFileMagic[8] = {'D', 'A', 'T', 'T', 'N', 'T', 'O', 'K'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderBytes = 64;
inline constexpr int64_t kMaxTokenFileVocab = 65536;

// A token file, memory-mapped (the tokens are never copied into memory as a whole).
class TokenFile {
 public:
  // Opens and checks `path`: the header, the size, and (when `verify`) the checksum and that every
  // token is < vocab_size, which reads the whole file once (about 1 s per GB from the page cache).
  static absl::StatusOr<TokenFile> Open(const std::string& path, bool verify = true);

  const std::string& path() const { return map_->path(); }
  int32_t vocab_size() const { return vocab_size_; }
  int64_t size() const { return token_count_; }  // Tokens.
  const std::string& sha256_hex() const { return sha256_hex_; }
  // Token i (0 <= i < size(); not checked).
  uint16_t at(int64_t i) const;
  // Copies tokens [begin, begin + out.size()) widened to int32; the range must be inside the file
  // (checked: OUT_OF_RANGE).
  absl::Status Read(int64_t begin, absl::Span<int32_t> out) const;

 private:
  std::shared_ptr<const MappedFile> map_;
  int32_t vocab_size_ = 0;
  int64_t token_count_ = 0;
  std::string sha256_hex_;
};

// Writes a token file in pieces without holding it in memory: the header is filled in by Finish.
// The file is written under "<path>.tmp" and renamed to `path` by Finish (after an fsync of the
// file and followed by one of its folder), so `path` is either absent or complete.
class TokenFileWriter {
 public:
  // INVALID_ARGUMENT for a vocab_size outside 1..65536; file-system errors for the temporary.
  static absl::StatusOr<TokenFileWriter> Create(const std::string& path, int32_t vocab_size);

  // INVALID_ARGUMENT naming the first id outside [0, vocab_size) and its index in the file;
  // nothing of that call is written then.
  absl::Status Append(absl::Span<const int32_t> tokens);
  absl::Status Append(absl::Span<const uint16_t> tokens);
  int64_t size() const { return count_; }
  // Writes the header, fsyncs, renames. The writer is spent afterwards.
  absl::Status Finish();

  // A writer destroyed before Finish removes its temporary file.
  ~TokenFileWriter();
  TokenFileWriter(TokenFileWriter&&) = default;
  TokenFileWriter& operator=(TokenFileWriter&&) = default;

 private:
  TokenFileWriter() = default;
  std::string path_;
  std::string temp_path_;
  int32_t vocab_size_ = 0;
  int64_t count_ = 0;
  std::unique_ptr<OutputFile> out_;
  std::unique_ptr<Sha256> sha_;
};

// The whole file at once.
absl::Status WriteTokenFile(const std::string& path, absl::Span<const int32_t> tokens,
                            int32_t vocab_size);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TOKEN_FILE_H_
