#include "worker/host_info.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dattn {
namespace worker {
namespace {

absl::StatusOr<std::string> ReadWholeFile(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value after "key:" on the first line whose key (trimmed) equals `key`, trimmed.
bool FindKeyValue(absl::string_view text, absl::string_view key, std::string* value) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    if (absl::StripAsciiWhitespace(line.substr(0, colon)) != key) continue;
    *value = std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<int64_t> ParseMeminfoBytes(absl::string_view meminfo, absl::string_view field) {
  std::string value;
  if (!FindKeyValue(meminfo, field, &value)) {
    return absl::NotFoundError(absl::StrCat("/proc/meminfo has no field ", field));
  }
  std::vector<absl::string_view> parts = absl::StrSplit(value, ' ', absl::SkipEmpty());
  int64_t amount = 0;
  if (parts.empty() || !absl::SimpleAtoi(parts[0], &amount) || amount < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("/proc/meminfo field ", field, " has unparsable value '", value, "'"));
  }
  int64_t unit = 1;
  if (parts.size() > 1) {
    if (parts[1] == "kB") {
      unit = 1024;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("/proc/meminfo field ", field, " has unknown unit '", parts[1], "'"));
    }
  }
  return amount * unit;
}

std::string ParseCpuModel(absl::string_view cpuinfo) {
  std::string value;
  if (FindKeyValue(cpuinfo, "model name", &value) && !value.empty()) return value;
  if (FindKeyValue(cpuinfo, "Hardware", &value) && !value.empty()) return value;
  return "cpu";
}

absl::StatusOr<int64_t> ReadMeminfoBytes(absl::string_view field) {
  absl::StatusOr<std::string> text = ReadWholeFile("/proc/meminfo");
  if (!text.ok()) return text.status();
  return ParseMeminfoBytes(*text, field);
}

std::string ReadCpuModel() {
  absl::StatusOr<std::string> text = ReadWholeFile("/proc/cpuinfo");
  if (!text.ok()) return "cpu";
  return ParseCpuModel(*text);
}

}  // namespace worker
}  // namespace dattn
