// The exit codes of dattn-train. Scripts depend on them: they are part of the command's interface
// (docs/TRAINING.md, `dattn-train --help`) and never change meaning; new codes go at the end.
#ifndef DATTN_TRAINER_EXIT_CODES_H_
#define DATTN_TRAINER_EXIT_CODES_H_

#include <string>

namespace dattn {
namespace trainer {

enum TrainExitCode : int {
  kExitOk = 0,              // The run reached its last step (or had already).
  kExitTrainingFailed = 1,  // Training failed: diverged, or an error while training (the last
                            // checkpoint written stays usable).
  kExitUsage = 2,           // A bad flag, config file or value; a config the data cannot serve.
  kExitData = 3,            // The training data cannot be read (missing, binary, damaged).
  kExitResume = 4,          // --resume found no checkpoint, or a damaged or incompatible one;
                            // or a fresh run was asked in a folder that holds checkpoints.
  kExitInterrupted = 5,     // Stopped by SIGINT or SIGTERM; a checkpoint was written first.
  kExitOutput = 6,          // The run folder or the loss-curve image cannot be written.
};

// The table printed by --help: one line per code.
inline std::string TrainExitCodeHelp() {
  return "Exit codes:\n"
         "  0  the run reached its last step\n"
         "  1  training failed (diverged, or an error while training)\n"
         "  2  bad flag, config file or value\n"
         "  3  the training data cannot be read\n"
         "  4  nothing to resume, a damaged or incompatible checkpoint, or checkpoints in the way\n"
         "     of a fresh run\n"
         "  5  interrupted (SIGINT/SIGTERM) after writing a checkpoint: continue with --resume\n"
         "  6  the run folder or the loss-curve image cannot be written\n";
}

}  // namespace trainer
}  // namespace dattn

#endif  // DATTN_TRAINER_EXIT_CODES_H_
