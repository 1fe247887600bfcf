// dattn-train and dattn-train-gpu: see trainer/train_cli.h and docs/TRAINING.md. The same source
// builds both: dattn-train-gpu (DATTN_TRAIN_WITH_CUDA) links the CUDA model and registers the
// "cuda" device before anything parses a config; dattn-train links no CUDA library.
#include <signal.h>

#include <atomic>
#include <iostream>

#include "engine/openblas_core.h"
#include "trainer/train_cli.h"
#ifdef DATTN_TRAIN_WITH_CUDA
#include "model/cuda/cuda_trainable_model.h"
#endif

namespace {

std::atomic<bool> stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler stores a lock-free bool");

// The first SIGINT or SIGTERM asks the trainer to stop after the current step (it then writes a
// checkpoint); SA_RESETHAND makes a second one end the process at once.
void OnSignal(int) { stop_requested.store(true); }

}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS off its generic kernels where it did not recognise the CPU (restarts the process).
#ifdef DATTN_TRAIN_WITH_CUDA
  dattn::ReexecWithBestOpenBlasCore("dattn-train-gpu", argv);
#else
  dattn::ReexecWithBestOpenBlasCore("dattn-train", argv);
#endif
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  dattn::trainer::TrainCliEnvironment env;
  env.stop = &stop_requested;
#ifdef DATTN_TRAIN_WITH_CUDA
  env.program = "dattn-train-gpu";
  const absl::Status registered = dattn::model::cuda::RegisterCudaTrainingDevice();
  if (!registered.ok()) {
    std::cerr << env.program << ": error: " << registered.message() << '\n';
    return 1;
  }
#endif
  return dattn::trainer::RunTrainCli(argc, argv, std::cout, std::cerr, env);
}
