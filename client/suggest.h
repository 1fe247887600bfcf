// "Did you mean ...?" for mistyped commands, flags, values and job-file keys. CLI11 (2.1 in Debian)
// has no suggestions of its own, so the CLI computes them: the candidates closest to what was typed
// by edit distance (Damerau's optimal string alignment: insertions, deletions, substitutions and
// swaps of two neighbours each count 1), compared case-insensitively with '_' and '-' alike.
//
// Thread-safe (no state).
#ifndef DATTN_CLIENT_SUGGEST_H_
#define DATTN_CLIENT_SUGGEST_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dattn {
namespace client {

// The optimal-string-alignment distance between `a` and `b`, byte by byte.
size_t EditDistance(absl::string_view a, absl::string_view b);

// The candidates `typed` was probably meant to be, best first, at most 3: those at the smallest
// distance from it, when that distance is at most max(1, min(3, length/3)) (length: of `typed`
// without leading dashes), plus, when nothing is that close, those that `typed` (3 characters or
// more) begins. Leading dashes are ignored in the comparison and kept in the result. Empty when
// nothing is close or `typed` is itself a candidate.
std::vector<std::string> Suggest(absl::string_view typed,
                                 const std::vector<std::string>& candidates);

// " (did you mean 'status'?)", " (did you mean 'drain' or 'undrain'?)", or "" when `suggestions`
// is empty. `quote` wraps each one ("'" for words; "" for flags, which read as --watch).
std::string DidYouMean(const std::vector<std::string>& suggestions, absl::string_view quote = "'");

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_SUGGEST_H_
