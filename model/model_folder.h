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
// Errors, each naming the folder or file and what is wrong:
//   NOT_FOUND            the folder does not exist.
//   FAILED_PRECONDITION  a folder of neither form (no MANIFEST.json and no config.json; a folder
//                        of checkpoint step folders is told so), an import with no weights file or
//                        more than one of the four names, tensors that do not fit the layout
//                        (missing, extra, another shape, a dtype other than the four), values that
//                        are not finite.
//   DATA_LOSS            a damaged file: a checkpoint as Checkpoint::Open says; an import's
//                        safetensors file that does not parse, an index that is not JSON or does
//                        not match the files, a file the index names missing.
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

  Form form_ = Form::kImported;
  std::string dir_;
  std::string config_;
  int64_t step_ = 0;
  std::string weights_source_;  // The single file's or the index's name (imported).
  std::shared_ptr<const Checkpoint> checkpoint_;  // The checkpoint form's.
  std::vector<SafetensorsFile> weights_;
  std::map<std::string, int> holder_;  // Tensor name -> position in weights_.
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_MODEL_FOLDER_H_
