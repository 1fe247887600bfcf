// Bit-exact resume through the libraries a trainer uses: a byte corpus from a folder, the split,
// the sampler, AdamW with the schedule and clipping, the trainer's own RNG, and a checkpoint. The
// model is a bigram table (logits = W[previous byte] + b), small enough to train in milliseconds,
// with its gradient written out by hand; the real model plugs into the same loop.
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/corpus.h"
#include "model/file_io.h"
#include "model/optimizer.h"
#include "model/rng.h"
#include "model/sampler.h"

namespace dattn {
namespace model {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kV = 256;
constexpr int64_t kSeqLen = 32;
constexpr int64_t kBatch = 4;
constexpr int64_t kSteps = 12;
constexpr char kConfig[] = R"({"model": "bigram", "vocab": 256})";

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return JoinPath(dir != nullptr ? dir : "/tmp", name);
}

std::string MakeCorpusFolder() {
  const std::string dir = TempPath("resume_corpus");
  fs::create_directories(dir);
  const char* sentences[] = {"the quick brown fox jumps over the lazy dog. ",
                             "in the beginning was the word. ", "to be or not to be. "};
  for (int f = 0; f < 3; ++f) {
    std::string text;
    for (int i = 0; i < 60; ++i) text += sentences[(f + i) % 3];
    EXPECT_TRUE(
        WriteWholeFile(JoinPath(dir, "part" + std::to_string(f) + ".txt"), text, false).ok());
  }
  return dir;
}

ParamLayout BigramLayout() {
  ParamLayout layout;
  EXPECT_TRUE(layout.Add("bigram.weight", {kV, kV}).ok());
  EXPECT_TRUE(layout.Add("bigram.bias", {kV}).ok());
  return layout;
}

// Mean cross-entropy over the scored targets, and its gradient, in fp32 (sums in fp64).
double LossAndGradient(const std::vector<float>& params, const Batch& batch,
                       std::vector<float>* grad) {
  std::fill(grad->begin(), grad->end(), 0.0f);
  const float* w = params.data();
  const float* b = params.data() + kV * kV;
  const int64_t count = batch.scored();
  double loss = 0;
  std::vector<float> p(kV);
  for (int64_t i = 0; i < batch.rows * batch.seq_len; ++i) {
    const int32_t target = batch.targets[i];
    if (target == kIgnoreTarget) continue;
    const int32_t a = batch.inputs[i];
    float max = -INFINITY;
    for (int64_t j = 0; j < kV; ++j) {
      p[j] = w[a * kV + j] + b[j];
      max = std::max(max, p[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < kV; ++j) {
      p[j] = std::exp(p[j] - max);
      sum += p[j];
    }
    for (int64_t j = 0; j < kV; ++j) p[j] = static_cast<float>(p[j] / sum);
    loss -= std::log(static_cast<double>(p[target]));
    for (int64_t j = 0; j < kV; ++j) {
      const float d = (p[j] - (j == target ? 1.0f : 0.0f)) / static_cast<float>(count);
      (*grad)[a * kV + j] += d;
      (*grad)[kV * kV + j] += d;
    }
  }
  return loss / static_cast<double>(count);
}

struct RunResult {
  std::vector<double> losses;  // Indexed by step - 1, for the steps this run made.
  std::vector<float> params;
  SamplerCursor cursor;
  std::array<uint64_t, 4> rng_state;
};

// Trains up to `last_step`, resuming from the newest checkpoint under `root` if there is one, and
// saving one after step `save_at`.
RunResult Train(const std::string& root, int64_t last_step, int64_t save_at) {
  RunResult result;
  const std::string folder = MakeCorpusFolder();
  absl::StatusOr<TokenCorpus> corpus = TokenCorpus::FromText(folder);
  EXPECT_TRUE(corpus.ok()) << corpus.status();
  absl::StatusOr<DataSplit> split = SplitTrainValidation(corpus->size(), 0.1, kSeqLen + 1);
  EXPECT_TRUE(split.ok());
  const SamplerOptions sampler_options{kSeqLen, kBatch, 11, true};
  absl::StatusOr<WindowSampler> sampler =
      WindowSampler::Create(*corpus, split->train, sampler_options);
  EXPECT_TRUE(sampler.ok());
  const ParamLayout layout = BigramLayout();
  const AdamWConfig adamw{0.9, 0.95, 1e-8, 0.1};
  const LrSchedule schedule{1e-1, 1e-2, 3, kSteps};
  absl::StatusOr<AdamW> opt = AdamW::Create(layout, adamw);
  EXPECT_TRUE(opt.ok());

  // A fresh start...
  std::vector<float> params(layout.total());
  Rng init(1234);
  for (float& x : params) x = static_cast<float>((init.Uniform() - 0.5) * 0.02);
  AdamWState state = opt->NewState();
  Rng rng(5);
  int64_t step = 0;
  int64_t tokens = 0;
  // ...or the newest checkpoint.
  absl::StatusOr<CheckpointEntry> latest = LatestCheckpoint(root);
  if (latest.ok()) {
    absl::StatusOr<Checkpoint> ck = Checkpoint::Open(latest->path);
    EXPECT_TRUE(ck.ok()) << ck.status();
    EXPECT_EQ(ck->model_config_json(), kConfig);
    EXPECT_TRUE(ck->Restore(layout, absl::MakeSpan(params), &state).ok());
    const TrainerState& t = ck->trainer_state();
    EXPECT_TRUE(sampler->Restore(t.sampler).ok());
    rng = *Rng::FromState(t.rng_state);
    step = t.step;
    tokens = t.tokens_seen;
  }

  std::vector<float> grad(layout.total());
  Batch batch;
  while (step < last_step) {
    EXPECT_TRUE(sampler->Next(&batch).ok());
    for (int32_t& x : batch.inputs) {  // Input-token dropout: the trainer's RNG matters.
      if (rng.Uniform() < 0.1) x = static_cast<int32_t>(rng.Below(kV));
    }
    const double loss = LossAndGradient(params, batch, &grad);
    const double norm = GlobalNorm({SumOfSquares(grad)});
    absl::StatusOr<double> scale = ClipScale(norm, 1.0);
    EXPECT_TRUE(scale.ok());
    EXPECT_TRUE(
        opt->Step(&state, schedule.At(state.step + 1), *scale, absl::MakeSpan(params), grad).ok());
    ++step;
    tokens += batch.rows * batch.seq_len;
    result.losses.push_back(loss);
    if (step == save_at) {
      CheckpointContents c;
      c.layout = &layout;
      c.params = params;
      c.optimizer = &state;
      c.model_config_json = kConfig;
      c.trainer.step = step;
      c.trainer.tokens_seen = tokens;
      c.trainer.sampler = sampler->cursor();
      c.trainer.rng_state = rng.state();
      c.trainer.schedule = schedule;
      c.trainer.adamw = adamw;
      c.trainer.max_grad_norm = 1.0;
      EXPECT_TRUE(SaveCheckpoint(root, c).ok());
    }
  }
  result.params = params;
  result.cursor = sampler->cursor();
  result.rng_state = rng.state();
  return result;
}

TEST(ResumeTest, ResumedRunIsBitExact) {
  const RunResult straight = Train(TempPath("resume_straight"), kSteps, /*save_at=*/-1);
  ASSERT_EQ(straight.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(straight.losses.back(), straight.losses.front() - 1.0);  // It learns.

  const std::string root = TempPath("resume_stopped");
  const RunResult first = Train(root, 5, /*save_at=*/5);  // The process stops after step 5.
  const RunResult second = Train(root, kSteps, -1);       // A new one resumes.
  ASSERT_EQ(first.losses.size(), 5u);
  ASSERT_EQ(second.losses.size(), static_cast<size_t>(kSteps - 5));
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(std::memcmp(&first.losses[i], &straight.losses[i], 8), 0) << "step " << i + 1;
  }
  for (size_t i = 0; i < second.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&second.losses[i], &straight.losses[5 + i], 8), 0)
        << "step " << 6 + i << ": " << second.losses[i] << " vs " << straight.losses[5 + i];
  }
  EXPECT_EQ(std::memcmp(second.params.data(), straight.params.data(), straight.params.size() * 4),
            0);
  EXPECT_EQ(second.cursor, straight.cursor);
  EXPECT_EQ(second.rng_state, straight.rng_state);
}

}  // namespace
}  // namespace model
}  // namespace dattn
