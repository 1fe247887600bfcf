// Where every parameter of a model lives inside one flat buffer.
//
// A model's parameters (and, with the same layout, its gradients and each optimizer moment) are one
// contiguous array of elements; a ParamLayout names the slices: entry i is the tensor `name` of
// `shape`, elements [offset, offset + numel) of the flat array, row-major. One flat buffer is what
// makes the rest simple: the optimizer updates a range of elements without knowing about tensors,
// a data-parallel rank owns a contiguous shard of it (reduce-scatter the gradients, all-gather the
// parameters), and a checkpoint writes each entry as one named tensor.
//
// Entries are laid out in the order they are added, each starting where the previous one ended (no
// padding). Names are unique. A layout is built once, then only read; reading it from several
// threads at once is safe, Add is not.
#ifndef DATTN_MODEL_PARAM_LAYOUT_H_
#define DATTN_MODEL_PARAM_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dattn {
namespace model {

// Elements [begin, end) of a flat buffer.
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

struct ParamEntry {
  std::string name;            // e.g. "blocks.3.attn.q_proj.weight".
  std::vector<int64_t> shape;  // Row-major; every dimension >= 1.
  int64_t offset = 0;          // First element in the flat buffer.
  int64_t numel = 0;           // Product of shape.
};

class ParamLayout {
 public:
  // Appends a tensor after the last one. INVALID_ARGUMENT naming the value for an empty or
  // duplicate name, an empty shape, a dimension < 1, or an element count that overflows int64.
  absl::Status Add(const std::string& name, std::vector<int64_t> shape);

  const std::vector<ParamEntry>& entries() const { return entries_; }
  // Elements in all entries together: the flat buffer's length.
  int64_t total() const { return total_; }
  // The entry named `name`, or NOT_FOUND naming it.
  absl::StatusOr<const ParamEntry*> Find(const std::string& name) const;

 private:
  std::vector<ParamEntry> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
  int64_t total_ = 0;
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_PARAM_LAYOUT_H_
