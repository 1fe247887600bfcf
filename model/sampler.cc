#include "model/sampler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "model/rng.h"

namespace dattn {
namespace model {

int64_t Batch::scored() const {
  int64_t n = 0;
  for (int32_t t : targets) n += t != kIgnoreTarget;
  return n;
}

bool SamplerCursor::operator==(const SamplerCursor& o) const {
  return seed == o.seed && shuffle == o.shuffle && seq_len == o.seq_len &&
         batch_size == o.batch_size && range_begin == o.range_begin && range_end == o.range_end &&
         epoch == o.epoch && position == o.position && batches == o.batches;
}

FeistelPermutation::FeistelPermutation(uint64_t n, uint64_t key) : n_(n < 1 ? 1 : n) {
  // The smallest h >= 1 with 4^h >= n.
  half_bits_ = 1;
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
  mask_ = (uint64_t{1} << half_bits_) - 1;
  for (int r = 0; r < 6; ++r) keys_[r] = HashPair(key, static_cast<uint64_t>(r));
}

uint64_t FeistelPermutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & mask_;
  for (uint64_t k : keys_) {
    const uint64_t next = left ^ (Mix64(right ^ k) & mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t FeistelPermutation::operator()(uint64_t index) const {
  // Encrypt permutes [0, 4^h); walking its cycle from index < n_ reaches a value < n_ again.
  uint64_t x = Encrypt(index);
  while (x >= n_) x = Encrypt(x);
  return x;
}

absl::StatusOr<WindowSampler> WindowSampler::Create(TokenCorpus corpus, TokenRange range,
                                                    const SamplerOptions& options) {
  if (options.seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len = ", options.seq_len, ": need >= 1"));
  }
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size = ", options.batch_size, ": need >= 1"));
  }
  if (range.begin < 0 || range.end < range.begin || range.end > corpus.size()) {
    return absl::InvalidArgumentError(absl::StrCat("token range [", range.begin, ", ", range.end,
                                                   ") is not inside the corpus's [0, ",
                                                   corpus.size(), ")"));
  }
  if (range.size() < options.seq_len + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("token range [", range.begin, ", ", range.end, ") holds ", range.size(),
                     " tokens, fewer than one window of seq_len + 1 = ", options.seq_len + 1));
  }
  WindowSampler s;
  s.corpus_ = std::move(corpus);
  s.range_ = range;
  s.options_ = options;
  s.cursor_.seed = options.seed;
  s.cursor_.shuffle = options.shuffle;
  s.cursor_.seq_len = options.seq_len;
  s.cursor_.batch_size = options.batch_size;
  s.cursor_.range_begin = range.begin;
  s.cursor_.range_end = range.end;
  return s;
}

int64_t WindowSampler::EpochOffset(int64_t epoch) const {
  if (!options_.shuffle) return 0;
  const int64_t n = options_.seq_len;
  const int64_t offset = static_cast<int64_t>(
      HashPair(options_.seed, static_cast<uint64_t>(epoch)) % static_cast<uint64_t>(n));
  if ((range_.size() - 1 - offset) / n < 1) return 0;
  return offset;
}

int64_t WindowSampler::WindowsInEpoch(int64_t epoch) const {
  return (range_.size() - 1 - EpochOffset(epoch)) / options_.seq_len;
}

int64_t WindowSampler::WindowStart(int64_t epoch, int64_t position) const {
  int64_t k = position;
  if (options_.shuffle) {
    const uint64_t key = HashPair(HashPair(options_.seed, static_cast<uint64_t>(epoch)), 0x5eed);
    FeistelPermutation perm(static_cast<uint64_t>(WindowsInEpoch(epoch)), key);
    k = static_cast<int64_t>(perm(static_cast<uint64_t>(position)));
  }
  return range_.begin + EpochOffset(epoch) + options_.seq_len * k;
}

absl::Status WindowSampler::Next(Batch* batch, int rank, int world) {
  if (batch == nullptr) return absl::InvalidArgumentError("WindowSampler::Next: null batch");
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of world ", world, ": need 0 <= rank < world"));
  }
  const int64_t b = options_.batch_size;
  if (b % world != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size ", b, " is not a multiple of the world size ", world));
  }
  const int64_t n = options_.seq_len;
  const int64_t rows = b / world;
  const int64_t first = rows * rank;

  // Walk the global batch's positions; keep this rank's rows.
  int64_t epoch = cursor_.epoch;
  int64_t position = cursor_.position;
  int64_t in_epoch = WindowsInEpoch(epoch);
  std::vector<int64_t> starts;
  starts.reserve(static_cast<size_t>(rows));
  for (int64_t row = 0; row < b; ++row) {
    if (position >= in_epoch) {
      ++epoch;
      position = 0;
      in_epoch = WindowsInEpoch(epoch);
    }
    if (row >= first && row < first + rows) starts.push_back(WindowStart(epoch, position));
    ++position;
  }

  Batch out;
  out.rows = rows;
  out.seq_len = n;
  out.first_row = first;
  out.inputs.resize(static_cast<size_t>(rows * n));
  out.targets.resize(static_cast<size_t>(rows * n));
  std::vector<int32_t> window(static_cast<size_t>(n + 1));
  for (int64_t r = 0; r < rows; ++r) {
    if (absl::Status s = corpus_.Read(starts[r], absl::MakeSpan(window)); !s.ok()) return s;
    std::copy(window.begin(), window.end() - 1, out.inputs.begin() + r * n);
    std::copy(window.begin() + 1, window.end(), out.targets.begin() + r * n);
  }
  out.starts = std::move(starts);
  *batch = std::move(out);
  if (position >= in_epoch) {  // Normalize: an exhausted epoch is the start of the next one.
    ++epoch;
    position = 0;
  }
  cursor_.epoch = epoch;
  cursor_.position = position;
  ++cursor_.batches;
  return absl::OkStatus();
}

absl::Status WindowSampler::Restore(const SamplerCursor& c) {
  auto mismatch = [](const char* field, auto saved, auto mine) {
    return absl::InvalidArgumentError(absl::StrCat("sampler cursor was saved with ", field, " = ",
                                                   saved, ", this sampler has ", mine));
  };
  if (c.seed != cursor_.seed) return mismatch("seed", c.seed, cursor_.seed);
  if (c.shuffle != cursor_.shuffle) return mismatch("shuffle", c.shuffle, cursor_.shuffle);
  if (c.seq_len != cursor_.seq_len) return mismatch("seq_len", c.seq_len, cursor_.seq_len);
  if (c.batch_size != cursor_.batch_size) {
    return mismatch("batch_size", c.batch_size, cursor_.batch_size);
  }
  if (c.range_begin != cursor_.range_begin || c.range_end != cursor_.range_end) {
    return mismatch("range", absl::StrCat("[", c.range_begin, ", ", c.range_end, ")"),
                    absl::StrCat("[", cursor_.range_begin, ", ", cursor_.range_end, ")"));
  }
  if (c.epoch < 0 || c.position < 0 || c.batches < 0 || c.position >= WindowsInEpoch(c.epoch)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler cursor epoch ", c.epoch, ", position ", c.position, ", batches ",
                     c.batches, ": not a position of this sampler (epoch ", c.epoch, " has ",
                     c.epoch >= 0 ? WindowsInEpoch(c.epoch) : 0, " windows)"));
  }
  cursor_ = c;
  return absl::OkStatus();
}

}  // namespace model
}  // namespace dattn
