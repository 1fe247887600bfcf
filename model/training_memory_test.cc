// PlanCpuTrainingRankMemory (training_memory.h) against what ranks use: the model's part against
// its allocations exactly (a counting LayerOps), and the whole figure against the resident memory
// that real ranks add to their processes over a resume, a step, an evaluation and a save (VmHWM,
// model/testing/training_rank_probe as 1, 2 and 2 processes): never under, at most 25% over.
#include "model/training_memory.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/comm/tcp_store.h"
#include "engine/testing/sanitizers.h"
#include "gtest/gtest.h"
#include "model/cpu_layer_ops.h"
#include "model/longnet.h"
#include "model/trainer_config.h"

extern char** environ;

namespace dattn {
namespace model {
namespace {

namespace fs = std::filesystem;

constexpr bool kSanitized = DATTN_ADDRESS_SANITIZER;

std::string TempDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  fs::remove_all(path);
  return path;
}

// A LayerOps that counts the bytes its Allocate hands out that are still alive, and their peak.
template <typename T>
class CountingOps final : public LayerOps<T> {
 public:
  CountingOps(std::unique_ptr<LayerOps<T>> inner, std::shared_ptr<int64_t> live,
              std::shared_ptr<int64_t> peak)
      : inner_(std::move(inner)), live_(std::move(live)), peak_(std::move(peak)) {}
  Device device() const override { return inner_->device(); }
  DType dtype() const override { return inner_->dtype(); }
  absl::StatusOr<DeviceArray<T>> Allocate(int64_t n) override {
    absl::StatusOr<DeviceArray<T>> a = inner_->Allocate(n);
    if (!a.ok()) return a;
    const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
    *live_ += bytes;
    *peak_ = std::max(*peak_, *live_);
    // Hand out a view whose deleter frees the inner array and uncounts it.
    auto holder = std::make_shared<DeviceArray<T>>(*std::move(a));
    std::shared_ptr<int64_t> live = live_;
    return DeviceArray<T>(holder->data(), n, [holder, live, bytes](T*) mutable {
      *live -= bytes;
      holder.reset();
    });
  }
  absl::Status Fill(T* x, int64_t n, double value) override { return inner_->Fill(x, n, value); }
  absl::Status CopyToHost(const T* x, int64_t n, T* host) override {
    return inner_->CopyToHost(x, n, host);
  }
  absl::Status CopyFromHost(const T* host, int64_t n, T* x) override {
    return inner_->CopyFromHost(host, n, x);
  }
  absl::Status EmbeddingForward(const int32_t* tokens, int64_t m, const T* table, int64_t d,
                                T* out) override {
    return inner_->EmbeddingForward(tokens, m, table, d, out);
  }
  absl::Status EmbeddingBackward(const int32_t* tokens, int64_t m, const T* dout, int64_t d,
                                 T* dtable) override {
    return inner_->EmbeddingBackward(tokens, m, dout, d, dtable);
  }
  absl::Status LinearForward(const T* x, int64_t m, int64_t in, const T* w, const T* b, int64_t out,
                             T* y) override {
    return inner_->LinearForward(x, m, in, w, b, out, y);
  }
  absl::Status LinearBackwardInput(const T* dy, int64_t m, int64_t out, const T* w, int64_t in,
                                   T* dx, Accumulate acc) override {
    return inner_->LinearBackwardInput(dy, m, out, w, in, dx, acc);
  }
  absl::Status LinearBackwardParams(const T* dy, const T* x, int64_t m, int64_t in, int64_t out,
                                    T* dw, T* db) override {
    return inner_->LinearBackwardParams(dy, x, m, in, out, dw, db);
  }
  absl::Status LayerNormForward(const T* x, int64_t m, int64_t n, const T* gain, const T* shift,
                                double eps, T* y, T* mean, T* rstd) override {
    return inner_->LayerNormForward(x, m, n, gain, shift, eps, y, mean, rstd);
  }
  absl::Status LayerNormBackward(const T* dy, const T* x, const T* mean, const T* rstd,
                                 const T* gain, int64_t m, int64_t n, T* dx, Accumulate acc,
                                 T* dgain, T* dshift) override {
    return inner_->LayerNormBackward(dy, x, mean, rstd, gain, m, n, dx, acc, dgain, dshift);
  }
  absl::Status GeluForward(const T* x, int64_t n, T* y) override {
    return inner_->GeluForward(x, n, y);
  }
  absl::Status GeluBackward(const T* x, const T* dy, int64_t n, T* dx) override {
    return inner_->GeluBackward(x, dy, n, dx);
  }
  absl::Status Add(const T* a, const T* b, int64_t n, T* y) override {
    return inner_->Add(a, b, n, y);
  }
  absl::Status RotaryForward(const RotaryPlan& plan, int64_t batch, int64_t seq_len, int64_t heads,
                             int64_t position_offset, T* q, T* k) override {
    return inner_->RotaryForward(plan, batch, seq_len, heads, position_offset, q, k);
  }
  absl::Status RotaryBackward(const RotaryPlan& plan, int64_t batch, int64_t seq_len, int64_t heads,
                              int64_t position_offset, T* dq, T* dk) override {
    return inner_->RotaryBackward(plan, batch, seq_len, heads, position_offset, dq, dk);
  }
  absl::Status CrossEntropyForward(const T* logits, const int32_t* targets, int64_t m, int64_t v,
                                   T* row_lse, double* loss_sum, int64_t* count) override {
    return inner_->CrossEntropyForward(logits, targets, m, v, row_lse, loss_sum, count);
  }
  absl::Status CrossEntropyBackward(const T* logits, const T* row_lse, const int32_t* targets,
                                    int64_t m, int64_t v, double scale, T* dlogits) override {
    return inner_->CrossEntropyBackward(logits, row_lse, targets, m, v, scale, dlogits);
  }

 private:
  std::unique_ptr<LayerOps<T>> inner_;
  std::shared_ptr<int64_t> live_, peak_;
};

TrainerConfig MeasuredConfig() {
  TrainerConfig c;
  c.model.vocab_size = 256;
  c.model.d_model = 128;
  c.model.num_layers = 2;
  c.model.num_heads = 4;
  c.model.ffn_dim = 512;
  c.model.segment_lengths = {256, 512};
  c.model.dilation_rates = {1, 2};
  c.threads = 1;
  c.data.paths = {fs::absolute("model/kjv.txt").string()};
  c.data.validation_fraction = 0.01;
  c.seq_len = 2048;
  c.batch_size = 4;
  c.micro_batches = 1;
  c.steps = 1;
  c.eval.every = 0;
  c.eval.batches = 1;
  c.optimizer.warmup_steps = 1;
  c.checkpoint.keep_last = 3;
  return c;
}

TEST(TrainingMemoryTest, TheModelsPartIsWhatTheModelAllocates) {
  TrainerConfig config = MeasuredConfig();
  config.seq_len = 256;
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "checkpointing" : "no checkpointing");
    config.checkpoint_activations = checkpointing;
    ModelOptions options;
    options.checkpoint_activations = checkpointing;
    auto live = std::make_shared<int64_t>(0), peak = std::make_shared<int64_t>(0);
    absl::StatusOr<std::unique_ptr<LongNetLM<float>>> lm = LongNetLM<float>::Create(
        config.model, options,
        std::make_unique<CountingOps<float>>(NewCpuLayerOps<float>({1}), live, peak),
        NewCpuLocalAttention(1));
    ASSERT_TRUE(lm.ok()) << lm.status();
    ASSERT_TRUE((*lm)->InitParams(1).ok());
    const int64_t rows = 2, n = config.seq_len;
    std::vector<int32_t> tokens(rows * n), targets(rows * n);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>(i * 7 % 256);
      targets[i] = static_cast<int32_t>(i * 13 % 256);
    }
    TokenBatch b;
    b.tokens = tokens.data();
    b.targets = targets.data();
    b.batch = rows;
    b.seq_len = n;
    ASSERT_TRUE((*lm)->Forward(b).ok());
    ASSERT_TRUE((*lm)->Backward().ok());
    const int64_t expected = 4 * (2 * (*lm)->layout().total() +
                                  LongNetLM<float>::BufferElements(config.model, options, rows, n));
    EXPECT_EQ(*peak, expected);
    EXPECT_EQ(*live, expected);
    // The plan's activation part is these buffers plus the token copies (2 x int32 per token).
    config.batch_size = rows;
    absl::StatusOr<CpuTrainingRankMemory> plan = PlanCpuTrainingRankMemory(config, 1, 1);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->params_bytes + plan->grads_bytes + plan->activation_bytes,
              expected + 8 * rows * n);
  }
}

struct Measured {
  std::string shape;
  int64_t peak = 0;
};

// Runs `world` probe processes (rank r of world x sp ranks) and returns each one's growth.
std::vector<int64_t> RunProbes(const std::string& config_path, const std::string& dir, int world,
                               int sp, bool resume) {
  std::unique_ptr<comm::TcpStoreServer> server;
  std::string address;
  if (world > 1) {
    absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> s = comm::TcpStoreServer::Start();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    server = *std::move(s);
    address = server->address();
  }
  const std::string probe = "model/testing/training_rank_probe";
  std::vector<pid_t> pids;
  std::vector<std::string> outputs;
  for (int r = 0; r < world; ++r) {
    const std::string out = absl::StrCat(dir, ".rank", r, ".out");
    outputs.push_back(out);
    std::vector<std::string> args = {probe,
                                     "--config",
                                     config_path,
                                     "--dir",
                                     dir,
                                     "--rank",
                                     std::to_string(r),
                                     "--world",
                                     std::to_string(world),
                                     "--sp",
                                     std::to_string(sp)};
    if (world > 1) {
      args.push_back("--store");
      args.push_back(address);
    }
    if (resume) args.push_back("--resume");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, probe.c_str(), &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    pids.push_back(pid);
  }
  std::vector<int64_t> growth;
  for (int r = 0; r < world; ++r) {
    int status = 0;
    EXPECT_EQ(waitpid(pids[r], &status, 0), pids[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " " << status;
    std::ifstream in(outputs[r]);
    std::string key;
    int64_t value = -1;
    in >> key >> value;
    EXPECT_EQ(key, "peak_growth_bytes");
    growth.push_back(value);
  }
  return growth;
}

// The measured config with parameters that outweigh its activations (d 512, 3 layers, F 2048:
// 9.6M parameters, sequences of 128): the checkpoints' copies and mappings dominate.
TrainerConfig ParameterHeavyConfig() {
  TrainerConfig c = MeasuredConfig();
  c.model.d_model = 512;
  c.model.num_layers = 3;
  c.model.ffn_dim = 2048;
  c.seq_len = 128;
  c.batch_size = 2;
  return c;
}

TEST(TrainingMemoryTest, TheEstimateCoversWhatRanksUseWithin25Percent) {
  if (kSanitized) {
    GTEST_SKIP() << "resident memory under AddressSanitizer includes its shadow memory and "
                    "quarantine; the plain build runs this check";
  }
  for (const auto& [name, base] : std::vector<std::pair<std::string, TrainerConfig>>{
           {"activations", MeasuredConfig()}, {"parameters", ParameterHeavyConfig()}}) {
    for (auto [dp, sp] : std::vector<std::pair<int, int>>{{1, 1}, {1, 2}, {2, 1}}) {
      SCOPED_TRACE(absl::StrCat(name, " ", dp, "x", sp));
      TrainerConfig config = base;
      const std::string dir = TempDir(absl::StrCat("memory_", name, "_", dp, "x", sp));
      fs::create_directories(dir);
      const std::string config_path = dir + ".json";
      std::ofstream(config_path) << TrainerConfigToJson(config);
      // A first run writes the checkpoint of step 1; the measured run resumes it, takes step 2,
      // evaluates and saves.
      RunProbes(config_path, dir, dp * sp, sp, /*resume=*/false);
      config.steps = 2;
      std::ofstream(config_path) << TrainerConfigToJson(config);
      const std::vector<int64_t> growth = RunProbes(config_path, dir, dp * sp, sp, /*resume=*/true);
      absl::StatusOr<CpuTrainingRankMemory> plan = PlanCpuTrainingRankMemory(config, dp, sp);
      ASSERT_TRUE(plan.ok()) << plan.status();
      for (size_t r = 0; r < growth.size(); ++r) {
        std::printf(
            "[ memory ] %s %dx%d rank %zu: measured %.1f MiB, planned %.1f MiB (%+.1f%%): "
            "%s\n",
            name.c_str(), dp, sp, r, growth[r] / 1048576.0, plan->total_bytes / 1048576.0,
            100.0 * (plan->total_bytes - growth[r]) / growth[r], plan->breakdown.c_str());
        EXPECT_GE(plan->total_bytes, growth[r]) << "rank " << r;
        EXPECT_LE(plan->total_bytes, 1.25 * growth[r]) << "rank " << r;
      }
    }
  }
}

TEST(TrainingMemoryTest, RefusesShapesThatDoNotFit) {
  const TrainerConfig config = MeasuredConfig();
  absl::Status s = PlanCpuTrainingRankMemory(config, 0, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("0 x 1 ranks"), std::string::npos) << s;
  s = PlanCpuTrainingRankMemory(config, 1, 3).status();
  EXPECT_NE(s.message().find("\"seq_len\": 2048 is not a multiple of the sequence-parallel "
                             "degree 3"),
            std::string::npos)
      << s;
  s = PlanCpuTrainingRankMemory(config, 8, 1).status();
  EXPECT_NE(s.message().find("\"batch_size\": 4 is not a multiple of micro_batches (1) x "
                             "data-parallel ranks (8)"),
            std::string::npos)
      << s;
  TrainerConfig bad = config;
  bad.model.num_heads = 5;
  EXPECT_NE(PlanCpuTrainingRankMemory(bad, 1, 1).status().message().find("model.num_heads"),
            std::string::npos);
  // More ranks: smaller moments and activations per rank; the ring's buffers only with S > 1.
  absl::StatusOr<CpuTrainingRankMemory> one = PlanCpuTrainingRankMemory(config, 1, 1);
  absl::StatusOr<CpuTrainingRankMemory> four = PlanCpuTrainingRankMemory(config, 2, 2);
  ASSERT_TRUE(one.ok() && four.ok());
  EXPECT_EQ(one->params_bytes, four->params_bytes);
  EXPECT_LT(four->moments_bytes, one->moments_bytes);
  EXPECT_LT(four->activation_bytes, one->activation_bytes);
  EXPECT_EQ(one->ring_bytes, 0);
  EXPECT_GT(four->ring_bytes, 0);
}

}  // namespace
}  // namespace model
}  // namespace dattn
