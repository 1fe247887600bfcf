// Fuzzes the relay of JobService.Attend (server/attend_relay.h), the decoding of a caller's tensor
// chunks: the input is a problem (B, N, H, D, element size, ring size, backward) and a sequence of
// chunks (tensor, offset, length) as a client might send them, in any order, of any size. Every
// chunk is either taken or refused with INVALID_ARGUMENT, never anything else; whatever was taken
// is exactly what each rank reads back (its positions of every batch row, in order); and once the
// inputs are whole, every rank's shard sent back as its outputs comes out to the caller as the
// whole tensors, byte for byte.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "server/attend_relay.h"

namespace {

using dattn::server::AttendSession;
using dattn::server::AttendShape;
namespace v1 = dattn::v1;

void CheckAt(bool ok, int line) {
  if (!ok) {
    std::fprintf(stderr, "attend_relay_fuzz: check at line %d failed\n", line);
    __builtin_trap();
  }
}
#define Check(ok) CheckAt((ok), __LINE__)

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  uint32_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint32_t Small(uint32_t bound) { return Byte() % bound; }
  int64_t Varint() {
    int64_t v = 0;
    for (int shift = 0; shift < 21 && !empty(); shift += 7) {
      const uint32_t b = Byte();
      v |= static_cast<int64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
    }
    return v;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// Byte i of input tensor t as the harness sends it.
char Pattern(int t, int64_t i) { return static_cast<char>((t * 73 + i * 13 + (i >> 8)) & 0xff); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  AttendShape shape;
  shape.num_ranks = 1 + static_cast<int>(in.Small(4));
  shape.batch = 1 + in.Small(3);
  shape.seq_len = shape.num_ranks * (1 + in.Small(6));
  shape.num_heads = 1 + in.Small(3);
  shape.head_dim = 1 + in.Small(4);
  shape.element_bytes = int64_t{1} << in.Small(4);
  shape.backward = in.Small(2) == 1;
  AttendSession session(shape);
  const int64_t bytes = shape.tensor_bytes();
  std::vector<int64_t> sent(4, 0);  // Bytes of each input taken.
  auto never = [] { return false; };
  while (!in.empty()) {
    const uint32_t op = in.Small(4);
    v1::AttendChunk chunk;
    if (op == 0) {
      // The next chunk a well-behaved client sends.
      int t = 0;
      while (t < shape.num_inputs() && sent[t] == bytes) ++t;
      if (t == shape.num_inputs()) break;
      const int64_t length = std::min<int64_t>(bytes - sent[t], 1 + in.Varint() % (bytes + 1));
      chunk.set_tensor(static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_Q + t));
      chunk.set_offset(sent[t]);
      for (int64_t i = 0; i < length; ++i) chunk.mutable_data()->push_back(Pattern(t, sent[t] + i));
    } else {
      // Anything: another tensor, offset or length.
      chunk.set_tensor(static_cast<v1::AttendTensor>(in.Small(10)));
      chunk.set_offset(in.Varint() - (op == 1 ? 8 : 0));
      const int64_t length = in.Varint() % (2 * bytes + 2);
      for (int64_t i = 0; i < length; ++i) chunk.mutable_data()->push_back('x');
    }
    const int t = chunk.tensor() - v1::ATTEND_TENSOR_Q;
    const bool good = t >= 0 && t < shape.num_inputs() && chunk.offset() == sent[t] &&
                      (t == 0 || sent[t - 1] == bytes) && !chunk.data().empty() &&
                      chunk.offset() + static_cast<int64_t>(chunk.data().size()) <= bytes;
    const absl::Status s = session.PushInput(chunk, never);
    // Taken exactly when a careful reader of the protocol would take it; refused as bad input.
    Check(s.ok() == good);
    Check(s.ok() || absl::IsInvalidArgument(s));
    if (s.ok()) {
      // A "good" chunk of junk would break the byte check below: only well-behaved chunks carry
      // the pattern, and a taken junk chunk is replaced in the shadow by what it carried.
      if (op != 0) return 0;
      sent[t] += static_cast<int64_t>(chunk.data().size());
    }
  }
  const bool whole = session.InputsComplete();
  Check(session.FinishInputs().ok() == whole);
  // Each rank reads what it was given: its positions, in order, of the tensors taken so far.
  const int64_t slab = shape.slab_bytes();
  const int64_t batch_bytes = shape.seq_len * shape.row_bytes();
  std::vector<std::vector<std::string>> shards(shape.num_ranks,
                                               std::vector<std::string>(shape.num_inputs()));
  for (int r = 0; r < shape.num_ranks; ++r) {
    const absl::Status s = session.ReadInput(
        r,
        [&](const v1::AttendChunk& c) {
          std::string& shard = shards[r][c.tensor() - v1::ATTEND_TENSOR_Q];
          Check(c.offset() == static_cast<int64_t>(shard.size()));
          shard += c.data();
          return true;
        },
        [] { return true; });  // Stop once its queue is empty.
    // OK once the rank has all its inputs (possibly before the others have theirs), else
    // CANCELLED when its queue ran dry; its bytes are checked below either way.
    Check(s.ok() || (!whole && absl::IsCancelled(s)));
  }
  for (int r = 0; r < shape.num_ranks; ++r) {
    for (int t = 0; t < shape.num_inputs(); ++t) {
      std::string want;
      for (int64_t b = 0; b < shape.batch; ++b) {
        for (int64_t i = b * batch_bytes + r * slab; i < b * batch_bytes + (r + 1) * slab; ++i) {
          if (i < sent[t]) want.push_back(Pattern(t, i));
        }
      }
      Check(shards[r][t] == want);
    }
  }
  Check(session.buffered_bytes() == 0);
  if (!whole) return 0;
  // The outputs: each rank sends its inputs back (out = q, dq = k, ...); the caller gets them
  // whole.
  for (int r = 0; r < shape.num_ranks; ++r) {
    for (int t = 0; t < shape.num_outputs(); ++t) {
      const std::string& shard = shards[r][t];
      for (size_t at = 0; at < shard.size(); at += 5) {
        Check(session
                  .PushOutput(r, static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_OUT + t),
                              static_cast<int64_t>(at), shard.substr(at, 5), never)
                  .ok());
      }
    }
  }
  std::vector<std::string> got(shape.num_outputs());
  for (;;) {
    v1::AttendChunk c;
    const absl::Status s = session.NextOutput(&c, absl::InfiniteFuture(), [] { return true; });
    if (absl::IsNotFound(s)) break;
    Check(s.ok());
    std::string& out = got[c.tensor() - v1::ATTEND_TENSOR_OUT];
    Check(c.offset() == static_cast<int64_t>(out.size()));
    out += c.data();
  }
  for (int t = 0; t < shape.num_outputs(); ++t) {
    Check(static_cast<int64_t>(got[t].size()) == bytes);
    for (int64_t i = 0; i < bytes; ++i) Check(got[t][i] == Pattern(t, i));
  }
  Check(session.OutputsDone() && session.buffered_bytes() == 0);
  return 0;
}
