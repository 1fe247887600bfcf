// dattn-train: see trainer/train_cli.h and docs/TRAINING.md.
#include <signal.h>

#include <atomic>
#include <iostream>

#include "engine/openblas_core.h"
#include "trainer/train_cli.h"

namespace {

std::atomic<bool> stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler stores a lock-free bool");

// The first SIGINT or SIGTERM asks the trainer to stop after the current step (it then writes a
// checkpoint); SA_RESETHAND makes a second one end the process at once.
void OnSignal(int) { stop_requested.store(true); }

}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS off its generic kernels where it did not recognise the CPU (restarts the process).
  dattn::ReexecWithBestOpenBlasCore("dattn-train", argv);
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  dattn::trainer::TrainCliEnvironment env;
  env.stop = &stop_requested;
  return dattn::trainer::RunTrainCli(argc, argv, std::cout, std::cerr, env);
}
