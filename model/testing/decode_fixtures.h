// What the decoder's tests share (decoder_test, ring_decoder_test): a small config whose patterns
// end segments every few tokens, random tokens, and parameters perturbed away from MAGNETO's
// initialisation. Testing only.
#ifndef DATTN_MODEL_TESTING_DECODE_FIXTURES_H_
#define DATTN_MODEL_TESTING_DECODE_FIXTURES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/testing/test_util.h"
#include "model/config.h"
#include "model/longnet.h"

namespace dattn {
namespace model {
namespace testing {

// Patterns with H % G != 0 (3 heads, 2 patterns in grouped mode), a rate dividing no segment
// (3 against 8), segments far shorter than the sequences decoded (every few tokens a segment of
// one pattern ends and its cache rows are dropped), and a strong XPOS decay.
inline LongNetConfig DecodeConfig(AttentionMode mode, HeadOffsets offsets, bool xpos) {
  LongNetConfig c;
  c.vocab_size = 11;
  c.d_model = 12;
  c.num_layers = 2;
  c.num_heads = 3;  // D = 4.
  c.ffn_dim = 10;
  c.segment_lengths = {3, 8};
  c.dilation_rates = {1, 3};
  c.attention_mode = mode;
  c.head_offsets = offsets;
  c.rope_theta = 50;
  c.xpos = xpos;
  c.xpos_scale_base = 8;
  return c;
}

inline std::vector<int32_t> RandomTokens(int64_t vocab, int64_t n, uint64_t seed) {
  testutil::Random rng(seed);
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) {
    t.push_back(static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(vocab)));
  }
  return t;
}

// MAGNETO's biases are 0 and gains 1: every parameter is perturbed (N(0, 0.3) from `seed`) so
// that each path is exercised.
template <typename T>
absl::Status PerturbedParams(LongNetLM<T>& model, uint64_t seed) {
  if (absl::Status s = model.InitParams(seed); !s.ok()) return s;
  std::vector<T> host(static_cast<size_t>(model.layout().total()));
  if (absl::Status s = model.CopyParamsToHost(host.data()); !s.ok()) return s;
  const std::vector<double> noise = testutil::RandomValues(model.layout().total(), seed, 0.3);
  for (size_t i = 0; i < host.size(); ++i) host[i] += static_cast<T>(noise[i]);
  return model.CopyParamsFromHost(host.data());
}

}  // namespace testing
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TESTING_DECODE_FIXTURES_H_
