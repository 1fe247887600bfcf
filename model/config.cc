#include "model/config.h"

#include <climits>
#include <cmath>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/validate.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace model {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("config field \"", path, "\": ", what));
}

// The value as written in the document, for messages (short: long arrays are cut).
std::string Shown(const Json& value) {
  std::string s = value.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

absl::Status ReadInt(const Json& value, const std::string& path, int64_t* out) {
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return FieldError(path, absl::StrCat(Shown(value), " does not fit in int64"));
    }
    *out = static_cast<int64_t>(value.get<uint64_t>());
    return absl::OkStatus();
  }
  if (value.is_number_integer()) {
    *out = value.get<int64_t>();
    return absl::OkStatus();
  }
  return FieldError(path, absl::StrCat(Shown(value), " must be an integer"));
}

absl::Status ReadDouble(const Json& value, const std::string& path, double* out) {
  if (!value.is_number()) return FieldError(path, absl::StrCat(Shown(value), " must be a number"));
  *out = value.get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& value, const std::string& path, bool* out) {
  if (!value.is_boolean()) {
    return FieldError(path, absl::StrCat(Shown(value), " must be true or false"));
  }
  *out = value.get<bool>();
  return absl::OkStatus();
}

absl::Status ReadString(const Json& value, const std::string& path, std::string* out) {
  if (!value.is_string()) return FieldError(path, absl::StrCat(Shown(value), " must be a string"));
  *out = value.get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadIntList(const Json& value, const std::string& path, std::vector<int64_t>* out) {
  if (!value.is_array()) {
    return FieldError(path, absl::StrCat(Shown(value), " must be an array of integers"));
  }
  out->clear();
  for (size_t i = 0; i < value.size(); ++i) {
    int64_t x = 0;
    absl::Status s = ReadInt(value[i], absl::StrCat(path, "[", i, "]"), &x);
    if (!s.ok()) return s;
    out->push_back(x);
  }
  return absl::OkStatus();
}

using FieldReader = std::function<absl::Status(const Json& value, const std::string& path)>;

// Reads every key of `object` with its reader; an unknown key is an error naming it and the keys
// accepted.
absl::Status ReadObject(const Json& object, const std::string& path,
                        const std::map<std::string, FieldReader>& readers) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.empty() ? "config" : absl::StrCat("config field \"", path, "\""), ": ",
                     Shown(object), " must be a JSON object"));
  }
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string field = path.empty() ? it.key() : absl::StrCat(path, ".", it.key());
    auto reader = readers.find(it.key());
    if (reader == readers.end()) {
      std::vector<std::string> known;
      for (const auto& [name, unused] : readers) known.push_back(name);
      return FieldError(field,
                        absl::StrCat("unknown field; accepted here: ", absl::StrJoin(known, ", ")));
    }
    absl::Status s = reader->second(it.value(), field);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckAtLeastOne(int64_t value, const std::string& path) {
  if (value < 1) return FieldError(path, absl::StrCat(value, " must be >= 1"));
  return absl::OkStatus();
}

absl::Status CheckBlasInt(int64_t value, const std::string& path) {
  if (value > INT_MAX) {
    return FieldError(path, absl::StrCat(value, " exceeds 2147483647 (BLAS's int)"));
  }
  return absl::OkStatus();
}

absl::Status CheckPositiveFinite(double value, const std::string& path) {
  if (!std::isfinite(value) || value <= 0) {
    return FieldError(path, absl::StrCat(value, " must be finite and > 0"));
  }
  return absl::OkStatus();
}

}  // namespace

AttentionSpec LongNetConfig::attention_spec() const {
  AttentionSpec spec;
  spec.segment_lengths = segment_lengths;
  spec.dilation_rates = dilation_rates;
  spec.causal = true;
  spec.mode = attention_mode;
  spec.head_offsets = head_offsets;
  return spec;
}

absl::Status ValidateConfig(const LongNetConfig& c) {
  for (const auto& [value, path] :
       std::vector<std::pair<int64_t, const char*>>{{c.vocab_size, "vocab_size"},
                                                    {c.d_model, "d_model"},
                                                    {c.num_layers, "num_layers"},
                                                    {c.num_heads, "num_heads"},
                                                    {c.ffn_dim, "ffn_dim"}}) {
    absl::Status s = CheckAtLeastOne(value, path);
    if (!s.ok()) return s;
  }
  for (const auto& [value, path] : std::vector<std::pair<int64_t, const char*>>{
           {c.vocab_size, "vocab_size"}, {c.d_model, "d_model"}, {c.ffn_dim, "ffn_dim"}}) {
    absl::Status s = CheckBlasInt(value, path);
    if (!s.ok()) return s;
  }
  if (c.num_layers > kMaxLayers) {
    return FieldError("num_layers", absl::StrCat(c.num_layers, " exceeds ", kMaxLayers));
  }
  // The parameter count (longnet_params.h's table) must fit in int64 elements of 8 bytes.
  {
    const __int128 d = c.d_model, f = c.ffn_dim, v = c.vocab_size;
    const __int128 block = 4 * (d * d + d) + 2 * d * f + f + d + 6 * d + 2 * f;
    const __int128 total = block * c.num_layers + 2 * v * d + 2 * d;
    if (total > static_cast<__int128>(INT64_MAX / 8)) {
      return FieldError("num_layers", absl::StrCat(c.num_layers, " layers of d_model = ", c.d_model,
                                                   " and ffn_dim = ", c.ffn_dim,
                                                   " have more parameters than int64 bytes hold"));
    }
  }
  if (c.d_model % c.num_heads != 0) {
    return FieldError("num_heads",
                      absl::StrCat(c.num_heads, " does not divide d_model = ", c.d_model));
  }
  if (c.head_dim() % 2 != 0) {
    return FieldError(
        "num_heads",
        absl::StrCat(c.num_heads, " gives head dim d_model / num_heads = ", c.head_dim(),
                     ", which must be even (rotary positions rotate "
                     "pairs of channels)"));
  }
  const int num_patterns = static_cast<int>(c.segment_lengths.size());
  if (c.segment_lengths.empty()) {
    return FieldError("attention.segment_lengths", "[] must hold at least one segment length");
  }
  if (c.dilation_rates.size() != c.segment_lengths.size()) {
    return FieldError(
        "attention.dilation_rates",
        absl::StrCat("[", absl::StrJoin(c.dilation_rates, ", "), "] has ", c.dilation_rates.size(),
                     " entries; segment_lengths has ", c.segment_lengths.size()));
  }
  for (int i = 0; i < num_patterns; ++i) {
    absl::Status s =
        CheckAtLeastOne(c.segment_lengths[i], absl::StrCat("attention.segment_lengths[", i, "]"));
    if (!s.ok()) return s;
    s = CheckAtLeastOne(c.dilation_rates[i], absl::StrCat("attention.dilation_rates[", i, "]"));
    if (!s.ok()) return s;
  }
  if (c.head_offsets == HeadOffsets::kBlocked && c.attention_mode != AttentionMode::kMixture) {
    return FieldError("attention.head_offsets", "\"blocked\" needs attention.mode \"mixture\"");
  }
  if (c.attention_mode == AttentionMode::kGrouped && c.num_heads < num_patterns) {
    return FieldError("num_heads", absl::StrCat(c.num_heads, " is fewer than the ", num_patterns,
                                                " attention patterns (grouped mode gives each "
                                                "pattern a group of at least one head)"));
  }
  // Whatever the engine refuses that is not caught above (kept as the last word on the spec).
  absl::Status spec = ValidateSpec(c.attention_spec());
  if (!spec.ok()) return FieldError("attention", std::string(spec.message()));
  for (const auto& [value, path] :
       std::vector<std::pair<double, const char*>>{{c.layer_norm_eps, "layer_norm_eps"},
                                                   {c.rope_theta, "rotary.theta"},
                                                   {c.xpos_scale_base, "rotary.xpos_scale_base"}}) {
    absl::Status s = CheckPositiveFinite(value, path);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<LongNetConfig> ParseConfigJson(const std::string& text) {
  Json document;
  try {
    document = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: not valid JSON: ", e.what()));
  }
  LongNetConfig c;
  std::map<std::string, FieldReader> attention = {
      {"mode",
       [&](const Json& v, const std::string& p) {
         std::string name;
         absl::Status s = ReadString(v, p, &name);
         if (!s.ok()) return s;
         absl::StatusOr<AttentionMode> mode = ParseAttentionMode(name);
         if (!mode.ok()) return FieldError(p, std::string(mode.status().message()));
         c.attention_mode = *mode;
         return absl::OkStatus();
       }},
      {"head_offsets",
       [&](const Json& v, const std::string& p) {
         std::string name;
         absl::Status s = ReadString(v, p, &name);
         if (!s.ok()) return s;
         absl::StatusOr<HeadOffsets> offsets = ParseHeadOffsets(name);
         if (!offsets.ok()) return FieldError(p, std::string(offsets.status().message()));
         c.head_offsets = *offsets;
         return absl::OkStatus();
       }},
      {"segment_lengths",
       [&](const Json& v, const std::string& p) { return ReadIntList(v, p, &c.segment_lengths); }},
      {"dilation_rates",
       [&](const Json& v, const std::string& p) { return ReadIntList(v, p, &c.dilation_rates); }},
  };
  std::map<std::string, FieldReader> rotary = {
      {"theta",
       [&](const Json& v, const std::string& p) { return ReadDouble(v, p, &c.rope_theta); }},
      {"xpos", [&](const Json& v, const std::string& p) { return ReadBool(v, p, &c.xpos); }},
      {"xpos_scale_base",
       [&](const Json& v, const std::string& p) { return ReadDouble(v, p, &c.xpos_scale_base); }},
  };
  std::map<std::string, FieldReader> top = {
      {"vocab_size",
       [&](const Json& v, const std::string& p) { return ReadInt(v, p, &c.vocab_size); }},
      {"d_model", [&](const Json& v, const std::string& p) { return ReadInt(v, p, &c.d_model); }},
      {"num_layers",
       [&](const Json& v, const std::string& p) { return ReadInt(v, p, &c.num_layers); }},
      {"num_heads",
       [&](const Json& v, const std::string& p) { return ReadInt(v, p, &c.num_heads); }},
      {"ffn_dim", [&](const Json& v, const std::string& p) { return ReadInt(v, p, &c.ffn_dim); }},
      {"layer_norm_eps",
       [&](const Json& v, const std::string& p) { return ReadDouble(v, p, &c.layer_norm_eps); }},
      {"tie_embeddings",
       [&](const Json& v, const std::string& p) { return ReadBool(v, p, &c.tie_embeddings); }},
      {"attention",
       [&](const Json& v, const std::string& p) { return ReadObject(v, p, attention); }},
      {"rotary", [&](const Json& v, const std::string& p) { return ReadObject(v, p, rotary); }},
  };
  absl::Status s = ReadObject(document, "", top);
  if (!s.ok()) return s;
  s = ValidateConfig(c);
  if (!s.ok()) return s;
  return c;
}

std::string ConfigToJson(const LongNetConfig& c) {
  // nlohmann's ordered_json keeps the keys in the order written here (the order of config.h).
  nlohmann::ordered_json j;
  j["vocab_size"] = c.vocab_size;
  j["d_model"] = c.d_model;
  j["num_layers"] = c.num_layers;
  j["num_heads"] = c.num_heads;
  j["ffn_dim"] = c.ffn_dim;
  j["layer_norm_eps"] = c.layer_norm_eps;
  j["tie_embeddings"] = c.tie_embeddings;
  j["attention"]["mode"] = AttentionModeName(c.attention_mode);
  j["attention"]["head_offsets"] = HeadOffsetsName(c.head_offsets);
  j["attention"]["segment_lengths"] = c.segment_lengths;
  j["attention"]["dilation_rates"] = c.dilation_rates;
  j["rotary"]["theta"] = c.rope_theta;
  j["rotary"]["xpos"] = c.xpos;
  j["rotary"]["xpos_scale_base"] = c.xpos_scale_base;
  return j.dump(2);
}

bool operator==(const LongNetConfig& a, const LongNetConfig& b) {
  return a.vocab_size == b.vocab_size && a.d_model == b.d_model && a.num_layers == b.num_layers &&
         a.num_heads == b.num_heads && a.ffn_dim == b.ffn_dim &&
         a.layer_norm_eps == b.layer_norm_eps && a.tie_embeddings == b.tie_embeddings &&
         a.attention_mode == b.attention_mode && a.head_offsets == b.head_offsets &&
         a.segment_lengths == b.segment_lengths && a.dilation_rates == b.dilation_rates &&
         a.rope_theta == b.rope_theta && a.xpos == b.xpos && a.xpos_scale_base == b.xpos_scale_base;
}

}  // namespace model
}  // namespace dattn
