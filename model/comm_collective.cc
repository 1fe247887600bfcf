#include "model/comm_collective.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace model {
namespace {

using comm::P2POp;
using comm::Stream;

absl::Status Prefixed(const absl::Status& s, const char* call) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(call, ": ", s.message()));
}

class CommunicatorCollective final : public TrainerCollective {
 public:
  CommunicatorCollective(comm::Communicator* comm, const CommCollectiveOptions& options)
      : comm_(comm), options_(options) {}

  int rank() const override { return comm_->rank(); }
  int world() const override { return comm_->size(); }

  absl::Status ReduceScatterGradients(float* grads, int64_t n,
                                      absl::Span<const ShardRange> shards) override {
    constexpr char kCall[] = "ReduceScatterGradients";
    if (absl::Status s = Check(kCall, grads, n, shards); !s.ok()) return s;
    const int w = world();
    const int me = rank();
    if (w == 1) return absl::OkStatus();
    int64_t largest = 0;
    for (const ShardRange& s : shards) largest = std::max(largest, s.size());
    const int64_t budget = std::max<int64_t>(options_.max_temp_bytes, 0) / 4 / w;
    const int64_t chunk = std::max<int64_t>(1, std::min(largest, std::max<int64_t>(1024, budget)));
    const ShardRange mine = shards[static_cast<size_t>(me)];
    const int64_t my_chunk = std::min(chunk, mine.size());
    // Slot p holds peer p's copy of this chunk of my shard (slot me is unused: my copy is in
    // grads); acc accumulates the sum.
    std::vector<float> received(static_cast<size_t>(w) * static_cast<size_t>(my_chunk));
    std::vector<float> acc(static_cast<size_t>(my_chunk));
    const int64_t rounds = largest == 0 ? 0 : (largest + chunk - 1) / chunk;
    std::vector<P2POp> ops;
    std::vector<const float*> sources(static_cast<size_t>(w));
    auto slot = [&](int p) { return received.data() + static_cast<size_t>(p) * my_chunk; };
    for (int64_t round = 0; round < rounds; ++round) {
      const int64_t lo = mine.begin + round * chunk;
      const int64_t len = ReduceScatterRoundOps(grads, shards, me, round, chunk, slot, &ops);
      if (!ops.empty()) {
        if (absl::Status s = Exchange(ops); !s.ok()) return Prefixed(s, kCall);
      }
      if (len == 0) continue;
      for (int p = 0; p < w; ++p) sources[static_cast<size_t>(p)] = p == me ? grads + lo : slot(p);
      // The documented order: ((g_0 + g_1) + g_2) + ... in fp32, element by element.
      std::memcpy(acc.data(), sources[0], static_cast<size_t>(len) * sizeof(float));
      for (int p = 1; p < w; ++p) {
        const float* src = sources[static_cast<size_t>(p)];
        for (int64_t i = 0; i < len; ++i) acc[static_cast<size_t>(i)] += src[i];
      }
      std::memcpy(grads + lo, acc.data(), static_cast<size_t>(len) * sizeof(float));
    }
    return absl::OkStatus();
  }

  absl::Status AllGatherParameters(float* params, int64_t n,
                                   absl::Span<const ShardRange> shards) override {
    constexpr char kCall[] = "AllGatherParameters";
    if (absl::Status s = Check(kCall, params, n, shards); !s.ok()) return s;
    const int w = world();
    const int me = rank();
    if (w == 1) return absl::OkStatus();
    const std::vector<P2POp> ops = AllGatherShardOps(params, shards, me);
    if (ops.empty()) return absl::OkStatus();
    return Prefixed(Exchange(ops), kCall);
  }

  absl::StatusOr<std::vector<double>> AllGather(absl::Span<const double> values) override {
    if (absl::Status s = HostOnly("AllGather"); !s.ok()) return s;
    const int64_t k = static_cast<int64_t>(values.size());
    std::vector<double> out(static_cast<size_t>(k) * static_cast<size_t>(world()));
    if (k == 0) return out;
    absl::Status s = comm_->AllGather(values.data(), out.data(), k, DType::kFloat64, Stream{});
    if (!s.ok()) return Prefixed(s, "AllGather");
    return out;
  }

  absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string& bytes) override {
    constexpr char kCall[] = "AllGatherBytes";
    if (absl::Status s = HostOnly(kCall); !s.ok()) return s;
    return AllGatherBytesAsWords(
        bytes, world(), [this, &kCall](const double* send, int64_t k, double* out) {
          return Prefixed(comm_->AllGather(send, out, k, DType::kFloat64, Stream{}), kCall);
        });
  }

  absl::Status Barrier() override {
    if (absl::Status s = HostOnly("Barrier"); !s.ok()) return s;
    return Prefixed(comm_->Barrier(), "Barrier");
  }

 private:
  absl::Status HostOnly(const char* call) const {
    if (comm_->device() != Device::kCpu) {
      return absl::FailedPreconditionError(absl::StrCat(
          call, ": the communicator collective works on host memory; this ", comm_->name(),
          " communicator's buffers are on ", DeviceName(comm_->device())));
    }
    return absl::OkStatus();
  }

  absl::Status Check(const char* call, const float* buffer, int64_t n,
                     absl::Span<const ShardRange> shards) const {
    if (absl::Status s = HostOnly(call); !s.ok()) return s;
    return CheckShardArguments(call, buffer, n, shards, world());
  }

  absl::Status Exchange(const std::vector<P2POp>& ops) {
    absl::StatusOr<std::unique_ptr<comm::Work>> work = comm_->StartGroup(ops, Stream{});
    if (!work.ok()) return work.status();
    return (*work)->Wait(Stream{});
  }

  comm::Communicator* const comm_;
  const CommCollectiveOptions options_;
};

}  // namespace

int64_t ReduceScatterRoundOps(float* buffer, absl::Span<const ShardRange> parts, int me,
                              int64_t round, int64_t chunk,
                              const std::function<float*(int peer)>& slot,
                              std::vector<comm::P2POp>* ops) {
  ops->clear();
  const ShardRange mine = parts[static_cast<size_t>(me)];
  const int64_t lo = mine.begin + round * chunk;
  const int64_t len = std::max<int64_t>(0, std::min(mine.end, lo + chunk) - lo);
  for (int p = 0; p < static_cast<int>(parts.size()); ++p) {
    if (p == me) continue;
    const ShardRange& theirs = parts[static_cast<size_t>(p)];
    const int64_t their_lo = theirs.begin + round * chunk;
    const int64_t their_len = std::min(theirs.end, their_lo + chunk) - their_lo;
    if (their_len > 0) {
      ops->push_back(comm::P2POp::Send(p, buffer + their_lo, their_len, DType::kFloat32));
    }
    if (len > 0) ops->push_back(comm::P2POp::Recv(p, slot(p), len, DType::kFloat32));
  }
  return len;
}

std::vector<comm::P2POp> AllGatherShardOps(float* buffer, absl::Span<const ShardRange> shards,
                                           int me) {
  const ShardRange mine = shards[static_cast<size_t>(me)];
  std::vector<comm::P2POp> ops;
  for (int p = 0; p < static_cast<int>(shards.size()); ++p) {
    if (p == me) continue;
    const ShardRange& theirs = shards[static_cast<size_t>(p)];
    if (mine.size() > 0) {
      ops.push_back(comm::P2POp::Send(p, buffer + mine.begin, mine.size(), DType::kFloat32));
    }
    if (theirs.size() > 0) {
      ops.push_back(comm::P2POp::Recv(p, buffer + theirs.begin, theirs.size(), DType::kFloat32));
    }
  }
  return ops;
}

absl::StatusOr<std::vector<std::string>> AllGatherBytesAsWords(const std::string& bytes, int world,
                                                               const WordGather& gather) {
  const double length = static_cast<double>(bytes.size());
  std::vector<double> lengths(static_cast<size_t>(world));
  if (absl::Status s = gather(&length, 1, lengths.data()); !s.ok()) return s;
  int64_t longest = 0;
  for (double l : lengths) longest = std::max(longest, static_cast<int64_t>(l));
  const int64_t words = (longest + 7) / 8;
  std::vector<std::string> out(static_cast<size_t>(world));
  if (words == 0) return out;
  std::vector<double> send(static_cast<size_t>(words), 0.0);
  if (!bytes.empty()) std::memcpy(send.data(), bytes.data(), bytes.size());
  std::vector<double> all(static_cast<size_t>(words) * static_cast<size_t>(world));
  if (absl::Status s = gather(send.data(), words, all.data()); !s.ok()) return s;
  for (int r = 0; r < world; ++r) {
    const char* from = reinterpret_cast<const char*>(all.data() + static_cast<size_t>(r) * words);
    out[static_cast<size_t>(r)].assign(from, static_cast<size_t>(lengths[static_cast<size_t>(r)]));
  }
  return out;
}

std::unique_ptr<TrainerCollective> NewCommunicatorCollective(comm::Communicator* world,
                                                             const CommCollectiveOptions& options) {
  return std::make_unique<CommunicatorCollective>(world, options);
}

}  // namespace model
}  // namespace dattn
