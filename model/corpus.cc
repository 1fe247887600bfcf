#include "model/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/file_io.h"
#include "model/token_file.h"

namespace dattn {
namespace model {

struct TokenCorpus::Impl {
  enum class Kind { kMapped8, kPread8, kTokenFile, kMemory };
  struct Source {
    Kind kind = Kind::kMemory;
    std::shared_ptr<const MappedFile> map;  // kMapped8
    std::string path;                       // kPread8
    int64_t bytes = 0;                      // kPread8: the size when the corpus was built
    TokenFile token_file;                   // kTokenFile
    std::vector<int32_t> memory;            // kMemory
  };
  int32_t vocab = 0;
  int32_t separator = -1;
  int64_t size = 0;
  std::vector<CorpusDocument> docs;
  std::vector<Source> sources;  // Parallel to docs.

  absl::Status ReadSource(size_t index, int64_t offset, absl::Span<int32_t> out) const;
};

namespace {

using Kind = TokenCorpus::Impl::Kind;

// Why bytes look binary, or "" when they look like text.
std::string BinaryReason(const uint8_t* p, int64_t n) {
  if (n > 0) {
    const void* nul = std::memchr(p, 0, static_cast<size_t>(n));
    if (nul != nullptr) {
      return absl::StrCat("binary: NUL byte at offset ", static_cast<const uint8_t*>(nul) - p);
    }
  }
  const int64_t m = std::min<int64_t>(n, 4096);
  int64_t control = 0;
  for (int64_t i = 0; i < m; ++i) {
    const uint8_t b = p[i];
    const bool allowed =
        b == '\t' || b == '\n' || b == '\v' || b == '\f' || b == '\r' || b == '\b' || b == 0x1b;
    if ((b < 0x20 && !allowed) || b == 0x7f) ++control;
  }
  if (control * 10 > m) {
    return absl::StrCat("binary: ", control, " of the first ", m, " bytes are control characters");
  }
  return "";
}

absl::Status PreadAll(int fd, const std::string& path, uint8_t* dst, int64_t size, int64_t offset) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, dst, static_cast<size_t>(size), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError("read", path, errno);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(
          path, ": shorter than when the corpus was built (no bytes at offset ", offset, ")"));
    }
    dst += n;
    size -= n;
    offset += n;
  }
  return absl::OkStatus();
}

// Reads a whole small file; the descriptor is closed before returning.
absl::Status ReadWhole(const std::string& path, int64_t size, std::vector<uint8_t>* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return FileError("open", path, errno);
  out->resize(static_cast<size_t>(size));
  absl::Status s = PreadAll(fd, path, out->data(), size, 0);
  ::close(fd);
  return s;
}

class Walker {
 public:
  Walker(const TextCorpusOptions& options, TokenCorpus::Impl* impl, CorpusReport* report)
      : options_(options), impl_(impl), report_(report) {}

  // Adds one regular file as a document, or records why not. `st` is its stat (links followed).
  // Returns the reason it was skipped ("" when added).
  std::string AddFile(const std::string& path, const struct stat& st) {
    const auto id = std::make_pair(st.st_dev, st.st_ino);
    auto seen = files_.find(id);
    if (seen != files_.end()) return absl::StrCat("the same file as ", seen->second);
    const int64_t size = static_cast<int64_t>(st.st_size);
    if (size == 0) return "empty";
    TokenCorpus::Impl::Source source;
    std::string reason;
    if (size >= options_.map_threshold_bytes) {
      absl::StatusOr<MappedFile> map = MappedFile::Open(path);
      if (!map.ok()) return absl::StrCat("cannot open: ", map.status().message());
      reason = BinaryReason(map->data(), map->size());
      source.kind = Kind::kMapped8;
      source.map = std::make_shared<const MappedFile>(std::move(*map));
    } else {
      std::vector<uint8_t> bytes;
      absl::Status s = ReadWhole(path, size, &bytes);
      if (!s.ok()) return absl::StrCat("cannot read: ", s.message());
      reason = BinaryReason(bytes.data(), size);
      source.kind = Kind::kPread8;
      source.path = path;
      source.bytes = size;
    }
    if (!reason.empty()) return reason;
    files_.emplace(id, path);
    if (!impl_->docs.empty()) impl_->size += 1;  // The separator before this document.
    impl_->docs.push_back(CorpusDocument{path, impl_->size, size});
    impl_->sources.push_back(std::move(source));
    impl_->size += size;
    report_->files += 1;
    report_->bytes += size;
    return "";
  }

  void WalkFolder(const std::string& path, const struct stat& st) {
    const auto id = std::make_pair(st.st_dev, st.st_ino);
    if (!folders_.insert(id).second) {
      Skip(path, "folder already visited (a symbolic link loop, or a second link to it)");
      return;
    }
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) {
      Skip(path, absl::StrCat("cannot open folder: ", strerror(errno)));
      return;
    }
    std::vector<std::string> names;
    while (struct dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      names.push_back(name);
    }
    ::closedir(dir);
    std::sort(names.begin(), names.end());  // std::string's < compares bytes, as strcmp does.
    for (const std::string& name : names) {
      const std::string child = JoinPath(path, name);
      if (options_.skip_hidden && name[0] == '.') {
        Skip(child, "hidden (skip_hidden)");
        continue;
      }
      struct stat cst;
      if (::stat(child.c_str(), &cst) != 0) {
        const int err = errno;
        struct stat lst;
        if (err == ENOENT && ::lstat(child.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
          Skip(child, "dangling symbolic link");
        } else if (err == ELOOP) {
          Skip(child, "symbolic link loop");
        } else {
          Skip(child, absl::StrCat("cannot stat: ", strerror(err)));
        }
        continue;
      }
      if (S_ISDIR(cst.st_mode)) {
        WalkFolder(child, cst);
      } else if (S_ISREG(cst.st_mode)) {
        const std::string reason = AddFile(child, cst);
        if (!reason.empty()) Skip(child, reason);
      } else {
        Skip(child, "not a regular file (FIFO, socket or device)");
      }
    }
  }

  void Skip(const std::string& path, std::string reason) {
    report_->skipped.push_back(SkippedFile{path, std::move(reason)});
  }

 private:
  const TextCorpusOptions& options_;
  TokenCorpus::Impl* impl_;
  CorpusReport* report_;
  std::set<std::pair<dev_t, ino_t>> folders_;
  std::map<std::pair<dev_t, ino_t>, std::string> files_;
};

}  // namespace

std::string CorpusReport::ToString() const {
  std::string text;
  for (const SkippedFile& s : skipped) absl::StrAppend(&text, s.path, ": ", s.reason, "\n");
  absl::StrAppend(&text, files, " files used (", bytes, " bytes), ", skipped.size(), " skipped");
  return text;
}

absl::StatusOr<TokenCorpus> TokenCorpus::FromText(const std::string& path,
                                                  const TextCorpusOptions& options,
                                                  CorpusReport* report) {
  CorpusReport local;
  CorpusReport* r = report != nullptr ? report : &local;
  *r = CorpusReport();
  auto impl = std::make_shared<Impl>();
  impl->vocab = kByteVocabSize;
  impl->separator = kByteDocumentSeparator;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return FileError("stat", path, errno);
  Walker walker(options, impl.get(), r);
  if (S_ISREG(st.st_mode)) {
    const std::string reason = walker.AddFile(path, st);
    if (!reason.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": cannot be used as text: ", reason));
    }
  } else if (S_ISDIR(st.st_mode)) {
    walker.WalkFolder(path, st);
    if (impl->docs.empty()) {
      std::string first;
      for (size_t i = 0; i < r->skipped.size() && i < 5; ++i) {
        absl::StrAppend(&first, "; ", r->skipped[i].path, ": ", r->skipped[i].reason);
      }
      return absl::InvalidArgumentError(absl::StrCat("no usable text file under ", path, " (",
                                                     r->skipped.size(), " skipped", first, ")"));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file or a folder (FIFO, socket or device)"));
  }
  return TokenCorpus(std::move(impl));
}

absl::StatusOr<TokenCorpus> TokenCorpus::FromTokenFiles(const std::vector<std::string>& paths,
                                                        bool verify_checksums) {
  if (paths.empty()) return absl::InvalidArgumentError("token corpus: no token files given");
  auto impl = std::make_shared<Impl>();
  for (const std::string& path : paths) {
    absl::StatusOr<TokenFile> file = TokenFile::Open(path, verify_checksums);
    if (!file.ok()) return file.status();
    if (impl->docs.empty()) {
      impl->vocab = file->vocab_size();
    } else if (file->vocab_size() != impl->vocab) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": vocab_size ", file->vocab_size(),
                                                     " differs from ", impl->docs[0].name, "'s ",
                                                     impl->vocab));
    }
    impl->docs.push_back(CorpusDocument{path, impl->size, file->size()});
    impl->size += file->size();
    Impl::Source source;
    source.kind = Kind::kTokenFile;
    source.token_file = std::move(*file);
    impl->sources.push_back(std::move(source));
  }
  return TokenCorpus(std::move(impl));
}

absl::StatusOr<TokenCorpus> TokenCorpus::FromTokens(std::vector<int32_t> tokens, int32_t vocab_size,
                                                    const std::string& name) {
  if (vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size = ", vocab_size, ": need >= 1"));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": token ", i, " is ", tokens[i], ", need 0..", vocab_size - 1));
    }
  }
  auto impl = std::make_shared<Impl>();
  impl->vocab = vocab_size;
  impl->size = static_cast<int64_t>(tokens.size());
  impl->docs.push_back(CorpusDocument{name, 0, impl->size});
  Impl::Source source;
  source.kind = Kind::kMemory;
  source.memory = std::move(tokens);
  impl->sources.push_back(std::move(source));
  return TokenCorpus(std::move(impl));
}

int64_t TokenCorpus::size() const { return impl_ ? impl_->size : 0; }
int32_t TokenCorpus::vocab_size() const { return impl_ ? impl_->vocab : 0; }
int32_t TokenCorpus::separator() const { return impl_ ? impl_->separator : -1; }

const std::vector<CorpusDocument>& TokenCorpus::documents() const {
  static const std::vector<CorpusDocument> kNone;
  return impl_ ? impl_->docs : kNone;
}

absl::Status TokenCorpus::Impl::ReadSource(size_t index, int64_t offset,
                                           absl::Span<int32_t> out) const {
  const Source& s = sources[index];
  const int64_t n = static_cast<int64_t>(out.size());
  switch (s.kind) {
    case Kind::kMapped8: {
      const uint8_t* p = s.map->data() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return absl::OkStatus();
    }
    case Kind::kPread8: {
      const int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0) return FileError("open", s.path, errno);
      std::vector<uint8_t> bytes(static_cast<size_t>(n));
      absl::Status st = PreadAll(fd, s.path, bytes.data(), n, offset);
      ::close(fd);
      if (!st.ok()) return st;
      for (int64_t i = 0; i < n; ++i) out[i] = bytes[i];
      return absl::OkStatus();
    }
    case Kind::kTokenFile:
      return s.token_file.Read(offset, out);
    case Kind::kMemory:
      std::copy(s.memory.begin() + offset, s.memory.begin() + offset + n, out.begin());
      return absl::OkStatus();
  }
  return absl::InternalError("corpus: unknown source kind");
}

absl::Status TokenCorpus::Read(int64_t begin, absl::Span<int32_t> out) const {
  const int64_t n = static_cast<int64_t>(out.size());
  const int64_t total = size();
  if (begin < 0 || begin > total || n > total - begin) {
    return absl::OutOfRangeError(
        absl::StrCat("corpus tokens [", begin, ", ", begin + n, ") are outside [0, ", total, ")"));
  }
  if (n == 0) return absl::OkStatus();
  const std::vector<CorpusDocument>& docs = impl_->docs;
  size_t i = static_cast<size_t>(
      std::upper_bound(docs.begin(), docs.end(), begin,
                       [](int64_t pos, const CorpusDocument& d) { return pos < d.begin; }) -
      docs.begin() - 1);
  int64_t pos = begin;
  int64_t k = 0;
  while (k < n) {
    const CorpusDocument& doc = docs[i];
    const int64_t end = doc.begin + doc.length;
    if (pos < end) {
      const int64_t take = std::min(n - k, end - pos);
      if (absl::Status s = impl_->ReadSource(i, pos - doc.begin, out.subspan(k, take)); !s.ok()) {
        return s;
      }
      k += take;
      pos += take;
    } else {
      if (impl_->separator >= 0) {
        out[k++] = impl_->separator;
        ++pos;
      }
      ++i;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TokenCorpus::ReadBytes(int64_t begin, int64_t count) const {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("count = ", count));
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  if (absl::Status s = Read(begin, absl::MakeSpan(tokens)); !s.ok()) return s;
  std::string text(static_cast<size_t>(count), '\0');
  for (int64_t i = 0; i < count; ++i) {
    if (tokens[i] > 255) {
      return absl::FailedPreconditionError(
          absl::StrCat("token ", begin + i, " is ", tokens[i], ", not a byte"));
    }
    text[i] = static_cast<char>(tokens[i]);
  }
  return text;
}

absl::StatusOr<DataSplit> SplitTrainValidation(int64_t corpus_size, double validation_fraction,
                                               int64_t min_tokens) {
  if (!(validation_fraction >= 0 && validation_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("validation_fraction = ", validation_fraction, ": need 0 <= fraction < 1"));
  }
  if (corpus_size < 0 || min_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("corpus size ", corpus_size, ", min_tokens ", min_tokens));
  }
  const int64_t validation =
      static_cast<int64_t>(std::ceil(validation_fraction * static_cast<double>(corpus_size)));
  DataSplit split;
  split.train = TokenRange{0, corpus_size - validation};
  split.validation = TokenRange{corpus_size - validation, corpus_size};
  if (split.train.size() < min_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training split has ", split.train.size(), " tokens (corpus ", corpus_size,
        ", validation_fraction ", validation_fraction, "), fewer than one window of ", min_tokens));
  }
  if (validation_fraction > 0 && split.validation.size() < min_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the validation split has ", split.validation.size(), " tokens (corpus ", corpus_size,
        ", validation_fraction ", validation_fraction, "), fewer than one window of ", min_tokens,
        ": raise the fraction or use a larger corpus"));
  }
  return split;
}

}  // namespace model
}  // namespace dattn
