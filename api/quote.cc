#include "api/quote.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace api {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  const size_t n = std::min<size_t>(s.size(), 40);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (s.size() > n) absl::StrAppend(&out, "...");
  out.push_back('"');
  return out;
}

}  // namespace api
}  // namespace dattn
