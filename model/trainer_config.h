// The trainer's configuration: every knob of a training run, as JSON.
//
// JSON form (every key optional; defaults below; an unknown key is an error, so that a typo is not
// silently a default). docs/TRAINING.md describes each field.
//   {
//     "model": { ...model/config.h's LongNetConfig JSON... },
//     "device": "cpu", "threads": 0,
//     "data": {"paths": ["corpus.txt"], "format": "text", "validation_fraction": 0.01},
//     "seq_len": 256, "batch_size": 8, "micro_batches": 1, "steps": 1000, "seed": 1,
//     "checkpoint_activations": false,
//     "optimizer": {"lr": 3e-4, "min_lr": 3e-5, "warmup_steps": 100, "beta1": 0.9, "beta2": 0.95,
//                   "epsilon": 1e-8, "weight_decay": 0.1, "decay_embeddings": false,
//                   "max_grad_norm": 1.0, "max_consecutive_skips": 10},
//     "eval": {"every": 100, "batches": 8},
//     "retrieval": {"examples": 0, "depth": 0.5, "seq_len": 0, "key_length": 6,
//                   "value_length": 6, "distractors": 0, "train_fraction": 0},
//     "checkpoint": {"every": 0, "keep_last": 3},
//     "log_every": 10
//   }
// "max_grad_norm": null turns clipping off. Where the run writes (the checkpoint folder) is not a
// knob of the run: the caller gives it (Trainer::Create, dattn-train --out).
//
// Errors are INVALID_ARGUMENT naming the field by its JSON path and the bad value, e.g.
// `trainer config field "optimizer.lr": -1 must be finite and > 0`; a bad model field is named
// under "model." (`trainer config field "model.d_model": 0 must be >= 1`).
//
// A config is a plain value; everything here is pure and thread-safe.
#ifndef DATTN_MODEL_TRAINER_CONFIG_H_
#define DATTN_MODEL_TRAINER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/optimizer.h"
#include "model/retrieval.h"

namespace dattn {
namespace model {

struct TrainerConfig {
  LongNetConfig model;

  // Where the model runs: one of trainable_model.h's TrainingDevices() ("cpu"; "cuda" in
  // dattn-train-gpu, which registers it).
  // threads: CPU threads of the model (OpenBLAS and the attention engine), 0 for every core. A
  // resumed run reproduces the uninterrupted one bit for bit only with the same device and thread
  // count.
  std::string device = "cpu";
  int64_t threads = 0;

  struct Data {
    // Text files or folders ("text": byte-level tokens, vocabulary 256, corpus.h's FromText; one
    // path) or token files ("tokens": joined in order, corpus.h's FromTokenFiles). Read by
    // OpenTrainingCorpus (dattn-train); a Trainer is given the corpus itself.
    std::vector<std::string> paths;
    std::string format = "text";
    double validation_fraction = 0.01;  // [0, 1): the last tokens are held out (corpus.h).
  } data;

  int64_t seq_len = 256;      // Tokens per sequence (N).
  int64_t batch_size = 8;     // Sequences per step (the global batch, all ranks together).
  int64_t micro_batches = 1;  // Forward/backward passes per step; divides batch_size.
  int64_t steps = 1000;       // Training steps of the run; also the schedule's total_steps.
  uint64_t seed = 1;          // Initialisation, data order and the trainer's Rng derive from it.
  bool checkpoint_activations = false;  // Recompute each block in the backward pass.

  struct Optimizer {
    double lr = 3e-4;            // Peak learning rate (after warmup).
    double min_lr = 3e-5;        // Floor of the cosine decay, reached at `steps`.
    int64_t warmup_steps = 100;  // Linear warmup; <= steps.
    double beta1 = 0.9;
    double beta2 = 0.95;
    double epsilon = 1e-8;
    double weight_decay = 0.1;
    // Which entries decay: matrices but not embeddings (optimizer.h's DecayByConvention), or, with
    // decay_embeddings, every matrix including the token embedding (longnet_params.h's
    // WantsWeightDecay). Vectors (biases, norms) never decay.
    bool decay_embeddings = false;
    double max_grad_norm = 1.0;  // > 0; +infinity (JSON null): no clipping.
    // A step whose gradient norm is not finite is skipped (no update); this many in a row stop the
    // run with ABORTED (it has diverged).
    int64_t max_consecutive_skips = 10;
  } optimizer;

  struct Eval {
    // Validation every `every` steps (and at step 0 of a fresh run), and always after the last
    // step; 0: after the last step only. Needs data.validation_fraction > 0.
    int64_t every = 100;
    // Validation micro-batches per evaluation (the first windows of the held-out split in corpus
    // order, the same every time; fewer when the split holds fewer).
    int64_t batches = 8;
  } eval;

  struct Retrieval {
    // Pass-key retrieval examples (retrieval.h) scored at each evaluation, built from the held-out
    // split; 0: none.
    int64_t examples = 0;
    double depth = 0.5;        // Where the needle sits, in [0, 1] (0: farthest from the question).
    int64_t seq_len = 0;       // 0: the training seq_len.
    int64_t key_length = 6;    // 1..64 letters.
    int64_t value_length = 6;  // 1..64 digits.
    int64_t distractors = 0;   // Extra needles with other keys.
    // Fraction [0, 1] of training rows replaced by retrieval examples from the training split
    // (random depth, text also scored), drawn with the trainer's Rng; needs byte-level data and
    // seq_len >= the task's minimum.
    double train_fraction = 0;
  } retrieval;

  struct Checkpointing {
    int64_t every = 0;      // Steps between checkpoints; 0: only the final one.
    int64_t keep_last = 3;  // Checkpoints kept (older ones are removed after each save); >= 1.
  } checkpoint;

  int64_t log_every = 10;  // Steps between progress lines (dattn-train); >= 1.

  // Derived values.
  LrSchedule schedule() const;
  AdamWConfig adamw() const;
  bool byte_level() const { return data.format == "text"; }
  int64_t retrieval_seq_len() const { return retrieval.seq_len > 0 ? retrieval.seq_len : seq_len; }
};

// Parses and validates a JSON document (the form above). INVALID_ARGUMENT for malformed JSON,
// an unknown key, a value of the wrong type, or what ValidateTrainerConfig refuses.
absl::StatusOr<TrainerConfig> ParseTrainerConfigJson(const std::string& text);

// The JSON form, every field written (the model config in full);
// ParseTrainerConfigJson(TrainerConfigToJson(c)) == c.
std::string TrainerConfigToJson(const TrainerConfig& config);

// Every rule of the fields on their own and together: the model config (ValidateConfig, named
// under "model."); device in TrainingDevices(); threads in [0, 4096]; data.format "text" or
// "tokens"; data.paths non-empty strings; 0 <= validation_fraction < 1; seq_len, batch_size,
// micro_batches, steps, eval.batches, log_every, checkpoint.keep_last >= 1; micro_batches divides
// batch_size; the optimizer's (ValidateAdamWConfig, ValidateLrSchedule with total_steps = steps,
// max_grad_norm > 0, max_consecutive_skips >= 1); eval.every and checkpoint.every >= 0;
// retrieval.examples >= 0, depth in [0, 1], key/value lengths 1..64, distractors >= 0,
// train_fraction in [0, 1] (> 0 or examples > 0 need data.format "text"; examples > 0 needs
// validation_fraction > 0).
absl::Status ValidateTrainerConfig(const TrainerConfig& config);

// What a run of `data_parallel` groups of `sequence_parallel` ranks (trainer.h) adds to the
// config's own rules: seq_len, and with retrieval examples the retrieval task's seq_len, multiples
// of the sequence-parallel degree; batch_size a multiple of micro_batches x the data-parallel
// degree. INVALID_ARGUMENT naming the field and the degree. Degrees >= 1 (the caller's check).
absl::Status CheckParallelDegrees(const TrainerConfig& config, int data_parallel,
                                  int sequence_parallel);

bool operator==(const TrainerConfig& a, const TrainerConfig& b);
inline bool operator!=(const TrainerConfig& a, const TrainerConfig& b) { return !(a == b); }

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TRAINER_CONFIG_H_
