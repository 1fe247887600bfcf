// A user-supplied string as error messages show it: quoted, cut to 40 characters, with control
// bytes, quotes and backslashes escaped (\xNN), so that a message can be shown to a user unchanged
// and no value can smuggle terminal escape codes or break a log line.
#ifndef DATTN_API_QUOTE_H_
#define DATTN_API_QUOTE_H_

#include <string>

namespace dattn {
namespace api {

// "\"abc\"", "\"a\\x1bb\"", "\"0123456789012345678901234567890123456789...\"".
std::string Quote(const std::string& s);

}  // namespace api
}  // namespace dattn

#endif  // DATTN_API_QUOTE_H_
