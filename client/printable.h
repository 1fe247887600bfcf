// Printable: text from elsewhere made safe to show on a terminal. Thread-safe (no state).
#ifndef DATTN_CLIENT_PRINTABLE_H_
#define DATTN_CLIENT_PRINTABLE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace dattn {
namespace client {

// `text` made safe to print on a terminal: every byte or character that a terminal would act on
// rather than show is written as an escape. \n, \r, \t as those two characters; other C0 controls
// and DEL as \xNN; C1 controls (U+0080..U+009F, e.g. U+009B, a one-character CSI) and the
// invisible format characters that move or reorder text (bidi marks, embeddings, overrides and
// isolates, zero-width characters, U+2028/U+2029, U+FEFF) as \uNNNN; bytes that are not valid
// UTF-8 as \xNN. Printable ASCII and other valid UTF-8 pass unchanged. Every string the CLI did
// not write itself (names, tenants, ids, worker names, event messages, reasons, server errors,
// the user's own arguments echoed back) goes through this in human output; --json output is the
// protobuf JSON mapping, which escapes control characters by itself.
std::string Printable(absl::string_view text);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_PRINTABLE_H_
