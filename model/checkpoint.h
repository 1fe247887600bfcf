// Checkpoints: everything a trainer needs to continue bit for bit, in one folder, written
// atomically and verified when read. Two versions of the folder: version 1, written by one process
// (SaveCheckpoint), and version 2, sharded, written by the W ranks of a data-parallel run together
// (BeginShardedCheckpoint, WriteCheckpointShard, CommitShardedCheckpoint). Checkpoint::Open reads
// both, and reads any element range of either, so a run resumes on another number of ranks.
//
// Version 1. <root>/step-<step, zero-padded to 8 digits>/ holds
//   weights.safetensors    one F32 tensor per ParamLayout entry, named and shaped as the entry
//                          (metadata: "format": "pt", "dattn": "weights", "step"). Loadable as is
//                          by safetensors.torch.load_file / safe_open.
//   optimizer.safetensors  AdamW's moments per entry, "exp_avg.<name>" and "exp_avg_sq.<name>"
//                          (F32, the entry's shape), and "step", an I64 scalar: updates applied.
//   config.json            the model's config, stored verbatim (the trainer's JSON, opaque here).
//   trainer_state.json     TrainerState below: step, tokens seen, the sampler's cursor, the
//                          trainer's RNG state, the schedule, AdamW's settings, clipping, and
//                          `extra`, a JSON object the trainer may fill with anything else.
//   MANIFEST.json          written last: {"format": "dattn-checkpoint", "version": 1, "step",
//                          "files": [{"name", "bytes", "sha256"}, ...] for the four files above,
//                          "manifest_sha256"}: manifest_sha256 is the SHA-256 of the manifest
//                          itself without that key, serialised compactly with sorted keys
//                          (Python: json.dumps(m, sort_keys=True, separators=(",", ":"))), so a
//                          damaged manifest is told apart from a damaged file it lists.
//
// Version 2 (sharded; W ranks, r = 0 .. W-1, both numbers zero-padded to 5 digits). The same
// folder name, with
//   weights-<r>-of-<W>.safetensors    whole tensors of the ParamLayout, split between W files by
//                          bytes: entry e goes to file floor(W * (e.offset + e.numel / 2) / total)
//                          (WeightsShardOfEntries), so every tensor is in exactly one file, a file
//                          holds consecutive entries (WeightsShardRange) and the files' sizes are
//                          balanced to within a tensor (a file may hold none). Each is a plain
//                          safetensors file (metadata "format": "pt", "dattn": "weights-shard",
//                          "step", "shard", "shards"): safetensors.torch.load_file loads it.
//   weights.safetensors.index.json    Hugging Face's index of sharded weights (as
//                          model.safetensors.index.json): {"metadata": {"total_size": bytes of all
//                          tensors}, "weight_map": {tensor name: file name}}.
//   optimizer-<r>-of-<W>.safetensors  rank r's ZeRO-1 shard of AdamW: "exp_avg" and "exp_avg_sq",
//                          F32 vectors of elements [begin, end) of the flat buffer (ShardRanges(
//                          total, W)[r], collective.h), and "step" (I64 scalar: updates applied);
//                          metadata "begin", "end", "total" (decimal strings), "format": "pt",
//                          "dattn": "adamw-shard", "step", "shard", "shards".
//   config.json, trainer_state.json   as in version 1.
//   MANIFEST.json          written last: version 2, "world": W, and "files" listing every file
//                          above (name, bytes, sha256), with manifest_sha256 as in version 1.
// Open checks, besides every listed file's size and SHA-256: the index maps exactly the tensors of
// the weights files, each to the file that holds it; the optimizer shards tile [0, total) in
// order and agree on "step". A shard missing, truncated or bit-flipped is DATA_LOSS naming it.
//
// Atomic save. Files are written into <root>/.step-<step>.tmp (removed first if a crashed save left
// it), each fsynced; the manifest last; then the folder is fsynced, renamed to step-<step>, and
// <root> fsynced. A crash at any point leaves either no step-<step> folder or a complete one.
// One process writes checkpoints under a root at a time (the temporary name is per step, not per
// process). A sharded save is the same with W writers in three parts: rank 0
// BeginShardedCheckpoint (the temporary folder), then every rank WriteCheckpointShard (its two
// files, in parallel; the folder is shared by the ranks, e.g. a network file system), then rank 0
// CommitShardedCheckpoint with every rank's file digests (the index, config, trainer state and the
// manifest, fsync, rename). The caller (trainer.h) orders the parts with its collective (a barrier
// after the first, an all-gather of the digests after the second) and calls
// AbortShardedCheckpoint when a rank failed.
//
// Verified load. Checkpoint::Open reads the manifest, checks its own checksum, then checks every
// listed file: present, exactly the listed size, and (verify_checksums) the listed SHA-256; then
// parses the JSON files and the safetensors headers. Reading weights or moments checks them
// against the caller's ParamLayout: every entry present with the same shape and dtype F32, and no
// tensor the layout lacks. Errors, each naming the file and what is wrong:
//   NOT_FOUND            the checkpoint folder does not exist.
//   DATA_LOSS            a damaged checkpoint: MANIFEST.json missing (an incomplete checkpoint),
//                        not JSON, or not matching its own checksum; a listed file missing, of
//                        another size (truncated or appended to), or with another SHA-256
//                        (bit-flipped); a file that does not parse (bad JSON, a bad safetensors
//                        header, a trainer state missing a field).
//   FAILED_PRECONDITION  an intact checkpoint that does not fit: a manifest version this build
//                        cannot read, or tensors that differ from the given layout (a missing or
//                        extra tensor, another shape, another dtype; version 2's moments: another
//                        total).
//   INVALID_ARGUMENT     a bad argument (a span of the wrong length, a range outside the layout).
//
// Threads: SaveCheckpoint, ListCheckpoints, LatestCheckpoint and PruneCheckpoints may be called
// from any thread, but only one thread or process may write under a root at a time. The buffers
// passed to SaveCheckpoint must not change during the call. A Checkpoint is immutable after Open;
// any number of threads may read from it.
#ifndef DATTN_MODEL_CHECKPOINT_H_
#define DATTN_MODEL_CHECKPOINT_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/optimizer.h"
#include "model/param_layout.h"
#include "model/safetensors.h"
#include "model/sampler.h"

namespace dattn {
namespace model {

inline constexpr char kWeightsFile[] = "weights.safetensors";
inline constexpr char kOptimizerFile[] = "optimizer.safetensors";
inline constexpr char kConfigFile[] = "config.json";
inline constexpr char kTrainerStateFile[] = "trainer_state.json";
inline constexpr char kManifestFile[] = "MANIFEST.json";
inline constexpr char kWeightsIndexFile[] = "weights.safetensors.index.json";

// Version 2's file names: "weights-00001-of-00004.safetensors" is rank 1's of 4.
std::string WeightsShardFileName(int shard, int shards);
std::string OptimizerShardFileName(int shard, int shards);

// What the trainer needs besides the tensors. Stored as trainer_state.json.
struct TrainerState {
  int64_t step = 0;                     // Training steps done; names the checkpoint folder. >= 0.
  int64_t tokens_seen = 0;              // Training tokens consumed so far.
  SamplerCursor sampler;                // The training sampler's cursor.
  std::array<uint64_t, 4> rng_state{};  // The trainer's own Rng (Rng::state()), if it has one.
  LrSchedule schedule;
  AdamWConfig adamw;
  double max_grad_norm = 1.0;     // +infinity (clipping off) is stored as null.
  std::string extra_json = "{}";  // A JSON object, stored as the "extra" field.
};

// trainer_state.json's text, and back. TrainerStateFromJson's errors are DATA_LOSS naming `name`
// and the field that is missing or of the wrong type.
std::string TrainerStateToJson(const TrainerState& state);
absl::StatusOr<TrainerState> TrainerStateFromJson(absl::string_view text, const std::string& name);

// What SaveCheckpoint writes. Views: nothing is owned.
struct CheckpointContents {
  const ParamLayout* layout = nullptr;
  absl::Span<const float> params;         // layout->total() fp32 master weights.
  const AdamWState* optimizer = nullptr;  // Its m and v have layout->total() elements.
  std::string model_config_json;          // Any JSON text; stored verbatim.
  TrainerState trainer;
};

// Writes <root>/step-<trainer.step>/ atomically (see above; <root> is created if missing) and
// returns its path. INVALID_ARGUMENT for a null layout or optimizer, a span or moment of the wrong
// length, a negative step, a model config that is not JSON, or an `extra` that is not a JSON
// object; ALREADY_EXISTS when that step's folder exists; file-system errors naming the path (the
// temporary folder is removed then).
absl::StatusOr<std::string> SaveCheckpoint(const std::string& root,
                                           const CheckpointContents& contents);

// ---- Sharded save (version 2) ----

// The weights file of each layout entry in a checkpoint of `shards` files (in entry order): entry
// e goes to floor(shards * (e.offset + e.numel / 2) / total). Non-decreasing. shards >= 1.
std::vector<int> WeightsShardOfEntries(const ParamLayout& layout, int shards);
// The elements of the flat buffer that weights file `shard` holds: its entries are consecutive, so
// this is one range (empty, at the next entry's offset, when it holds none; param_layout.h).
ElementRange WeightsShardRange(const ParamLayout& layout, int shard, int shards);
// WeightsShardRange of every shard 0 .. shards-1, in one pass over the layout (O(entries + shards),
// where asking for each shard in turn is O(entries x shards)).
std::vector<ElementRange> WeightsShardRanges(const ParamLayout& layout, int shards);

// A file of a checkpoint as the manifest lists it.
struct CheckpointFile {
  std::string name;  // Inside the step folder.
  int64_t bytes = 0;
  std::string sha256;  // Lower-case hex.
};

// What one rank writes. Views: nothing is owned.
struct CheckpointShard {
  const ParamLayout* layout = nullptr;
  int shard = 0;   // This rank, in [0, shards).
  int shards = 1;  // W.
  int64_t step = 0;
  // params[i] is element weights_begin + i of the flat buffer; it covers at least
  // WeightsShardRange(*layout, shard, shards).
  int64_t weights_begin = 0;
  absl::Span<const float> params;
  // This rank's AdamW moments: elements [moments_begin, moments_begin + m.size()) of the flat
  // buffers (ShardRanges(total, shards)[shard] in the trainer), and the updates applied.
  int64_t moments_begin = 0;
  absl::Span<const float> m;
  absl::Span<const float> v;
  int64_t optimizer_step = 0;
};

// Rank 0, first: creates <root> if missing and the temporary folder <root>/.step-<step>.tmp
// (removing one a crashed save left), and returns its path. ALREADY_EXISTS when step-<step>
// exists; INVALID_ARGUMENT for a negative step; file-system errors naming the path.
absl::StatusOr<std::string> BeginShardedCheckpoint(const std::string& root, int64_t step);

// Every rank, once the temporary folder exists: writes WeightsShardFileName(shard, shards) and
// OptimizerShardFileName(shard, shards) into `tmp_dir`, each fsynced, and returns the two files
// with their sizes and SHA-256. INVALID_ARGUMENT for a null layout, a shard outside [0, shards),
// spans that do not cover what they must or lie outside the layout, m and v of different sizes;
// file-system errors naming the path.
absl::StatusOr<std::vector<CheckpointFile>> WriteCheckpointShard(const std::string& tmp_dir,
                                                                 const CheckpointShard& shard);

// What rank 0 commits. `shard_files` are every rank's files (WriteCheckpointShard's results, in
// any order); the layout gives the index.
struct ShardedCheckpointCommit {
  const ParamLayout* layout = nullptr;
  int shards = 1;
  std::string model_config_json;  // Any JSON text; stored verbatim.
  TrainerState trainer;
  std::vector<CheckpointFile> shard_files;
};

// Rank 0, last, once every rank's WriteCheckpointShard returned: writes the index, config.json,
// trainer_state.json and MANIFEST.json (version 2) into <root>/.step-<step>.tmp, fsyncs it,
// renames it to step-<step>, fsyncs <root>, and returns the final path. INVALID_ARGUMENT as
// SaveCheckpoint's for the config and extra, and when shard_files is not exactly the 2 x shards
// files the shards write; file-system errors naming the path (the temporary folder is left for
// AbortShardedCheckpoint or the next save to remove).
absl::StatusOr<std::string> CommitShardedCheckpoint(const std::string& root,
                                                    const ShardedCheckpointCommit& commit);

// Removes <root>/.step-<step>.tmp (after a rank failed); OK when there is none.
absl::Status AbortShardedCheckpoint(const std::string& root, int64_t step);

class Checkpoint {
 public:
  // Opens and verifies the checkpoint folder `dir` (see above).
  static absl::StatusOr<Checkpoint> Open(const std::string& dir, bool verify_checksums = true);

  const std::string& dir() const { return dir_; }
  // The manifest's version (1: one process's files; 2: sharded) and, for version 2, the number of
  // ranks that wrote it (1 for version 1).
  int version() const { return version_; }
  int world() const { return world_; }
  int64_t step() const { return trainer_.step; }
  const std::string& model_config_json() const { return config_; }
  const TrainerState& trainer_state() const { return trainer_; }
  int64_t optimizer_step() const { return optimizer_step_; }
  // The weights files: version 1's weights.safetensors, or version 2's shards in order.
  const std::vector<SafetensorsFile>& weights_files() const { return weights_; }
  // The first of them (version 1: the only one).
  const SafetensorsFile& weights_file() const { return weights_.front(); }

  // Copies elements [begin, begin + out.size()) of the flat parameter buffer `layout` describes
  // (a data-parallel rank may read only its shard), from whichever files hold them (version 2:
  // across shard files, whatever the number of ranks reading). Every weights tensor is first
  // checked against the layout, so nothing is copied from a checkpoint that does not fit.
  absl::Status ReadWeights(const ParamLayout& layout, int64_t begin, absl::Span<float> out) const;
  // The same for AdamW's two moments (m and v cover the same elements); version 2 reads the
  // ranges of the optimizer shards that overlap [begin, begin + m.size()).
  absl::Status ReadMoments(const ParamLayout& layout, int64_t begin, absl::Span<float> m,
                           absl::Span<float> v) const;
  // Everything for a single process: the weights into `params` (layout.total() elements) and
  // `state` (moments resized to layout.total(), step = optimizer_step()).
  absl::Status Restore(const ParamLayout& layout, absl::Span<float> params,
                       AdamWState* state) const;
  // Checks the weights tensors against `layout` from the headers alone (ReadWeights' first step):
  // FAILED_PRECONDITION naming a missing or extra tensor, another shape, a dtype other than F32.
  absl::Status CheckWeights(const ParamLayout& layout) const;

 private:
  Checkpoint() = default;
  absl::Status OpenV2(int64_t world);

  std::string dir_;
  int version_ = 1;
  int world_ = 1;
  std::string config_;
  TrainerState trainer_;
  int64_t optimizer_step_ = 0;
  std::vector<SafetensorsFile> weights_;    // Version 1: one; version 2: one per rank.
  std::vector<SafetensorsFile> optimizer_;  // Likewise.
  // Version 2: the optimizer shards' ranges of the flat buffer (tiling [0, moments_total_)).
  std::vector<ElementRange> moment_ranges_;
  int64_t moments_total_ = 0;
};

// A step folder under a root.
struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
  bool has_manifest = false;  // Saved to the end (not a proof of integrity: Open verifies).
};

// The step-<digits> folders under `root`, by increasing step; temporaries and other names are
// ignored. An empty list when `root` does not exist; file-system errors otherwise.
absl::StatusOr<std::vector<CheckpointEntry>> ListCheckpoints(const std::string& root);

// The newest step folder that Checkpoint::Open accepts without verifying checksums (manifest,
// every listed file present with its listed size, JSON and safetensors headers that parse: it
// reads headers, not data; Open with checksums is still the caller's next step). Newer folders
// that fail are skipped, and `skipped` (optional) receives "path: reason" for each. NOT_FOUND
// when there is none.
absl::StatusOr<CheckpointEntry> LatestCheckpoint(const std::string& root,
                                                 std::vector<std::string>* skipped = nullptr);

// Keeps the newest `keep` (>= 1) checkpoints that have a manifest; removes every step folder older
// than the oldest one kept (with or without a manifest) and leftover temporaries of steps older
// than the newest kept. Returns the removed paths. INVALID_ARGUMENT for keep < 1.
absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& root, int64_t keep);

// Pins a complete step folder against pruning: `pin` (a new folder, outside any root's step-*
// names, e.g. <root>/pinned/<name>: ListCheckpoints and PruneCheckpoints ignore it) receives a
// hard link of every file of `step_folder`. No data is copied, and since a checkpoint's files are
// never rewritten in place (a save writes a new folder), the links keep exactly the bytes saved
// after PruneCheckpoints removed the original. The links are made in `pin`.tmp, fsynced and
// renamed; the result is then opened (without checksums: every listed file present with its
// size) so that a step removed while it was being linked is an error, never a partial pin.
// Both folders must be on one file system (hard links). Errors: NOT_FOUND `step_folder` has no
// manifest (never completed, or pruned); ALREADY_EXISTS `pin` exists; DATA_LOSS the step changed
// while linked (nothing is left at `pin`); otherwise file-system errors naming the operation and
// path, with the code errno maps to (e.g. PERMISSION_DENIED; EXDEV when `pin` is on another file
// system than the step).
absl::Status PinCheckpoint(const std::string& step_folder, const std::string& pin);

// Removes a folder PinCheckpoint made (and its leftover temporary). OK when there is none.
absl::Status RemoveCheckpointPin(const std::string& pin);

// "step-00000042".
std::string CheckpointFolderName(int64_t step);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CHECKPOINT_H_
