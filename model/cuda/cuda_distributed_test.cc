// Training on several GPUs (docs/TRAINING.md, "Training on several GPUs"): the GPU collective
// (nccl_collective.h), the CUDA model's attention factory and the ring's attention on the model's
// views (cuda_sequence_attention.h), and the trainer over them. Ranks are threads of this process,
// one per GPU: each makes its GPU current, joins an NCCL communicator of all W ranks (and, for S >
// 1, one of its sequence-parallel group of S contiguous ranks) through a local TcpStore, as the
// service's worker processes do across processes. NCCL_NVLS_ENABLE=0 is set (NVLink multicast
// stays off).
//
//   NoGpu.CollectiveRefusesWhatItCannotUse      everywhere: a host-memory communicator, nulls
//   OneGpu.AttentionFactoryGivesTheDefaultBits  1 GPU: a model whose factory makes the local CUDA
//       attention on the stream it is handed (the model's) gives the default model's loss and
//       logits' argmax bit for bit, and its gradient too where the attention backward is
//       deterministic (head dim 64, the Hopper kernels; head dim 16 runs cuDNN's, which may add dQ
//       in another order: within 1e-3); a factory's error, a null or CPU attention are refused
//   OneGpu.CollectiveOfOneRank                  1 GPU: NewCudaCollective over an NCCL communicator
//       of one rank leaves the buffers alone and returns the host values; errors name the values
//   OneGpu.TrainerOverTheCollectiveOfOneRank    1 GPU: the trainer with that collective gives the
//       single-process trainer's step losses, norms and final weights bit for bit (5 steps, head
//       dim 64)
//   Gpus.CollectiveMatchesTheHostSums           >= 2 GPUs (W = all, at most 8): the reduce-scatter
//       equals, bit for bit, the host's fp32 sum in rank order (and the fp64 sum within fp32
//       rounding), with one and with many chunk rounds, waiting on the host or only on the stream,
//       and handed over range by range as each range is written on the model's stream;
//       its traffic is (W - 1) / W of the buffer each way; the all-gather of parameters is exact
//       and leaves every rank the same bits; AllGather, AllGatherBytes (a message larger than the
//       staging buffer, an empty one) and Barrier
//   Gpus.SequenceParallelStepMatchesTheWholeSequence  >= 2 GPUs (S = 2; 4 too with 4): each rank's
//       ring model on its slice of positions (head dims 16: cuDNN, and 64: the Hopper kernels),
//       with loss_scale = its targets / all targets, reduced by the collective, gives the whole
//       sequence's loss and gradient on one GPU within bf16 tolerance, the same bits on every
//       rank; positions that are not the rank's shard are refused by every rank
//   Gpus.DataAndSequenceParallelTrainingMatchesOneGpu  >= 2 GPUs: D x S = 2x1, 1x2 (and with 4
//       GPUs 4x1, 2x2, 1x4) through model::Trainer: every step's loss within 2e-2 of the one-GPU
//       run's, the same targets, and every rank the same losses, norms and final weights bit for
//       bit; with S = 1, the gradient reduction overlapped with the backward (the default) and
//       after it give the same bits. S > 1 needs a trainer with TrainerOptions::sequence_parallel
//       (the train-dist branch); a build without it runs the S = 1 runs and says which it skipped.
// Tolerances (bf16 products on fp32 master weights; a rank runs other GEMM shapes than one GPU,
// so other roundings): loss per step 2e-2 relative, the one-step gradient 2e-2 in relative L2
// norm, the one-step loss sum 2e-3 (cuda_trainer_test's bounds for 4 micro-batches against 1).
// Measured values are printed as "[ parity ]" lines. Every test runs in seconds.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_status.h"
#include "gtest/gtest.h"
#include "model/collective.h"
#include "model/config.h"
#include "model/corpus.h"
#include "model/cuda/cuda_longnet.h"
#include "model/cuda/cuda_sequence_attention.h"
#include "model/cuda/cuda_trainable_model.h"
#include "model/cuda/nccl_collective.h"
#include "model/cuda/nccl_ranks.h"
#include "model/sequence_attention.h"
#include "model/trainable_model.h"
#include "model/trainer.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

constexpr double kLossTolerance = 2e-2;     // per training step, relative
constexpr double kGradTolerance = 2e-2;     // one step's gradient, relative L2 norm
constexpr double kLossSumTolerance = 2e-3;  // one step's loss sum, relative
constexpr int kMaxRanks = 8;

// --- GPUs and ranks.

int GpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

#define REQUIRE_GPUS(n)                                    \
  do {                                                     \
    std::string why_;                                      \
    if (!HaveHopperGpus((n), &why_)) GTEST_SKIP() << why_; \
  } while (0)

void ExpectAllOk(const std::vector<absl::Status>& results) {
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

// --- Data and models.

std::vector<float> Pattern(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    // Magnitudes over 8 decades, so that the order of the additions shows in the bits.
    const double unit = static_cast<double>(x >> 11) / 9007199254740992.0 - 0.5;
    const int decade = static_cast<int>((static_cast<uint64_t>(i) * 7 + seed) % 9) - 4;
    v[static_cast<size_t>(i)] = static_cast<float>(unit * std::pow(10.0, decade));
  }
  return v;
}

uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, 8);
  return b;
}

int64_t DifferingBits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0 ? 1 : 0;
  return n;
}

double Rel(double x, double ref) { return std::fabs(x - ref) / std::fabs(ref); }

double RelNorm(const std::vector<float>& x, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(x[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

// The tiny model, with one segment as long as the sequence: d 64, 2 blocks, 4 heads (head dim 16:
// cuDNN's attention; grouped mode gives the 3 patterns 2, 1 and 1 heads), segments 64/128/256 at
// rates 1/2/4, so that with N = 256 a segment crosses the shards of S = 2 (256) and of S = 4 (128
// and 256) and the ring has blocks to move (segments 64/128 alone would never cross S = 2's).
LongNetConfig TinyModel() {
  LongNetConfig c;
  c.vocab_size = 256;
  c.d_model = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.ffn_dim = 256;
  c.segment_lengths = {64, 128, 256};
  c.dilation_rates = {1, 2, 4};
  return c;
}

// The same with head dim 64 (4 heads of d 256, so that each of the 3 patterns has a head): the
// model's and the ring's local calls on the Hopper kernels.
LongNetConfig TinyModelHeadDim64() {
  LongNetConfig c = TinyModel();
  c.d_model = 256;
  c.num_heads = 4;
  return c;
}

constexpr int64_t kSeqLen = 256;

// Words over a small vocabulary, drawn pseudo-randomly: text a model learns from in a few steps.
const TokenCorpus& Corpus() {
  static const TokenCorpus* corpus = [] {
    static const char* const kWords[] = {
        "the ",     "ring ",    "of ",     "dilated ", "attention ", "passes ", "blocks ",
        "between ", "ranks ",   "and ",    "every ",   "gradient ",  "shard ",  "is ",
        "summed ",  "in ",      "order. ", "a ",       "segment ",   "spans ",  "GPUs, ",
        "while ",   "weights ", "stay ",   "fp32; ",   "bf16 ",      "holds ",  "products. "};
    constexpr int kCount = sizeof(kWords) / sizeof(kWords[0]);
    std::vector<int32_t> tokens;
    uint64_t x = 12345;
    while (tokens.size() < (1u << 17)) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      for (const char* p = kWords[x % kCount]; *p != '\0'; ++p) {
        tokens.push_back(static_cast<unsigned char>(*p));
      }
    }
    absl::StatusOr<TokenCorpus> c = TokenCorpus::FromTokens(std::move(tokens), 256, "synthetic");
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", std::string(c.status().message()).c_str());
      std::abort();
    }
    return new TokenCorpus(*std::move(c));
  }();
  return *corpus;
}

// `rows` consecutive windows of the corpus: tokens and next-token targets, row-major.
struct HostBatch {
  int64_t rows = 0, seq_len = 0;
  std::vector<int32_t> tokens, targets;
  TokenBatch View() const {
    TokenBatch b;
    b.tokens = tokens.data();
    b.targets = targets.data();
    b.batch = rows;
    b.seq_len = seq_len;
    return b;
  }
  // Positions [begin, end) of every row, as rank `begin / (end - begin)` of the ring sees them.
  HostBatch Slice(int64_t begin, int64_t end) const {
    HostBatch s;
    s.rows = rows;
    s.seq_len = end - begin;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = begin; t < end; ++t) {
        s.tokens.push_back(tokens[static_cast<size_t>(r * seq_len + t)]);
        s.targets.push_back(targets[static_cast<size_t>(r * seq_len + t)]);
      }
    }
    return s;
  }
};

HostBatch MakeBatch(int64_t rows, int64_t seq_len) {
  HostBatch b;
  b.rows = rows;
  b.seq_len = seq_len;
  std::vector<int32_t> window(static_cast<size_t>(seq_len + 1));
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(Corpus().Read(1000 + r * 3 * seq_len, absl::MakeSpan(window)).ok());
    b.tokens.insert(b.tokens.end(), window.begin(), window.end() - 1);
    b.targets.insert(b.targets.end(), window.begin() + 1, window.end());
  }
  // A few ignored targets, so that the ranks' target counts differ.
  b.targets[3] = b.targets[static_cast<size_t>(seq_len + 200)] = kIgnoreTarget;
  return b;
}

int64_t CountTargets(const HostBatch& b) {
  int64_t n = 0;
  for (int32_t t : b.targets) n += t != kIgnoreTarget ? 1 : 0;
  return n;
}

std::vector<float> ReadParams(TrainableModel& m) {
  std::vector<float> p(static_cast<size_t>(m.layout().total()));
  EXPECT_TRUE(m.ReadParams(0, absl::MakeSpan(p)).ok());
  return p;
}

// The model's grads (after its queued work).
std::vector<float> ReadGrads(TrainableModel& m) {
  std::vector<float> g(static_cast<size_t>(m.layout().total()));
  absl::StatusOr<cudaStream_t> stream = CudaTrainableModelStream(m);
  EXPECT_TRUE(stream.ok());
  EXPECT_EQ(cudaMemcpyAsync(g.data(), m.grads(), g.size() * 4, cudaMemcpyDeviceToHost, *stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(*stream), cudaSuccess);
  return g;
}

// The local CUDA attention made by a factory, owning its backend.
class OwningLocalAttention final : public SequenceAttention {
 public:
  explicit OwningLocalAttention(std::unique_ptr<CudaAttentionBackend> backend)
      : backend_(std::move(backend)), local_(NewLocalAttention(backend_.get())) {}
  Device device() const override { return local_->device(); }
  absl::Status Forward(const AttentionSpec& spec, const SequencePositions& positions,
                       const ForwardArgs& args) override {
    return local_->Forward(spec, positions, args);
  }
  absl::Status Backward(const AttentionSpec& spec, const SequencePositions& positions,
                        const BackwardArgs& args) override {
    return local_->Backward(spec, positions, args);
  }

 private:
  const std::unique_ptr<CudaAttentionBackend> backend_;
  const std::unique_ptr<SequenceAttention> local_;
};

// --- The trainer.

TrainerConfig TinyTraining(const LongNetConfig& model) {
  TrainerConfig c;
  c.model = model;
  c.seq_len = kSeqLen;
  c.batch_size = 8;
  c.micro_batches = 1;
  c.steps = 5;
  c.seed = 11;
  c.optimizer.lr = 3e-3;
  c.optimizer.min_lr = 3e-4;
  c.optimizer.warmup_steps = 2;
  c.eval.every = 0;
  c.eval.batches = 1;
  c.data.validation_fraction = 0.05;
  return c;
}

// TrainerOptions::sequence_parallel where this build's trainer has it (train-dist's trainer.h);
// false when S > 1 cannot be asked of this trainer. A template, so that the member is looked up
// only where it exists.
template <typename T, typename = void>
struct HasSequenceParallel : std::false_type {};
template <typename T>
struct HasSequenceParallel<T, std::void_t<decltype(std::declval<T&>().sequence_parallel)>>
    : std::true_type {};

template <typename Options>
bool SetSequenceParallel(Options* options, int s) {
  if constexpr (HasSequenceParallel<Options>::value) {
    options->sequence_parallel = s;
    return true;
  } else {
    return s == 1;
  }
}

struct RunRecord {
  std::vector<StepResult> steps;
  std::vector<float> final_params;
};

// config.steps steps of `trainer`.
absl::StatusOr<RunRecord> RunSteps(Trainer& trainer) {
  RunRecord r;
  for (int64_t i = 0; i < trainer.config().steps; ++i) {
    absl::StatusOr<StepResult> s = trainer.Step();
    if (!s.ok()) return s.status();
    r.steps.push_back(*s);
  }
  r.final_params = ReadParams(trainer.model());
  return r;
}

// The single-process trainer on GPU 0.
RunRecord RunOneGpu(const LongNetConfig& model_config) {
  cudaSetDevice(0);
  const TrainerConfig config = TinyTraining(model_config);
  absl::StatusOr<std::unique_ptr<TrainableModel>> model = NewCudaTrainableModel(config.model, {});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(config, Corpus(), *std::move(model));
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return {};
  absl::StatusOr<RunRecord> r = RunSteps(**trainer);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : RunRecord();
}

// The same, once per process and head dim (tests share it).
const RunRecord& OneGpuRun(const LongNetConfig& model_config) {
  static std::map<int64_t, RunRecord>* runs = new std::map<int64_t, RunRecord>();
  auto it = runs->find(model_config.head_dim());
  if (it == runs->end()) {
    it = runs->emplace(model_config.head_dim(), RunOneGpu(model_config)).first;
  }
  return it->second;
}

// Rank `rank` of a D x S run: its model (the ring's attention when S > 1), the collective over the
// world on the model's stream, the trainer.
absl::StatusOr<RunRecord> TrainRank(const LongNetConfig& model_config, int rank,
                                    int sequence_parallel, comm::Communicator& world,
                                    comm::Communicator* sp, bool overlap = true) {
  const TrainerConfig config = TinyTraining(model_config);
  CudaModelOptions cuda_options;
  cuda_options.device = rank;
  absl::StatusOr<std::unique_ptr<TrainableModel>> model =
      NewCudaTrainableModel(config.model, {}, cuda_options, sp);
  if (!model.ok()) return model.status();
  absl::StatusOr<cudaStream_t> stream = CudaTrainableModelStream(**model);
  if (!stream.ok()) return stream.status();
  // Declared before the trainer, destroyed after it (the trainer borrows the collective).
  absl::StatusOr<std::unique_ptr<TrainerCollective>> collective =
      NewCudaCollective(&world, *stream);
  if (!collective.ok()) return collective.status();
  TrainerOptions options;
  options.collective = collective->get();
  options.overlap_gradient_reduction = overlap;
  if (!SetSequenceParallel(&options, sequence_parallel)) {
    return absl::FailedPreconditionError("this trainer has no TrainerOptions::sequence_parallel");
  }
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(config, Corpus(), *std::move(model), options);
  if (!trainer.ok()) return trainer.status();
  return RunSteps(**trainer);
}

// --- Tests.

// A host-memory communicator: NewCudaCollective and NewCudaRingSequenceAttention refuse it before
// touching a GPU.
class HostCommunicator final : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "host"; }
  absl::Duration timeout() const override { return absl::Seconds(1); }
  absl::StatusOr<std::unique_ptr<comm::Work>> StartGroup(absl::Span<const comm::P2POp>,
                                                         comm::Stream) override {
    return absl::UnimplementedError("host");
  }
  absl::Status AllGather(const void*, void*, int64_t, DType, comm::Stream) override {
    return absl::UnimplementedError("host");
  }
  absl::Status AllReduce(const void*, void*, int64_t, DType, comm::ReduceOp,
                         comm::Stream) override {
    return absl::UnimplementedError("host");
  }
  absl::Status Barrier() override { return absl::UnimplementedError("host"); }
  absl::Status Synchronize(comm::Stream) override { return absl::OkStatus(); }
  void Abort(const std::string&) override {}
  absl::Status health() const override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Shrink(absl::Span<const int>) override {
    return absl::UnimplementedError("host");
  }
  comm::CommStats stats() const override { return {}; }
};

TEST(NoGpu, CollectiveRefusesWhatItCannotUse) {
  absl::StatusOr<std::unique_ptr<TrainerCollective>> c = NewCudaCollective(nullptr, nullptr);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("communicator is null"), std::string::npos) << c.status();
  HostCommunicator host;
  c = NewCudaCollective(&host, nullptr);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("host communicator's buffers are on cpu"), std::string::npos)
      << c.status();
  absl::StatusOr<std::unique_ptr<SequenceAttention>> a =
      NewCudaRingSequenceAttention(nullptr, nullptr, 0);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  a = NewCudaRingSequenceAttention(&host, reinterpret_cast<cudaStream_t>(1), 0);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(a.status().message().find("host communicator works on cpu"), std::string::npos)
      << a.status();
  // A model that is not the CUDA model has no stream.
  absl::StatusOr<std::unique_ptr<TrainableModel>> cpu = NewCpuTrainableModel(TinyModel(), {}, 1);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<cudaStream_t> stream = CudaTrainableModelStream(**cpu);
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(stream.status().message().find("cpu fp32"), std::string::npos) << stream.status();
}

TEST(OneGpu, AttentionFactoryGivesTheDefaultBits) {
  REQUIRE_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t handed = nullptr;
  int calls = 0;
  CudaModelOptions options;
  options.attention_factory =
      [&](cudaStream_t stream) -> absl::StatusOr<std::unique_ptr<SequenceAttention>> {
    handed = stream;
    ++calls;
    CudaBackendOptions b;
    b.device = 0;
    b.stream = stream;
    absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> backend = NewCudaBackend(b);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<SequenceAttention>(new OwningLocalAttention(*std::move(backend)));
  };
  const HostBatch batch = MakeBatch(2, kSeqLen);
  // Head dim 64 runs on the Hopper kernels (deterministic: every bit equal); head dim 16 on cuDNN,
  // whose backward may add dQ in another order from one call to the next: its forward (loss,
  // logits) equal bit for bit, its gradient within 1e-3 (an fp32 dQ that differs in its last bit
  // may round to another bf16 value).
  for (const LongNetConfig& config : {TinyModelHeadDim64(), TinyModel()}) {
    SCOPED_TRACE(absl::StrCat("head dim ", config.head_dim()));
    calls = 0;
    absl::StatusOr<std::unique_ptr<TrainableModel>> plain = NewCudaTrainableModel(config, {});
    ASSERT_TRUE(plain.ok()) << plain.status();
    absl::StatusOr<std::unique_ptr<TrainableModel>> made =
        NewCudaTrainableModel(config, {}, options);
    ASSERT_TRUE(made.ok()) << made.status();
    EXPECT_EQ(calls, 1);
    absl::StatusOr<cudaStream_t> stream = CudaTrainableModelStream(**made);
    ASSERT_TRUE(stream.ok());
    EXPECT_EQ(handed, *stream);  // The factory got the model's own stream.
    // No communicator: the default path.
    absl::StatusOr<std::unique_ptr<TrainableModel>> again =
        NewCudaTrainableModel(config, {}, CudaModelOptions{}, nullptr);
    ASSERT_TRUE(again.ok()) << again.status();
    std::vector<std::vector<float>> grads;
    std::vector<double> losses;
    std::vector<std::vector<int32_t>> predictions;
    for (TrainableModel* m : {plain->get(), made->get(), again->get()}) {
      ASSERT_TRUE(m->InitParams(5).ok());
      absl::StatusOr<LossResult> first = m->ForwardBackward(batch.View(), {});
      ASSERT_TRUE(first.ok()) << first.status();
      absl::StatusOr<LossResult> second =
          m->ForwardBackward(batch.View(), {0.5, Accumulate::kAdd, nullptr});
      ASSERT_TRUE(second.ok()) << second.status();
      EXPECT_EQ(Bits(first->loss_sum), Bits(second->loss_sum));
      losses.push_back(first->loss_sum);
      grads.push_back(ReadGrads(*m));
      std::vector<int32_t> argmax(static_cast<size_t>(batch.rows * batch.seq_len));
      ASSERT_TRUE(m->Evaluate(batch.View(), absl::MakeSpan(argmax)).ok());
      predictions.push_back(argmax);
    }
    double worst = 0;
    for (size_t i = 1; i < losses.size(); ++i) {
      EXPECT_EQ(Bits(losses[i]), Bits(losses[0])) << losses[i] << " vs " << losses[0];
      EXPECT_EQ(predictions[i], predictions[0]) << "model " << i;
      if (config.head_dim() == 64) {
        EXPECT_EQ(DifferingBits(grads[i], grads[0]), 0) << "model " << i;
      }
      worst = std::max(worst, RelNorm(grads[i], grads[0]));
    }
    EXPECT_LE(worst, config.head_dim() == 64 ? 0.0 : 1e-3);
    std::printf(
        "[ parity ] head dim %lld, factory-made local attention: loss sum %.9g (default "
        "%.9g), gradient %.2e relative L2 from the default's\n",
        static_cast<long long>(config.head_dim()), losses[1], losses[0], worst);
  }

  const LongNetConfig config = TinyModel();
  // The factory's error is Create's; null and CPU attentions are refused.
  options.attention_factory =
      [](cudaStream_t) -> absl::StatusOr<std::unique_ptr<SequenceAttention>> {
    return absl::ResourceExhaustedError("no room for the ring");
  };
  absl::StatusOr<std::unique_ptr<TrainableModel>> bad = NewCudaTrainableModel(config, {}, options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(bad.status().message().find("no room for the ring"), std::string::npos);
  options.attention_factory =
      [](cudaStream_t) -> absl::StatusOr<std::unique_ptr<SequenceAttention>> {
    return std::unique_ptr<SequenceAttention>();
  };
  bad = NewCudaTrainableModel(config, {}, options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("no attention (null)"), std::string::npos) << bad.status();
  options.attention_factory =
      [](cudaStream_t) -> absl::StatusOr<std::unique_ptr<SequenceAttention>> {
    return NewCpuLocalAttention(1);
  };
  bad = NewCudaTrainableModel(config, {}, options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("an attention on cpu"), std::string::npos) << bad.status();
}

TEST(OneGpu, CollectiveOfOneRank) {
  REQUIRE_GPUS(1);
  ExpectAllOk(RunNcclRanks(
      1, 1,
      [](int, comm::Communicator& world, comm::Communicator*) -> absl::Status {
        cudaStream_t stream = nullptr;
        EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
        EXPECT_EQ(NewCudaCollective(&world, nullptr).status().code(),
                  absl::StatusCode::kInvalidArgument);
        absl::StatusOr<std::unique_ptr<TrainerCollective>> c = NewCudaCollective(&world, stream);
        if (!c.ok()) return c.status();
        TrainerCollective& collective = **c;
        EXPECT_EQ(collective.rank(), 0);
        EXPECT_EQ(collective.world(), 1);
        const int64_t n = 4099;
        const std::vector<float> values = Pattern(n, 3);
        float* buffer = nullptr;
        EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&buffer), n * 4), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(buffer, values.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
        const std::vector<ShardRange> shards = ShardRanges(n, 1);
        EXPECT_TRUE(collective.ReduceScatterGradients(buffer, n, shards).ok());
        EXPECT_TRUE(collective.AllGatherParameters(buffer, n, shards).ok());
        std::vector<float> back(static_cast<size_t>(n));
        EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(back.data(), buffer, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(DifferingBits(back, values), 0);
        absl::StatusOr<std::vector<double>> all = collective.AllGather({1.5, -2e300});
        EXPECT_TRUE(all.ok()) << all.status();
        if (all.ok()) {
          EXPECT_EQ(*all, (std::vector<double>{1.5, -2e300}));
        }
        const std::string message("one\0rank", 8);
        absl::StatusOr<std::vector<std::string>> bytes = collective.AllGatherBytes(message);
        EXPECT_TRUE(bytes.ok()) << bytes.status();
        if (bytes.ok()) {
          EXPECT_EQ(*bytes, std::vector<std::string>{message});
        }
        EXPECT_TRUE(collective.Barrier().ok());
        // Shards that do not tile the buffer: refused, naming them.
        const absl::Status s = collective.ReduceScatterGradients(buffer, n, {{0, n - 1}});
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(s.message().find("the shards end at 4098, the buffer has 4099"),
                  std::string::npos)
            << s;
        EXPECT_EQ(collective.AllGatherParameters(buffer, n, ShardRanges(n, 2)).code(),
                  absl::StatusCode::kInvalidArgument);
        c->reset();
        cudaFree(buffer);
        cudaStreamDestroy(stream);
        return absl::OkStatus();
      },
      "one-rank"));
}

// Head dim 64: the Hopper kernels, whose backward is deterministic (cuDNN's, for head dim 16, may
// add dQ in another order from one call to the next), so that equal bits are the contract.
TEST(OneGpu, TrainerOverTheCollectiveOfOneRank) {
  REQUIRE_GPUS(1);
  const LongNetConfig config = TinyModelHeadDim64();
  const RunRecord& reference = OneGpuRun(config);
  ASSERT_EQ(reference.steps.size(), 5u);
  RunRecord mine;
  ExpectAllOk(RunNcclRanks(
      1, 1,
      [&](int rank, comm::Communicator& world, comm::Communicator* sp) -> absl::Status {
        absl::StatusOr<RunRecord> r = TrainRank(config, rank, 1, world, sp);
        if (!r.ok()) return r.status();
        mine = *std::move(r);
        return absl::OkStatus();
      },
      "trainer-1x1"));
  ASSERT_EQ(mine.steps.size(), reference.steps.size());
  for (size_t i = 0; i < mine.steps.size(); ++i) {
    EXPECT_EQ(Bits(mine.steps[i].loss), Bits(reference.steps[i].loss)) << "step " << i + 1;
    EXPECT_EQ(Bits(mine.steps[i].grad_norm), Bits(reference.steps[i].grad_norm));
  }
  EXPECT_EQ(DifferingBits(mine.final_params, reference.final_params), 0);
}

// One rank's view of the collective test.
struct CollectiveRecord {
  std::vector<float> gathered;  // the whole reduced buffer after AllGatherParameters
};

TEST(Gpus, CollectiveMatchesTheHostSums) {
  REQUIRE_GPUS(2);
  const int w = std::min(GpuCount(), kMaxRanks);
  const int64_t n = 1000003;  // prime: the shards differ in size
  const std::vector<ShardRange> shards = ShardRanges(n, w);
  // The host's sums in rank order (fp32) and in fp64, with the bound of fp32 rounding.
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < w; ++r) inputs.push_back(Pattern(n, 100 + r));
  std::vector<float> expected(static_cast<size_t>(n));
  int64_t outside = 0;
  for (int64_t i = 0; i < n; ++i) {
    float acc = inputs[0][i];
    double exact = inputs[0][i], magnitude = std::fabs(inputs[0][i]);
    for (int r = 1; r < w; ++r) {
      acc += inputs[r][i];
      exact += inputs[r][i];
      magnitude += std::fabs(inputs[r][i]);
    }
    expected[static_cast<size_t>(i)] = acc;
    outside += std::fabs(acc - exact) > (w - 1) * std::ldexp(magnitude, -24) ? 1 : 0;
  }
  EXPECT_EQ(outside, 0);

  struct Variant {
    const char* name;
    CudaCollectiveOptions options;
    bool ranges;  // Handed range by range as a backward would (BeginGradientReduction).
  };
  CudaCollectiveOptions many_rounds;
  many_rounds.max_temp_bytes = 64 << 10;  // chunks of 16384 / (W - 1) (at least 1024): many
  many_rounds.wait_on_host = false;
  const std::vector<Variant> variants = {{"one round, waiting on the host", {}, false},
                                         {"many rounds, stream-ordered only", many_rounds, false},
                                         {"handed in ranges while written", {}, true},
                                         {"handed in ranges, many rounds", many_rounds, true}};
  // The ranges a "backward" hands, from the end of the buffer down, of uneven sizes (some inside
  // one shard, some across several); [0, 40000) is never handed (FinishGradientReduction's part).
  std::vector<ShardRange> handed;
  for (int64_t end = n, k = 0; end > 40000; ++k) {
    const int64_t begin = std::max<int64_t>(40000, end - (k % 3 == 0 ? 250000 : 37111 * (k + 1)));
    handed.push_back({begin, end});
    end = begin;
  }
  for (const Variant& variant : variants) {
    SCOPED_TRACE(variant.name);
    std::vector<CollectiveRecord> records(static_cast<size_t>(w));
    ExpectAllOk(RunNcclRanks(
        w, 1,
        [&](int rank, comm::Communicator& world, comm::Communicator*) -> absl::Status {
          cudaStream_t stream = nullptr;
          EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
          absl::StatusOr<std::unique_ptr<TrainerCollective>> c =
              NewCudaCollective(&world, stream, variant.options);
          if (!c.ok()) return c.status();
          TrainerCollective& collective = **c;
          EXPECT_EQ(collective.rank(), rank);
          EXPECT_EQ(collective.world(), w);
          float* grads = nullptr;
          EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&grads), n * 4), cudaSuccess);
          EXPECT_EQ(cudaMemcpy(grads, inputs[rank].data(), n * 4, cudaMemcpyHostToDevice),
                    cudaSuccess);
          const comm::CommStats before = world.stats();
          absl::Status s;
          if (variant.ranges) {
            // The buffer starts as NaN; each range gets its values on the model's stream (a
            // device copy, asynchronous) just before it is handed, as the backward writes a
            // block's gradients before the model hands the block.
            float* source = nullptr;
            EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&source), n * 4), cudaSuccess);
            EXPECT_EQ(cudaMemcpy(source, grads, n * 4, cudaMemcpyDeviceToDevice), cudaSuccess);
            EXPECT_EQ(cudaMemset(grads, 0xFF, n * 4), cudaSuccess);
            s = collective.BeginGradientReduction(grads, n, shards);
            for (const ShardRange& r : handed) {
              if (!s.ok()) break;
              EXPECT_EQ(cudaMemcpyAsync(grads + r.begin, source + r.begin, r.size() * 4,
                                        cudaMemcpyDeviceToDevice, stream),
                        cudaSuccess);
              s = collective.GradientsFinal(r.begin, r.end);
            }
            EXPECT_EQ(cudaMemcpyAsync(grads, source, 40000 * 4, cudaMemcpyDeviceToDevice, stream),
                      cudaSuccess);
            if (s.ok()) s = collective.FinishGradientReduction();
            EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            cudaFree(source);
          } else {
            s = collective.ReduceScatterGradients(grads, n, shards);
          }
          if (!s.ok()) return s;
          const comm::CommStats after = world.stats();
          const ShardRange mine = shards[static_cast<size_t>(rank)];
          // (W - 1) / W of the buffer each way: every other shard out, W - 1 copies of mine in.
          EXPECT_EQ(after.p2p_bytes_sent - before.p2p_bytes_sent, 4 * (n - mine.size()));
          EXPECT_EQ(after.p2p_bytes_received - before.p2p_bytes_received,
                    4 * (w - 1) * mine.size());
          // Read on the stream (a collective that did not wait on the host is ordered there).
          std::vector<float> shard(static_cast<size_t>(mine.size()));
          EXPECT_EQ(cudaMemcpyAsync(shard.data(), grads + mine.begin, mine.size() * 4,
                                    cudaMemcpyDeviceToHost, stream),
                    cudaSuccess);
          EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          const std::vector<float> want(expected.begin() + mine.begin, expected.begin() + mine.end);
          EXPECT_EQ(DifferingBits(shard, want), 0) << "rank " << rank << "'s shard";
          // Everything but my shard poisoned (NaN), then gathered: the whole reduced buffer.
          EXPECT_EQ(cudaMemsetAsync(grads, 0xFF, mine.begin * 4, stream), cudaSuccess);
          EXPECT_EQ(cudaMemsetAsync(grads + mine.end, 0xFF, (n - mine.end) * 4, stream),
                    cudaSuccess);
          s = collective.AllGatherParameters(grads, n, shards);
          if (!s.ok()) return s;
          std::vector<float>& gathered = records[static_cast<size_t>(rank)].gathered;
          gathered.resize(static_cast<size_t>(n));
          EXPECT_EQ(cudaMemcpyAsync(gathered.data(), grads, n * 4, cudaMemcpyDeviceToHost, stream),
                    cudaSuccess);
          EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          // Host values: doubles bit for bit (a negative zero, a subnormal), messages of every
          // length, one empty and one larger than the staging buffer (it grows).
          absl::StatusOr<std::vector<double>> all =
              collective.AllGather({rank + 0.25, -0.0, 4.9e-324 * (rank + 1)});
          if (!all.ok()) return all.status();
          EXPECT_EQ(all->size(), static_cast<size_t>(3 * w));
          for (int q = 0; q < w && all->size() == static_cast<size_t>(3 * w); ++q) {
            EXPECT_EQ(Bits((*all)[3 * q]), Bits(q + 0.25));
            EXPECT_EQ(Bits((*all)[3 * q + 1]), Bits(-0.0));
            EXPECT_EQ(Bits((*all)[3 * q + 2]), Bits(4.9e-324 * (q + 1)));
          }
          auto message = [](int q) {
            const size_t length = q == 1 ? 0 : q == 0 ? 100000 : 5 + 13 * static_cast<size_t>(q);
            std::string m(length, '\0');
            for (size_t i = 0; i < length; ++i) m[i] = static_cast<char>((q * 31 + i * 7) & 0xFF);
            return m;
          };
          absl::StatusOr<std::vector<std::string>> bytes = collective.AllGatherBytes(message(rank));
          if (!bytes.ok()) return bytes.status();
          EXPECT_EQ(bytes->size(), static_cast<size_t>(w));
          for (int q = 0; q < w && bytes->size() == static_cast<size_t>(w); ++q) {
            EXPECT_EQ((*bytes)[static_cast<size_t>(q)], message(q)) << "rank " << q << "'s";
          }
          s = collective.Barrier();
          c->reset();  // Frees its buffers (cudaFree), the stream still alive or not.
          cudaFree(grads);
          cudaStreamDestroy(stream);
          return s;
        },
        absl::StrCat("collective-", variant.options.max_temp_bytes,
                     variant.ranges ? "-ranges" : "")));
    for (int r = 0; r < w; ++r) {
      EXPECT_EQ(DifferingBits(records[static_cast<size_t>(r)].gathered, expected), 0)
          << "rank " << r << "'s gathered buffer";
    }
  }
  std::printf(
      "[ parity ] %d GPUs: reduce-scatter of %lld floats equal to the host's rank-order "
      "sum bit for bit, on every rank\n",
      w, static_cast<long long>(n));
}

// One rank's result of a sequence-parallel step.
struct StepRecord {
  LossResult loss;
  std::vector<float> grads;  // the sum over ranks, gathered
};

TEST(Gpus, SequenceParallelStepMatchesTheWholeSequence) {
  REQUIRE_GPUS(2);
  const HostBatch batch = MakeBatch(2, kSeqLen);
  const int64_t all_targets = CountTargets(batch);
  std::vector<int> sizes = {2};
  if (GpuCount() >= 4) sizes.push_back(4);
  for (const LongNetConfig& config : {TinyModel(), TinyModelHeadDim64()}) {
    SCOPED_TRACE(absl::StrCat("head dim ", config.head_dim()));
    // The whole sequence on GPU 0.
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    LossResult whole;
    std::vector<float> whole_grads;
    {
      absl::StatusOr<std::unique_ptr<TrainableModel>> m = NewCudaTrainableModel(config, {});
      ASSERT_TRUE(m.ok()) << m.status();
      ASSERT_TRUE((*m)->InitParams(9).ok());
      absl::StatusOr<LossResult> l = (*m)->ForwardBackward(batch.View(), {});
      ASSERT_TRUE(l.ok()) << l.status();
      whole = *l;
      whole_grads = ReadGrads(**m);
    }
    ASSERT_EQ(whole.num_targets, all_targets);
    for (int s : sizes) {
      SCOPED_TRACE(absl::StrCat(s, " sequence ranks"));
      std::vector<StepRecord> records(static_cast<size_t>(s));
      ExpectAllOk(RunNcclRanks(
          s, s,
          [&](int rank, comm::Communicator& world, comm::Communicator* sp) -> absl::Status {
            CudaModelOptions cuda_options;
            cuda_options.device = rank;
            absl::StatusOr<std::unique_ptr<TrainableModel>> m =
                NewCudaTrainableModel(config, {}, cuda_options, sp);
            if (!m.ok()) return m.status();
            TrainableModel& model = **m;
            absl::StatusOr<cudaStream_t> stream = CudaTrainableModelStream(model);
            if (!stream.ok()) return stream.status();
            absl::StatusOr<std::unique_ptr<TrainerCollective>> c =
                NewCudaCollective(&world, *stream);
            if (!c.ok()) return c.status();
            DATTN_RETURN_IF_ERROR(model.InitParams(9));
            const int64_t n = kSeqLen / s, begin = rank * n;
            const HostBatch slice = batch.Slice(begin, begin + n);
            // Positions that are not this rank's shard: every rank refuses, nothing is sent.
            TokenBatch wrong = slice.View();
            wrong.positions = {begin == 0 ? 1 : begin - 1, kSeqLen};  // inside the sequence
            absl::StatusOr<LossResult> refused = model.ForwardBackward(wrong, {});
            EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
            EXPECT_NE(refused.status().message().find("this rank's shard must start at"),
                      std::string::npos)
                << refused.status();
            // This rank's slice, scaled by its share of the targets.
            TokenBatch view = slice.View();
            view.positions = {begin, kSeqLen};
            const double scale =
                static_cast<double>(CountTargets(slice)) / static_cast<double>(all_targets);
            absl::StatusOr<LossResult> l =
                model.ForwardBackward(view, {scale, Accumulate::kOverwrite, nullptr});
            if (!l.ok()) return l.status();
            const int64_t total = model.layout().total();
            const std::vector<ShardRange> shards = ShardRanges(total, s);
            DATTN_RETURN_IF_ERROR((*c)->ReduceScatterGradients(model.grads(), total, shards));
            DATTN_RETURN_IF_ERROR((*c)->AllGatherParameters(model.grads(), total, shards));
            StepRecord& r = records[static_cast<size_t>(rank)];
            r.loss = *l;
            r.grads = ReadGrads(model);
            c->reset();
            return absl::OkStatus();
          },
          absl::StrCat("sp-", s, "-d", config.head_dim())));
      double loss_sum = 0;
      int64_t targets = 0;
      for (const StepRecord& r : records) {
        loss_sum += r.loss.loss_sum;
        targets += r.loss.num_targets;
      }
      EXPECT_EQ(targets, all_targets);
      const double loss_rel = Rel(loss_sum, whole.loss_sum);
      const double grad_rel = RelNorm(records[0].grads, whole_grads);
      EXPECT_LE(loss_rel, kLossSumTolerance) << loss_sum << " vs " << whole.loss_sum;
      EXPECT_LE(grad_rel, kGradTolerance);
      for (int r = 1; r < s; ++r) {
        EXPECT_EQ(DifferingBits(records[static_cast<size_t>(r)].grads, records[0].grads), 0)
            << "rank " << r;
      }
      std::printf(
          "[ parity ] head dim %lld, %d sequence ranks: loss sum %.9g vs %.9g (%.2e), "
          "gradient %.2e relative L2\n",
          static_cast<long long>(config.head_dim()), s, loss_sum, whole.loss_sum, loss_rel,
          grad_rel);
    }
  }
}

TEST(Gpus, DataAndSequenceParallelTrainingMatchesOneGpu) {
  REQUIRE_GPUS(2);
  const LongNetConfig config = TinyModel();
  const RunRecord& reference = OneGpuRun(config);
  ASSERT_EQ(reference.steps.size(), 5u);
  std::vector<std::pair<int, int>> runs = {{2, 1}, {1, 2}};
  if (GpuCount() >= 4) runs.insert(runs.end(), {{4, 1}, {2, 2}, {1, 4}});
  TrainerOptions probe;
  const bool has_sequence_parallel = SetSequenceParallel(&probe, 2);
  std::string skipped;
  for (const std::pair<int, int>& run : runs) {
    const int d = run.first, s = run.second;  // plain ints: lambdas below capture them
    if (s > 1 && !has_sequence_parallel) {
      absl::StrAppend(&skipped, skipped.empty() ? "" : ", ", d, "x", s);
      continue;
    }
    SCOPED_TRACE(absl::StrCat(d, " x ", s));
    const int w = d * s;
    std::vector<RunRecord> records(static_cast<size_t>(w));
    ExpectAllOk(RunNcclRanks(
        w, s,
        [&](int rank, comm::Communicator& world, comm::Communicator* sp) -> absl::Status {
          absl::StatusOr<RunRecord> r = TrainRank(config, rank, s, world, sp);
          if (!r.ok()) return r.status();
          records[static_cast<size_t>(rank)] = *std::move(r);
          return absl::OkStatus();
        },
        absl::StrCat("train-", d, "x", s)));
    const RunRecord& first = records[0];
    ASSERT_EQ(first.steps.size(), reference.steps.size());
    double worst = 0;
    for (size_t i = 0; i < reference.steps.size(); ++i) {
      const double rel = Rel(first.steps[i].loss, reference.steps[i].loss);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, kLossTolerance) << "step " << i + 1 << ": " << first.steps[i].loss
                                     << " vs one GPU's " << reference.steps[i].loss;
      EXPECT_EQ(first.steps[i].targets, reference.steps[i].targets);
      EXPECT_FALSE(first.steps[i].skipped);
    }
    // Every rank reports the same step losses and norms and holds the same weights.
    for (int r = 1; r < w; ++r) {
      const RunRecord& other = records[static_cast<size_t>(r)];
      ASSERT_EQ(other.steps.size(), first.steps.size()) << "rank " << r;
      for (size_t i = 0; i < first.steps.size(); ++i) {
        EXPECT_EQ(Bits(other.steps[i].loss), Bits(first.steps[i].loss))
            << "rank " << r << ", step " << i + 1;
        EXPECT_EQ(Bits(other.steps[i].grad_norm), Bits(first.steps[i].grad_norm))
            << "rank " << r << ", step " << i + 1;
      }
      EXPECT_EQ(DifferingBits(other.final_params, first.final_params), 0) << "rank " << r;
    }
    if (s == 1) {
      // The reduction after the backward instead of overlapped with it: the same bits.
      std::vector<RunRecord> plain(static_cast<size_t>(w));
      ExpectAllOk(RunNcclRanks(
          w, 1,
          [&](int rank, comm::Communicator& world, comm::Communicator* sp) -> absl::Status {
            absl::StatusOr<RunRecord> r = TrainRank(config, rank, 1, world, sp, false);
            if (!r.ok()) return r.status();
            plain[static_cast<size_t>(rank)] = *std::move(r);
            return absl::OkStatus();
          },
          absl::StrCat("train-", d, "x1-after")));
      ASSERT_EQ(plain[0].steps.size(), first.steps.size());
      for (size_t i = 0; i < first.steps.size(); ++i) {
        EXPECT_EQ(Bits(plain[0].steps[i].loss), Bits(first.steps[i].loss)) << "step " << i + 1;
        EXPECT_EQ(Bits(plain[0].steps[i].grad_norm), Bits(first.steps[i].grad_norm))
            << "step " << i + 1;
      }
      EXPECT_EQ(DifferingBits(plain[0].final_params, first.final_params), 0)
          << "final weights with the reduction after the backward";
      std::printf(
          "[ parity ] %d x 1 GPUs: reduction overlapped with the backward or after it: "
          "%lld differing bits in the final weights\n",
          d, static_cast<long long>(DifferingBits(plain[0].final_params, first.final_params)));
    }
    std::printf(
        "[ parity ] %d x %d GPUs: step losses %.6f .. %.6f, largest relative difference "
        "from one GPU %.2e (bound %.0e), final weights %.2e relative L2 from one GPU's\n",
        d, s, first.steps.front().loss, first.steps.back().loss, worst, kLossTolerance,
        RelNorm(first.final_params, reference.final_params));
  }
  if (!skipped.empty()) {
    std::printf(
        "[ skipped  ] %s: this build's trainer has no TrainerOptions::sequence_parallel "
        "(the data-parallel x sequence-parallel trainer of the train-dist branch); the "
        "sequence-parallel step is checked by SequenceParallelStepMatchesTheWholeSequence\n",
        skipped.c_str());
    RecordProperty("skipped_runs", skipped);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace model
}  // namespace dattn
