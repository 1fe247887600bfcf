// The JSON config (every error names the field and the value) and the parameter layout and MAGNETO
// initialisation built from it.
#include "model/config.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/longnet_params.h"

namespace dattn {
namespace model {
namespace {

TEST(ConfigTest, EmptyObjectIsLongNetBase) {
  absl::StatusOr<LongNetConfig> c = ParseConfigJson("{}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, LongNetConfig());
  EXPECT_EQ(c->d_model, 768);
  EXPECT_EQ(c->num_layers, 12);
  EXPECT_EQ(c->vocab_size, 256);
  EXPECT_EQ(c->segment_lengths, (std::vector<int64_t>{2048, 4096, 8192, 16384, 32768}));
  EXPECT_EQ(c->dilation_rates, (std::vector<int64_t>{1, 2, 4, 6, 12}));
  EXPECT_EQ(c->head_dim(), 64);
  const AttentionSpec spec = c->attention_spec();
  EXPECT_TRUE(spec.causal);
  EXPECT_FALSE(spec.scale.has_value());
}

TEST(ConfigTest, ParsesEveryFieldAndRoundTrips) {
  const std::string text = R"({
    "vocab_size": 300, "d_model": 64, "num_layers": 3, "num_heads": 4, "ffn_dim": 96,
    "layer_norm_eps": 1e-6, "tie_embeddings": false,
    "attention": {"mode": "mixture", "head_offsets": "blocked",
                  "segment_lengths": [16, 32], "dilation_rates": [1, 4]},
    "rotary": {"theta": 500000, "xpos": true, "xpos_scale_base": 256.5}
  })";
  absl::StatusOr<LongNetConfig> c = ParseConfigJson(text);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 300);
  EXPECT_EQ(c->d_model, 64);
  EXPECT_EQ(c->num_layers, 3);
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(c->ffn_dim, 96);
  EXPECT_EQ(c->layer_norm_eps, 1e-6);
  EXPECT_FALSE(c->tie_embeddings);
  EXPECT_EQ(c->attention_mode, AttentionMode::kMixture);
  EXPECT_EQ(c->head_offsets, HeadOffsets::kBlocked);
  EXPECT_EQ(c->segment_lengths, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(c->dilation_rates, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(c->rope_theta, 500000);
  EXPECT_TRUE(c->xpos);
  EXPECT_EQ(c->xpos_scale_base, 256.5);
  absl::StatusOr<LongNetConfig> again = ParseConfigJson(ConfigToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << ConfigToJson(*c);
  EXPECT_EQ(*again, *c);
  // Doubles survive the round trip exactly.
  LongNetConfig odd;
  odd.layer_norm_eps = 1.0 / 3.0;
  odd.xpos_scale_base = 0.1 + 0.2;
  again = ParseConfigJson(ConfigToJson(odd));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, odd);
}

struct BadCase {
  std::string json;
  std::string fragment;  // What the message must say.
};

TEST(ConfigTest, BadConfigsNameTheFieldAndValue) {
  const std::vector<BadCase> cases = {
      {"[1, 2]", "must be a JSON object"},
      {"{\"d_model\": 64,}", "not valid JSON"},
      {R"({"dmodel": 64})", "config field \"dmodel\": unknown field"},
      {R"({"attention": {"segments": [4]}})", "\"attention.segments\": unknown field"},
      {R"({"d_model": "768"})", "\"d_model\": \"768\" must be an integer"},
      {R"({"d_model": 768.5})", "\"d_model\": 768.5 must be an integer"},
      {R"({"vocab_size": 0})", "\"vocab_size\": 0 must be >= 1"},
      {R"({"num_layers": -2})", "\"num_layers\": -2 must be >= 1"},
      {R"({"ffn_dim": 99999999999})", "\"ffn_dim\": 99999999999 exceeds 2147483647"},
      {R"({"vocab_size": 18446744073709551615})",
       "\"vocab_size\": 18446744073709551615 does not "
       "fit in int64"},
      {R"({"num_heads": 5})", "\"num_heads\": 5 does not divide d_model = 768"},
      {R"({"num_layers": 1000000})", "\"num_layers\": 1000000 exceeds 512"},
      {R"({"num_layers": 512, "d_model": 2000000000, "num_heads": 2})",
       "have more parameters than int64 bytes hold"},
      {R"({"d_model": 36, "num_heads": 4, "attention": {"segment_lengths": [8],
           "dilation_rates": [1]}})",
       "head dim d_model / num_heads = 9, which must be even"},
      {R"({"num_heads": 4})", "\"num_heads\": 4 is fewer than the 5 attention patterns"},
      {R"({"attention": {"segment_lengths": [8, 0], "dilation_rates": [1, 2]}})",
       "\"attention.segment_lengths[1]\": 0 must be >= 1"},
      {R"({"attention": {"segment_lengths": [8, 16], "dilation_rates": [1, -2]}})",
       "\"attention.dilation_rates[1]\": -2 must be >= 1"},
      {R"({"attention": {"segment_lengths": [8, 16], "dilation_rates": [1]}})",
       "\"attention.dilation_rates\": [1] has 1 entries; segment_lengths has 2"},
      {R"({"attention": {"segment_lengths": [], "dilation_rates": []}})",
       "\"attention.segment_lengths\": [] must hold at least one"},
      {R"({"attention": {"segment_lengths": 8}})",
       "\"attention.segment_lengths\": 8 must be an array of integers"},
      {R"({"attention": {"mode": "sparse"}})",
       "\"attention.mode\": unknown attention mode 'sparse'"},
      {R"({"attention": {"head_offsets": "blocked"}})",
       "\"attention.head_offsets\": \"blocked\" needs attention.mode \"mixture\""},
      {R"({"attention": {"head_offsets": "strided", "mode": "mixture"}})",
       "unknown head_offsets 'strided'"},
      {R"({"layer_norm_eps": 0})", "\"layer_norm_eps\": 0 must be finite and > 0"},
      {R"({"rotary": {"theta": -1}})", "\"rotary.theta\": -1 must be finite and > 0"},
      {R"({"rotary": {"xpos": 1}})", "\"rotary.xpos\": 1 must be true or false"},
      {R"({"rotary": {"xpos_scale_base": 0}})", "\"rotary.xpos_scale_base\": 0 must be finite"},
      {R"({"tie_embeddings": "yes"})", "\"tie_embeddings\": \"yes\" must be true or false"},
      {R"({"rotary": []})", "config field \"rotary\": [] must be a JSON object"},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<LongNetConfig> parsed = ParseConfigJson(c.json);
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << parsed.status();
    EXPECT_NE(parsed.status().message().find(c.fragment), std::string::npos)
        << "json: " << c.json << "\nmessage: " << parsed.status().message()
        << "\nshould contain: " << c.fragment;
  }
}

LongNetConfig Small() {
  LongNetConfig c;
  c.vocab_size = 11;
  c.d_model = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  c.ffn_dim = 24;
  c.segment_lengths = {4, 8};
  c.dilation_rates = {1, 2};
  return c;
}

TEST(ParamLayoutTest, NamesShapesAndOrder) {
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(Small());
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<std::string> names;
  for (const ParamEntry& e : layout->entries()) names.push_back(e.name);
  const std::vector<std::string> block1 = {
      "blocks.1.attn_norm.weight",     "blocks.1.attn_norm.bias",
      "blocks.1.attn.q_proj.weight",   "blocks.1.attn.q_proj.bias",
      "blocks.1.attn.k_proj.weight",   "blocks.1.attn.k_proj.bias",
      "blocks.1.attn.v_proj.weight",   "blocks.1.attn.v_proj.bias",
      "blocks.1.attn.sub_norm.weight", "blocks.1.attn.sub_norm.bias",
      "blocks.1.attn.out_proj.weight", "blocks.1.attn.out_proj.bias",
      "blocks.1.ffn_norm.weight",      "blocks.1.ffn_norm.bias",
      "blocks.1.ffn.fc1.weight",       "blocks.1.ffn.fc1.bias",
      "blocks.1.ffn.sub_norm.weight",  "blocks.1.ffn.sub_norm.bias",
      "blocks.1.ffn.fc2.weight",       "blocks.1.ffn.fc2.bias"};
  ASSERT_EQ(names.size(), 1 + 2 * 20 + 2u);  // Tied: no lm_head.
  EXPECT_EQ(names.front(), "token_embedding.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 21, names.begin() + 41), block1);
  EXPECT_EQ(names[41], "final_norm.weight");
  EXPECT_EQ((*layout->Find("blocks.0.ffn.fc1.weight"))->shape, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ((*layout->Find("blocks.0.ffn.fc2.weight"))->shape, (std::vector<int64_t>{16, 24}));
  EXPECT_EQ((*layout->Find("blocks.0.ffn.sub_norm.bias"))->shape, (std::vector<int64_t>{24}));
  EXPECT_EQ((*layout->Find("token_embedding.weight"))->shape, (std::vector<int64_t>{11, 16}));
  // Weight decay on matrices only.
  for (const ParamEntry& e : layout->entries()) {
    EXPECT_EQ(WantsWeightDecay(e), e.name.find(".bias") == std::string::npos &&
                                       e.name.find("norm.") == std::string::npos)
        << e.name;
  }
  LongNetConfig untied = Small();
  untied.tie_embeddings = false;
  absl::StatusOr<ParamLayout> u = BuildParamLayout(untied);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->entries().back().name, "lm_head.weight");
  EXPECT_EQ(u->total(), layout->total() + 11 * 16);
  // Offsets resolve; a layout from another config does not.
  EXPECT_TRUE(ResolveOffsets(Small(), *layout).ok());
  absl::Status wrong = ResolveOffsets(untied, *layout).status();
  EXPECT_TRUE(absl::IsInternal(wrong)) << wrong;
  EXPECT_NE(wrong.message().find("lm_head.weight"), std::string::npos);
  LongNetConfig wider = Small();
  wider.ffn_dim = 32;
  wrong = ResolveOffsets(wider, *layout).status();
  EXPECT_NE(wrong.message().find("[24, 16]"), std::string::npos) << wrong;
}

double Std(const double* x, int64_t n) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    s += x[i];
    s2 += x[i] * x[i];
  }
  const double mean = s / n;
  return std::sqrt(s2 / n - mean * mean);
}

TEST(MagnetoInitTest, ConstantsAndDeterminism) {
  LongNetConfig c = Small();
  c.d_model = 64;
  c.num_heads = 2;
  c.ffn_dim = 192;
  c.vocab_size = 256;
  c.num_layers = 6;
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(c);
  ASSERT_TRUE(layout.ok());
  std::vector<double> p(layout->total(), std::nan("")), again(layout->total(), std::nan(""));
  ASSERT_TRUE(InitMagneto(c, *layout, 42, p.data()).ok());
  ASSERT_TRUE(InitMagneto(c, *layout, 42, again.data()).ok());
  EXPECT_EQ(p, again);
  const double gamma = std::sqrt(std::log(12.0));
  EXPECT_DOUBLE_EQ(MagnetoGamma(6), gamma);
  for (const ParamEntry& e : layout->entries()) {
    const double* x = p.data() + e.offset;
    const std::string& n = e.name;
    if (n.find(".bias") != std::string::npos) {
      for (int64_t i = 0; i < e.numel; ++i) ASSERT_EQ(x[i], 0.0) << n;
    } else if (n.find("norm.weight") != std::string::npos) {
      for (int64_t i = 0; i < e.numel; ++i) ASSERT_EQ(x[i], 1.0) << n;
    } else {
      double want;
      if (n == "token_embedding.weight") {
        want = 1.0 / 8.0;
      } else {
        const bool scaled = n.find("v_proj") != std::string::npos ||
                            n.find("out_proj") != std::string::npos ||
                            n.find(".fc") != std::string::npos;
        want = (scaled ? gamma : 1.0) * std::sqrt(2.0 / (e.shape[0] + e.shape[1]));
      }
      // 4096+ draws: the sample std is within 5% of the target (about 4.5 sigma).
      EXPECT_NEAR(Std(x, e.numel), want, 0.05 * want) << n;
    }
  }
  // Another seed gives other values; an entry's values do not depend on the others (untied adds
  // lm_head at the end and changes nothing before it).
  std::vector<double> other(layout->total());
  ASSERT_TRUE(InitMagneto(c, *layout, 43, other.data()).ok());
  EXPECT_NE(other, p);
  LongNetConfig untied = c;
  untied.tie_embeddings = false;
  absl::StatusOr<ParamLayout> u = BuildParamLayout(untied);
  ASSERT_TRUE(u.ok());
  std::vector<double> pu(u->total());
  ASSERT_TRUE(InitMagneto(untied, *u, 42, pu.data()).ok());
  EXPECT_EQ(std::vector<double>(pu.begin(), pu.begin() + layout->total()), p);
  const ParamEntry* head = *u->Find("lm_head.weight");
  EXPECT_NEAR(Std(pu.data() + head->offset, head->numel), 1.0 / 8.0, 0.05 / 8.0);
  // The head is not a copy of the embedding.
  EXPECT_NE(pu[head->offset], pu[0]);
}

}  // namespace
}  // namespace model
}  // namespace dattn
