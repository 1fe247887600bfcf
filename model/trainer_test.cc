// The trainer on the CPU in fp32, on the built-in corpus (//model:kjv_corpus): the loss falls,
// resume after a killed process is bit-exact, gradient accumulation equals the big batch, damaged
// or foreign checkpoints are refused by name, divergence aborts, stop saves, configs are checked.
#include "model/trainer.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/file_io.h"
#include "model/longnet_params.h"
#include "model/testing/forwarding_model.h"
#include "model/testing/local_collective.h"

namespace dattn {
namespace model {
namespace {

namespace fs = std::filesystem;

constexpr char kKjv[] = "model/kjv.txt";

std::string TempDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = JoinPath(dir != nullptr ? dir : "/tmp", name);
  fs::remove_all(path);
  return path;
}

// A small byte-level model: 2 blocks of d = 64, 4 heads, FFN 256, dilated segments 32/64/128 with
// rates 1/2/4 (every pattern of the engine is used at seq_len 128); 117,760 parameters.
TrainerConfig TinyConfig() {
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
  c.steps = 100;
  c.seed = 7;
  c.optimizer.lr = 3e-3;
  c.optimizer.min_lr = 3e-4;
  c.optimizer.warmup_steps = 10;
  c.eval.every = 0;
  c.eval.batches = 16;
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

absl::StatusOr<std::unique_ptr<TrainableModel>> MakeModel(const TrainerConfig& config) {
  ModelOptions options;
  options.checkpoint_activations = config.checkpoint_activations;
  return NewTrainableModel(config.device, config.model, options, static_cast<int>(config.threads));
}

absl::StatusOr<std::unique_ptr<Trainer>> MakeTrainer(const TrainerConfig& config,
                                                     const std::string& checkpoint_dir = "") {
  absl::StatusOr<std::unique_ptr<TrainableModel>> model = MakeModel(config);
  if (!model.ok()) return model.status();
  TrainerOptions options;
  options.checkpoint_dir = checkpoint_dir;
  return Trainer::Create(config, Kjv(), *std::move(model), options);
}

uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Entropy in nats of the empirical distribution of tokens [begin, end): the smallest mean loss
// any predictor that ignores context can have on them, even one fitted to them.
double EmpiricalEntropy(const TokenCorpus& corpus, int64_t begin, int64_t end) {
  std::vector<int32_t> tokens(static_cast<size_t>(end - begin));
  EXPECT_TRUE(corpus.Read(begin, absl::MakeSpan(tokens)).ok());
  std::array<double, 256> counts{};
  for (int32_t t : tokens) counts[static_cast<size_t>(t)] += 1;
  double h = 0;
  for (double c : counts) {
    if (c > 0) h -= c / tokens.size() * std::log(c / tokens.size());
  }
  return h;
}

TEST(TrainerTest, LossFallsOnKjv) {
  const TrainerConfig config = TinyConfig();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = MakeTrainer(config);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<EvalResult> before = (*trainer)->Evaluate();
  ASSERT_TRUE(before.ok()) << before.status();
  std::vector<double> losses;
  RunCallbacks callbacks;
  callbacks.on_step = [&](const StepResult& r) { losses.push_back(r.loss); };
  const absl::Status run = (*trainer)->Run(callbacks);
  ASSERT_TRUE(run.ok()) << run;
  ASSERT_EQ(losses.size(), 100u);
  const EvalResult& after = (*trainer)->history().evals.back();
  ASSERT_TRUE(after.has_loss);
  EXPECT_EQ(after.step, 100);
  // The validation targets the trainer scored: eval.batches windows of 8 rows, in corpus order.
  const int64_t begin = (*trainer)->split().validation.begin + 1;
  const int64_t scored = config.eval.batches * config.batch_size * config.seq_len;
  EXPECT_EQ(after.targets, scored);
  const double unigram = EmpiricalEntropy(Kjv(), begin, begin + scored);
  auto mean = [](const std::vector<double>& v, size_t from, size_t to) {
    double s = 0;
    for (size_t i = from; i < to; ++i) s += v[i];
    return s / static_cast<double>(to - from);
  };
  std::printf(
      "validation loss %.4f -> %.4f nats (%.3f bits/byte); unigram entropy of those bytes %.4f; "
      "training loss, mean of the first 5 steps %.4f, of the last 5 %.4f\n",
      before->loss, after.loss, after.bits_per_byte, unigram, mean(losses, 0, 5),
      mean(losses, 95, 100));
  // Untrained, the model is no better than uniform over 256 bytes (ln 256 = 5.55).
  EXPECT_GT(before->loss, 5.0);
  // Trained: below the entropy of the held-out bytes' own unigram distribution, which no
  // predictor that ignores context can beat, whatever its parameters (measured: 2.21 vs 3.03).
  // Reaching it needs a model that uses the preceding bytes; it is a mean over 16,384 held-out
  // positions, so it cannot be met by a lucky batch.
  EXPECT_LT(after.loss, unigram - 0.3);
  EXPECT_NEAR(after.bits_per_byte, after.loss / std::log(2.0), 1e-12);
  EXPECT_LT(mean(losses, 95, 100), mean(losses, 0, 5) - 2.0);
}

// The config of the resume test: accumulation over 2 micro-batches, a quarter of the rows
// replaced by retrieval examples (the trainer's Rng decides which), evaluations in between
// (validation and retrieval, which reshape the model's buffers), checkpoints every 4 steps.
TrainerConfig ResumeConfig() {
  TrainerConfig c = TinyConfig();
  c.steps = 12;
  c.micro_batches = 2;
  c.retrieval.train_fraction = 0.25;
  c.retrieval.examples = 4;
  c.eval.every = 3;
  c.eval.batches = 2;
  c.checkpoint.every = 4;
  c.checkpoint.keep_last = 10;
  return c;
}

TEST(TrainerTest, ResumeAfterKillIsBitExact) {
  const TrainerConfig config = ResumeConfig();
  // The run that never stops.
  const std::string straight_dir = TempDir("resume_straight");
  absl::StatusOr<std::unique_ptr<Trainer>> straight = MakeTrainer(config, straight_dir);
  ASSERT_TRUE(straight.ok()) << straight.status();
  std::vector<StepResult> expected;
  RunCallbacks record;
  record.on_step = [&](const StepResult& r) { expected.push_back(r); };
  ASSERT_TRUE((*straight)->Run(record).ok());
  ASSERT_EQ(expected.size(), 12u);
  int64_t retrieval_rows = 0;
  for (const StepResult& r : expected) retrieval_rows += r.retrieval_rows;
  EXPECT_GT(retrieval_rows, 0);  // The Rng's choices are part of what resume must restore.

  // A process that is killed after step 6 (its last checkpoint is step 4; steps 5 and 6 are lost).
  const std::string dir = TempDir("resume_killed");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<std::unique_ptr<Trainer>> doomed = MakeTrainer(config, dir);
    if (!doomed.ok()) _exit(3);
    RunCallbacks die;
    die.on_step = [](const StepResult& r) {
      if (r.step == 6) _exit(0);  // No unwinding, no final checkpoint: as if killed.
    };
    (void)(*doomed)->Run(die);
    _exit(4);  // Run ended without reaching step 6.
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  absl::StatusOr<std::vector<CheckpointEntry>> left = ListCheckpoints(dir);
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ(left->back().step, 4);

  // A new process resumes.
  absl::StatusOr<std::unique_ptr<Trainer>> resumed = MakeTrainer(config, dir);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  const absl::Status resume = (*resumed)->Resume();
  ASSERT_TRUE(resume.ok()) << resume;
  EXPECT_EQ((*resumed)->step(), 4);
  EXPECT_TRUE((*resumed)->resume_notes().empty());
  std::vector<StepResult> got;
  RunCallbacks again;
  again.on_step = [&](const StepResult& r) { got.push_back(r); };
  ASSERT_TRUE((*resumed)->Run(again).ok());
  ASSERT_EQ(got.size(), 8u);
  for (size_t i = 0; i < got.size(); ++i) {
    const StepResult& want = expected[4 + i];
    EXPECT_EQ(got[i].step, want.step);
    EXPECT_EQ(Bits(got[i].loss), Bits(want.loss))
        << "step " << want.step << ": " << got[i].loss << " vs " << want.loss;
    EXPECT_EQ(Bits(got[i].grad_norm), Bits(want.grad_norm)) << "step " << want.step;
    EXPECT_EQ(got[i].retrieval_rows, want.retrieval_rows) << "step " << want.step;
  }
  // The history in the checkpoint carries the steps before the resume.
  const TrainingHistory& history = (*resumed)->history();
  ASSERT_EQ(history.train.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(Bits(history.train[i].loss), Bits(expected[i].loss)) << "history step " << i + 1;
  }
  EXPECT_EQ(history.evals.size(), (*straight)->history().evals.size());
  // And the weights end the same, bit for bit.
  const int64_t total = (*straight)->model().layout().total();
  std::vector<float> a(static_cast<size_t>(total)), b(static_cast<size_t>(total));
  ASSERT_TRUE((*straight)->model().ReadParams(0, absl::MakeSpan(a)).ok());
  ASSERT_TRUE((*resumed)->model().ReadParams(0, absl::MakeSpan(b)).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ((*resumed)->tokens_seen(), (*straight)->tokens_seen());
  EXPECT_EQ((*resumed)->updates(), 12);
}

// One step from the same weights over the same 8 rows: in one pass, in 4 micro-batches of 2 rows,
// in 8 of 1. The micro-batch losses are scaled by their share of the targets, so the accumulated
// gradient is the big batch's up to fp32 summation order: each parameter gradient is a sum over
// the 1,024 positions, added as one GEMM reduction or as 4 or 8 partial sums; the bound below is
// relative to the largest gradient entry. Loss sums are fp64.
TEST(TrainerTest, AccumulationEqualsTheBigBatch) {
  TrainerConfig config = TinyConfig();
  config.steps = 3;
  config.optimizer.warmup_steps = 1;
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<StepResult>> steps;
  for (int64_t micro : {1, 4, 8}) {
    config.micro_batches = micro;
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = MakeTrainer(config);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    std::vector<StepResult> results;
    absl::StatusOr<StepResult> first = (*trainer)->Step();
    ASSERT_TRUE(first.ok()) << first.status();
    results.push_back(*first);
    // The first step's gradient (AdamW leaves grads() as computed: clipping is a factor of the
    // update).
    const float* g = (*trainer)->model().grads();
    grads.emplace_back(g, g + (*trainer)->model().layout().total());
    for (int s = 0; s < 2; ++s) {
      absl::StatusOr<StepResult> r = (*trainer)->Step();
      ASSERT_TRUE(r.ok()) << r.status();
      results.push_back(*r);
    }
    steps.push_back(results);
  }
  float largest = 0;
  for (float x : grads[0]) largest = std::max(largest, std::abs(x));
  ASSERT_GT(largest, 0);
  for (size_t k = 1; k < grads.size(); ++k) {
    double worst = 0;
    for (size_t i = 0; i < grads[0].size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(grads[k][i] - grads[0][i])));
    }
    std::printf(
        "micro-batches %s: max |gradient difference| / max |gradient| = %.3g; first "
        "loss difference %.3g\n",
        k == 1 ? "4" : "8", worst / largest, steps[k][0].loss - steps[0][0].loss);
    EXPECT_LE(worst, 1e-5 * largest) << "micro-batch variant " << k;
    // The loss is summed in fp64, but its per-token terms come from fp32 matrix products, and
    // OpenBLAS may round a row differently with the number of rows in the call: its Haswell
    // kernels (AVX2, the ones an AMD EPYC runs) give 2.7e-9 relative here, its SkylakeX and
    // Sandybridge ones 5e-16. So fp32 rounding, not bit equality: a micro-batch weighted wrongly or
    // left out is far above it, an fp32 sum of the micro-batches' losses would not be.
    EXPECT_NEAR(steps[k][0].loss, steps[0][0].loss, 1e-6 * steps[0][0].loss);
    EXPECT_NEAR(steps[k][0].grad_norm, steps[0][0].grad_norm, 1e-5 * steps[0][0].grad_norm);
    EXPECT_EQ(steps[k][0].targets, steps[0][0].targets);
    // Later steps start from weights that differ by those roundings only.
    for (size_t s = 1; s < 3; ++s) {
      EXPECT_NEAR(steps[k][s].loss, steps[0][s].loss, 1e-4 * steps[0][s].loss) << "step " << s + 1;
    }
  }
}

// A collective of one rank that reduces ranges early (as the GPU one does) and records them: a copy
// of each range when handed, compared with the buffer when the reduction finishes.
class HandOverRecorder final : public testing::LocalCollective {
 public:
  bool reduces_ranges_early() const override { return true; }

  std::vector<std::vector<ElementRange>> steps;  // The ranges of each reduction, in order.
  int changed_after_hand_over = 0;

 protected:
  absl::Status ReduceGradientRange(float* grads, int64_t begin, int64_t end,
                                   absl::Span<const ShardRange>) override {
    if (pending_.empty()) steps.emplace_back();
    steps.back().push_back({begin, end});
    pending_.push_back({grads, begin, std::vector<float>(grads + begin, grads + end)});
    return absl::OkStatus();
  }
  absl::Status FinishGradientRanges() override {
    for (const Pending& p : pending_) {
      if (!std::equal(p.copy.begin(), p.copy.end(), p.grads + p.begin)) ++changed_after_hand_over;
    }
    pending_.clear();
    return absl::OkStatus();
  }

 private:
  struct Pending {
    const float* grads;
    int64_t begin;
    std::vector<float> copy;
  };
  std::vector<Pending> pending_;
};

// TrainerOptions::overlap_gradient_reduction: the last micro-batch's backward hands every range
// once, in the model's finishing order, each final when handed; the earlier micro-batches' hand
// none (their gradients are not final). Off, the reduction gets the whole buffer after the
// backward. The losses are the same bits.
TEST(TrainerTest, HandsFinishedGradientRangesToTheCollective) {
  TrainerConfig config = TinyConfig();
  config.steps = 2;
  config.optimizer.warmup_steps = 1;
  config.micro_batches = 2;
  std::vector<std::vector<uint64_t>> losses;
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    absl::StatusOr<std::unique_ptr<TrainableModel>> model = MakeModel(config);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<ModelOffsets> offsets = ResolveOffsets(config.model, (*model)->layout());
    ASSERT_TRUE(offsets.ok()) << offsets.status();
    const int64_t total = (*model)->layout().total();
    const std::vector<ElementRange> order = BackwardFinishOrder(*offsets, total);
    HandOverRecorder recorder;
    TrainerOptions options;
    options.collective = &recorder;
    options.overlap_gradient_reduction = overlap;
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(config, Kjv(), *std::move(model), options);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    std::vector<uint64_t> bits;
    for (int s = 0; s < 2; ++s) {
      absl::StatusOr<StepResult> r = (*trainer)->Step();
      ASSERT_TRUE(r.ok()) << r.status();
      bits.push_back(Bits(r->loss));
    }
    losses.push_back(bits);
    ASSERT_EQ(recorder.steps.size(), 2u);  // One reduction per step, not one per micro-batch.
    for (const std::vector<ElementRange>& step : recorder.steps) {
      if (overlap) {
        ASSERT_EQ(step.size(), order.size());
        for (size_t k = 0; k < order.size(); ++k) {
          EXPECT_EQ(step[k].begin, order[k].begin) << "range " << k;
          EXPECT_EQ(step[k].end, order[k].end) << "range " << k;
        }
      } else {
        ASSERT_EQ(step.size(), 1u);
        EXPECT_EQ(step[0].begin, 0);
        EXPECT_EQ(step[0].end, total);
      }
    }
    EXPECT_EQ(recorder.changed_after_hand_over, 0);
  }
  EXPECT_EQ(losses[0], losses[1]);
}

void FlipByte(const std::string& path, int64_t from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  f.seekg(size - from_end);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(size - from_end);
  f.write(&c, 1);
}

TrainerConfig FourSteps() {
  TrainerConfig c = TinyConfig();
  c.steps = 4;
  c.optimizer.warmup_steps = 1;
  c.checkpoint.every = 2;
  return c;
}

// Trains 4 steps with a checkpoint every 2 into a fresh folder; returns it.
std::string TrainFourSteps(const std::string& name) {
  const std::string dir = TempDir(name);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = MakeTrainer(FourSteps(), dir);
  if (!trainer.ok()) {
    ADD_FAILURE() << trainer.status();
    return dir;
  }
  const absl::Status run = (*trainer)->Run();
  EXPECT_TRUE(run.ok()) << run;
  return dir;
}

absl::Status ResumeIn(const std::string& dir, const TrainerConfig& config = FourSteps()) {
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = MakeTrainer(config, dir);
  if (!trainer.ok()) return trainer.status();
  return (*trainer)->Resume();
}

TEST(TrainerTest, ResumeNamesWhatIsWrongWithACheckpoint) {
  const std::string newest = CheckpointFolderName(4);
  {
    // Intact: resumes.
    const std::string dir = TrainFourSteps("ck_intact");
    EXPECT_TRUE(ResumeIn(dir).ok());
  }
  {
    // A bit flipped in the weights (same size: only the checksum can tell).
    const std::string dir = TrainFourSteps("ck_flipped");
    const std::string file = JoinPath(JoinPath(dir, newest), kWeightsFile);
    FlipByte(file, 100);
    const absl::Status s = ResumeIn(dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(file), std::string::npos) << s;
    EXPECT_NE(s.message().find("SHA-256"), std::string::npos) << s;
  }
  {
    // A truncated optimizer file: the newest folder is damaged; not silently skipped.
    const std::string dir = TrainFourSteps("ck_truncated");
    const std::string file = JoinPath(JoinPath(dir, newest), kOptimizerFile);
    fs::resize_file(file, fs::file_size(file) - 8);
    const absl::Status s = ResumeIn(dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(file), std::string::npos) << s;
  }
  {
    // A file listed in the manifest is missing.
    const std::string dir = TrainFourSteps("ck_missing");
    const std::string file = JoinPath(JoinPath(dir, newest), kTrainerStateFile);
    fs::remove(file);
    const absl::Status s = ResumeIn(dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(file), std::string::npos) << s;
  }
  {
    // No manifest: an incomplete folder (as from an interrupted copy). The complete one before it
    // is used; the incomplete one is moved aside and reported, and the run writes step 4 again.
    const std::string dir = TrainFourSteps("ck_manifest");
    const std::string folder = JoinPath(dir, newest);
    fs::remove(JoinPath(folder, kManifestFile));
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = MakeTrainer(FourSteps(), dir);
    ASSERT_TRUE(trainer.ok());
    const absl::Status s = (*trainer)->Resume();
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ((*trainer)->step(), 2);
    ASSERT_EQ((*trainer)->resume_notes().size(), 1u);
    EXPECT_NE((*trainer)->resume_notes()[0].find(folder + " has no MANIFEST.json"),
              std::string::npos)
        << (*trainer)->resume_notes()[0];
    EXPECT_TRUE(fs::is_directory(folder + ".incomplete"));
    const absl::Status run = (*trainer)->Run();
    EXPECT_TRUE(run.ok()) << run;
    EXPECT_TRUE(Checkpoint::Open(folder).ok());
  }
  {
    // Another model.
    const std::string dir = TrainFourSteps("ck_model");
    TrainerConfig other = FourSteps();
    other.model.ffn_dim = 128;
    const absl::Status s = ResumeIn(dir, other);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(JoinPath(JoinPath(dir, newest), kConfigFile)), std::string::npos)
        << s;
    EXPECT_NE(s.message().find("ffn_dim: 256 there, 128 here"), std::string::npos) << s;
  }
  {
    // Another global batch, the same model: the cursor does not fit.
    const std::string dir = TrainFourSteps("ck_cursor");
    TrainerConfig other = FourSteps();
    other.batch_size = 4;
    const absl::Status s = ResumeIn(dir, other);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(kTrainerStateFile), std::string::npos) << s;
  }
  {
    // Nothing to resume.
    const absl::Status s = ResumeIn(TempDir("ck_none"));
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  }
  {
    // Only incomplete folders.
    const std::string dir = TrainFourSteps("ck_all_incomplete");
    fs::remove(JoinPath(JoinPath(dir, CheckpointFolderName(2)), kManifestFile));
    fs::remove(JoinPath(JoinPath(dir, newest), kManifestFile));
    const absl::Status s = ResumeIn(dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_NE(s.message().find("2 step folders without MANIFEST.json"), std::string::npos) << s;
  }
}

TEST(TrainerTest, KeepsTheLastCheckpointsAndStopsOnRequest) {
  TrainerConfig config = TinyConfig();
  config.steps = 10;
  config.optimizer.warmup_steps = 2;
  config.checkpoint.every = 2;
  config.checkpoint.keep_last = 2;
  const std::string dir = TempDir("ck_keep");
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = MakeTrainer(config, dir);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::atomic<bool> stop{false};
  std::vector<int64_t> saved;
  RunCallbacks callbacks;
  callbacks.stop = &stop;
  callbacks.on_step = [&](const StepResult& r) { stop = r.step == 7; };
  callbacks.on_checkpoint = [&](const std::string&, int64_t step) { saved.push_back(step); };
  const absl::Status s = (*trainer)->Run(callbacks);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_NE(s.message().find(CheckpointFolderName(7)), std::string::npos) << s;
  EXPECT_EQ(saved, (std::vector<int64_t>{2, 4, 6, 7}));
  absl::StatusOr<std::vector<CheckpointEntry>> left = ListCheckpoints(dir);
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 2u);
  EXPECT_EQ((*left)[0].step, 6);
  EXPECT_EQ((*left)[1].step, 7);
  // Resuming finishes the run and keeps the last two.
  absl::StatusOr<std::unique_ptr<Trainer>> next = MakeTrainer(config, dir);
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE((*next)->Resume().ok());
  ASSERT_TRUE((*next)->Run().ok());
  left = ListCheckpoints(dir);
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 2u);
  EXPECT_EQ((*left)[0].step, 8);
  EXPECT_EQ((*left)[1].step, 10);
}

// The CPU model, except that its gradients are NaN from step `from` on.
class NanAfter : public ForwardingModel {
 public:
  NanAfter(std::unique_ptr<TrainableModel> inner, int64_t from)
      : ForwardingModel(std::move(inner)), from_(from) {}
  absl::StatusOr<LossResult> ForwardBackward(const TokenBatch& batch,
                                             const BackwardOptions& options) override {
    absl::StatusOr<LossResult> r = inner().ForwardBackward(batch, options);
    if (r.ok() && ++calls_ >= from_) inner().grads()[0] = std::numeric_limits<float>::quiet_NaN();
    return r;
  }

 private:
  int64_t from_;
  int64_t calls_ = 0;
};

TEST(TrainerTest, NonFiniteGradientsSkipThenAbort) {
  TrainerConfig config = TinyConfig();
  config.steps = 20;
  config.optimizer.max_consecutive_skips = 3;
  absl::StatusOr<std::unique_ptr<TrainableModel>> model = MakeModel(config);
  ASSERT_TRUE(model.ok());
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(config, Kjv(), std::make_unique<NanAfter>(*std::move(model), /*from=*/3));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::vector<StepResult> steps;
  RunCallbacks callbacks;
  callbacks.on_step = [&](const StepResult& r) { steps.push_back(r); };
  const absl::Status s = (*trainer)->Run(callbacks);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("optimizer.max_consecutive_skips"), std::string::npos) << s;
  ASSERT_EQ(steps.size(), 4u);  // Steps 3 and 4 skipped and reported; step 5 aborts.
  EXPECT_FALSE(steps[1].skipped);
  EXPECT_TRUE(steps[2].skipped);
  EXPECT_TRUE(steps[3].skipped);
  EXPECT_EQ((*trainer)->step(), 5);
  EXPECT_EQ((*trainer)->updates(), 2);
}

TEST(TrainerTest, RetrievalEvaluationScoresTheAnswers) {
  TrainerConfig config = TinyConfig();
  config.steps = 1;
  config.optimizer.warmup_steps = 1;
  config.retrieval.examples = 10;
  config.retrieval.depth = 0;
  config.retrieval.seq_len = 160;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = MakeTrainer(config);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<EvalResult> a = (*trainer)->Evaluate();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->has_retrieval);
  EXPECT_EQ(a->retrieval_seq_len, 160);
  EXPECT_EQ(a->retrieval_depth, 0);
  EXPECT_EQ(a->retrieval.examples, 10);  // Batches of 8 and 2.
  EXPECT_EQ(a->retrieval.answer_tokens, 60);
  EXPECT_LE(a->retrieval.correct_tokens, 60);
  // The same examples every time: an evaluation changes nothing.
  absl::StatusOr<EvalResult> b = (*trainer)->Evaluate();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Bits(a->loss), Bits(b->loss));
  EXPECT_EQ(a->retrieval.correct_tokens, b->retrieval.correct_tokens);
  EXPECT_EQ((*trainer)->history().evals.size(), 2u);
}

TEST(TrainerTest, CreateRefusesWhatDoesNotFit) {
  TrainerConfig config = TinyConfig();
  {
    // A model made for another config.
    TrainerConfig other = config;
    other.model.d_model = 32;
    absl::StatusOr<std::unique_ptr<TrainableModel>> model = MakeModel(other);
    ASSERT_TRUE(model.ok());
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(config, Kjv(), *std::move(model));
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("\"model\""), std::string::npos) << t.status();
  }
  {
    // A retrieval sequence too short for the question.
    TrainerConfig bad = config;
    bad.retrieval.examples = 2;
    bad.retrieval.seq_len = 50;
    absl::StatusOr<std::unique_ptr<Trainer>> t = MakeTrainer(bad);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("\"retrieval\""), std::string::npos) << t.status();
  }
  {
    // A corpus too small for one window.
    absl::StatusOr<TokenCorpus> small = TokenCorpus::FromTokens({1, 2, 3, 4, 5}, 256);
    ASSERT_TRUE(small.ok());
    absl::StatusOr<std::unique_ptr<TrainableModel>> model = MakeModel(config);
    ASSERT_TRUE(model.ok());
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(config, *small, *std::move(model));
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("seq_len 128"), std::string::npos) << t.status();
  }
}

}  // namespace
}  // namespace model
}  // namespace dattn
