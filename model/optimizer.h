// AdamW, its learning-rate schedule, and global-norm gradient clipping, over the flat buffers a
// ParamLayout describes (model/param_layout.h): the fp32 master weights, their fp32 gradients,
// and the two fp32 moments all share one layout, so the optimizer works on element ranges and
// never needs to know about tensors, except for the weight-decay choice, which is per entry.
//
// One update, for elements [begin, end) (a data-parallel rank under ZeRO-1 updates only its
// shard; the update of an element depends on nothing outside that element, so splitting the range
// any way gives the same bits as one call over everything; optimizer_test checks it):
//
//   t      = the update's number, 1 for the first                 (bias correction)
//   lr     = the schedule's rate at t                              (LrSchedule::At)
//   g      = grad * grad_scale                                     (clipping, 1/accumulation)
//   p      = p * (1 - lr * weight_decay)      only where the entry decays (decoupled decay)
//   m      = beta1 * m + (1 - beta1) * g
//   v      = beta2 * v + (1 - beta2) * g * g
//   p      = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + epsilon)
//
// This is PyTorch's torch.optim.AdamW (decay applied to the weights before the Adam step, and
// scaled by the scheduled lr), arranged the same way. The per-step factors (1 - lr * wd,
// lr / (1 - beta1^t), sqrt(1 - beta2^t), 1 - beta1, 1 - beta2) are computed once in fp64 and
// rounded to fp32; the per-element arithmetic is fp32, in the order written above, one rounding per
// operation (the target is built with -ffp-contract=off and without -ffast-math, so no compiler
// fuses a multiply and an add into an FMA and results are the same on every x86-64 build).
//
// Weight decay, by convention (DecayByConvention): matrices decay, except embeddings; vectors
// (biases, LayerNorm weights and biases) never decay. Decaying a LayerNorm gain pulls it towards 0
// (the identity is 1), decaying a bias pulls an offset that costs no capacity, and decaying an
// embedding shrinks rows of rare tokens that get few gradient updates; the usual GPT/LLaMA
// recipes exclude all three. A tied LM head is the embedding, so it does not decay; an untied
// "lm_head" matrix does, like every other projection. The caller may pass any other predicate.
//
// No loss scaling in bf16. fp16 training scales the loss because fp16's smallest normal number is
// 6.1e-5 (subnormals to 6e-8): small gradients underflow to zero. bf16 has fp32's 8-bit exponent
// (smallest normal 1.2e-38), so any gradient an fp32 run can represent above that is representable
// in bf16 too, only with 8 bits of mantissa instead of 24; there is nothing to scale away from.
// What the rest of the trainer must keep for this to hold: the master weights, the moments and
// this update stay fp32 (a bf16 weight would swallow updates smaller than 2^-8 of it), and
// gradients are accumulated and reduced in fp32, so only the per-layer products are bf16.
//
// Gradient clipping: the global L2 norm of all gradients, sqrt(sum of g^2), accumulated in fp64 in
// element order (SumOfSquares over a range), so a data-parallel run computes one partial sum per
// shard, all-reduces the partials (or gathers them and adds them in rank order: GlobalNorm), and
// every rank derives the same scale from the same norm. fp64 addition is not associative: a
// different number of shards can change the last bits of the norm; the same shards in the same
// order give the same bits.
//
// Threads: everything here is a pure function of its arguments, or a const method; several
// threads may update disjoint ranges of the same buffers at once.
#ifndef DATTN_MODEL_OPTIMIZER_H_
#define DATTN_MODEL_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/param_layout.h"

namespace dattn {
namespace model {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  double weight_decay = 0.1;  // Applied only to entries the decay predicate selects.
};

// INVALID_ARGUMENT naming the field and its value unless 0 <= beta1 < 1, 0 <= beta2 < 1,
// epsilon > 0 and finite, weight_decay >= 0 and finite.
absl::Status ValidateAdamWConfig(const AdamWConfig& config);

// Chooses whether an entry's weights decay.
using DecayPredicate = std::function<bool(const ParamEntry&)>;

// The convention above: true iff the entry has two or more dimensions and its name does not
// contain "embed" (so "tok_embeddings.weight", "embed.weight" and "wte" style names written as
// "embedding" do not decay; "blocks.0.attn.q_proj.weight" does; any bias or norm vector does not).
bool DecayByConvention(const ParamEntry& entry);

// The state of one AdamW over a whole layout (a single process, or what a checkpoint holds).
struct AdamWState {
  int64_t step = 0;      // Updates applied; the next one is t = step + 1.
  std::vector<float> m;  // First moment, layout.total() elements, zero at the start.
  std::vector<float> v;  // Second moment, the same.
};

// The per-update values every element of one update shares.
struct AdamWStepArgs {
  int64_t t = 1;            // The update's number, >= 1.
  double lr = 0;            // >= 0 and finite.
  double grad_scale = 1.0;  // Gradients are multiplied by this first; > 0 and finite.
};

class AdamW {
 public:
  // Fixes the config and, for every entry of `layout`, whether it decays (`decay` is called once
  // per entry, here). INVALID_ARGUMENT from ValidateAdamWConfig, or for a layout with no elements.
  // The layout is copied (only the decay segments are kept).
  static absl::StatusOr<AdamW> Create(const ParamLayout& layout, const AdamWConfig& config,
                                      const DecayPredicate& decay = DecayByConvention);

  // Updates elements [begin, end) of the layout's flat buffers. Every span covers exactly those
  // elements: params[i] is element begin + i of the full parameter buffer (pass
  // absl::MakeSpan(all).subspan(begin, end - begin) when holding the whole buffer).
  // INVALID_ARGUMENT naming the value for a range outside [0, total), a span of the wrong length,
  // or bad args (t < 1, negative or non-finite lr, non-positive or non-finite grad_scale); nothing
  // is written then.
  absl::Status Update(const AdamWStepArgs& args, int64_t begin, int64_t end,
                      absl::Span<float> params, absl::Span<const float> grads, absl::Span<float> m,
                      absl::Span<float> v) const;

  // One update of every element: t = state->step + 1; on success state->step is incremented.
  // INVALID_ARGUMENT for spans or moments whose length is not total(), and as for Update.
  absl::Status Step(AdamWState* state, double lr, double grad_scale, absl::Span<float> params,
                    absl::Span<const float> grads) const;

  // A state of zero moments sized for the layout.
  AdamWState NewState() const;

  const AdamWConfig& config() const { return config_; }
  int64_t total() const { return total_; }
  // Whether element `index` decays (tests, diagnostics).
  bool Decays(int64_t index) const;
  // The names of the entries that decay, in layout order (for a log line at startup).
  const std::vector<std::string>& decayed_entries() const { return decayed_names_; }

 private:
  struct Segment {
    int64_t begin = 0;  // First element.
    int64_t end = 0;    // One past the last.
    bool decay = false;
  };
  AdamW() = default;
  AdamWConfig config_;
  int64_t total_ = 0;
  std::vector<Segment> segments_;  // Runs of equal decay, covering [0, total) in order.
  std::vector<std::string> decayed_names_;
};

// Linear warmup from 0 to peak_lr, then a half cosine from peak_lr down to min_lr, then min_lr:
//   t <= warmup_steps:              lr = peak_lr * t / warmup_steps
//   warmup_steps < t <= total_steps: lr = min_lr + (peak_lr - min_lr) * (1 + cos(pi * q)) / 2,
//                                    q = (t - warmup_steps) / (total_steps - warmup_steps)
//   t > total_steps:                lr = min_lr
// with t the update's number (1 for the first): the first update already has a non-zero rate,
// update warmup_steps has peak_lr, update total_steps has min_lr. The schedule is a pure function
// of t, so a resumed run needs only the step count to be at the same point.
struct LrSchedule {
  double peak_lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  // The rate for update t (t >= 1; t < 1 is treated as 1).
  double At(int64_t t) const;
};

// INVALID_ARGUMENT naming the field unless peak_lr > 0 and finite, 0 <= min_lr <= peak_lr,
// warmup_steps >= 0, total_steps >= 1 and total_steps >= warmup_steps.
absl::Status ValidateLrSchedule(const LrSchedule& schedule);

// Sum of g[i]^2 over `grads`, each square and the running sum in fp64, in index order. One shard's
// share of the global norm.
double SumOfSquares(absl::Span<const float> grads);

// sqrt of the sum of the shards' partial sums of squares, added in the order given (rank order).
double GlobalNorm(absl::Span<const double> partial_sums_of_squares);

// The factor that brings the gradient's global norm down to max_norm: min(1, max_norm / (norm +
// 1e-6)), as in PyTorch's clip_grad_norm_. max_norm = +infinity disables clipping (returns 1).
// OUT_OF_RANGE when the norm is NaN or infinite (the step must be skipped: applying it would
// write NaN into every weight); INVALID_ARGUMENT for a max_norm that is not > 0.
absl::StatusOr<double> ClipScale(double global_norm, double max_norm);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_OPTIMIZER_H_
