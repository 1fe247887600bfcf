// Fuzzes the rendezvous store's wire format (engine/comm/tcp_store_wire.h) as the server meets it:
// the input is what one client connection sends, decoded frame by frame until it ends or goes out
// of step, each request answered on the server's map. Each decoded frame must re-encode to exactly
// the bytes it was read from, and each reply must be a well-formed reply frame. Each input is
// served twice: by a store without a secret, and by one that requires kFuzzSecret
// (fuzz/make_seeds.cc writes seeds whose hello carries it), whose first frame goes through
// AdmitStoreConnection and whose later frames are served only when it admitted the connection.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "engine/comm/tcp_store_wire.h"

namespace {

namespace comm = dattn::comm;

// The secret of the store that requires one: 32 bytes, as a ring attempt's (make_seeds.cc has the
// same).
constexpr char kFuzzSecret[] = "fuzz-ring-secret-0123456789abcde";
static_assert(sizeof(kFuzzSecret) == 33, "32 bytes and the terminating zero");

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void CheckReply(const std::string& reply) {
  Check(reply.size() >= 5);
  uint32_t len = 0;
  std::memcpy(&len, reply.data() + 1, 4);
  Check(len == reply.size() - 5 && static_cast<uint8_t>(reply[0]) <= comm::kStoreDenied);
}

void Serve(const char* bytes, size_t size, const std::string& secret) {
  size_t pos = 0;
  auto read = [&](char* out, size_t n) {
    if (size - pos < n) return false;
    std::memcpy(out, bytes + pos, n);
    pos += n;
    return true;
  };
  std::map<std::string, std::string> store;
  for (bool first = true;; first = false) {
    const size_t start = pos;
    absl::StatusOr<comm::StoreRequest> request = comm::ReadStoreRequest(read);
    if (!request.ok()) break;
    Check(comm::EncodeStoreRequest(*request) == std::string(bytes + start, pos - start));
    if (first && !secret.empty()) {
      bool admitted = false;
      const std::string reply = comm::AdmitStoreConnection(*request, secret, &admitted);
      CheckReply(reply);
      // Admitted exactly when the first frame is a hello carrying the secret; never echoes it.
      Check(admitted == (request->op == comm::kStoreHello && request->value == secret));
      Check(static_cast<uint8_t>(reply[0]) == (admitted ? comm::kStoreOk : comm::kStoreDenied));
      Check(reply.find(secret) == std::string::npos);
      if (!admitted) break;
      continue;
    }
    bool changed = false;
    const std::string reply = comm::ApplyStoreRequest(*std::move(request), &store, &changed);
    CheckReply(reply);
    Check(static_cast<uint8_t>(reply[0]) != comm::kStoreDenied);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);
  Serve(bytes, size, "");
  Serve(bytes, size, std::string(kFuzzSecret, 32));
  return 0;
}
