// One CPU training rank in a process of its own, for model:training_memory_test: it measures how
// much resident memory the rank adds to its process. Testing only.
//
//   training_rank_probe --config FILE --rank R --world W --sp S --dir DIR [--store HOST:PORT]
//                       [--resume]
//
// At start it resets the process's peak resident size (/proc/self/clear_refs, "5") and reads its
// resident size (VmRSS); then it joins the world communicator (and its sequence-parallel group's,
// S > 1; Gloo through the store, when W > 1), makes the model and the trainer, resumes from DIR
// when asked, and runs to config.steps (evaluations and the final checkpoint as the config says).
// It prints "peak_growth_bytes N" (VmHWM at the end minus VmRSS at the start) and exits 0; on an
// error it prints it to stderr and exits 1.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/comm/tcp_store.h"
#include "model/comm_collective.h"
#include "model/ring_sequence_attention.h"
#include "model/trainer.h"

namespace dattn {
namespace model {
namespace {

// A field of /proc/self/status in bytes ("VmRSS:    1234 kB").
int64_t StatusBytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) {
      int64_t kb = 0;
      std::istringstream(line.substr(std::strlen(field) + 1)) >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

absl::Status Run(int argc, char** argv, int64_t* growth) {
  std::string config_path, dir, store_address;
  int rank = 0, world = 1, sp = 1;
  bool resume = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (flag == "--config") {
      config_path = value();
    } else if (flag == "--dir") {
      dir = value();
    } else if (flag == "--store") {
      store_address = value();
    } else if (flag == "--rank") {
      if (!absl::SimpleAtoi(value(), &rank)) return absl::InvalidArgumentError("--rank");
    } else if (flag == "--world") {
      if (!absl::SimpleAtoi(value(), &world)) return absl::InvalidArgumentError("--world");
    } else if (flag == "--sp") {
      if (!absl::SimpleAtoi(value(), &sp)) return absl::InvalidArgumentError("--sp");
    } else if (flag == "--resume") {
      resume = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
  }
  std::ifstream in(config_path);
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<TrainerConfig> config = ParseTrainerConfigJson(text.str());
  if (!config.ok()) return config.status();

  // The baseline: the process as it is before the rank exists.
  const int fd = open("/proc/self/clear_refs", O_WRONLY);
  if (fd < 0 || write(fd, "5", 1) != 1) return absl::InternalError("cannot reset VmHWM");
  close(fd);
  const int64_t baseline = StatusBytes("VmRSS:");

  absl::StatusOr<TokenCorpus> corpus = OpenTrainingCorpus(*config);
  if (!corpus.ok()) return corpus.status();
  std::unique_ptr<comm::Communicator> world_comm, sp_comm;
  std::unique_ptr<TrainerCollective> collective;
  if (world > 1) {
    absl::StatusOr<std::unique_ptr<comm::TcpStore>> client = comm::TcpStore::Connect(store_address);
    if (!client.ok()) return client.status();
    std::shared_ptr<comm::Store> store(std::move(*client));
    comm::GlooOptions options;
    options.prefix = "probe/world";
    absl::StatusOr<std::unique_ptr<comm::Communicator>> made =
        comm::CreateGlooCommunicator(store, rank, world, options);
    if (!made.ok()) return made.status();
    world_comm = *std::move(made);
    if (sp > 1) {
      options.prefix = absl::StrCat("probe/sp", rank / sp);
      made = comm::CreateGlooCommunicator(store, rank % sp, sp, options);
      if (!made.ok()) return made.status();
      sp_comm = *std::move(made);
    }
    collective = NewCommunicatorCollective(world_comm.get());
  }
  ModelOptions model_options;
  model_options.checkpoint_activations = config->checkpoint_activations;
  const int threads = static_cast<int>(config->threads);
  absl::StatusOr<std::unique_ptr<TrainableModel>> model =
      sp_comm != nullptr ? NewCpuTrainableModel(config->model, model_options, threads,
                                                NewCpuRingSequenceAttention(sp_comm.get(), threads))
                         : NewCpuTrainableModel(config->model, model_options, threads);
  if (!model.ok()) return model.status();
  TrainerOptions options;
  options.checkpoint_dir = dir;
  options.collective = collective.get();
  options.sequence_parallel = sp;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(*config, *std::move(corpus), *std::move(model), options);
  if (!trainer.ok()) return trainer.status();
  if (resume) {
    if (absl::Status s = (*trainer)->Resume(); !s.ok()) return s;
  }
  if (absl::Status s = (*trainer)->Run(); !s.ok()) return s;
  *growth = StatusBytes("VmHWM:") - baseline;
  return absl::OkStatus();
}

}  // namespace
}  // namespace model
}  // namespace dattn

int main(int argc, char** argv) {
  int64_t growth = 0;
  const absl::Status s = dattn::model::Run(argc, argv, &growth);
  if (!s.ok()) {
    std::fprintf(stderr, "training_rank_probe: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("peak_growth_bytes %lld\n", static_cast<long long>(growth));
  return 0;
}
