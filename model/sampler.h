// The deterministic sampler: batches of (input, target) windows cut from a range of a corpus, in
// an order fixed by a seed, with a cursor that a checkpoint saves so that a resumed run sees
// exactly the batches an uninterrupted run would have seen.
//
// Windows. A window is seq_len + 1 consecutive tokens starting at s: its inputs are tokens [s,
// s + N) and its targets tokens [s + 1, s + N + 1) (N = seq_len). In epoch e the range [begin,
// end) is cut into W_e = floor((end - begin - 1 - o_e) / N) windows starting at begin + o_e + N*k
// (k = 0 .. W_e - 1), which share their boundary token, so every token of the cut is a target
// once per epoch. With shuffle, o_e = HashPair(seed, e) mod N (a new alignment each epoch, so a
// small corpus with a long N is not always cut at the same places; 0 when that leaves no window)
// and the windows are visited in the order of a seeded permutation of [0, W_e): a 6-round
// Feistel network on the smallest even number of bits that covers W_e, round keys
// HashPair(HashPair(HashPair(seed, e), 0x5eed), round), round function Mix64(right ^ key), walked
// until the value falls below W_e (cycle walking).
// It needs no memory and no state beyond (seed, epoch, position). Without shuffle (validation),
// o_e = 0 and windows come in corpus order.
//
// Batches. Global batch b is the next batch_size windows of this order: when an epoch runs out in
// the middle of a batch, the rest comes from the next epoch. A data-parallel run of R ranks calls
// Next on every rank with its rank r: rank r receives rows [r*B/R, (r+1)*B/R) of the same global
// batch (B must be a multiple of R), so the ranks' shares are disjoint and together are the batch
// a single process would have seen. Every rank's cursor advances by the whole global batch.
//
// Cursor. (epoch, position): the next window is number `position` of epoch `epoch`'s order. It
// also records what it was made for (seed, seq_len, batch_size, range), and Restore refuses a
// cursor of another sampler (INVALID_ARGUMENT naming the field), since its positions would mean
// other windows.
//
// Threads: a sampler is used by one thread at a time (Next advances the cursor). The corpus it
// reads may be shared.
#ifndef DATTN_MODEL_SAMPLER_H_
#define DATTN_MODEL_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/corpus.h"
#include "model/ignore_target.h"

namespace dattn {
namespace model {

// Rows of (input, target) sequences, row-major.
struct Batch {
  int64_t rows = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> inputs;   // rows * seq_len token ids.
  std::vector<int32_t> targets;  // rows * seq_len: the next token, or kIgnoreTarget.
  std::vector<int64_t> starts;   // Per row: the corpus position of its first input token.
  int64_t first_row = 0;         // Index of row 0 within the global batch (rank r's share).
  int64_t scored() const;        // Targets that are not kIgnoreTarget.
};

struct SamplerOptions {
  int64_t seq_len = 0;     // N >= 1.
  int64_t batch_size = 0;  // B >= 1: rows of a global batch.
  uint64_t seed = 0;
  bool shuffle = true;  // false: corpus order, no offset (for validation passes).
};

struct SamplerCursor {
  // What the cursor belongs to.
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t seq_len = 0;
  int64_t batch_size = 0;
  int64_t range_begin = 0;
  int64_t range_end = 0;
  // Where it is.
  int64_t epoch = 0;
  int64_t position = 0;  // Windows of `epoch` already handed out.
  int64_t batches = 0;   // Global batches handed out since the start.

  bool operator==(const SamplerCursor& o) const;
};

class WindowSampler {
 public:
  // INVALID_ARGUMENT naming the value for seq_len < 1, batch_size < 1, a range outside the
  // corpus, or a range holding fewer than seq_len + 1 tokens. The sampler keeps a copy of the
  // corpus handle (it shares the files).
  static absl::StatusOr<WindowSampler> Create(TokenCorpus corpus, TokenRange range,
                                              const SamplerOptions& options);

  // Fills `batch` with rank `rank`'s share of the next global batch (see above) and advances the
  // cursor by one global batch. INVALID_ARGUMENT for world < 1, rank outside [0, world), or a
  // batch_size that world does not divide; errors from the corpus's Read. On any error the cursor
  // does not move.
  absl::Status Next(Batch* batch, int rank = 0, int world = 1);

  const SamplerCursor& cursor() const { return cursor_; }
  // Continues from a saved cursor; see above for what is refused.
  absl::Status Restore(const SamplerCursor& cursor);

  // Windows in epoch `epoch` (>= 1 for every epoch), and where window `position` of its order
  // starts in the corpus. For tests and diagnostics.
  int64_t WindowsInEpoch(int64_t epoch) const;
  int64_t WindowStart(int64_t epoch, int64_t position) const;

 private:
  WindowSampler() = default;
  int64_t EpochOffset(int64_t epoch) const;
  TokenCorpus corpus_;
  TokenRange range_;
  SamplerOptions options_;
  SamplerCursor cursor_;
};

// A seeded bijection on [0, n): the Feistel permutation described above. n >= 1.
class FeistelPermutation {
 public:
  FeistelPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t index) const;

 private:
  uint64_t Encrypt(uint64_t x) const;
  uint64_t n_ = 1;
  int half_bits_ = 1;
  uint64_t mask_ = 1;
  uint64_t keys_[6] = {};
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_SAMPLER_H_
