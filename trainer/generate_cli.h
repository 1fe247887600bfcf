// dattn-generate, as a function: trainer/generate_main.cc calls it with the process's streams;
// tests call it in-process with string streams.
//
// It loads a checkpoint that dattn-train wrote (a step folder, a run's checkpoints folder or the
// run folder itself: the newest checkpoint then) onto the CPU and continues a prompt with the
// incremental decoder (model/decoder.h: a cache of only the keys the attention patterns can still
// select) and the sampler of model/generation.h. Byte-level models (vocab_size 256, the trainer's
// text corpora) take the prompt as text (--prompt, --prompt-file) and print bytes; any model takes
// --prompt-tokens "1,2,3" and, with --print-tokens, prints token ids. Tokens are written to `out`
// as they are made (flushed each one); a summary line goes to `err` (tokens, seconds, tokens/s,
// why it stopped, the cache's bytes). Errors go to `err` naming the flag, file or value at fault.
// Flags and exit codes: docs/TRAINING.md ("Generating text") and `dattn-generate --help`.
//
// RunGenerateCli never throws and never calls exit(). Thread-safety: one call at a time per
// process (the model sets OpenBLAS's global thread count).
#ifndef DATTN_TRAINER_GENERATE_CLI_H_
#define DATTN_TRAINER_GENERATE_CLI_H_

#include <ostream>

namespace dattn {
namespace trainer {

// Exit codes of dattn-generate.
enum GenerateExitCode : int {
  kGenerateOk = 0,
  kGenerateFailed = 1,      // The model failed while generating (a non-finite logit, memory).
  kGenerateUsage = 2,       // A bad flag or value (names it), a prompt the model cannot take.
  kGenerateCheckpoint = 4,  // No checkpoint there, or a damaged or unreadable one.
};

// Runs one dattn-generate command line (argv[0] is the program name); returns the exit code.
int RunGenerateCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace trainer
}  // namespace dattn

#endif  // DATTN_TRAINER_GENERATE_CLI_H_
