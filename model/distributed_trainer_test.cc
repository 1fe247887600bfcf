// The trainer on W = D x S ranks (D data-parallel groups of S sequence-parallel ranks), each rank
// a thread with its own Gloo communicators (a world one, and its group's ring for S > 1), on the
// King James Bible: every shape of ranks computes the single process's losses; a 2 x 2 run resumed
// by fresh ranks is bit-exact; checkpoints move between worlds; a stop asked by one rank stops
// every rank at the same step; damaged shards are DATA_LOSS naming the file; retrieval answers
// that straddle sequence ranks are scored once; Create refuses shapes that do not fit.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/comm_collective.h"
#include "model/file_io.h"
#include "model/ring_sequence_attention.h"
#include "model/testing/forwarding_model.h"
#include "model/testing/gloo_ranks.h"
#include "model/trainer.h"

namespace dattn {
namespace model {
namespace {

namespace fs = std::filesystem;
using testing::RunRanks;

constexpr char kKjv[] = "model/kjv.txt";
// Relative bound between the losses of different shapes of ranks: the same fp32 computation,
// summed in other groupings (rank-order reductions, ring blocks merged by log-sum-exp).
constexpr double kShapeTolerance = 1e-5;

std::string TempDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = JoinPath(dir != nullptr ? dir : "/tmp", name);
  fs::remove_all(path);
  return path;
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

// The brief's tiny model: d 32, 2 layers, 2 heads, segments 16/32 with rates 1/2; sequences of 64
// (slices of 16 on 4 sequence ranks, so the 32-segments span two ranks), batches of 8 in 2
// micro-batches (1 row per micro-batch on 4 data-parallel ranks), evaluations every 3 steps.
TrainerConfig SmallConfig() {
  TrainerConfig c;
  c.model.vocab_size = 256;
  c.model.d_model = 32;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.model.ffn_dim = 64;
  c.model.segment_lengths = {16, 32};
  c.model.dilation_rates = {1, 2};
  c.threads = 1;
  c.data.validation_fraction = 0.01;
  c.seq_len = 64;
  c.batch_size = 8;
  c.micro_batches = 2;
  c.steps = 6;
  c.seed = 11;
  c.optimizer.lr = 3e-3;
  c.optimizer.min_lr = 3e-4;
  c.optimizer.warmup_steps = 2;
  c.eval.every = 3;
  c.eval.batches = 2;
  // Retrieval at 192 positions (48 per rank on 4 sequence ranks); a 52-digit answer starts at
  // position 140 and so straddles sequence ranks 2 and 3.
  c.retrieval.examples = 4;
  c.retrieval.seq_len = 192;
  c.retrieval.key_length = 1;
  c.retrieval.value_length = 52;
  c.checkpoint.keep_last = 10;
  return c;
}

// Predicts every answer token right except the one at absolute position `wrong` (-1: none): the
// real model runs (its ring included), then the answer positions' predictions are replaced.
class OracleModel : public ForwardingModel {
 public:
  OracleModel(std::unique_ptr<TrainableModel> inner, int64_t wrong)
      : ForwardingModel(std::move(inner)), wrong_(wrong) {}
  absl::StatusOr<LossResult> Evaluate(const TokenBatch& batch,
                                      absl::Span<int32_t> predictions) override {
    absl::StatusOr<LossResult> loss = inner().Evaluate(batch, predictions);
    if (!loss.ok() || predictions.empty()) return loss;
    for (int64_t r = 0; r < batch.batch; ++r) {
      for (int64_t t = 0; t < batch.seq_len; ++t) {
        const int64_t i = r * batch.seq_len + t;
        if (batch.targets[i] == kIgnoreTarget) continue;
        const int64_t position = batch.positions.offset + t;
        predictions[static_cast<size_t>(i)] = position == wrong_ ? -5 : batch.targets[i];
      }
    }
    return loss;
  }

 private:
  const int64_t wrong_;
};

// What one rank saw.
struct RankRun {
  absl::Status status;
  std::vector<StepResult> steps;
  std::vector<EvalResult> evals;
  std::vector<std::string> checkpoints;
  EvalResult evaluation;  // Shape::evaluate_only.
};

struct Shape {
  int dp = 1;
  int sp = 1;
  int world() const { return dp * sp; }
  std::string Name() const { return absl::StrCat(dp, "x", sp); }
};

struct RunOptions {
  std::string checkpoint_dir;
  bool resume = false;
  // Rank that sets its own stop flag after this step (-1: none).
  int stop_rank = -1;
  int64_t stop_after = 0;
  bool evaluate_only = false;
  int64_t oracle_wrong = -2;  // >= -1: wrap the model in OracleModel.
};

absl::StatusOr<std::unique_ptr<TrainableModel>> MakeModel(const TrainerConfig& config,
                                                          comm::Communicator* sp) {
  ModelOptions options;
  options.checkpoint_activations = config.checkpoint_activations;
  const int threads = static_cast<int>(config.threads);
  if (sp == nullptr) return NewCpuTrainableModel(config.model, options, threads);
  return NewCpuTrainableModel(config.model, options, threads,
                              NewCpuRingSequenceAttention(sp, threads));
}

// One rank: model, trainer, (resume), run or evaluate.
absl::Status RunRank(const TrainerConfig& config, const RunOptions& run, int sp_degree,
                     TrainerCollective* collective, comm::Communicator* sp, RankRun* out) {
  absl::StatusOr<std::unique_ptr<TrainableModel>> model = MakeModel(config, sp);
  if (!model.ok()) return model.status();
  if (run.oracle_wrong >= -1) {
    *model = std::make_unique<OracleModel>(*std::move(model), run.oracle_wrong);
  }
  TrainerOptions options;
  options.checkpoint_dir = run.checkpoint_dir;
  options.collective = collective;
  options.sequence_parallel = sp_degree;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(config, Kjv(), *std::move(model), options);
  if (!trainer.ok()) return trainer.status();
  if (run.resume) {
    if (absl::Status s = (*trainer)->Resume(); !s.ok()) return s;
  }
  if (run.evaluate_only) {
    absl::StatusOr<EvalResult> e = (*trainer)->Evaluate();
    if (!e.ok()) return e.status();
    out->evaluation = *e;
    return absl::OkStatus();
  }
  std::atomic<bool> stop{false};
  const int rank = collective == nullptr ? 0 : collective->rank();
  RunCallbacks callbacks;
  callbacks.stop = &stop;
  callbacks.on_step = [&](const StepResult& r) {
    out->steps.push_back(r);
    if (rank == run.stop_rank && r.step == run.stop_after) stop = true;
  };
  callbacks.on_eval = [&](const EvalResult& e) { out->evals.push_back(e); };
  callbacks.on_checkpoint = [&](const std::string& path, int64_t) {
    out->checkpoints.push_back(path);
  };
  return (*trainer)->Run(callbacks);
}

// Every rank of `shape` (a single process with no collective for 1 x 1 unless `gloo`).
std::vector<RankRun> Train(const Shape& shape, const TrainerConfig& config, const RunOptions& run,
                           bool gloo = true) {
  std::vector<RankRun> runs(static_cast<size_t>(shape.world()));
  if (shape.world() == 1 && !gloo) {
    runs[0].status = RunRank(config, run, 1, nullptr, nullptr, &runs[0]);
    return runs;
  }
  const std::vector<absl::Status> results = RunRanks(
      shape.world(), shape.sp,
      [&](int rank, comm::Communicator& world, comm::Communicator* sp) {
        std::unique_ptr<TrainerCollective> collective = NewCommunicatorCollective(&world);
        return RunRank(config, run, shape.sp, collective.get(), sp,
                       &runs[static_cast<size_t>(rank)]);
      },
      absl::Seconds(30), absl::StrCat("train-", shape.Name()));
  for (size_t r = 0; r < runs.size(); ++r) runs[r].status = results[r];
  return runs;
}

uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

double Relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

void ExpectOk(const std::vector<RankRun>& runs) {
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_TRUE(runs[r].status.ok()) << "rank " << r << ": " << runs[r].status;
  }
}

// Every rank reports rank 0's losses, bit for bit.
void ExpectRanksAgree(const std::vector<RankRun>& runs) {
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].steps.size(), runs[0].steps.size()) << "rank " << r;
    for (size_t i = 0; i < runs[0].steps.size(); ++i) {
      EXPECT_EQ(Bits(runs[r].steps[i].loss), Bits(runs[0].steps[i].loss))
          << "rank " << r << " step " << runs[0].steps[i].step;
      EXPECT_EQ(Bits(runs[r].steps[i].grad_norm), Bits(runs[0].steps[i].grad_norm));
    }
    ASSERT_EQ(runs[r].evals.size(), runs[0].evals.size());
    for (size_t i = 0; i < runs[0].evals.size(); ++i) {
      EXPECT_EQ(Bits(runs[r].evals[i].loss), Bits(runs[0].evals[i].loss));
    }
  }
}

TEST(DistributedTrainerTest, EveryShapeOfRanksComputesTheSingleProcessLosses) {
  const TrainerConfig config = SmallConfig();
  const std::vector<RankRun> single = Train({1, 1}, config, {}, /*gloo=*/false);
  ExpectOk(single);
  ASSERT_EQ(single[0].steps.size(), 6u);
  ASSERT_EQ(single[0].evals.size(), 3u);  // Steps 0, 3 and 6.
  for (const Shape& shape : std::vector<Shape>{{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}}) {
    SCOPED_TRACE(shape.Name());
    const std::vector<RankRun> runs = Train(shape, config, {});
    ExpectOk(runs);
    ExpectRanksAgree(runs);
    ASSERT_EQ(runs[0].steps.size(), single[0].steps.size());
    double worst = 0;
    for (size_t i = 0; i < runs[0].steps.size(); ++i) {
      const StepResult& got = runs[0].steps[i];
      const StepResult& want = single[0].steps[i];
      EXPECT_EQ(got.targets, want.targets);
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.retrieval_rows, want.retrieval_rows);
      EXPECT_LT(Relative(got.loss, want.loss), kShapeTolerance) << "step " << want.step;
      EXPECT_LT(Relative(got.grad_norm, want.grad_norm), 1e-4) << "step " << want.step;
      worst = std::max(worst, Relative(got.loss, want.loss));
      // This rank's share of the work: the data-parallel rank's, split over its sequence ranks.
      EXPECT_NEAR(got.flops * shape.world(), want.flops, 1e-9 * want.flops);
    }
    ASSERT_EQ(runs[0].evals.size(), single[0].evals.size());
    for (size_t i = 0; i < runs[0].evals.size(); ++i) {
      const EvalResult& got = runs[0].evals[i];
      const EvalResult& want = single[0].evals[i];
      EXPECT_EQ(got.targets, want.targets);
      EXPECT_LT(Relative(got.loss, want.loss), kShapeTolerance) << "eval at " << want.step;
      worst = std::max(worst, Relative(got.loss, want.loss));
      EXPECT_EQ(got.retrieval.examples, 4);
      EXPECT_EQ(got.retrieval.answer_tokens, 4 * 52);
      EXPECT_EQ(got.retrieval.correct_tokens, want.retrieval.correct_tokens);
      EXPECT_EQ(got.retrieval.exact, want.retrieval.exact);
    }
    std::printf("[ shapes ] %s: largest relative loss difference from one process %.3g\n",
                shape.Name().c_str(), worst);
  }
}

TEST(DistributedTrainerTest, RetrievalAnswersAcrossSequenceRanksAreScoredOnce) {
  const TrainerConfig config = SmallConfig();
  // Answers at positions [140, 192): on 4 sequence ranks of 48 they straddle ranks 2 and 3.
  for (const Shape& shape : std::vector<Shape>{{1, 1}, {1, 4}, {2, 2}, {1, 2}}) {
    SCOPED_TRACE(shape.Name());
    RunOptions all_right;
    all_right.evaluate_only = true;
    all_right.oracle_wrong = -1;
    std::vector<RankRun> runs = Train(shape, config, all_right);
    ExpectOk(runs);
    for (const RankRun& r : runs) {
      EXPECT_EQ(r.evaluation.retrieval.examples, 4);
      EXPECT_EQ(r.evaluation.retrieval.exact, 4);
      EXPECT_EQ(r.evaluation.retrieval.correct_tokens, 4 * 52);
    }
    // One wrong digit, the first of the answer (on sequence rank 2 of 4): no answer is exact.
    RunOptions first_wrong = all_right;
    first_wrong.oracle_wrong = 192 - 52;
    runs = Train(shape, config, first_wrong);
    ExpectOk(runs);
    for (const RankRun& r : runs) {
      EXPECT_EQ(r.evaluation.retrieval.exact, 0);
      EXPECT_EQ(r.evaluation.retrieval.correct_tokens, 4 * 51);
    }
  }
}

TEST(DistributedTrainerTest, ResumedTwoByTwoRunIsBitExact) {
  TrainerConfig config = SmallConfig();
  config.checkpoint.every = 3;
  const Shape shape{2, 2};
  const std::vector<RankRun> straight = Train(shape, config, {TempDir("dist_straight")});
  ExpectOk(straight);
  ASSERT_EQ(straight[0].steps.size(), 6u);

  // A run whose rank 0 asks to stop after step 3 (saved there), then fresh ranks and fresh
  // communicators resume it.
  const std::string dir = TempDir("dist_resumed");
  RunOptions first;
  first.checkpoint_dir = dir;
  first.stop_rank = 0;
  first.stop_after = 3;
  const std::vector<RankRun> stopped = Train(shape, config, first);
  for (const RankRun& r : stopped) EXPECT_TRUE(absl::IsCancelled(r.status)) << r.status;
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(dir + "/step-00000003");
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->version(), 2);
  EXPECT_EQ(ck->world(), 4);
  RunOptions second;
  second.checkpoint_dir = dir;
  second.resume = true;
  const std::vector<RankRun> resumed = Train(shape, config, second);
  ExpectOk(resumed);
  ExpectRanksAgree(resumed);
  ASSERT_EQ(resumed[0].steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const StepResult& got = resumed[0].steps[i];
    const StepResult& want = straight[0].steps[i + 3];
    EXPECT_EQ(got.step, want.step);
    EXPECT_EQ(Bits(got.loss), Bits(want.loss)) << "step " << want.step;
    EXPECT_EQ(Bits(got.grad_norm), Bits(want.grad_norm)) << "step " << want.step;
    EXPECT_EQ(got.retrieval_rows, want.retrieval_rows);
  }
  // The final weights, as saved by both runs, bit for bit.
  absl::StatusOr<Checkpoint> a = Checkpoint::Open(straight[0].checkpoints.back());
  absl::StatusOr<Checkpoint> b = Checkpoint::Open(resumed[0].checkpoints.back());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(resumed[0].checkpoints.back(), dir + "/step-00000006");
  for (size_t f = 0; f < a->weights_files().size(); ++f) {
    for (const SafeTensorInfo& t : a->weights_files()[f].tensors()) {
      EXPECT_EQ(a->weights_files()[f].Data(t),
                b->weights_files()[f].Data(**b->weights_files()[f].Find(t.name)))
          << t.name;
    }
  }
}

// Saves at step 3 on `from`, resumes on `to` (fresh ranks) to step 6: the losses of steps 4-6
// follow the single process's within the shapes' tolerance (the moments matter: without them the
// next steps' losses move by about 1e-2, checked once).
void ExpectResumesAcross(const Shape& from, const Shape& to, const std::vector<RankRun>& single) {
  SCOPED_TRACE(absl::StrCat(from.Name(), " -> ", to.Name()));
  const TrainerConfig config = SmallConfig();
  const std::string dir = TempDir(absl::StrCat("dist_", from.Name(), "_to_", to.Name()));
  // The same run as `single` (its schedule is of 6 steps), stopped after step 3 and saved.
  RunOptions first;
  first.checkpoint_dir = dir;
  first.stop_rank = 0;
  first.stop_after = 3;
  for (const RankRun& r : Train(from, config, first)) {
    EXPECT_TRUE(absl::IsCancelled(r.status)) << r.status;
  }
  RunOptions resume;
  resume.checkpoint_dir = dir;
  resume.resume = true;
  const std::vector<RankRun> runs = Train(to, config, resume);
  ExpectOk(runs);
  ExpectRanksAgree(runs);
  ASSERT_EQ(runs[0].steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(runs[0].steps[i].step, single[0].steps[i + 3].step);
    EXPECT_LT(Relative(runs[0].steps[i].loss, single[0].steps[i + 3].loss), kShapeTolerance)
        << "step " << runs[0].steps[i].step;
  }
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(dir + "/step-00000006");
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->world(), to.world());
  EXPECT_EQ(ck->version(), to.world() == 1 ? 1 : 2);
}

TEST(DistributedTrainerTest, CheckpointsMoveBetweenWorlds) {
  const TrainerConfig config = SmallConfig();
  const std::vector<RankRun> single = Train({1, 1}, config, {}, /*gloo=*/false);
  ExpectOk(single);
  ExpectResumesAcross({2, 2}, {1, 1}, single);  // 4 -> 1.
  ExpectResumesAcross({2, 2}, {1, 2}, single);  // 4 -> 2.
  ExpectResumesAcross({1, 1}, {2, 1}, single);  // 1 -> 2.
  ExpectResumesAcross({1, 1}, {2, 2}, single);  // 1 -> 4.
  ExpectResumesAcross({2, 1}, {2, 2}, single);  // 2 -> 4.
}

TEST(DistributedTrainerTest, AStopAskedByOneRankStopsEveryRankAtTheSameStep) {
  TrainerConfig config = SmallConfig();
  config.eval.every = 0;
  const std::string dir = TempDir("dist_stop");
  RunOptions run;
  run.checkpoint_dir = dir;
  run.stop_rank = 3;  // Only rank 3 sees the request, after its step 2.
  run.stop_after = 2;
  const std::vector<RankRun> runs = Train({2, 2}, config, run);
  for (size_t r = 0; r < runs.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_TRUE(absl::IsCancelled(runs[r].status)) << runs[r].status;
    EXPECT_NE(runs[r].status.message().find("stopped by request of rank 3 after step 2"),
              std::string::npos)
        << runs[r].status;
    EXPECT_EQ(runs[r].steps.size(), 2u);
    ASSERT_EQ(runs[r].checkpoints.size(), 1u);
    EXPECT_EQ(runs[r].checkpoints[0], dir + "/step-00000002");
  }
  absl::StatusOr<std::vector<CheckpointEntry>> all = ListCheckpoints(dir);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_TRUE((*all)[0].has_manifest);
  EXPECT_TRUE(Checkpoint::Open((*all)[0].path).ok());
}

TEST(DistributedTrainerTest, DamagedShardsAreDataLossNamingTheFile) {
  TrainerConfig config = SmallConfig();
  config.steps = 2;
  config.eval.every = 0;
  const std::string dir = TempDir("dist_damage");
  ExpectOk(Train({2, 2}, config, {dir}));
  const std::string saved = dir + "/step-00000002";
  struct Damage {
    std::string file;
    bool truncate;
    std::string words;
  };
  for (const Damage& d : {Damage{OptimizerShardFileName(1, 4), true, "(truncated)"},
                          Damage{WeightsShardFileName(2, 4), false, "(the file is corrupt)"}}) {
    SCOPED_TRACE(d.file);
    const std::string root = TempDir("dist_damaged_" + d.file);
    fs::create_directories(root);
    fs::copy(saved, root + "/step-00000002", fs::copy_options::recursive);
    const std::string path = root + "/step-00000002/" + d.file;
    if (d.truncate) {
      fs::resize_file(path, fs::file_size(path) - 3);
    } else {
      absl::StatusOr<std::string> bytes = ReadSmallFile(path, 1 << 30);
      ASSERT_TRUE(bytes.ok());
      (*bytes)[bytes->size() / 2] ^= 0x04;
      ASSERT_TRUE(WriteWholeFile(path, *bytes, false).ok());
    }
    RunOptions resume;
    resume.checkpoint_dir = root;
    resume.resume = true;
    config.steps = 4;
    for (const RankRun& r : Train({2, 2}, config, resume)) {
      EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss) << r.status;
      EXPECT_NE(r.status.message().find(path), std::string::npos) << r.status;
      EXPECT_NE(r.status.message().find(d.words), std::string::npos) << r.status;
    }
  }
}

// A collective that only answers who it is: Create communicates nothing.
class ShapeOnlyCollective : public TrainerCollective {
 public:
  ShapeOnlyCollective(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  absl::Status ReduceScatterGradients(float*, int64_t, absl::Span<const ShardRange>) override {
    return absl::UnimplementedError("ShapeOnlyCollective");
  }
  absl::Status AllGatherParameters(float*, int64_t, absl::Span<const ShardRange>) override {
    return absl::UnimplementedError("ShapeOnlyCollective");
  }
  absl::StatusOr<std::vector<double>> AllGather(absl::Span<const double>) override {
    return absl::UnimplementedError("ShapeOnlyCollective");
  }
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string&) override {
    return absl::UnimplementedError("ShapeOnlyCollective");
  }
  absl::Status Barrier() override { return absl::UnimplementedError("ShapeOnlyCollective"); }

 private:
  const int rank_, world_;
};

TEST(DistributedTrainerTest, CreateRefusesShapesThatDoNotFit) {
  auto create = [](TrainerConfig config, int world, int sp) {
    ShapeOnlyCollective collective(world - 1, world);
    TrainerOptions options;
    options.collective = &collective;
    options.sequence_parallel = sp;
    absl::StatusOr<std::unique_ptr<TrainableModel>> model = MakeModel(config, nullptr);
    EXPECT_TRUE(model.ok());
    return Trainer::Create(config, Kjv(), *std::move(model), options).status();
  };
  const TrainerConfig config = SmallConfig();
  absl::Status s = create(config, 4, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sequence_parallel: 3 must be >= 1 and divide the collective's "
                             "world of 4 ranks"),
            std::string::npos)
      << s;
  s = create(config, 2, 0);
  EXPECT_NE(s.message().find("sequence_parallel: 0"), std::string::npos) << s;
  TrainerConfig odd = config;
  odd.seq_len = 66;
  s = create(odd, 4, 4);
  EXPECT_NE(s.message().find("\"seq_len\": 66 is not a multiple of the sequence-parallel degree 4"),
            std::string::npos)
      << s;
  TrainerConfig retrieval = config;
  retrieval.retrieval.seq_len = 190;
  s = create(retrieval, 4, 4);
  EXPECT_NE(s.message().find("\"retrieval.seq_len\": 190"), std::string::npos) << s;
  // 8 rows in 2 micro-batches over 8 data-parallel ranks do not divide; over 2 x 4 they do.
  s = create(config, 8, 1);
  EXPECT_NE(s.message().find("\"batch_size\": 8 is not a multiple of micro_batches (2) x "
                             "data-parallel ranks (8)"),
            std::string::npos)
      << s;
  EXPECT_TRUE(create(config, 8, 4).ok());
  EXPECT_TRUE(create(config, 4, 2).ok());
}

}  // namespace
}  // namespace model
}  // namespace dattn
