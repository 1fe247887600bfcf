#include "tests/training_files.h"

#include <cstdint>
#include <filesystem>
#include <fstream>

namespace dattn::testing {

void WriteTestCorpus(const std::string& path) {
  static const char* const kWords[] = {"the",   "light", "and",  "darkness", "was",  "upon",
                                       "face",  "of",    "deep", "waters",   "said", "let",
                                       "there", "be",    "day",  "night",    "good", "evening"};
  std::ofstream out(path);
  uint64_t x = 12345;
  for (int verse = 1; out.tellp() < 200000; ++verse) {
    out << (verse % 31 + 1) << ":" << verse << " ";
    for (int w = 0; w < 14; ++w) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      out << kWords[(x >> 33) % (sizeof(kWords) / sizeof(kWords[0]))] << (w == 13 ? ".\n" : " ");
    }
  }
}

std::string TestTrainerConfig(const std::string& corpus, int steps, int checkpoint_every) {
  return R"({
  "model": {"vocab_size": 256, "d_model": 32, "num_layers": 2, "num_heads": 2, "ffn_dim": 64,
            "attention": {"mode": "grouped", "segment_lengths": [16, 32],
                          "dilation_rates": [1, 2]}},
  "threads": 1,
  "data": {"paths": [")" +
         corpus + R"("], "format": "text", "validation_fraction": 0.05},
  "seq_len": 64, "batch_size": 4, "micro_batches": 1, "steps": )" +
         std::to_string(steps) + R"(, "seed": 7,
  "optimizer": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5},
  "eval": {"every": 20, "batches": 2},
  "checkpoint": {"every": )" +
         std::to_string(checkpoint_every) + R"(, "keep_last": 3}
})";
}

std::string WriteTrainingJobFile(const std::string& root, const std::string& name, int data,
                                 int sequence, int steps, int checkpoint_every, bool checkpoints) {
  const std::string dir = root + "/" + name;
  std::filesystem::create_directories(dir);
  const std::string corpus = root + "/corpus.txt";
  if (!std::filesystem::exists(corpus)) WriteTestCorpus(corpus);
  std::ofstream(dir + "/trainer.json") << TestTrainerConfig(corpus, steps, checkpoint_every);
  std::ofstream job(dir + "/job.yaml");
  job << "name: " << name << "\n"
      << "training:\n"
      << "  config_file: trainer.json\n"
      << "  data_parallel: " << data << "\n"
      << "  sequence_parallel: " << sequence << "\n"
      << "  device: cpu\n";
  if (checkpoints) job << "  checkpoint_dir: " << dir << "/checkpoints\n";
  return dir + "/job.yaml";
}

std::vector<double> LossCurve(const dattn::v1::Job& job) {
  std::vector<double> out;
  for (const auto& p : job.result().training().loss_curve()) out.push_back(p.loss());
  return out;
}

std::map<std::string, int> CheckpointEventCounts(const dattn::v1::Job& job) {
  std::map<std::string, int> seen;
  for (const auto& e : job.events()) {
    if (e.kind() == "checkpoint") ++seen[e.message().substr(0, e.message().find(':'))];
  }
  return seen;
}

}  // namespace dattn::testing
