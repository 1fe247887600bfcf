// Fuzzes the rendezvous store's wire format (engine/comm/tcp_store_wire.h) as the server meets it:
// the input is what one client connection sends, decoded frame by frame until it ends or goes out
// of step, each request answered on the server's map. Each decoded frame must re-encode to exactly
// the bytes it was read from, and each reply must be a well-formed reply frame.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "engine/comm/tcp_store_wire.h"

namespace {

namespace comm = dattn::comm;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);
  size_t pos = 0;
  auto read = [&](char* out, size_t n) {
    if (size - pos < n) return false;
    std::memcpy(out, bytes + pos, n);
    pos += n;
    return true;
  };
  std::map<std::string, std::string> store;
  for (;;) {
    const size_t start = pos;
    absl::StatusOr<comm::StoreRequest> request = comm::ReadStoreRequest(read);
    if (!request.ok()) break;
    Check(comm::EncodeStoreRequest(*request) == std::string(bytes + start, pos - start));
    bool changed = false;
    const std::string reply = comm::ApplyStoreRequest(*std::move(request), &store, &changed);
    Check(reply.size() >= 5);
    uint32_t len = 0;
    std::memcpy(&len, reply.data() + 1, 4);
    Check(len == reply.size() - 5 && static_cast<uint8_t>(reply[0]) <= comm::kStoreInvalid);
  }
  return 0;
}
