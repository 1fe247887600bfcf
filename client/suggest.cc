#include "client/suggest.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dattn {
namespace client {
namespace {

// Lower case, '_' as '-', without leading dashes: the form names are compared in.
std::string Comparable(absl::string_view text) {
  while (absl::ConsumePrefix(&text, "-")) {
  }
  std::string out = absl::AsciiStrToLower(text);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

}  // namespace

size_t EditDistance(absl::string_view a, absl::string_view b) {
  // Three rows of the dynamic programme: i-2, i-1 and i.
  std::vector<size_t> two(b.size() + 1), one(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) one[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({one[j] + 1, cur[j - 1] + 1, one[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        cur[j] = std::min(cur[j], two[j - 2] + 1);
      }
    }
    std::swap(two, one);
    std::swap(one, cur);
  }
  return one[b.size()];
}

std::vector<std::string> Suggest(absl::string_view typed,
                                 const std::vector<std::string>& candidates) {
  const std::string want = Comparable(typed);
  if (want.empty()) return {};
  const size_t limit = std::max<size_t>(1, std::min<size_t>(3, want.size() / 3));
  std::vector<std::pair<size_t, std::string>> close;
  std::vector<std::string> prefixed;
  for (const std::string& candidate : candidates) {
    const std::string have = Comparable(candidate);
    if (have == want) return {};
    const size_t d = EditDistance(want, have);
    if (d <= limit) close.emplace_back(d, candidate);
    if (want.size() >= 3 && have.size() > want.size() && have.compare(0, want.size(), want) == 0) {
      prefixed.push_back(candidate);
    }
  }
  std::vector<std::string> out;
  if (!close.empty()) {
    std::stable_sort(close.begin(), close.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    for (const auto& [d, candidate] : close) {
      if (d != close.front().first || out.size() == 3) break;
      if (std::find(out.begin(), out.end(), candidate) == out.end()) out.push_back(candidate);
    }
    return out;
  }
  for (const std::string& candidate : prefixed) {
    if (out.size() == 3) break;
    if (std::find(out.begin(), out.end(), candidate) == out.end()) out.push_back(candidate);
  }
  return out;
}

std::string DidYouMean(const std::vector<std::string>& suggestions, absl::string_view quote) {
  if (suggestions.empty()) return "";
  std::string text = " (did you mean ";
  for (size_t i = 0; i < suggestions.size(); ++i) {
    if (i > 0) absl::StrAppend(&text, i + 1 == suggestions.size() ? " or " : ", ");
    absl::StrAppend(&text, quote, suggestions[i], quote);
  }
  absl::StrAppend(&text, "?)");
  return text;
}

}  // namespace client
}  // namespace dattn
