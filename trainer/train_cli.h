// dattn-train, as a function: trainer/main.cc calls it with the process's streams and its signal
// flag; tests call it in-process with string streams.
//
// It trains the LongNet model (model/trainer.h) on a text file or folder (byte-level) or on token
// files, on one device, in a run folder --out:
//   <out>/config.json          the trainer config of the run, every field (written at the start)
//   <out>/checkpoints/step-N/  checkpoints (model/checkpoint.h), the newest checkpoint.keep_last
//   <out>/loss.svg             the loss curve, written at the end (also after an error or a stop,
//                              when at least one step ran)
//   <out>/history.json         the same losses as numbers (every step's, every evaluation's, with
//                              bits/byte and retrieval), the device, its description and the
//                              config; written with loss.svg
// Progress goes to `out`, one line per log_every steps (step, mean loss since the last line,
// learning rate, gradient norm, tokens/s, MFU, ETA), plus a line per evaluation and checkpoint;
// errors go to `err`, each naming the flag, field, file or value at fault. Usage, flags and exit
// codes: docs/TRAINING.md and `dattn-train --help`; the codes are trainer/exit_codes.h's.
//
// RunTrainCli never throws and never calls exit(). Thread-safety: one call at a time per process
// (the model sets OpenBLAS's global thread count).
#ifndef DATTN_TRAINER_TRAIN_CLI_H_
#define DATTN_TRAINER_TRAIN_CLI_H_

#include <atomic>
#include <ostream>
#include <string>

namespace dattn {
namespace trainer {

struct TrainCliEnvironment {
  // The binary's name, in messages, --help and the curve's title ("dattn-train-gpu" for the build
  // that registers the "cuda" device, trainer/main.cc).
  std::string program = "dattn-train";
  // Set (from a signal handler) to stop after the current step: a checkpoint is written and the
  // exit code is kExitInterrupted. Null: never.
  const std::atomic<bool>* stop = nullptr;
};

// Runs one dattn-train command line (argv[0] is the program name); returns the exit code.
int RunTrainCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
                const TrainCliEnvironment& env = {});

// This machine's fp32 matrix-multiply rate in FLOP/s: the best of a few 1024^3 sgemm calls on
// OpenBLAS with `threads` threads (0: every core), after a warm-up; about a quarter of a second.
// dattn-train's default peak for MFU.
double MeasureSgemmFlops(int threads);

}  // namespace trainer
}  // namespace dattn

#endif  // DATTN_TRAINER_TRAIN_CLI_H_
