// dattn-generate in-process: from a checkpoint (a step folder or a run folder), greedy output
// equals model::Generate on the same weights, text in and bytes out for a byte-level model, stop
// text honoured, and every bad flag, prompt or checkpoint refused naming it, with its exit code.
#include "trainer/generate_cli.h"

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "model/decoder.h"
#include "model/generation.h"
#include "model/longnet.h"
#include "model/testing/test_checkpoint.h"

namespace dattn {
namespace trainer {
namespace {

namespace fs = std::filesystem;

model::LongNetConfig ByteConfig() {
  model::LongNetConfig c;
  c.vocab_size = 256;
  c.d_model = 16;
  c.num_layers = 2;
  c.num_heads = 4;
  c.ffn_dim = 24;
  c.segment_lengths = {4, 16};
  c.dilation_rates = {1, 4};
  return c;
}

struct CliRun {
  int code = -1;
  std::string out, err;
};

CliRun Cli(std::vector<std::string> args) {
  args.insert(args.begin(), "dattn-generate");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  CliRun r;
  r.code = RunGenerateCli(static_cast<int>(argv.size()), argv.data(), out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// A run folder <tmp>/<name> with one checkpoint at step 5 of a perturbed model; the weights are
// returned too.
std::string MakeRun(const std::string& name, std::vector<float>* weights) {
  const std::string run = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  fs::remove_all(run);
  absl::StatusOr<std::string> dir =
      model::testing::SaveTestCheckpoint(run + "/checkpoints", ByteConfig(), 3, 5, 0.3f, weights);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return run;
}

std::vector<int32_t> Direct(const std::vector<float>& weights, const std::vector<int32_t>& prompt,
                            int64_t max_tokens) {
  auto lm = model::LongNetLM<float>::CreateCpu(ByteConfig(), {}, 1);
  EXPECT_TRUE((*lm)->CopyParamsFromHost(weights.data()).ok());
  auto decoder =
      model::Decoder<float>::Create(lm->get(), static_cast<int64_t>(prompt.size()) + max_tokens);
  model::GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = max_tokens;
  auto r = model::Generate<float>(**decoder, prompt, o, nullptr);
  EXPECT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> t;
  for (const model::GeneratedToken& g : r->tokens) t.push_back(g.token);
  return t;
}

TEST(GenerateCliTest, GreedyOutputIsTheModelsFromAStepOrARunFolder) {
  std::vector<float> weights;
  const std::string run = MakeRun("greedy", &weights);
  const std::vector<int32_t> expected = Direct(weights, {'H', 'i'}, 30);
  for (const std::string& where : {run, run + "/checkpoints/step-00000005"}) {
    CliRun r = Cli({"--checkpoint", where, "--prompt", "Hi", "--max-tokens", "30", "--temperature",
                    "0", "--print-tokens", "--threads", "1"});
    ASSERT_EQ(r.code, kGenerateOk) << r.err;
    EXPECT_EQ(r.out, absl::StrCat(absl::StrJoin(expected, "\n"), "\n"));
    EXPECT_NE(r.err.find("30 tokens after a prompt of 2"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("finish: length"), std::string::npos) << r.err;
  }
  // As bytes, and stopped before a stretch of its own output.
  CliRun text = Cli({"--checkpoint", run, "--prompt", "Hi", "--max-tokens", "30", "--temperature",
                     "0", "--threads", "1"});
  ASSERT_EQ(text.code, kGenerateOk) << text.err;
  std::string bytes;
  for (int32_t t : expected) bytes.push_back(static_cast<char>(t));
  EXPECT_EQ(text.out, bytes + "\n");
  const std::string stop = bytes.substr(10, 3);
  if (stop.find('\0') == std::string::npos) {
    CliRun stopped = Cli({"--checkpoint", run, "--prompt", "Hi", "--max-tokens", "30",
                          "--temperature", "0", "--stop", stop, "--threads", "1"});
    ASSERT_EQ(stopped.code, kGenerateOk) << stopped.err;
    EXPECT_EQ(stopped.out, bytes.substr(0, bytes.find(stop)) + "\n");
    EXPECT_NE(stopped.err.find("finish: stop"), std::string::npos) << stopped.err;
  }
}

TEST(GenerateCliTest, BadInputIsRefusedNamingIt) {
  std::vector<float> weights;
  const std::string run = MakeRun("bad", &weights);
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string text;
  };
  const std::string missing = run + "/nowhere";
  const std::vector<Case> cases = {
      {{"--checkpoint", missing, "--prompt", "x"}, kGenerateCheckpoint, missing},
      {{"--checkpoint", run}, kGenerateUsage, "give the prompt once"},
      {{"--checkpoint", run, "--prompt", "x", "--prompt-tokens", "1"},
       kGenerateUsage,
       "give the prompt once"},
      {{"--checkpoint", run, "--prompt", "x", "--temperature", "-1"},
       kGenerateUsage,
       "temperature -1"},
      {{"--checkpoint", run, "--prompt", "x", "--top-p", "1.5"}, kGenerateUsage, "top_p 1.5"},
      {{"--checkpoint", run, "--prompt-tokens", "1,300"}, kGenerateUsage, "300"},
      {{"--checkpoint", run, "--prompt-tokens", "1,x"}, kGenerateUsage, "'x' is not a token id"},
      {{"--checkpoint", run, "--prompt", "hello", "--max-context", "3"},
       kGenerateUsage,
       "max_context of 3"},
      {{"--checkpoint", run, "--prompt-file", missing}, kGenerateUsage, missing},
      {{"--checkpoint", run, "--prompt", "x", "--stop-tokens", "1,999"}, kGenerateUsage, "999"},
  };
  for (const Case& c : cases) {
    CliRun r = Cli(c.args);
    EXPECT_EQ(r.code, c.code) << absl::StrJoin(c.args, " ") << ": " << r.err;
    EXPECT_NE(r.err.find(c.text), std::string::npos) << absl::StrJoin(c.args, " ") << ": " << r.err;
  }
}

}  // namespace
}  // namespace trainer
}  // namespace dattn
