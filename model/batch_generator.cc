#include "model/batch_generator.h"

#include "model/batch_generator_impl.h"

namespace dattn {
namespace model {

template class BatchGenerator<float>;
template class BatchGenerator<double>;

}  // namespace model
}  // namespace dattn
