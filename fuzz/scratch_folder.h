// What the harnesses that read files (checkpoint_fuzz, model_folder_fuzz) share: a scratch folder
// per process and a plain file write. The folder is made under $TMPDIR (/tmp by default) on first
// use, named after the harness, and removed at exit. Not thread-safe (libFuzzer calls a harness
// from one thread).
#ifndef DATTN_FUZZ_SCRATCH_FOLDER_H_
#define DATTN_FUZZ_SCRATCH_FOLDER_H_

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/string_view.h"

namespace dattn {
namespace fuzz {

// A failed harness invariant: a crash libFuzzer reports with the input.
inline void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// $TMPDIR/dattn-<harness>.XXXXXX, made once per process.
inline const std::string& ScratchFolder(const char* harness) {
  static std::string* folder = nullptr;
  if (folder == nullptr) {
    const char* tmp = getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/dattn-" +
                          harness + ".XXXXXX";
    Check(mkdtemp(pattern.data()) != nullptr);
    folder = new std::string(pattern);
    atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*folder, ec);
    });
  }
  return *folder;
}

// Plain POSIX writes: the model's OutputFile reserves a 1 MiB buffer per file, which would cost
// more than the parse under test.
inline void WriteScratchFile(const std::string& path, absl::string_view content) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  Check(fd >= 0);
  Check(write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
  close(fd);
}

}  // namespace fuzz
}  // namespace dattn

#endif  // DATTN_FUZZ_SCRATCH_FOLDER_H_
