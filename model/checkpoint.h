// Checkpoints: everything a trainer needs to continue bit for bit, in one folder, written
// atomically and verified when read.
//
// Layout. <root>/step-<step, zero-padded to 8 digits>/ holds
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
// Atomic save. Files are written into <root>/.step-<step>.tmp (removed first if a crashed save left
// it), each fsynced; the manifest last; then the folder is fsynced, renamed to step-<step>, and
// <root> fsynced. A crash at any point leaves either no step-<step> folder or a complete one.
// One process writes checkpoints under a root at a time (the temporary name is per step, not per
// process).
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
//                        extra tensor, another shape, another dtype).
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

class Checkpoint {
 public:
  // Opens and verifies the checkpoint folder `dir` (see above).
  static absl::StatusOr<Checkpoint> Open(const std::string& dir, bool verify_checksums = true);

  const std::string& dir() const { return dir_; }
  int64_t step() const { return trainer_.step; }
  const std::string& model_config_json() const { return config_; }
  const TrainerState& trainer_state() const { return trainer_; }
  int64_t optimizer_step() const { return optimizer_step_; }
  const SafetensorsFile& weights_file() const { return weights_; }

  // Copies elements [begin, begin + out.size()) of the flat parameter buffer `layout` describes
  // (a data-parallel rank may read only its shard). The whole file is first checked against the
  // layout, so nothing is copied from a checkpoint that does not fit.
  absl::Status ReadWeights(const ParamLayout& layout, int64_t begin, absl::Span<float> out) const;
  // The same for AdamW's two moments (m and v cover the same elements).
  absl::Status ReadMoments(const ParamLayout& layout, int64_t begin, absl::Span<float> m,
                           absl::Span<float> v) const;
  // Everything for a single process: the weights into `params` (layout.total() elements) and
  // `state` (moments resized to layout.total(), step = optimizer_step()).
  absl::Status Restore(const ParamLayout& layout, absl::Span<float> params,
                       AdamWState* state) const;

 private:
  Checkpoint() = default;
  std::string dir_;
  std::string config_;
  TrainerState trainer_;
  int64_t optimizer_step_ = 0;
  SafetensorsFile weights_;
  SafetensorsFile optimizer_;
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

// "step-00000042".
std::string CheckpointFolderName(int64_t step);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CHECKPOINT_H_
