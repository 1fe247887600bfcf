// The trainer (model/trainer.h) on a GPU through NewCudaTrainableModel, against the same trainer on
// the CPU in fp32, on the built-in corpus with the tiny model of model/trainer_test.cc:
//   - the step losses follow the CPU's within 3% at every step (bf16 products against fp32: about
//     2^-9 relative per rounding; the model's own GPU test measured 2.4e-3 over 100 steps), the
//     validation losses too, bits per byte = loss / ln 2, the retrieval evaluation scores the same
//     examples, and the GPU run learns;
//   - gradient accumulation: 4 micro-batches give the 1-batch step's loss, norm and gradient
//     within 2e-2 (bf16: a different batch shape runs other GEMM tilings); loss_scale = 1 instead
//     of n_i / T would be 4x off;
//   - a non-finite gradient norm skips the update (weights unchanged) and enough in a row abort;
//   - the ShardOptimizer: the trainer's decay choice (optimizer.decay_embeddings), shards equal the
//     whole bit for bit, moments round-trip, errors name their values;
//   - checkpoints: the GPU's weights read back in fp32 bit for bit; a GPU checkpoint resumes on the
//     CPU and a CPU checkpoint on the GPU with bit-identical weights, each continuing within 3% of
//     the run it continues; a GPU run resumed on the GPU continues from the checkpoint (not bit
//     for bit in general: cuda_trainable_model.h says why): its next losses within 1e-3 and its
//     updates and second moments within 5e-2 of the uninterrupted run's (a resume that dropped
//     the moments would lose steps 1-3 from the second moments' sums: far more than 5e-2).
// Measured values are printed as "[ parity ]" lines. Without a GPU every test but the pure one
// skips, saying why.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/cuda/cuda_trainable_model.h"
#include "model/cuda/gpu_test_util.h"
#include "model/file_io.h"
#include "model/longnet_params.h"
#include "model/optimizer.h"
#include "model/testing/forwarding_model.h"
#include "model/trainer.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

namespace fs = std::filesystem;

constexpr char kKjv[] = "model/kjv.txt";
constexpr double kCurveTolerance = 3e-2;  // GPU bf16 against CPU fp32, relative, every step.

std::string TempDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = JoinPath(dir != nullptr ? dir : "/tmp", name);
  fs::remove_all(path);
  return path;
}

// model/trainer_test.cc's tiny model: 2 blocks of d = 64, 4 heads (D = 16: cuDNN's attention on
// the GPU), FFN 256, segments 32/64/128 with rates 1/2/4; batches of 8 x 128 bytes.
TrainerConfig TinyConfig(int64_t steps) {
  TrainerConfig c;
  c.model.vocab_size = 256;
  c.model.d_model = 64;
  c.model.num_layers = 2;
  c.model.num_heads = 4;
  c.model.ffn_dim = 256;
  c.model.segment_lengths = {32, 64, 128};
  c.model.dilation_rates = {1, 2, 4};
  c.threads = 2;
  c.data.validation_fraction = 0.01;
  c.seq_len = 128;
  c.batch_size = 8;
  c.micro_batches = 1;
  c.steps = steps;
  c.seed = 7;
  c.optimizer.lr = 3e-3;
  c.optimizer.min_lr = 3e-4;
  c.optimizer.warmup_steps = std::min<int64_t>(10, steps);  // The config allows no more.
  c.eval.every = 0;
  c.eval.batches = 4;
  return c;
}

const TokenCorpus& Kjv() {
  static const TokenCorpus* corpus = [] {
    absl::StatusOr<TokenCorpus> c = TokenCorpus::FromText(kKjv);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", std::string(c.status().message()).c_str());
      std::abort();
    }
    return new TokenCorpus(*std::move(c));
  }();
  return *corpus;
}

absl::StatusOr<std::unique_ptr<TrainableModel>> MakeModel(const TrainerConfig& config, bool gpu) {
  ModelOptions options;
  options.checkpoint_activations = config.checkpoint_activations;
  if (gpu) return NewCudaTrainableModel(config.model, options);
  return NewCpuTrainableModel(config.model, options, static_cast<int>(config.threads));
}

absl::StatusOr<std::unique_ptr<Trainer>> MakeTrainer(const TrainerConfig& config, bool gpu,
                                                     const std::string& checkpoint_dir = "") {
  absl::StatusOr<std::unique_ptr<TrainableModel>> model = MakeModel(config, gpu);
  if (!model.ok()) return model.status();
  TrainerOptions options;
  options.checkpoint_dir = checkpoint_dir;
  return Trainer::Create(config, Kjv(), *std::move(model), options);
}

struct RunRecord {
  std::vector<StepResult> steps;
  std::vector<EvalResult> evals;
};

// Runs `trainer` to its last step, recording what the callbacks see.
RunRecord RunToEnd(Trainer& trainer) {
  RunRecord r;
  RunCallbacks callbacks;
  callbacks.on_step = [&](const StepResult& s) { r.steps.push_back(s); };
  callbacks.on_eval = [&](const EvalResult& e) { r.evals.push_back(e); };
  const absl::Status s = trainer.Run(callbacks);
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

double Rel(double x, double ref) { return std::fabs(x - ref) / std::fabs(ref); }

// ||x - ref|| / ||ref||, in fp64.
double RelNorm(const std::vector<float>& x, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(x[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> ReadParams(TrainableModel& m) {
  std::vector<float> p(static_cast<size_t>(m.layout().total()));
  EXPECT_TRUE(m.ReadParams(0, absl::MakeSpan(p)).ok());
  return p;
}

std::vector<float> ReadDeviceGrads(TrainableModel& m) {
  std::vector<float> g(static_cast<size_t>(m.layout().total()));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(g.data(), m.grads(), g.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return g;
}

void WriteDevice(float* dst, const std::vector<float>& src) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dst, src.data(), src.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

std::vector<float> Pattern(int64_t n, uint64_t seed, double magnitude) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = static_cast<float>(magnitude * (static_cast<double>(x >> 11) / 9007199254740992.0 - 0.5));
  }
  return v;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The weights and moments of the checkpoint at `step` under `dir`.
struct Saved {
  std::vector<float> params, m, v;
};
Saved ReadCheckpoint(const std::string& dir, int64_t step, const ParamLayout& layout) {
  Saved s;
  absl::StatusOr<std::vector<CheckpointEntry>> all = ListCheckpoints(dir);
  EXPECT_TRUE(all.ok()) << all.status();
  if (!all.ok()) return s;
  for (const CheckpointEntry& e : *all) {
    if (e.step != step) continue;
    absl::StatusOr<Checkpoint> ck = Checkpoint::Open(e.path);
    EXPECT_TRUE(ck.ok()) << ck.status();
    if (!ck.ok()) return s;
    AdamWState state;
    s.params.resize(static_cast<size_t>(layout.total()));
    EXPECT_TRUE(ck->Restore(layout, absl::MakeSpan(s.params), &state).ok());
    s.m = std::move(state.m);
    s.v = std::move(state.v);
    return s;
  }
  ADD_FAILURE() << "no checkpoint of step " << step << " under " << dir;
  return s;
}

// A copy of `from`'s step folder alone under a new checkpoint folder `to`.
void CopyCheckpoint(const std::string& from, int64_t step, const std::string& to) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  fs::create_directories(to);
  fs::copy(JoinPath(from, name), JoinPath(to, name), fs::copy_options::recursive);
}

// The model with NaN written into its gradient after every ForwardBackward.
class PoisonedGradients : public ForwardingModel {
 public:
  explicit PoisonedGradients(std::unique_ptr<TrainableModel> inner)
      : ForwardingModel(std::move(inner)) {}
  absl::StatusOr<LossResult> ForwardBackward(const TokenBatch& batch,
                                             const BackwardOptions& options) override {
    absl::StatusOr<LossResult> r = inner().ForwardBackward(batch, options);
    if (!r.ok()) return r;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(inner().grads() + 5, &nan, 4, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      return absl::InternalError("poisoning the gradient failed");
    }
    return r;
  }
};

TEST(CudaTrainer, NominalPeakOfKnownCards) {
  EXPECT_EQ(NominalBf16PeakFlops("NVIDIA H200", 9, 0), 989.4e12);
  EXPECT_EQ(NominalBf16PeakFlops("NVIDIA H100 80GB HBM3", 9, 0), 989.4e12);
  EXPECT_EQ(NominalBf16PeakFlops("NVIDIA H100 PCIe", 9, 0), 756e12);
  EXPECT_EQ(NominalBf16PeakFlops("NVIDIA H100 NVL", 9, 0), 835e12);
  EXPECT_EQ(NominalBf16PeakFlops("NVIDIA A100-SXM4-80GB", 8, 0), 0);
  EXPECT_EQ(NominalBf16PeakFlops("NVIDIA B200", 10, 0), 0);
}

TEST(CudaTrainer, FollowsTheCpuTrainer) {
  SKIP_WITHOUT_GPU();
  TrainerConfig config = TinyConfig(40);
  config.eval.every = 20;
  config.retrieval.examples = 8;
  config.retrieval.depth = 0.5;
  absl::StatusOr<std::unique_ptr<Trainer>> cpu = MakeTrainer(config, false);
  absl::StatusOr<std::unique_ptr<Trainer>> gpu = MakeTrainer(config, true);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_NE((*gpu)->model().description().find("cuda bf16"), std::string::npos);
  EXPECT_GT((*gpu)->model().NominalPeakFlops(), 0);
  EXPECT_EQ((*gpu)->flops_per_step(), (*cpu)->flops_per_step());
  // The same initial weights, bit for bit.
  EXPECT_EQ(ReadParams((*gpu)->model()), ReadParams((*cpu)->model()));
  const RunRecord c = RunToEnd(**cpu);
  const RunRecord g = RunToEnd(**gpu);
  ASSERT_EQ(c.steps.size(), 40u);
  ASSERT_EQ(g.steps.size(), 40u);
  EXPECT_LE(Rel(g.steps[0].loss, c.steps[0].loss), 1e-2);
  EXPECT_LE(Rel(g.steps[0].grad_norm, c.steps[0].grad_norm), 5e-2);
  double worst = 0;
  for (size_t i = 0; i < c.steps.size(); ++i) {
    EXPECT_FALSE(g.steps[i].skipped) << i;
    EXPECT_EQ(g.steps[i].targets, c.steps[i].targets) << i;
    EXPECT_EQ(g.steps[i].lr, c.steps[i].lr) << i;
    worst = std::max(worst, Rel(g.steps[i].loss, c.steps[i].loss));
  }
  EXPECT_LE(worst, kCurveTolerance);
  ASSERT_EQ(c.evals.size(), 3u);  // Steps 0, 20, 40.
  ASSERT_EQ(g.evals.size(), 3u);
  double worst_eval = 0;
  for (size_t i = 0; i < c.evals.size(); ++i) {
    const EvalResult& ge = g.evals[i];
    const EvalResult& ce = c.evals[i];
    EXPECT_EQ(ge.step, ce.step);
    ASSERT_TRUE(ge.has_loss && ce.has_loss);
    EXPECT_EQ(ge.targets, ce.targets);
    EXPECT_DOUBLE_EQ(ge.bits_per_byte, ge.loss / std::log(2.0));
    worst_eval = std::max(worst_eval, Rel(ge.loss, ce.loss));
    ASSERT_TRUE(ge.has_retrieval);
    EXPECT_EQ(ge.retrieval.examples, 8);
    EXPECT_EQ(ge.retrieval.answer_tokens, ce.retrieval.answer_tokens);
    EXPECT_LE(ge.retrieval.correct_tokens, ge.retrieval.answer_tokens);
  }
  EXPECT_LE(worst_eval, kCurveTolerance);
  auto mean = [](const RunRecord& r, size_t from, size_t to) {
    double s = 0;
    for (size_t i = from; i < to; ++i) s += r.steps[i].loss;
    return s / static_cast<double>(to - from);
  };
  EXPECT_LT(mean(g, 35, 40), mean(g, 0, 5) - 1.0);
  std::cout << "[ parity ] trainer, 40 steps: CPU fp32 loss " << c.steps.front().loss << " -> "
            << c.steps.back().loss << ", GPU bf16 " << g.steps.front().loss << " -> "
            << g.steps.back().loss << "; largest step difference " << worst
            << " relative, validation " << worst_eval << " (bound " << kCurveTolerance << ")\n";
}

TEST(CudaTrainer, AccumulationEqualsTheBigBatch) {
  SKIP_WITHOUT_GPU();
  TrainerConfig config = TinyConfig(2);
  absl::StatusOr<std::unique_ptr<Trainer>> one = MakeTrainer(config, true);
  config.micro_batches = 4;
  absl::StatusOr<std::unique_ptr<Trainer>> four = MakeTrainer(config, true);
  ASSERT_TRUE(one.ok() && four.ok()) << one.status() << " / " << four.status();
  absl::StatusOr<StepResult> a = (*one)->Step();
  absl::StatusOr<StepResult> b = (*four)->Step();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->targets, b->targets);
  const double loss_err = Rel(b->loss, a->loss);
  const double norm_err = Rel(b->grad_norm, a->grad_norm);
  const double grad_err =
      RelNorm(ReadDeviceGrads((*four)->model()), ReadDeviceGrads((*one)->model()));
  EXPECT_LE(loss_err, 2e-3);
  EXPECT_LE(norm_err, 2e-2);
  EXPECT_LE(grad_err, 2e-2);
  std::cout << "[ parity ] accumulation on the GPU, 4 micro-batches against 1: loss " << loss_err
            << ", norm " << norm_err << ", gradient " << grad_err << " relative\n";
}

TEST(CudaTrainer, NonFiniteGradientNormsSkipThenAbort) {
  SKIP_WITHOUT_GPU();
  TrainerConfig config = TinyConfig(10);
  config.optimizer.max_consecutive_skips = 3;
  absl::StatusOr<std::unique_ptr<TrainableModel>> inner = MakeModel(config, true);
  ASSERT_TRUE(inner.ok()) << inner.status();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(config, Kjv(), std::make_unique<PoisonedGradients>(*std::move(inner)), {});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const std::vector<float> before = ReadParams((*trainer)->model());
  for (int i = 1; i <= 2; ++i) {
    absl::StatusOr<StepResult> r = (*trainer)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->skipped);
    EXPECT_FALSE(std::isfinite(r->grad_norm));
    EXPECT_EQ((*trainer)->updates(), 0);
  }
  EXPECT_EQ(ReadParams((*trainer)->model()), before);
  absl::StatusOr<StepResult> third = (*trainer)->Step();
  EXPECT_EQ(third.status().code(), absl::StatusCode::kAborted) << third.status();
  EXPECT_NE(third.status().message().find("optimizer.max_consecutive_skips"), std::string::npos);
}

TEST(CudaTrainer, ShardOptimizer) {
  SKIP_WITHOUT_GPU();
  const TrainerConfig config = TinyConfig(1);
  absl::StatusOr<std::unique_ptr<TrainableModel>> a = MakeModel(config, true);
  absl::StatusOr<std::unique_ptr<TrainableModel>> b = MakeModel(config, true);
  ASSERT_TRUE(a.ok() && b.ok());
  TrainableModel& ma = **a;
  TrainableModel& mb = **b;
  const ParamLayout& layout = ma.layout();
  const int64_t total = layout.total();
  ASSERT_TRUE(ma.InitParams(3).ok());
  ASSERT_TRUE(mb.InitParams(3).ok());

  // The trainer's decay choice: with a zero gradient and zero moments an update only decays.
  AdamWConfig wd;
  wd.weight_decay = 0.5;
  for (const bool decay_embeddings : {false, true}) {
    absl::StatusOr<AdamW> adamw = AdamW::Create(
        layout, wd,
        decay_embeddings ? DecayPredicate(WantsWeightDecay) : DecayPredicate(DecayByConvention));
    ASSERT_TRUE(adamw.ok());
    absl::StatusOr<std::unique_ptr<ShardOptimizer>> opt = ma.NewOptimizer(*adamw, 0, total);
    ASSERT_TRUE(opt.ok()) << opt.status();
    WriteDevice(ma.grads(), std::vector<float>(static_cast<size_t>(total), 0.0f));
    const std::vector<float> p0 = ReadParams(ma);
    AdamWStepArgs args;
    args.t = 1;
    args.lr = 0.1;
    ASSERT_TRUE((*opt)->Update(args).ok());
    const std::vector<float> p1 = ReadParams(ma);
    const float keep = static_cast<float>(1.0 - 0.1 * 0.5);
    for (const ParamEntry& e : layout.entries()) {
      const bool decays = adamw->Decays(e.offset);
      if (e.name == "token_embedding.weight") {
        EXPECT_EQ(decays, decay_embeddings);
      }
      if (e.name.find("q_proj.weight") != std::string::npos) {
        EXPECT_TRUE(decays) << e.name;
      }
      if (e.name.find("norm") != std::string::npos) {
        EXPECT_FALSE(decays) << e.name;
      }
      for (int64_t i = e.offset; i < e.offset + e.numel; ++i) {
        ASSERT_EQ(Bits(p1[i]), Bits(decays ? p0[i] * keep : p0[i])) << e.name << " " << i;
      }
    }
  }

  // Two shards equal one optimizer over everything, bit for bit; their sums of squares add up.
  ASSERT_TRUE(ma.InitParams(3).ok());
  absl::StatusOr<AdamW> adamw = AdamW::Create(layout, {});
  ASSERT_TRUE(adamw.ok());
  const int64_t cut = total / 3 + 1;
  absl::StatusOr<std::unique_ptr<ShardOptimizer>> whole = mb.NewOptimizer(*adamw, 0, total);
  absl::StatusOr<std::unique_ptr<ShardOptimizer>> lo = ma.NewOptimizer(*adamw, 0, cut);
  absl::StatusOr<std::unique_ptr<ShardOptimizer>> hi = ma.NewOptimizer(*adamw, cut, total);
  ASSERT_TRUE(whole.ok() && lo.ok() && hi.ok());
  EXPECT_EQ((*hi)->begin(), cut);
  EXPECT_EQ((*hi)->end(), total);
  for (int t = 1; t <= 2; ++t) {
    const std::vector<float> g = Pattern(total, t, 0.02);
    WriteDevice(ma.grads(), g);
    WriteDevice(mb.grads(), g);
    absl::StatusOr<double> sw = (*whole)->GradSumOfSquares();
    absl::StatusOr<double> sl = (*lo)->GradSumOfSquares();
    absl::StatusOr<double> sh = (*hi)->GradSumOfSquares();
    ASSERT_TRUE(sw.ok() && sl.ok() && sh.ok());
    const double host = SumOfSquares(g);
    EXPECT_NEAR(*sw, host, 1e-12 * host);
    EXPECT_NEAR(*sl + *sh, host, 1e-12 * host);
    AdamWStepArgs args;
    args.t = t;
    args.lr = 1e-2;
    args.grad_scale = 0.7;
    ASSERT_TRUE((*whole)->Update(args).ok());
    ASSERT_TRUE((*lo)->Update(args).ok());
    ASSERT_TRUE((*hi)->Update(args).ok());
  }
  EXPECT_EQ(ReadParams(ma), ReadParams(mb));

  // Moments round-trip; the high shard's are the whole's tail.
  std::vector<float> m(static_cast<size_t>(total)), v(m.size());
  ASSERT_TRUE((*whole)->ReadMoments(absl::MakeSpan(m), absl::MakeSpan(v)).ok());
  std::vector<float> mh(static_cast<size_t>(total - cut)), vh(mh.size());
  ASSERT_TRUE((*hi)->ReadMoments(absl::MakeSpan(mh), absl::MakeSpan(vh)).ok());
  EXPECT_TRUE(std::equal(mh.begin(), mh.end(), m.begin() + cut));
  EXPECT_TRUE(std::equal(vh.begin(), vh.end(), v.begin() + cut));
  const std::vector<float> pm = Pattern(total, 11, 1.0), pv = Pattern(total, 12, 1.0);
  ASSERT_TRUE((*whole)->WriteMoments(pm, pv).ok());
  ASSERT_TRUE((*whole)->ReadMoments(absl::MakeSpan(m), absl::MakeSpan(v)).ok());
  EXPECT_EQ(m, pm);
  EXPECT_EQ(v, pv);

  // Errors, each before anything is enqueued.
  AdamWStepArgs bad;
  bad.t = 0;
  EXPECT_EQ((*whole)->Update(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.t = 1;
  bad.grad_scale = 0;
  EXPECT_EQ((*whole)->Update(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*hi)->ReadMoments(absl::MakeSpan(m), absl::MakeSpan(v)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ma.NewOptimizer(*adamw, 5, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ma.NewOptimizer(*adamw, 0, total + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  TrainerConfig other = TinyConfig(1);
  other.model.ffn_dim = 128;
  absl::StatusOr<ParamLayout> other_layout = BuildParamLayout(other.model);
  ASSERT_TRUE(other_layout.ok());
  absl::StatusOr<AdamW> other_adamw = AdamW::Create(*other_layout, {});
  ASSERT_TRUE(other_adamw.ok());
  EXPECT_EQ(ma.NewOptimizer(*other_adamw, 0, other_adamw->total()).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> two(2);
  const absl::Status read = ma.ReadParams(total - 1, absl::MakeSpan(two));
  EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(read.message().find(std::to_string(total)), std::string::npos) << read;
  EXPECT_EQ(ma.WriteParams(-1, two).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> tokens(2 * 16, 1);
  TokenBatch tb;
  tb.tokens = tokens.data();
  tb.batch = 2;
  tb.seq_len = 16;
  EXPECT_EQ(ma.ForwardBackward(tb, {}).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> predictions(5);
  EXPECT_EQ(ma.Evaluate(tb, absl::MakeSpan(predictions)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Predictions are the argmax of the logits, and need no targets.
  predictions.resize(tokens.size());
  ASSERT_TRUE(ma.Evaluate(tb, absl::MakeSpan(predictions)).ok());
  for (int32_t p : predictions) {
    EXPECT_GE(p, 0);
    EXPECT_LT(p, 256);
  }
}

TEST(CudaTrainer, CheckpointsMoveBetweenGpuAndCpu) {
  SKIP_WITHOUT_GPU();
  TrainerConfig config = TinyConfig(6);
  config.checkpoint.every = 3;
  config.checkpoint.keep_last = 5;
  config.eval.batches = 2;
  const std::string gpu_dir = TempDir("gpu_run"), cpu_dir = TempDir("cpu_run");

  // The uninterrupted runs, on each device.
  absl::StatusOr<std::unique_ptr<Trainer>> ga = MakeTrainer(config, true, gpu_dir);
  ASSERT_TRUE(ga.ok()) << ga.status();
  const RunRecord a = RunToEnd(**ga);
  absl::StatusOr<std::unique_ptr<Trainer>> ca = MakeTrainer(config, false, cpu_dir);
  ASSERT_TRUE(ca.ok()) << ca.status();
  const RunRecord c = RunToEnd(**ca);
  ASSERT_EQ(a.steps.size(), 6u);
  ASSERT_EQ(c.steps.size(), 6u);
  const ParamLayout& layout = (*ga)->model().layout();
  // The GPU's checkpoint holds its fp32 master weights, read back bit for bit, and its moments.
  const Saved a6 = ReadCheckpoint(gpu_dir, 6, layout);
  ASSERT_EQ(a6.params.size(), static_cast<size_t>(layout.total()));
  EXPECT_EQ(a6.params, ReadParams((*ga)->model()));
  double v_sum = 0;
  for (float x : a6.v) v_sum += x;
  EXPECT_GT(v_sum, 0);
  const Saved a3 = ReadCheckpoint(gpu_dir, 3, layout);
  const Saved c3 = ReadCheckpoint(cpu_dir, 3, layout);

  // A GPU checkpoint on the CPU, and a CPU checkpoint on the GPU: the same weights, bit for bit;
  // each run continues within the curve tolerance of the run it continues.
  struct Cross {
    const char* what;
    bool gpu;
    const std::string from;
    const Saved& saved;
    const RunRecord& continues;
  };
  for (const Cross& x : {Cross{"GPU checkpoint resumed on the CPU", false, gpu_dir, a3, a},
                         Cross{"CPU checkpoint resumed on the GPU", true, cpu_dir, c3, c}}) {
    const std::string dir = TempDir(x.gpu ? "cpu_to_gpu" : "gpu_to_cpu");
    CopyCheckpoint(x.from, 3, dir);
    absl::StatusOr<std::unique_ptr<Trainer>> t = MakeTrainer(config, x.gpu, dir);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->Resume().ok()) << x.what;
    EXPECT_EQ((*t)->step(), 3);
    EXPECT_EQ((*t)->updates(), 3);
    EXPECT_EQ(ReadParams((*t)->model()), x.saved.params) << x.what;
    const RunRecord r = RunToEnd(**t);
    ASSERT_EQ(r.steps.size(), 3u) << x.what;
    double worst = 0;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(r.steps[i].step, static_cast<int64_t>(i + 4));
      worst = std::max(worst, Rel(r.steps[i].loss, x.continues.steps[i + 3].loss));
    }
    EXPECT_LE(worst, kCurveTolerance) << x.what;
    ASSERT_EQ((*t)->history().train.size(), 6u);  // Steps 1-3 from the checkpoint's history.
    EXPECT_EQ((*t)->history().train[0].loss, x.continues.steps[0].loss);
    std::cout << "[ parity ] " << x.what << ": weights bit-identical; steps 4-6 within " << worst
              << " of the run it continues\n";
  }

  // A GPU run resumed on the GPU continues from the checkpoint: its next losses, its updates since
  // step 3 and its second moments at step 6 equal the uninterrupted run's within bf16 noise.
  const std::string dir = TempDir("gpu_resume");
  CopyCheckpoint(gpu_dir, 3, dir);
  absl::StatusOr<std::unique_ptr<Trainer>> gb = MakeTrainer(config, true, dir);
  ASSERT_TRUE(gb.ok()) << gb.status();
  ASSERT_TRUE((*gb)->Resume().ok());
  EXPECT_EQ(ReadParams((*gb)->model()), a3.params);
  const RunRecord b = RunToEnd(**gb);
  ASSERT_EQ(b.steps.size(), 3u);
  double worst = 0;
  bool bit_exact = true;
  for (size_t i = 0; i < 3; ++i) {
    worst = std::max(worst, Rel(b.steps[i].loss, a.steps[i + 3].loss));
    bit_exact = bit_exact && b.steps[i].loss == a.steps[i + 3].loss;
  }
  EXPECT_LE(worst, 1e-3);
  const Saved b6 = ReadCheckpoint(dir, 6, layout);
  ASSERT_EQ(b6.params.size(), a6.params.size());
  std::vector<float> update_a(a6.params.size()), update_b(a6.params.size());
  for (size_t i = 0; i < a6.params.size(); ++i) {
    update_a[i] = a6.params[i] - a3.params[i];
    update_b[i] = b6.params[i] - a3.params[i];
  }
  const double update_err = RelNorm(update_b, update_a);
  const double v_err = RelNorm(b6.v, a6.v);
  EXPECT_LE(update_err, 5e-2);
  EXPECT_LE(v_err, 5e-2);
  std::cout << "[ parity ] GPU resumed on the GPU (same process): steps 4-6 within " << worst
            << (bit_exact ? " (bit-exact)" : "") << "; updates since step 3 within " << update_err
            << ", second moments within " << v_err << " of the uninterrupted run\n";
}

}  // namespace
}  // namespace cuda
}  // namespace model
}  // namespace dattn
