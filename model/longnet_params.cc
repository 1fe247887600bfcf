#include "model/longnet_params.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dattn {
namespace model {
namespace {

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor of the model in layout order (longnet_params.h's table).
std::vector<Tensor> Tensors(const LongNetConfig& c) {
  const int64_t d = c.d_model, f = c.ffn_dim, v = c.vocab_size;
  std::vector<Tensor> t;
  t.push_back({"token_embedding.weight", {v, d}});
  auto norm = [&](const std::string& prefix, int64_t n) {
    t.push_back({prefix + ".weight", {n}});
    t.push_back({prefix + ".bias", {n}});
  };
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in) {
    t.push_back({prefix + ".weight", {out, in}});
    t.push_back({prefix + ".bias", {out}});
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = absl::StrCat("blocks.", i, ".");
    norm(b + "attn_norm", d);
    linear(b + "attn.q_proj", d, d);
    linear(b + "attn.k_proj", d, d);
    linear(b + "attn.v_proj", d, d);
    norm(b + "attn.sub_norm", d);
    linear(b + "attn.out_proj", d, d);
    norm(b + "ffn_norm", d);
    linear(b + "ffn.fc1", f, d);
    norm(b + "ffn.sub_norm", f);
    linear(b + "ffn.fc2", d, f);
  }
  norm("final_norm", d);
  if (!c.tie_embeddings) t.push_back({"lm_head.weight", {v, d}});
  return t;
}

// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit state stepped by a constant, finalised by a mix.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]: 53 random bits.
  double UniformOpenClosed() { return (static_cast<double>(Next() >> 11) + 1.0) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

uint64_t Fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Fills out[0..n) with independent N(0, std^2) draws (Box-Muller, both outputs used).
void FillNormal(uint64_t seed, const std::string& name, double std, int64_t n, double* out) {
  SplitMix64 rng(seed ^ Fnv1a64(name));
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < n; i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(rng.UniformOpenClosed()));
    const double angle = kTwoPi * rng.UniformOpenClosed();
    out[i] = std * radius * std::cos(angle);
    if (i + 1 < n) out[i + 1] = std * radius * std::sin(angle);
  }
}

}  // namespace

absl::StatusOr<ParamLayout> BuildParamLayout(const LongNetConfig& config) {
  absl::Status valid = ValidateConfig(config);
  if (!valid.ok()) return valid;
  ParamLayout layout;
  for (Tensor& t : Tensors(config)) {
    absl::Status s = layout.Add(t.name, std::move(t.shape));
    if (!s.ok()) return s;
  }
  return layout;
}

bool WantsWeightDecay(const ParamEntry& entry) { return entry.shape.size() >= 2; }

absl::StatusOr<ModelOffsets> ResolveOffsets(const LongNetConfig& config,
                                            const ParamLayout& layout) {
  const std::vector<Tensor> tensors = Tensors(config);
  for (const Tensor& t : tensors) {
    absl::StatusOr<const ParamEntry*> e = layout.Find(t.name);
    if (!e.ok()) {
      return absl::InternalError(absl::StrCat("parameter layout has no entry \"", t.name, "\""));
    }
    if ((*e)->shape != t.shape) {
      return absl::InternalError(
          absl::StrCat("parameter \"", t.name, "\" has shape [", absl::StrJoin((*e)->shape, ", "),
                       "] in the layout; the config needs [", absl::StrJoin(t.shape, ", "), "]"));
    }
  }
  auto at = [&](const std::string& name) { return (*layout.Find(name))->offset; };
  auto norm = [&](const std::string& p) { return NormOffsets{at(p + ".weight"), at(p + ".bias")}; };
  auto linear = [&](const std::string& p) {
    return LinearOffsets{at(p + ".weight"), at(p + ".bias")};
  };
  ModelOffsets m;
  m.token_embedding = at("token_embedding.weight");
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string b = absl::StrCat("blocks.", i, ".");
    BlockOffsets o;
    o.attn_norm = norm(b + "attn_norm");
    o.q_proj = linear(b + "attn.q_proj");
    o.k_proj = linear(b + "attn.k_proj");
    o.v_proj = linear(b + "attn.v_proj");
    o.attn_sub_norm = norm(b + "attn.sub_norm");
    o.out_proj = linear(b + "attn.out_proj");
    o.ffn_norm = norm(b + "ffn_norm");
    o.fc1 = linear(b + "ffn.fc1");
    o.ffn_sub_norm = norm(b + "ffn.sub_norm");
    o.fc2 = linear(b + "ffn.fc2");
    m.blocks.push_back(o);
  }
  m.final_norm = norm("final_norm");
  m.lm_head = config.tie_embeddings ? -1 : at("lm_head.weight");
  return m;
}

std::vector<ElementRange> BackwardFinishOrder(const ModelOffsets& offsets, int64_t total) {
  // The layout's order (BuildParamLayout): the embedding, the blocks, the final norm, the head.
  std::vector<ElementRange> order;
  order.push_back({offsets.final_norm.weight, total});
  const int64_t layers = static_cast<int64_t>(offsets.blocks.size());
  for (int64_t i = layers - 1; i >= 0; --i) {
    const int64_t end = i + 1 < layers ? offsets.blocks[static_cast<size_t>(i + 1)].attn_norm.weight
                                       : offsets.final_norm.weight;
    order.push_back({offsets.blocks[static_cast<size_t>(i)].attn_norm.weight, end});
  }
  order.push_back({offsets.token_embedding,
                   layers > 0 ? offsets.blocks[0].attn_norm.weight : offsets.final_norm.weight});
  return order;
}

double MagnetoGamma(int64_t num_layers) {
  return std::sqrt(std::log(2.0 * static_cast<double>(num_layers)));
}

absl::Status InitMagneto(const LongNetConfig& config, const ParamLayout& layout, uint64_t seed,
                         double* params) {
  if (params == nullptr) return absl::InvalidArgumentError("InitMagneto: params is null");
  absl::StatusOr<ModelOffsets> offsets = ResolveOffsets(config, layout);
  if (!offsets.ok()) return offsets.status();
  const double gamma = MagnetoGamma(config.num_layers);
  for (const ParamEntry& e : layout.entries()) {
    double* out = params + e.offset;
    const std::string& n = e.name;
    if (absl::EndsWith(n, ".bias")) {
      std::fill(out, out + e.numel, 0.0);
    } else if (absl::EndsWith(n, "norm.weight")) {  // attn_norm, sub_norm, ffn_norm, final_norm.
      std::fill(out, out + e.numel, 1.0);
    } else if (n == "token_embedding.weight" || n == "lm_head.weight") {
      FillNormal(seed, n, 1.0 / std::sqrt(static_cast<double>(config.d_model)), e.numel, out);
    } else {
      // A linear weight [out, in]: xavier normal, gain gamma for v/out/fc1/fc2, 1 for q/k.
      const bool scaled = absl::EndsWith(n, ".v_proj.weight") ||
                          absl::EndsWith(n, ".out_proj.weight") ||
                          absl::EndsWith(n, ".fc1.weight") || absl::EndsWith(n, ".fc2.weight");
      const double gain = scaled ? gamma : 1.0;
      const double fans = static_cast<double>(e.shape[0] + e.shape[1]);
      FillNormal(seed, n, gain * std::sqrt(2.0 / fans), e.numel, out);
    }
  }
  return absl::OkStatus();
}

}  // namespace model
}  // namespace dattn
