// The target id that takes no part in the loss, shared by the data side (sampler.h, retrieval.h)
// and the model side (layer_ops.h, longnet.h), so that one translation unit can include both.
#ifndef DATTN_MODEL_IGNORE_TARGET_H_
#define DATTN_MODEL_IGNORE_TARGET_H_

#include <cstdint>

namespace dattn {
namespace model {

// Targets equal to this are not scored: the loss averages over the other positions only (the
// retrieval task scores its answer alone this way; the sampler's own batches score every position).
inline constexpr int32_t kIgnoreTarget = -1;

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_IGNORE_TARGET_H_
