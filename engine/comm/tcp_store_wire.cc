#include "engine/comm/tcp_store_wire.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dattn {
namespace comm {
namespace {

// How far ahead of the bytes received a value's buffer may grow.
constexpr size_t kValueStep = size_t{64} << 10;

void AppendU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void AppendI64(std::string* out, int64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }

absl::Status Ended(const char* what) {
  return absl::UnavailableError(absl::StrCat("the connection ended before the request's ", what));
}

}  // namespace

absl::StatusOr<StoreRequest> ReadStoreRequest(StoreReader read) {
  StoreRequest request;
  uint32_t klen = 0, vlen = 0;
  if (!read(reinterpret_cast<char*>(&request.op), 1)) return Ended("op");
  if (!read(reinterpret_cast<char*>(&klen), 4)) return Ended("key length");
  if (klen > kMaxStoreKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key length ", klen, " exceeds the limit of ", kMaxStoreKeyBytes));
  }
  request.key.resize(klen);
  if (!read(request.key.data(), klen)) return Ended("key");
  if (!read(reinterpret_cast<char*>(&vlen), 4)) return Ended("value length");
  if (vlen > kMaxStoreValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store value length ", vlen, " exceeds the limit of ", kMaxStoreValueBytes));
  }
  while (request.value.size() < vlen) {
    const size_t have = request.value.size();
    const size_t step = std::min<size_t>(vlen - have, kValueStep);
    request.value.resize(have + step);
    if (!read(request.value.data() + have, step)) return Ended("value");
  }
  if (!read(reinterpret_cast<char*>(&request.arg), 8)) return Ended("arg");
  return request;
}

std::string EncodeStoreRequest(const StoreRequest& request) {
  std::string frame;
  frame.reserve(17 + request.key.size() + request.value.size());
  frame.push_back(static_cast<char>(request.op));
  AppendU32(&frame, static_cast<uint32_t>(request.key.size()));
  frame += request.key;
  AppendU32(&frame, static_cast<uint32_t>(request.value.size()));
  frame += request.value;
  AppendI64(&frame, request.arg);
  return frame;
}

std::string EncodeStoreReply(StoreCode code, absl::string_view payload) {
  std::string out;
  out.push_back(static_cast<char>(code));
  AppendU32(&out, static_cast<uint32_t>(payload.size()));
  out.append(payload.data(), payload.size());
  return out;
}

std::string ApplyStoreRequest(StoreRequest request, std::map<std::string, std::string>* data,
                              bool* changed) {
  *changed = false;
  if (request.op == kStoreSet) {
    (*data)[request.key] = std::move(request.value);
    *changed = true;
    return EncodeStoreReply(kStoreOk, "");
  }
  if (request.op == kStoreGet) {
    auto it = data->find(request.key);
    return it == data->end() ? EncodeStoreReply(kStoreNotFound, "")
                             : EncodeStoreReply(kStoreOk, it->second);
  }
  if (request.op == kStoreAdd) {
    int64_t current = 0;
    auto it = data->find(request.key);
    if (it != data->end() && !absl::SimpleAtoi(it->second, &current)) {
      return EncodeStoreReply(kStoreInvalid, absl::StrCat("key \"", request.key, "\" holds \"",
                                                          it->second, "\", not an integer"));
    }
    int64_t sum = 0;
    if (__builtin_add_overflow(current, request.arg, &sum)) {
      return EncodeStoreReply(
          kStoreInvalid, absl::StrCat("adding ", request.arg, " to key \"", request.key, "\" (",
                                      current, ") overflows a 64-bit integer"));
    }
    current = sum;
    (*data)[request.key] = absl::StrCat(current);
    *changed = true;
    return EncodeStoreReply(kStoreOk, absl::StrCat(current));
  }
  if (request.op == kStoreHello) return EncodeStoreReply(kStoreOk, "");
  return EncodeStoreReply(kStoreInvalid,
                          absl::StrCat("unknown store op ", static_cast<int>(request.op)));
}

bool StoreSecretsEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  // No early exit: the time taken does not say where the first difference is.
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

std::string AdmitStoreConnection(const StoreRequest& first, absl::string_view secret,
                                 bool* admitted) {
  *admitted = false;
  if (first.op != kStoreHello) {
    return EncodeStoreReply(kStoreDenied,
                            absl::StrCat("the store requires a ring secret: the "
                                         "connection's first request is op ",
                                         static_cast<int>(first.op), ", not a hello"));
  }
  if (first.value.empty()) {
    return EncodeStoreReply(kStoreDenied,
                            "the store requires a ring secret and the hello has none");
  }
  if (!StoreSecretsEqual(first.value, secret)) {
    return EncodeStoreReply(kStoreDenied, "the hello's ring secret is wrong");
  }
  *admitted = true;
  return EncodeStoreReply(kStoreOk, "");
}

}  // namespace comm
}  // namespace dattn
