// A model to serve, read from a folder in either of two forms:
//
//   a dattn checkpoint    a step folder that dattn-train or a training job wrote (checkpoint.h: the
//                         folder holds MANIFEST.json), opened and verified by Checkpoint::Open;
//   an imported model     a model from elsewhere, with no manifest:
//                           config.json   the model's LongNetConfig as JSON (config.h; what
//                                         `dump_logits --save-weights` and every checkpoint hold);
//                           the weights   in safetensors, either one file, model.safetensors or
//                                         weights.safetensors, or several files named by a Hugging
//                                         Face index, model.safetensors.index.json or
//                                         weights.safetensors.index.json ({"weight_map": {tensor
//                                         name: file name}}; other keys ignored). Exactly one of
//                                         these four may be present.
//                         One tensor per ParamLayout entry (longnet_params.h), named and shaped as
//                         the entry, of dtype F32, BF16, F16 or F64 (read as fp32: BF16 and F16
//                         exactly, F64 rounded to nearest); no other tensor.
//
// The form is chosen by MANIFEST.json alone: a folder with one is a checkpoint (a damaged one is
// DATA_LOSS, never read as an import), so a checkpoint's integrity checks are never bypassed. An
// imported model has no checksums: what is checked is structure (each safetensors file as
// safetensors.h checks it; the index maps exactly the tensors the files hold, each to its own file,
// and names only plain file names in the folder), the tensors against the layout (CheckWeights),
// and, on ReadWeights, that every value is finite.
//
// Checksums: an imported model may carry SHA256SUMS, lines of "<64 hex digits>  <file name>" (the
// format of coreutils' sha256sum, so `sha256sum -c SHA256SUMS` checks the folder as well). When it
// is present, Open with verify_checksums reads every file it lists and compares, and requires
// config.json, the index and every weights file to be listed: a model with checksums is checked
// whole. The coordinator's model registry (server/model_registry.h) writes one into every version
// it keeps, and its workers open with verify_checksums, so a registered model that changed on disk
// is refused at load, naming the file.
//
// Errors, each naming the folder or file and what is wrong:
//   NOT_FOUND            the folder does not exist.
//   FAILED_PRECONDITION  a folder of neither form (no MANIFEST.json and no config.json; a folder
//                        of checkpoint step folders is told so), an import with no weights file or
//                        more than one of the four names, tensors that do not fit the layout
//                        (missing, extra, another shape, a dtype other than the four), values that
//                        are not finite.
//   DATA_LOSS            a damaged file: a checkpoint as Checkpoint::Open says; an import's
//                        safetensors file that does not parse, an index that is not JSON or does
//                        not match the files, a file the index names missing; with
//                        verify_checksums, a SHA256SUMS line that does not parse, a file whose
//                        digest differs from its line, a listed file missing, a model file not
//                        listed.
//   INVALID_ARGUMENT     an index naming a file outside the folder (a path, "..") or not a
//                        .safetensors file; a span of the wrong length.
//
// Threads: a ModelFolder is immutable after Open; any number of threads may read from it. Open
// maps the files and reads only their headers (and a checkpoint's checksums when asked), so it is
// cheap enough for a coordinator to call at submit.
#ifndef DATTN_MODEL_MODEL_FOLDER_H_
#define DATTN_MODEL_MODEL_FOLDER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/checkpoint.h"
#include "model/param_layout.h"
#include "model/safetensors.h"

namespace dattn {
namespace model {

inline constexpr char kImportedWeightsFile[] = "model.safetensors";
inline constexpr char kImportedIndexFile[] = "model.safetensors.index.json";
inline constexpr char kChecksumsFile[] = "SHA256SUMS";
// An index may name at most this many files.
inline constexpr int kMaxImportedWeightsFiles = 4096;

class ModelFolder {
 public:
  enum class Form { kCheckpoint, kImported };

  // Opens `dir` (see above). `verify_checksums` applies to a checkpoint (Checkpoint::Open's).
  static absl::StatusOr<ModelFolder> Open(const std::string& dir, bool verify_checksums = true);

  Form form() const { return form_; }
  const std::string& dir() const { return dir_; }
  // config.json's text, verbatim.
  const std::string& model_config_json() const { return config_; }
  // A checkpoint's training step; 0 for an imported model.
  int64_t step() const { return step_; }
  // The weights files, in the order of their names (an index's files sorted by name).
  const std::vector<SafetensorsFile>& weights_files() const { return weights_; }
  // The files the model is made of, as names in dir(): config.json, the weights index if there
  // is one, then the weights files. A checkpoint's optimizer and trainer state are not among them:
  // these files alone, copied into another folder, are the same model in the imported form.
  std::vector<std::string> ModelFiles() const;
  // An imported model whose SHA256SUMS Open verified (verify_checksums and the file present).
  bool checksums_verified() const { return checksums_verified_; }
  // "checkpoint of step 300", "imported model (model.safetensors, BF16)", "imported model (4 files
  // of model.safetensors.index.json, BF16 and F32)".
  std::string Describe() const;

  // Checks the tensors against `layout` from the headers alone: every entry present with its
  // shape and a readable dtype (a checkpoint: F32, as Checkpoint requires), nothing else.
  absl::Status CheckWeights(const ParamLayout& layout) const;
  // CheckWeights, then every tensor into `out` (layout.total() elements, fp32, at the entries'
  // offsets), then that every value is finite.
  absl::Status ReadWeights(const ParamLayout& layout, absl::Span<float> out) const;

 private:
  ModelFolder() = default;
  absl::Status OpenImported();
  absl::Status VerifyChecksums();

  Form form_ = Form::kImported;
  std::string dir_;
  std::string config_;
  int64_t step_ = 0;
  std::string weights_source_;  // The single file's or the index's name (imported).
  bool checksums_verified_ = false;
  std::shared_ptr<const Checkpoint> checkpoint_;  // The checkpoint form's.
  std::vector<SafetensorsFile> weights_;
  std::map<std::string, int> holder_;  // Tensor name -> position in weights_.
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_MODEL_FOLDER_H_
