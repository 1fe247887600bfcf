#include "model/block_forward.h"

namespace dattn {
namespace model {

#define BLOCK_RETURN_IF_ERROR(expr)    \
  do {                                 \
    absl::Status status_ = (expr);     \
    if (!status_.ok()) return status_; \
  } while (0)

template <typename T>
absl::Status BlockQkvForward(LayerOps<T>& ops, const LongNetConfig& config, const T* p,
                             const BlockOffsets& o, int64_t m, const T* x_in,
                             const BlockTensors<T>& t) {
  const int64_t d = config.d_model;
  BLOCK_RETURN_IF_ERROR(ops.LayerNormForward(x_in, m, d, p + o.attn_norm.weight,
                                             p + o.attn_norm.bias, config.layer_norm_eps, t.ln1,
                                             t.ln1_mean, t.ln1_rstd));
  BLOCK_RETURN_IF_ERROR(
      ops.LinearForward(t.ln1, m, d, p + o.q_proj.weight, p + o.q_proj.bias, d, t.q));
  BLOCK_RETURN_IF_ERROR(
      ops.LinearForward(t.ln1, m, d, p + o.k_proj.weight, p + o.k_proj.bias, d, t.k));
  return ops.LinearForward(t.ln1, m, d, p + o.v_proj.weight, p + o.v_proj.bias, d, t.v);
}

template <typename T>
absl::Status BlockOutputForward(LayerOps<T>& ops, const LongNetConfig& config, const T* p,
                                const BlockOffsets& o, int64_t m, const T* x_in,
                                const BlockTensors<T>& t, T* x_out) {
  const int64_t d = config.d_model, f = config.ffn_dim;
  const double eps = config.layer_norm_eps;
  BLOCK_RETURN_IF_ERROR(ops.LayerNormForward(t.attn, m, d, p + o.attn_sub_norm.weight,
                                             p + o.attn_sub_norm.bias, eps, t.sub1, t.sub1_mean,
                                             t.sub1_rstd));
  BLOCK_RETURN_IF_ERROR(
      ops.LinearForward(t.sub1, m, d, p + o.out_proj.weight, p + o.out_proj.bias, d, t.x_mid));
  BLOCK_RETURN_IF_ERROR(ops.Add(x_in, t.x_mid, m * d, t.x_mid));
  // Feed-forward branch.
  BLOCK_RETURN_IF_ERROR(ops.LayerNormForward(t.x_mid, m, d, p + o.ffn_norm.weight,
                                             p + o.ffn_norm.bias, eps, t.ln2, t.ln2_mean,
                                             t.ln2_rstd));
  BLOCK_RETURN_IF_ERROR(ops.LinearForward(t.ln2, m, d, p + o.fc1.weight, p + o.fc1.bias, f, t.h1));
  BLOCK_RETURN_IF_ERROR(ops.GeluForward(t.h1, m * f, t.g));
  BLOCK_RETURN_IF_ERROR(ops.LayerNormForward(t.g, m, f, p + o.ffn_sub_norm.weight,
                                             p + o.ffn_sub_norm.bias, eps, t.sub2, t.sub2_mean,
                                             t.sub2_rstd));
  BLOCK_RETURN_IF_ERROR(
      ops.LinearForward(t.sub2, m, f, p + o.fc2.weight, p + o.fc2.bias, d, x_out));
  return ops.Add(t.x_mid, x_out, m * d, x_out);
}

#undef BLOCK_RETURN_IF_ERROR

template absl::Status BlockQkvForward<float>(LayerOps<float>&, const LongNetConfig&, const float*,
                                             const BlockOffsets&, int64_t, const float*,
                                             const BlockTensors<float>&);
template absl::Status BlockQkvForward<double>(LayerOps<double>&, const LongNetConfig&,
                                              const double*, const BlockOffsets&, int64_t,
                                              const double*, const BlockTensors<double>&);
template absl::Status BlockOutputForward<float>(LayerOps<float>&, const LongNetConfig&,
                                                const float*, const BlockOffsets&, int64_t,
                                                const float*, const BlockTensors<float>&, float*);
template absl::Status BlockOutputForward<double>(LayerOps<double>&, const LongNetConfig&,
                                                 const double*, const BlockOffsets&, int64_t,
                                                 const double*, const BlockTensors<double>&,
                                                 double*);

}  // namespace model
}  // namespace dattn
