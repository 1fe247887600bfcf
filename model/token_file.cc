#include "model/token_file.h"

#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace dattn {
namespace model {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian");

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path, bool verify) {
  absl::StatusOr<MappedFile> map = MappedFile::Open(path);
  if (!map.ok()) return map.status();
  const uint8_t* p = map->data();
  const int64_t file_bytes = map->size();
  if (file_bytes < kTokenFileHeaderBytes) {
    if (file_bytes >= 8 && std::memcmp(p, kTokenFileMagic, 8) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a dattn token file (starts with \"",
                       absl::CHexEscape(absl::string_view(reinterpret_cast<const char*>(p), 8)),
                       "\", expected \"DATTNTOK\")"));
    }
    return absl::DataLossError(absl::StrCat(path, ": truncated: ", file_bytes,
                                            " bytes, shorter than the ", kTokenFileHeaderBytes,
                                            "-byte header"));
  }
  if (std::memcmp(p, kTokenFileMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a dattn token file (starts with \"",
                     absl::CHexEscape(absl::string_view(reinterpret_cast<const char*>(p), 8)),
                     "\", expected \"DATTNTOK\")"));
  }
  const uint32_t version = LoadU32(p + 8);
  const uint32_t header_bytes = LoadU32(p + 12);
  const uint32_t vocab = LoadU32(p + 16);
  const uint32_t token_bytes = LoadU32(p + 20);
  const uint64_t count = LoadU64(p + 24);
  if (version != kTokenFileVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": token file version ", version, ", this reader knows version ", kTokenFileVersion));
  }
  if (header_bytes != kTokenFileHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header_bytes = ", header_bytes,
                                                   ", version 1 has ", kTokenFileHeaderBytes));
  }
  if (token_bytes != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": token_bytes = ", token_bytes, ", version 1 has 2 (uint16)"));
  }
  if (vocab < 1 || vocab > kMaxTokenFileVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": vocab_size = ", vocab, ", need 1..", kMaxTokenFileVocab));
  }
  const uint64_t data_bytes = static_cast<uint64_t>(file_bytes - kTokenFileHeaderBytes);
  if (count > data_bytes / 2) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: the header says ", count,
                                            " tokens (2 bytes each) but the file has ", data_bytes,
                                            " bytes of tokens"));
  }
  if (data_bytes != count * 2) {
    return absl::DataLossError(absl::StrCat(path, ": size mismatch: the header says ", count,
                                            " tokens (", count * 2, " bytes) but the file has ",
                                            data_bytes, " bytes of tokens"));
  }
  TokenFile file;
  file.vocab_size_ = static_cast<int32_t>(vocab);
  file.token_count_ = static_cast<int64_t>(count);
  std::array<uint8_t, 32> stored;
  std::memcpy(stored.data(), p + 32, 32);
  file.sha256_hex_ = HexDigest(stored);
  if (verify) {
    absl::StatusOr<std::string> actual = Sha256Hex(
        absl::string_view(reinterpret_cast<const char*>(p + kTokenFileHeaderBytes), data_bytes));
    if (!actual.ok()) return actual.status();
    if (*actual != file.sha256_hex_) {
      return absl::DataLossError(absl::StrCat(path, ": checksum mismatch: the header's SHA-256 is ",
                                              file.sha256_hex_, ", the tokens' is ", *actual));
    }
    const uint8_t* t = p + kTokenFileHeaderBytes;
    for (uint64_t i = 0; i < count; ++i) {
      uint16_t id;
      std::memcpy(&id, t + 2 * i, 2);
      if (id >= vocab) {
        return absl::DataLossError(
            absl::StrCat(path, ": token ", i, " is ", id, ", not below vocab_size ", vocab));
      }
    }
  }
  file.map_ = std::make_shared<const MappedFile>(std::move(*map));
  return file;
}

uint16_t TokenFile::at(int64_t i) const {
  uint16_t id;
  std::memcpy(&id, map_->data() + kTokenFileHeaderBytes + 2 * i, 2);
  return id;
}

absl::Status TokenFile::Read(int64_t begin, absl::Span<int32_t> out) const {
  const int64_t n = static_cast<int64_t>(out.size());
  if (begin < 0 || begin > token_count_ || n > token_count_ - begin) {
    return absl::OutOfRangeError(absl::StrCat(path(), ": tokens [", begin, ", ", begin + n,
                                              ") are outside [0, ", token_count_, ")"));
  }
  const uint8_t* t = map_->data() + kTokenFileHeaderBytes + 2 * begin;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t id;
    std::memcpy(&id, t + 2 * i, 2);
    out[i] = id;
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenFileWriter> TokenFileWriter::Create(const std::string& path,
                                                        int32_t vocab_size) {
  if (vocab_size < 1 || vocab_size > kMaxTokenFileVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": vocab_size = ", vocab_size, ", need 1..", kMaxTokenFileVocab));
  }
  TokenFileWriter w;
  w.path_ = path;
  w.temp_path_ = path + ".tmp";
  w.vocab_size_ = vocab_size;
  absl::StatusOr<OutputFile> out = OutputFile::Create(w.temp_path_);
  if (!out.ok()) return out.status();
  w.out_ = std::make_unique<OutputFile>(std::move(*out));
  w.sha_ = std::make_unique<Sha256>();
  const char zeros[kTokenFileHeaderBytes] = {};
  if (absl::Status s = w.out_->Append(zeros, kTokenFileHeaderBytes); !s.ok()) return s;
  return w;
}

TokenFileWriter::~TokenFileWriter() {
  if (out_ != nullptr) {
    out_.reset();
    ::unlink(temp_path_.c_str());
  }
}

absl::Status TokenFileWriter::Append(absl::Span<const int32_t> tokens) {
  if (out_ == nullptr) return absl::FailedPreconditionError(path_ + ": writer already finished");
  std::vector<uint16_t> narrow(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": token ",
                                                     count_ + static_cast<int64_t>(i), " is ",
                                                     tokens[i], ", need 0..", vocab_size_ - 1));
    }
    narrow[i] = static_cast<uint16_t>(tokens[i]);
  }
  return Append(absl::MakeConstSpan(narrow));
}

absl::Status TokenFileWriter::Append(absl::Span<const uint16_t> tokens) {
  if (out_ == nullptr) return absl::FailedPreconditionError(path_ + ": writer already finished");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": token ",
                                                     count_ + static_cast<int64_t>(i), " is ",
                                                     tokens[i], ", need 0..", vocab_size_ - 1));
    }
  }
  const int64_t bytes = static_cast<int64_t>(tokens.size()) * 2;
  if (absl::Status s = out_->Append(tokens.data(), bytes); !s.ok()) return s;
  sha_->Update(tokens.data(), bytes);
  count_ += static_cast<int64_t>(tokens.size());
  return absl::OkStatus();
}

absl::Status TokenFileWriter::Finish() {
  if (out_ == nullptr) return absl::FailedPreconditionError(path_ + ": writer already finished");
  absl::StatusOr<std::array<uint8_t, 32>> digest = sha_->Finish();
  if (!digest.ok()) return digest.status();
  uint8_t header[kTokenFileHeaderBytes] = {};
  std::memcpy(header, kTokenFileMagic, 8);
  const uint32_t fields[4] = {kTokenFileVersion, static_cast<uint32_t>(kTokenFileHeaderBytes),
                              static_cast<uint32_t>(vocab_size_), 2};
  std::memcpy(header + 8, fields, sizeof(fields));
  const uint64_t count = static_cast<uint64_t>(count_);
  std::memcpy(header + 24, &count, 8);
  std::memcpy(header + 32, digest->data(), 32);
  absl::Status s = out_->WriteAt(0, header, kTokenFileHeaderBytes);
  if (s.ok()) s = out_->Close(/*sync=*/true);
  out_.reset();
  if (!s.ok()) return s;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return FileError(absl::StrCat("rename ", temp_path_, " to"), path_, errno);
  }
  return FsyncPath(ParentDir(path_));
}

absl::Status WriteTokenFile(const std::string& path, absl::Span<const int32_t> tokens,
                            int32_t vocab_size) {
  absl::StatusOr<TokenFileWriter> w = TokenFileWriter::Create(path, vocab_size);
  if (!w.ok()) return w.status();
  if (absl::Status s = w->Append(tokens); !s.ok()) return s;
  return w->Finish();
}

}  // namespace model
}  // namespace dattn
