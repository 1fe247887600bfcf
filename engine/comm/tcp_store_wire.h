// The TcpStore's wire format (tcp_store.h), apart from the sockets: what the server decodes from a
// connection and how it answers, so that both can be tested and fuzzed on bytes in memory
// (fuzz/tcp_store_fuzz.cc).
//
// One frame per request, one per reply, little-endian (the only byte order of the machines here):
//   request  op u8, key length u32, key, value length u32, value, arg i64
//   reply    code u8, payload length u32, payload
// Ops: Set (key := value), Get (key's value; arg: milliseconds the server waits for the key to be
// set), Add (key := key + arg, an integer in decimal text; a missing key counts as 0), Hello
// (value: the ring's secret; key and arg unused, sent empty and 0).
//
// Admission: the client's first frame on every connection is a Hello. A server started with a
// secret (tcp_store.h) answers it with AdmitStoreConnection: OK when the Hello carries exactly that
// secret, DENIED otherwise (any other first frame, a missing or a wrong secret), and closes the
// connection after a DENIED. A server without a secret answers every Hello OK (ApplyStoreRequest).
//
// Thread-safety: free functions without state; ApplyStoreRequest's `data` is the caller's to guard.
#ifndef DATTN_ENGINE_COMM_TCP_STORE_WIRE_H_
#define DATTN_ENGINE_COMM_TCP_STORE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dattn {
namespace comm {

enum StoreOp : uint8_t { kStoreSet = 1, kStoreGet = 2, kStoreAdd = 3, kStoreHello = 4 };
enum StoreCode : uint8_t { kStoreOk = 0, kStoreNotFound = 1, kStoreInvalid = 2, kStoreDenied = 3 };

inline constexpr uint32_t kMaxStoreKeyBytes = 1 << 16;
inline constexpr uint32_t kMaxStoreValueBytes = 64 << 20;

// One request as decoded; `op` is the byte on the wire (any value: ApplyStoreRequest refuses the
// unknown ones).
struct StoreRequest {
  uint8_t op = 0;
  std::string key;
  std::string value;
  int64_t arg = 0;
};

// Fills exactly `n` bytes at `data` from the connection and returns true, or returns false when the
// connection ended (closed, reset or shut down) first.
using StoreReader = absl::FunctionRef<bool(char* data, size_t n)>;

// Reads one request frame through `read`. UNAVAILABLE when the connection ends before the frame
// does; INVALID_ARGUMENT naming the length when the key is longer than kMaxStoreKeyBytes or the
// value longer than kMaxStoreValueBytes (nothing after that length is read: the stream is out of
// step and the server closes it). The value is allocated as its bytes arrive (at most 64 KiB
// ahead), so a frame that announces 64 MiB and stops costs no more than it sent.
absl::StatusOr<StoreRequest> ReadStoreRequest(StoreReader read);

// The request's frame (what the client sends). The key and value must be within the limits.
std::string EncodeStoreRequest(const StoreRequest& request);

// A reply frame.
std::string EncodeStoreReply(StoreCode code, absl::string_view payload);

// The server's reply to `request` on the map `data`, once any wait of a Get is over: Set stores the
// value; Get replies with the key's value, or NOT_FOUND; Add adds arg to the key's integer and
// replies with the sum, or INVALID naming the key when it holds something else than an integer
// or when the sum overflows int64 (the key then keeps its value);
// Hello is OK (a store without a secret, or a connection already admitted: nothing to check);
// any other op is INVALID naming it. `*changed` says whether `data` changed (waiters to wake).
std::string ApplyStoreRequest(StoreRequest request, std::map<std::string, std::string>* data,
                              bool* changed);

// The answer of a server that requires `secret` (not empty) to the first frame of a connection:
// OK when it is a Hello whose value equals `secret` (compared in constant time for equal lengths),
// DENIED otherwise, naming what was wrong but never echoing either secret. `*admitted` says which.
std::string AdmitStoreConnection(const StoreRequest& first, absl::string_view secret,
                                 bool* admitted);

// Whether `a` and `b` are equal, in time that depends on their lengths only.
bool StoreSecretsEqual(absl::string_view a, absl::string_view b);

}  // namespace comm
}  // namespace dattn

#endif  // DATTN_ENGINE_COMM_TCP_STORE_WIRE_H_
