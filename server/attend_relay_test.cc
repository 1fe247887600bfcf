#include "server/attend_relay.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace server {
namespace {

using ::testing::HasSubstr;

// Byte i of tensor t of the whole problem: a pattern that tells every byte apart.
char Byte(int t, int64_t i) { return static_cast<char>((t * 131 + i * 7 + i / 251) & 0xff); }

std::string Bytes(int t, int64_t begin, int64_t end) {
  std::string s;
  for (int64_t i = begin; i < end; ++i) s.push_back(Byte(t, i));
  return s;
}

v1::AttendChunk Chunk(v1::AttendTensor tensor, int64_t offset, std::string data) {
  v1::AttendChunk c;
  c.set_tensor(tensor);
  c.set_offset(offset);
  c.set_data(std::move(data));
  return c;
}

AttendShape Shape(int64_t b, int64_t n, int ranks, bool backward) {
  AttendShape s;
  s.batch = b;
  s.seq_len = n;
  s.num_heads = 2;
  s.head_dim = 3;
  s.element_bytes = 4;
  s.num_ranks = ranks;
  s.backward = backward;
  return s;
}

// The whole flow with `ranks` ranks: the caller sends every input in chunks of `chunk` bytes, each
// rank reads its shard and checks it is its positions of every tensor, sends the shard back as
// its outputs (out = its q, dq = k, ...), and the caller gets every output tensor whole and in
// order: what it sent.
void RoundTrip(int64_t batch, int64_t n, int ranks, bool backward, int64_t chunk) {
  const AttendShape shape = Shape(batch, n, ranks, backward);
  AttendSession session(shape);
  const int64_t tensor_bytes = shape.tensor_bytes();
  const int64_t slab = shape.slab_bytes();
  const int64_t batch_bytes = n * shape.row_bytes();
  std::vector<std::string> shards(static_cast<size_t>(ranks * shape.num_inputs()));
  std::vector<std::thread> workers;
  for (int r = 0; r < ranks; ++r) {
    workers.emplace_back([&, r] {
      std::vector<std::string> mine(static_cast<size_t>(shape.num_inputs()),
                                    std::string(static_cast<size_t>(shape.shard_bytes()), '\0'));
      ASSERT_TRUE(session
                      .ReadInput(
                          r,
                          [&](const v1::AttendChunk& c) {
                            const int t = c.tensor() - v1::ATTEND_TENSOR_Q;
                            mine[static_cast<size_t>(t)].replace(static_cast<size_t>(c.offset()),
                                                                 c.data().size(), c.data());
                            return true;
                          },
                          nullptr)
                      .ok());
      for (int t = 0; t < shape.num_outputs(); ++t) {
        const std::string& shard = mine[static_cast<size_t>(t)];
        for (int64_t at = 0; at < shape.shard_bytes(); at += 1000) {
          const int64_t len = std::min<int64_t>(1000, shape.shard_bytes() - at);
          ASSERT_TRUE(session
                          .PushOutput(r, static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_OUT + t),
                                      at, shard.substr(static_cast<size_t>(at), len), nullptr)
                          .ok());
        }
      }
      for (int t = 0; t < shape.num_inputs(); ++t) {
        shards[static_cast<size_t>(r * shape.num_inputs() + t)] = mine[static_cast<size_t>(t)];
      }
    });
  }
  std::thread caller([&] {
    for (int t = 0; t < shape.num_inputs(); ++t) {
      for (int64_t at = 0; at < tensor_bytes; at += chunk) {
        const int64_t end = std::min(tensor_bytes, at + chunk);
        ASSERT_TRUE(session
                        .PushInput(Chunk(static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_Q + t), at,
                                         Bytes(t, at, end)),
                                   nullptr)
                        .ok());
      }
    }
    EXPECT_TRUE(session.FinishInputs().ok());
  });
  std::vector<std::string> got(static_cast<size_t>(shape.num_outputs()));
  for (;;) {
    v1::AttendChunk c;
    absl::Status s = session.NextOutput(&c, absl::Now() + absl::Seconds(30), nullptr);
    if (absl::IsNotFound(s)) break;
    ASSERT_TRUE(s.ok()) << s;
    const int t = c.tensor() - v1::ATTEND_TENSOR_OUT;
    ASSERT_EQ(c.offset(), static_cast<int64_t>(got[static_cast<size_t>(t)].size()));
    got[static_cast<size_t>(t)] += c.data();
  }
  caller.join();
  for (std::thread& w : workers) w.join();
  EXPECT_TRUE(session.OutputsDone());
  EXPECT_EQ(session.buffered_bytes(), 0);
  for (int t = 0; t < shape.num_outputs(); ++t) {
    EXPECT_EQ(got[static_cast<size_t>(t)], Bytes(t, 0, tensor_bytes)) << "output " << t;
  }
  // Each rank got exactly its positions of every batch row.
  for (int r = 0; r < ranks; ++r) {
    for (int t = 0; t < shape.num_inputs(); ++t) {
      std::string want;
      for (int64_t b = 0; b < batch; ++b) {
        want += Bytes(t, b * batch_bytes + r * slab, b * batch_bytes + (r + 1) * slab);
      }
      EXPECT_EQ(shards[static_cast<size_t>(r * shape.num_inputs() + t)], want)
          << "rank " << r << " input " << t;
    }
  }
}

TEST(AttendSessionTest, OneRankForward) { RoundTrip(1, 8, 1, false, 50); }
TEST(AttendSessionTest, RanksGetTheirPositionsOfEveryBatchRow) { RoundTrip(3, 12, 4, true, 77); }
TEST(AttendSessionTest, ChunksLargerThanASlabAreCut) { RoundTrip(2, 16, 2, false, 1000); }

// More than kBufferBytes in flight: a rank that reads late blocks the caller (bounded memory), and
// everything still arrives once it reads.
TEST(AttendSessionTest, QueuesAreBoundedAndTheSlowRankCatchesUp) {
  AttendShape shape;
  shape.batch = 1;
  shape.seq_len = 64;
  shape.num_heads = 1;
  shape.head_dim = (int64_t{2} << 20) / 4;  // 2 MiB a row: 128 MiB a tensor.
  shape.element_bytes = 4;
  shape.num_ranks = 2;
  AttendSession session(shape);
  std::atomic<int64_t> peak{0};
  std::atomic<bool> rank1_may_read{false};
  std::thread caller([&] {
    const std::string data(static_cast<size_t>(4 << 20), 'x');
    for (int t = 0; t < 3; ++t) {
      for (int64_t at = 0; at < shape.tensor_bytes(); at += 4 << 20) {
        ASSERT_TRUE(
            session
                .PushInput(Chunk(static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_Q + t), at, data),
                           nullptr)
                .ok());
        peak = std::max<int64_t>(peak, session.buffered_bytes());
      }
    }
  });
  auto reader = [&](int r) {
    int64_t bytes = 0;
    EXPECT_TRUE(session
                    .ReadInput(
                        r,
                        [&](const v1::AttendChunk& c) {
                          bytes += static_cast<int64_t>(c.data().size());
                          return true;
                        },
                        nullptr)
                    .ok());
    EXPECT_EQ(bytes, 3 * shape.shard_bytes());
  };
  std::thread rank0(reader, 0);
  absl::SleepFor(absl::Milliseconds(300));
  // Rank 1 has not read: the caller is blocked with at most the buffer in flight.
  EXPECT_LE(session.buffered_bytes(), AttendSession::kBufferBytes + (4 << 20));
  rank1_may_read = true;
  std::thread rank1(reader, 1);
  caller.join();
  rank0.join();
  rank1.join();
  EXPECT_LE(peak.load(), AttendSession::kBufferBytes + (4 << 20));
}

TEST(AttendSessionTest, BadChunksNameTheTensorAndTheValue) {
  AttendSession session(Shape(1, 4, 2, false));
  const int64_t bytes = session.shape().tensor_bytes();  // 4 x 2 x 3 x 4 = 96
  absl::Status s = session.PushInput(Chunk(v1::ATTEND_TENSOR_K, 0, "abcd"), nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("expected q"));
  s = session.PushInput(Chunk(v1::ATTEND_TENSOR_Q, 8, "abcd"), nullptr);
  EXPECT_THAT(s.message(), HasSubstr("offset 8, expected 0"));
  s = session.PushInput(Chunk(v1::ATTEND_TENSOR_Q, 0, ""), nullptr);
  EXPECT_THAT(s.message(), HasSubstr("0 bytes"));
  s = session.PushInput(Chunk(v1::ATTEND_TENSOR_Q, 0, std::string(bytes + 1, 'x')), nullptr);
  EXPECT_THAT(s.message(), HasSubstr("ends past the tensor's 96 bytes"));
  ASSERT_TRUE(
      session.PushInput(Chunk(v1::ATTEND_TENSOR_Q, 0, std::string(bytes, 'x')), nullptr).ok());
  ASSERT_TRUE(session.PushInput(Chunk(v1::ATTEND_TENSOR_K, 0, std::string(10, 'x')), nullptr).ok());
  s = session.FinishInputs();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("k incomplete: 10 of its 96 bytes"));
  // Outputs: another tensor or offset than the rank's next.
  s = session.PushOutput(0, v1::ATTEND_TENSOR_DQ, 0, "ab", nullptr);
  EXPECT_THAT(s.message(), HasSubstr("expected out at offset 0"));
  s = session.PushOutput(1, v1::ATTEND_TENSOR_OUT, 4, "ab", nullptr);
  EXPECT_THAT(s.message(), HasSubstr("expected out at offset 0"));
}

TEST(AttendSessionTest, CloseWakesEveryoneWithItsStatus) {
  AttendSession session(Shape(1, 4, 2, false));
  std::thread rank([&] {
    absl::Status s = session.ReadInput(
        1, [](const v1::AttendChunk&) { return true; }, nullptr);
    EXPECT_TRUE(absl::IsCancelled(s));
    EXPECT_THAT(s.message(), HasSubstr("client went away"));
  });
  std::thread caller([&] {
    v1::AttendChunk c;
    absl::Status s = session.NextOutput(&c, absl::InfiniteFuture(), nullptr);
    EXPECT_TRUE(absl::IsCancelled(s));
  });
  absl::SleepFor(absl::Milliseconds(50));
  session.Close(absl::CancelledError("the client went away"));
  rank.join();
  caller.join();
  EXPECT_TRUE(absl::IsCancelled(session.PushInput(Chunk(v1::ATTEND_TENSOR_Q, 0, "a"), nullptr)));
  EXPECT_EQ(session.buffered_bytes(), 0);
  // A rank's inputs are read once.
  AttendSession other(Shape(1, 4, 1, false));
  std::atomic<bool> stop{false};
  std::thread first([&] {
    (void)other.ReadInput(
        0, [](const v1::AttendChunk&) { return true; }, [&] { return stop.load(); });
  });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsFailedPrecondition(other.ReadInput(
      0, [](const v1::AttendChunk&) { return true; }, nullptr)));
  stop = true;
  first.join();
}

TEST(AttendSessionTest, CancelledCallersReturnAndDeadlinesBoundTheWait) {
  AttendSession session(Shape(1, 4, 1, false));
  v1::AttendChunk c;
  absl::Status s = session.NextOutput(&c, absl::Now() + absl::Milliseconds(30), nullptr);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s));
  s = session.NextOutput(&c, absl::InfiniteFuture(), [] { return true; });
  EXPECT_TRUE(absl::IsCancelled(s));
}

TEST(AttendSessionTest, SharedMemoryCallsRelayNothing) {
  AttendShape shape = Shape(1, 8, 2, true);
  shape.shared_memory = true;
  AttendSession session(shape);
  EXPECT_TRUE(session.InputsComplete());
  EXPECT_TRUE(session.FinishInputs().ok());
  EXPECT_TRUE(session.OutputsDone());
  v1::AttendChunk chunk;
  EXPECT_TRUE(absl::IsNotFound(session.NextOutput(&chunk, absl::InfiniteFuture(), nullptr)));
  absl::Status read = session.ReadInput(
      0, [](const v1::AttendChunk&) { return true; }, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(read)) << read;
  EXPECT_THAT(read.message(), HasSubstr("shared memory"));
  absl::Status pushed = session.PushOutput(1, v1::ATTEND_TENSOR_OUT, 0, "abcd", nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(pushed)) << pushed;
  EXPECT_EQ(session.peak_buffered_bytes(), 0);
}

TEST(AttendRelayTest, FindsSessionsByJob) {
  AttendRelay relay;
  auto session = std::make_shared<AttendSession>(Shape(1, 4, 1, false));
  relay.Add("j-1", session);
  EXPECT_EQ(relay.Find("j-1"), session);
  EXPECT_EQ(relay.Find("j-2"), nullptr);
  EXPECT_EQ(relay.size(), 1);
  relay.Remove("j-1");
  EXPECT_EQ(relay.Find("j-1"), nullptr);
}

}  // namespace
}  // namespace server
}  // namespace dattn
