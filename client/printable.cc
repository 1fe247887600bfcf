#include "client/printable.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace client {
namespace {

// Format characters that change where or in which order text appears without showing anything.
bool InvisibleFormatChar(uint32_t cp) {
  return cp == 0x061C || (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) ||
         (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) || cp == 0xFEFF ||
         (cp >= 0xFFF9 && cp <= 0xFFFB);
}

// The length (2..4) of the valid UTF-8 sequence at text[i] and its code point, or 0 when the bytes
// there are not one (overlong forms and surrogates included).
size_t Utf8Sequence(absl::string_view text, size_t i, uint32_t* cp) {
  const unsigned char c = static_cast<unsigned char>(text[i]);
  size_t len;
  uint32_t min;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, min = 0x80, *cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, min = 0x800, *cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, min = 0x10000, *cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > text.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const unsigned char next = static_cast<unsigned char>(text[i + k]);
    if ((next & 0xC0) != 0x80) return 0;
    *cp = (*cp << 6) | (next & 0x3F);
  }
  if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    if (c < 0x80) {
      switch (c) {
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
      }
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t len = Utf8Sequence(text, i, &cp);
    if (len == 0) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
      ++i;
    } else if (cp <= 0x9F || InvisibleFormatChar(cp)) {
      absl::StrAppend(&out, "\\u", absl::Hex(cp, absl::kZeroPad4));
      i += len;
    } else {
      out.append(text.data() + i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace client
}  // namespace dattn
