// The TcpStore's frames on bytes in memory: decoding (whole, cut short, over the limits), encoding
// round trips, and the server's answers.
#include "engine/comm/tcp_store_wire.h"

#include <cstring>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace comm {
namespace {

using ::testing::HasSubstr;

// Reads from a buffer as the server reads from its socket; counts the bytes handed out.
class BufferReader {
 public:
  explicit BufferReader(std::string bytes) : bytes_(std::move(bytes)) {}
  bool operator()(char* data, size_t n) {
    if (bytes_.size() - pos_ < n) return false;
    std::memcpy(data, bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::string bytes_;
  size_t pos_ = 0;
};

absl::StatusOr<StoreRequest> Decode(const std::string& bytes, size_t* consumed = nullptr) {
  BufferReader reader(bytes);
  absl::StatusOr<StoreRequest> r =
      ReadStoreRequest([&reader](char* data, size_t n) { return reader(data, n); });
  if (consumed != nullptr) *consumed = reader.pos();
  return r;
}

std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string I64(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

TEST(TcpStoreWireTest, DecodesTheFrameTheClientEncodes) {
  const StoreRequest sent{kStoreSet, "rank/0", std::string("a\0b", 3), -7};
  const std::string frame = EncodeStoreRequest(sent);
  // op, key length, key, value length, value, arg: little-endian.
  EXPECT_EQ(frame,
            std::string("\x01", 1) + U32(6) + "rank/0" + U32(3) + std::string("a\0b", 3) + I64(-7));
  size_t consumed = 0;
  absl::StatusOr<StoreRequest> got = Decode(frame + "next", &consumed);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->op, kStoreSet);
  EXPECT_EQ(got->key, "rank/0");
  EXPECT_EQ(got->value, std::string("a\0b", 3));
  EXPECT_EQ(got->arg, -7);
  EXPECT_EQ(consumed, frame.size());  // One frame, not a byte of the next.
}

TEST(TcpStoreWireTest, AFrameCutShortIsAnEndedConnection) {
  const std::string frame = EncodeStoreRequest(StoreRequest{kStoreGet, "key", "value", 5});
  for (size_t n = 0; n < frame.size(); ++n) {
    absl::StatusOr<StoreRequest> got = Decode(frame.substr(0, n));
    EXPECT_TRUE(absl::IsUnavailable(got.status())) << n << ": " << got.status();
  }
}

TEST(TcpStoreWireTest, LengthsOverTheLimitsAreRefusedBeforeTheirBytes) {
  size_t consumed = 0;
  absl::StatusOr<StoreRequest> key = Decode(
      std::string("\x01", 1) + U32(kMaxStoreKeyBytes + 1) + std::string(100, 'k'), &consumed);
  EXPECT_TRUE(absl::IsInvalidArgument(key.status()));
  EXPECT_THAT(key.status().message(), HasSubstr("key length 65537 exceeds the limit of 65536"));
  EXPECT_EQ(consumed, 5u);

  absl::StatusOr<StoreRequest> value =
      Decode(std::string("\x01", 1) + U32(1) + "k" + U32(0xffffffffu), &consumed);
  EXPECT_TRUE(absl::IsInvalidArgument(value.status()));
  EXPECT_THAT(value.status().message(),
              HasSubstr("value length 4294967295 exceeds the limit of 67108864"));
  EXPECT_EQ(consumed, 10u);

  // At the limits exactly, frames decode.
  const StoreRequest big{kStoreSet, std::string(kMaxStoreKeyBytes, 'k'), std::string(3u << 20, 'v'),
                         0};
  absl::StatusOr<StoreRequest> got = Decode(EncodeStoreRequest(big));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->key, big.key);
  EXPECT_EQ(got->value, big.value);
}

TEST(TcpStoreWireTest, AnAnnouncedValueIsAllocatedAsItsBytesArrive) {
  // 64 MiB announced, 10 bytes sent: the reader is asked for at most 64 KiB at a time.
  size_t largest = 0;
  const std::string frame =
      std::string("\x01", 1) + U32(1) + "k" + U32(kMaxStoreValueBytes) + std::string(10, 'v');
  BufferReader reader(frame);
  absl::StatusOr<StoreRequest> got = ReadStoreRequest([&](char* data, size_t n) {
    largest = std::max(largest, n);
    return reader(data, n);
  });
  EXPECT_TRUE(absl::IsUnavailable(got.status()));
  EXPECT_THAT(got.status().message(), HasSubstr("before the request's value"));
  EXPECT_EQ(largest, size_t{64} << 10);
}

TEST(TcpStoreWireTest, TheServerAnswersSetGetAddAndUnknownOps) {
  std::map<std::string, std::string> data;
  bool changed = false;
  EXPECT_EQ(ApplyStoreRequest({kStoreGet, "k", "", 0}, &data, &changed),
            EncodeStoreReply(kStoreNotFound, ""));
  EXPECT_FALSE(changed);
  EXPECT_EQ(ApplyStoreRequest({kStoreSet, "k", "v", 0}, &data, &changed),
            EncodeStoreReply(kStoreOk, ""));
  EXPECT_TRUE(changed);
  EXPECT_EQ(ApplyStoreRequest({kStoreGet, "k", "", 0}, &data, &changed),
            std::string("\x00", 1) + U32(1) + "v");
  EXPECT_EQ(ApplyStoreRequest({kStoreAdd, "n", "", 5}, &data, &changed),
            EncodeStoreReply(kStoreOk, "5"));
  EXPECT_EQ(ApplyStoreRequest({kStoreAdd, "n", "", -7}, &data, &changed),
            EncodeStoreReply(kStoreOk, "-2"));
  EXPECT_EQ(data["n"], "-2");
  EXPECT_EQ(ApplyStoreRequest({kStoreAdd, "k", "", 1}, &data, &changed),
            EncodeStoreReply(kStoreInvalid, "key \"k\" holds \"v\", not an integer"));
  EXPECT_FALSE(changed);
  EXPECT_EQ(ApplyStoreRequest({9, "k", "", 0}, &data, &changed),
            EncodeStoreReply(kStoreInvalid, "unknown store op 9"));
  EXPECT_FALSE(changed);
}

// Found by fuzz/tcp_store_fuzz (fuzz/corpus/tcp_store_fuzz/add-overflow): two Adds whose sum passes
// INT64_MAX were signed overflow (UndefinedBehaviorSanitizer); now a refusal that keeps the value.
TEST(TcpStoreWireTest, AnAddThatOverflowsIsRefusedAndKeepsTheValue) {
  std::map<std::string, std::string> data;
  bool changed = false;
  const int64_t big = int64_t{1} << 62;
  EXPECT_EQ(ApplyStoreRequest({kStoreAdd, "n", "", big}, &data, &changed),
            EncodeStoreReply(kStoreOk, "4611686018427387904"));
  EXPECT_EQ(ApplyStoreRequest({kStoreAdd, "n", "", big}, &data, &changed),
            EncodeStoreReply(kStoreInvalid,
                             "adding 4611686018427387904 to key \"n\" (4611686018427387904) "
                             "overflows a 64-bit integer"));
  EXPECT_FALSE(changed);
  EXPECT_EQ(data["n"], "4611686018427387904");
  data["m"] = "-9223372036854775808";
  EXPECT_EQ(ApplyStoreRequest({kStoreAdd, "m", "", -1}, &data, &changed)[0], kStoreInvalid);
  EXPECT_EQ(ApplyStoreRequest({kStoreAdd, "m", "", INT64_MAX}, &data, &changed),
            EncodeStoreReply(kStoreOk, "-1"));
}

TEST(TcpStoreWireTest, AdmissionNeedsAHelloWithExactlyTheSecret) {
  const std::string secret(32, '\x5a');
  bool admitted = true;
  EXPECT_EQ(AdmitStoreConnection({kStoreHello, "", secret, 0}, secret, &admitted),
            EncodeStoreReply(kStoreOk, ""));
  EXPECT_TRUE(admitted);

  std::string wrong = secret;
  wrong[31] = 'x';
  for (const StoreRequest& first :
       {StoreRequest{kStoreHello, "", wrong, 0},
        StoreRequest{kStoreHello, "", secret.substr(0, 31), 0},
        StoreRequest{kStoreHello, "", secret + "x", 0}, StoreRequest{kStoreHello, "", "", 0},
        StoreRequest{kStoreSet, "k", secret, 0}}) {
    admitted = true;
    const std::string reply = AdmitStoreConnection(first, secret, &admitted);
    EXPECT_FALSE(admitted) << first.value.size();
    ASSERT_GE(reply.size(), 5u);
    EXPECT_EQ(reply[0], kStoreDenied);
    EXPECT_EQ(reply.find(secret), std::string::npos) << "the reply echoes the secret";
  }
  EXPECT_THAT(AdmitStoreConnection({kStoreSet, "k", "v", 0}, secret, &admitted),
              HasSubstr("not a hello"));
}

TEST(TcpStoreWireTest, AHelloToAStoreWithoutASecretIsAnsweredOk) {
  std::map<std::string, std::string> data;
  bool changed = true;
  EXPECT_EQ(ApplyStoreRequest({kStoreHello, "", "anything", 0}, &data, &changed),
            EncodeStoreReply(kStoreOk, ""));
  EXPECT_FALSE(changed);
  EXPECT_TRUE(data.empty());
}

TEST(TcpStoreWireTest, SecretsCompareByEveryByte) {
  EXPECT_TRUE(StoreSecretsEqual("", ""));
  EXPECT_TRUE(StoreSecretsEqual("abc", "abc"));
  EXPECT_FALSE(StoreSecretsEqual("abc", "abd"));
  EXPECT_FALSE(StoreSecretsEqual("abc", "xbc"));
  EXPECT_FALSE(StoreSecretsEqual("abc", "ab"));
  EXPECT_FALSE(StoreSecretsEqual(std::string("a\0", 2), std::string("a\1", 2)));
}

}  // namespace
}  // namespace comm
}  // namespace dattn
