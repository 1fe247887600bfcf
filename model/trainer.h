// The training loop of the LongNet language model: one device, or one rank of a run of W = D x S
// ranks (D data-parallel groups of S sequence-parallel ranks) through collective.h: AdamW with
// warmup + cosine and global-norm clipping, gradient accumulation, evaluation on the held-out
// split and on the retrieval task, atomic checkpoints kept last-K (sharded when W > 1), and
// bit-exact resume. docs/TRAINING.md has the whole story.
//
// Ranks. The collective spans all W ranks; TrainerOptions::sequence_parallel is S. Rank w is
// data-parallel rank d = w / S (of D = W / S) and sequence rank s = w % S: the S ranks of a
// data-parallel group are contiguous. The model of a rank with S > 1 must attend over its group
// (ring_sequence_attention.h: NewCpuTrainableModel over NewCpuRingSequenceAttention on the group's
// communicator); the ranks of a group are driven in lockstep, since every forward and backward
// pass is collective over the group.
//
// One step (Step):
//   1. the global batch of config.batch_size windows from the training sampler: data-parallel
//      rank d gets rows [d B / D, (d + 1) B / D) (sampler.h's rank share, Next(&b, d, D)), some
//      rows replaced by retrieval examples when retrieval.train_fraction > 0 (the choice drawn
//      from the trainer's Rng for every global row, so every rank draws the same); sequence rank s
//      keeps positions [s N / S, (s + 1) N / S) of each of its rows (tokens and targets) and runs
//      the model with TokenBatch::positions = {s N / S, N};
//   2. the global count of scored targets T (AllGather of the ranks' counts: each rank counts
//      its slice only, so the sum over all W ranks is the global count);
//   3. micro_batches forward/backward passes over consecutive rows, micro-batch i with loss_scale
//      = (this rank's scored targets of it) / T, the first overwriting grads() and the others
//      adding: the sum over micro-batches and ranks is the gradient of the mean loss over the
//      whole global batch, exactly what one pass over all rows would compute (up to fp32
//      summation order);
//   4. ReduceScatterGradients over all W ranks (every rank's gradient is a partial sum of the same
//      parameters); 5. the global norm from every shard's fp64 sum of squares
//      (GlobalNorm in rank order); the clip factor ClipScale(norm, max_grad_norm), passed to AdamW
//      as its grad_scale; a norm that is not finite skips the update (counted;
//      max_consecutive_skips in a row abort the run);
//   6. ShardOptimizer::Update with lr = schedule(step + 1) and t = updates applied + 1 (ZeRO-1:
//      AdamW's moments are sharded over all W ranks, ShardRanges(total, W));
//   7. AllGatherParameters. The step's loss is (sum of the ranks' fp64 loss sums) / T, the same
//      on every rank.
//
// Stopping (Run's RunCallbacks::stop) is a collective decision when W > 1: before each step the
// ranks all-gather their flags, and all stop at the same step, save the same checkpoint and
// return CANCELLED together, whichever rank saw the request.
//
// Determinism: on the CPU in fp32, a run resumed from a checkpoint computes the same loss, bit for
// bit, at every later step as a run that never stopped (trainer_test checks it), given the same
// config, device and thread count, and on the same ranks (W, S and the communicators' order of
// addition: comm_collective.h adds in rank order, so a run of W ranks gives the same bits every
// time). A checkpoint holds the fp32 weights, both AdamW moments and the
// update count, the sampler's cursor, the Rng's state, the trainer config and the loss history;
// the training step depends on nothing else (evaluation reads the weights only).
//
// Seeds derived from config.seed: the initial weights use seed itself (InitMagneto); the training
// sampler HashPair(seed, 1); the retrieval evaluation HashPair(seed, 2); the trainer's Rng
// HashPair(seed, 3); retrieval training examples HashPair(seed, 4).
//
// Ownership: the trainer owns the model, the corpus handle and the collective it creates when none
// is given (a given one is borrowed and must outlive it). Thread-safety: one thread at a time;
// RunCallbacks are called on that thread. Errors: as each method says; after an error from Step
// or Run other than ABORTED/CANCELLED the model's state is unspecified: resume from a checkpoint.
// With W > 1 every rank must make the same calls in the same order (Step, Evaluate, Save, Resume,
// Run are collective); Save and Resume return the same status on every rank.
#ifndef DATTN_MODEL_TRAINER_H_
#define DATTN_MODEL_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/collective.h"
#include "model/corpus.h"
#include "model/optimizer.h"
#include "model/retrieval.h"
#include "model/rng.h"
#include "model/sampler.h"
#include "model/trainable_model.h"
#include "model/trainer_config.h"

namespace dattn {
namespace model {

// What one training step did.
struct StepResult {
  int64_t step = 0;            // The step's number: 1 for the first.
  double loss = 0;             // Mean over the global batch's scored targets (fp64 sums).
  int64_t targets = 0;         // Scored targets of the global batch.
  double lr = 0;               // The rate applied (0 when skipped).
  double grad_norm = 0;        // Global L2 norm of the gradient before clipping.
  double clip_scale = 1;       // The factor applied to the gradient (1: not clipped).
  bool skipped = false;        // The norm was not finite: no update.
  int64_t tokens = 0;          // Tokens of the global batch (batch_size x seq_len).
  int64_t retrieval_rows = 0;  // Rows of the global batch that were retrieval examples.
  double flops = 0;            // This rank's model FLOPs (TrainableModel::TrainingFlops).
  double seconds = 0;          // Wall time of the step on this rank.
};

// What one evaluation measured.
struct EvalResult {
  int64_t step = 0;  // Training steps done when it ran.
  // Validation loss: mean over the evaluated windows' targets; has_loss false without a split.
  bool has_loss = false;
  double loss = 0;
  int64_t targets = 0;
  // loss / ln 2 for byte-level data (every token one byte of text); NaN for token files.
  double bits_per_byte = std::numeric_limits<double>::quiet_NaN();
  // Retrieval (retrieval.examples > 0): answers scored at `retrieval_depth`.
  bool has_retrieval = false;
  double retrieval_depth = 0;
  int64_t retrieval_seq_len = 0;
  RetrievalScore retrieval;
  double seconds = 0;
};

// Losses so far, for curves: saved in every checkpoint, restored on resume.
struct TrainingHistory {
  struct Point {
    int64_t step = 0;
    double loss = 0;
  };
  std::vector<Point> train;       // Every step's loss.
  std::vector<EvalResult> evals;  // Every evaluation (seconds are not kept across a resume).
};

struct TrainerOptions {
  // Where checkpoints go (<dir>/step-NNNNNNNN, checkpoint.h); empty: none (Save and Resume are
  // FAILED_PRECONDITION then). With W > 1 ranks every rank is given the same folder, on a file
  // system they share: each writes its own shard files there (checkpoint.h, version 2).
  std::string checkpoint_dir;
  // The ranks' communication over all W ranks (borrowed; comm_collective.h's
  // NewCommunicatorCollective over the world communicator); null: a single process.
  TrainerCollective* collective = nullptr;
  // S, the sequence-parallel degree: the collective's world W must be a multiple of it, and
  // config.seq_len (and the retrieval evaluation's seq_len) too. S > 1 needs a model whose
  // attention spans the rank's group of S (see the file comment).
  int sequence_parallel = 1;
  // With S = 1 and a collective that reduces ranges early (TrainerCollective::
  // reduces_ranges_early: the GPU one), each step hands the gradient's ranges to the collective as
  // the last micro-batch's backward finishes them (BackwardOptions::on_grads_final), so that the
  // reduce-scatter of a block's gradients overlaps the backward of the blocks below it. Same bits
  // either way (collective.h). Not with S > 1: the model's ring attention then runs on a
  // communicator of its own during the backward, and NCCL documents two communicators' kernels in
  // flight on one device at once as a possible deadlock. false: the reduction follows the backward.
  bool overlap_gradient_reduction = true;
};

struct RunCallbacks {
  std::function<void(const StepResult&)> on_step;
  std::function<void(const EvalResult&)> on_eval;
  std::function<void(const std::string& path, int64_t step)> on_checkpoint;
  // Checked before each step: once true, Run saves a checkpoint (when it has a folder) and returns
  // CANCELLED naming the step. May be set from a signal handler. With W > 1 ranks the ranks
  // agree before every step (an all-gather of their flags, one double each): once any rank's
  // flag is set, every rank stops at that same step, saves the same checkpoint and returns
  // CANCELLED naming the ranks that asked. Ranks without a flag (null) still take part.
  const std::atomic<bool>* stop = nullptr;
};

class Trainer {
 public:
  // A fresh run at step 0: the model's weights initialised from config.seed, zero moments, the
  // samplers at their start. `corpus` is split by config.data.validation_fraction. The model must
  // have been made for config.model (INVALID_ARGUMENT otherwise) with checkpointing as
  // config.checkpoint_activations. INVALID_ARGUMENT naming the field for a config
  // ValidateTrainerConfig refuses, a corpus whose vocabulary exceeds the model's, a split or a
  // retrieval task the corpus cannot hold (corpus.h's and retrieval.h's messages, prefixed with
  // the data's size or the config field concerned), a batch the ranks cannot share (batch_size /
  // micro_batches not a multiple of the data-parallel ranks D), a sequence_parallel that does not
  // divide the collective's world, or a seq_len (retrieval.seq_len) that S does not divide.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerConfig& config,
                                                         TokenCorpus corpus,
                                                         std::unique_ptr<TrainableModel> model,
                                                         const TrainerOptions& options = {});

  // Continues from the newest complete checkpoint under options.checkpoint_dir (the newest step
  // folder with a MANIFEST.json), verified. Step folders newer than it without a manifest
  // (incomplete: the writer never leaves one, so it was damaged or copied in part) are renamed to
  // <folder>.incomplete and listed in resume_notes(), so the run can write those steps again.
  // Errors, each naming the folder or file and what is wrong:
  //   NOT_FOUND            no complete checkpoint under the folder;
  //   DATA_LOSS            the newest complete checkpoint is damaged (Checkpoint::Open's message: a
  //                        file missing, of the wrong size or checksum, bad JSON, a bad safetensors
  //                        header): never silently passed over for an older one;
  //   FAILED_PRECONDITION  an intact checkpoint of another run: another model config (the first
  //                        differing field named), a data cursor of another seed, seq_len,
  //                        batch_size or split, tensors that do not fit the layout.
  // With W > 1 ranks, every rank opens the same newest complete checkpoint (version 1 or 2, written
  // by any number of ranks), reads all the weights and its own range of the moments; the ranks
  // then agree: if one failed, all return its error (prefixed with "rank r: " on the others), and
  // ranks that see different newest checkpoints are FAILED_PRECONDITION naming them. Only rank 0
  // moves incomplete folders aside.
  // On error the trainer's state is unspecified (call Resume again or make a new trainer).
  absl::Status Resume();

  // One training step (see the file comment). ABORTED once optimizer.max_consecutive_skips steps
  // in a row had a non-finite gradient norm; data, model and collective errors otherwise.
  absl::StatusOr<StepResult> Step();

  // Validation loss over the first eval.batches micro-batches of the held-out split (in corpus
  // order), and the retrieval score when retrieval.examples > 0. Changes nothing the training
  // step reads.
  absl::StatusOr<EvalResult> Evaluate();

  // Writes the checkpoint of the current step (atomically; then removes all but the newest
  // checkpoint.keep_last) and returns its folder. A second call at the same step returns the same
  // folder without writing. FAILED_PRECONDITION without a checkpoint folder; checkpoint.h's errors.
  // One rank writes version 1 (weights.safetensors, ...). W > 1 ranks write version 2 together
  // (collective): rank 0 makes the temporary folder, every rank writes its weights file (its
  // whole tensors) and its optimizer shard, the ranks all-gather their files' sizes and SHA-256,
  // rank 0 writes the rest and the manifest last, renames and prunes; every rank returns the same
  // path, or the same error naming the rank that failed.
  absl::StatusOr<std::string> Save();

  // Steps until config.steps: evaluates at step 0 of a fresh run (eval.every > 0), every
  // eval.every steps and after the last step; saves every checkpoint.every steps and after the
  // last step (when there is a checkpoint folder); calls the callbacks. OK when step() ==
  // config.steps; CANCELLED after `stop` (checkpoint saved); Step's, Evaluate's and Save's errors.
  absl::Status Run(const RunCallbacks& callbacks = {});

  int64_t step() const { return step_; }
  int64_t tokens_seen() const { return tokens_seen_; }
  int64_t updates() const { return updates_; }
  const TrainerConfig& config() const { return config_; }
  const TrainingHistory& history() const { return history_; }
  const DataSplit& split() const { return split_; }
  TrainableModel& model() { return *model_; }
  // The folder Resume continued from; empty for a fresh run.
  const std::string& resumed_from() const { return resumed_from_; }
  // What Resume noticed: fields of the trainer config that differ from those of the checkpoint it
  // continued from, each "field: <value> there, <value> here" (allowed: they apply from the next
  // step on, and end bit-exactness with the uninterrupted run), and incomplete folders moved aside.
  const std::vector<std::string>& resume_notes() const { return resume_notes_; }
  // This rank's model FLOPs per step: micro_batches x TrainableModel::TrainingFlops(rows of a
  // micro-batch, seq_len) / S, i.e. the data-parallel rank's work split evenly between its S
  // sequence ranks (the nominal count; causal attention gives later sequence ranks more of it,
  // docs/RING.md).
  double flops_per_step() const;
  // The rank's place (see the file comment).
  int data_parallel() const { return data_parallel_; }
  int sequence_parallel() const { return sequence_parallel_; }
  int data_rank() const { return data_rank_; }
  int sequence_rank() const { return sequence_rank_; }

 private:
  Trainer() = default;
  absl::Status MixRetrieval(Batch* batch, int64_t* replaced);
  absl::StatusOr<EvalResult> EvaluateNow();
  // This sequence rank's positions of every row of `batch` (of seq_len n) into `tokens` and
  // `targets`, and the TokenBatch over them.
  TokenBatch SliceRows(const Batch& batch, int64_t first_row, int64_t rows, int64_t n,
                       std::vector<int32_t>* tokens, std::vector<int32_t>* targets) const;
  // The same status on every rank: OK when every rank's is, else the first failing rank's (its
  // own when this rank failed; "rank r: " before it on the others).
  absl::Status AgreeOnStatus(const absl::Status& mine);
  // Whether any rank asks to stop, and which (empty on a single rank: `mine` decides).
  absl::StatusOr<std::vector<int>> RanksAskingToStop(bool mine);
  absl::StatusOr<std::string> SaveSharded();
  TrainerState TrainerStateNow() const;
  std::string ExtraJson() const;
  absl::Status RestoreExtra(const std::string& extra_json, const std::string& where);

  TrainerConfig config_;
  TrainerOptions options_;
  std::unique_ptr<TrainerCollective> own_collective_;
  TrainerCollective* collective_ = nullptr;
  bool overlap_reduction_ = false;  // Hand ranges as the backward finishes them (TrainerOptions).
  std::unique_ptr<TrainableModel> model_;
  TokenCorpus corpus_;
  DataSplit split_;
  std::optional<WindowSampler> train_sampler_;
  std::optional<WindowSampler> validation_sampler_;
  SamplerCursor validation_start_;
  int64_t validation_rows_ = 0;     // Global rows of a validation batch.
  int64_t validation_batches_ = 0;  // Batches per evaluation.
  std::optional<RetrievalTask> eval_task_;
  std::optional<RetrievalTask> train_task_;
  std::optional<AdamW> adamw_;
  std::vector<ShardRange> shards_;
  std::unique_ptr<ShardOptimizer> optimizer_;
  Rng rng_{0};
  int64_t micro_rows_ = 0;  // This rank's rows per micro-batch.
  int data_parallel_ = 1, sequence_parallel_ = 1, data_rank_ = 0, sequence_rank_ = 0;

  int64_t step_ = 0;
  int64_t updates_ = 0;
  int64_t tokens_seen_ = 0;
  int64_t consecutive_skips_ = 0;
  int64_t last_saved_step_ = -1;
  std::string last_saved_path_;
  std::string resumed_from_;
  std::vector<std::string> resume_notes_;
  TrainingHistory history_;
};

// The corpus config.data names: FromText(paths[0]) for "text", FromTokenFiles(paths) for
// "tokens". INVALID_ARGUMENT naming "data.paths" when there is no path; corpus.h's errors (each
// naming the file) otherwise. `report` (optional) receives what a text corpus used and skipped.
absl::StatusOr<TokenCorpus> OpenTrainingCorpus(const TrainerConfig& config,
                                               CorpusReport* report = nullptr);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TRAINER_H_
