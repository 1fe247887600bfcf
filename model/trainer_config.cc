#include "model/trainer_config.h"

#include <climits>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/trainable_model.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace model {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("trainer config field \"", path, "\": ", what));
}

// A model config error (config.h's `config field "x": ...`) as a field of this config.
absl::Status ModelError(const absl::Status& status) {
  const std::string message(status.message());
  constexpr char kField[] = "config field \"";
  if (absl::StartsWith(message, kField)) {
    return absl::Status(status.code(), absl::StrCat("trainer config field \"model.",
                                                    message.substr(sizeof(kField) - 1)));
  }
  return absl::Status(status.code(), absl::StrCat("trainer config field \"model\": ", message));
}

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

absl::Status ReadU64(const Json& value, const std::string& path, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return absl::OkStatus();
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(value.get<int64_t>());
    return absl::OkStatus();
  }
  return FieldError(path, absl::StrCat(Shown(value), " must be an integer in [0, 2^64)"));
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

absl::Status ReadStringList(const Json& value, const std::string& path,
                            std::vector<std::string>* out) {
  if (value.is_string()) {  // One path may be given as a string.
    *out = {value.get<std::string>()};
    return absl::OkStatus();
  }
  if (!value.is_array()) {
    return FieldError(path, absl::StrCat(Shown(value), " must be a string or an array of strings"));
  }
  out->clear();
  for (size_t i = 0; i < value.size(); ++i) {
    std::string s;
    absl::Status status = ReadString(value[i], absl::StrCat(path, "[", i, "]"), &s);
    if (!status.ok()) return status;
    out->push_back(std::move(s));
  }
  return absl::OkStatus();
}

using FieldReader = std::function<absl::Status(const Json& value, const std::string& path)>;

absl::Status ReadObject(const Json& object, const std::string& path,
                        const std::map<std::string, FieldReader>& readers) {
  if (!object.is_object()) {
    if (path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer config: ", Shown(object), " must be a JSON object"));
    }
    return FieldError(path, absl::StrCat(Shown(object), " must be a JSON object"));
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

// Shorthands for the reader tables.
FieldReader Int(int64_t* out) {
  return [out](const Json& v, const std::string& p) { return ReadInt(v, p, out); };
}
FieldReader Double(double* out) {
  return [out](const Json& v, const std::string& p) { return ReadDouble(v, p, out); };
}
FieldReader Bool(bool* out) {
  return [out](const Json& v, const std::string& p) { return ReadBool(v, p, out); };
}

absl::Status AtLeast(int64_t value, int64_t least, const std::string& path) {
  if (value < least) return FieldError(path, absl::StrCat(value, " must be >= ", least));
  return absl::OkStatus();
}

absl::Status InUnit(double value, const std::string& path, bool include_one) {
  if (!(value >= 0) || (include_one ? value > 1 : value >= 1)) {
    return FieldError(
        path, absl::StrCat(value, include_one ? " must be in [0, 1]" : " must be in [0, 1)"));
  }
  return absl::OkStatus();
}

// An optimizer.h validation message ("... field \"x\" ...") as this config's field.
absl::Status OptimizerError(const absl::Status& status, const std::string& path) {
  return FieldError(path, std::string(status.message()));
}

}  // namespace

LrSchedule TrainerConfig::schedule() const {
  LrSchedule s;
  s.peak_lr = optimizer.lr;
  s.min_lr = optimizer.min_lr;
  s.warmup_steps = optimizer.warmup_steps;
  s.total_steps = steps;
  return s;
}

AdamWConfig TrainerConfig::adamw() const {
  AdamWConfig a;
  a.beta1 = optimizer.beta1;
  a.beta2 = optimizer.beta2;
  a.epsilon = optimizer.epsilon;
  a.weight_decay = optimizer.weight_decay;
  return a;
}

absl::Status ValidateTrainerConfig(const TrainerConfig& c) {
  absl::Status s = ValidateConfig(c.model);
  if (!s.ok()) return ModelError(s);
  const std::vector<std::string> devices = TrainingDevices();
  if (std::find(devices.begin(), devices.end(), c.device) == devices.end()) {
    return FieldError("device", UnavailableDeviceMessage(c.device));
  }
  if (c.threads < 0 || c.threads > 4096) {
    return FieldError("threads", absl::StrCat(c.threads, " must be in [0, 4096] (0: every core)"));
  }
  if (c.data.format != "text" && c.data.format != "tokens") {
    return FieldError("data.format",
                      absl::StrCat("\"", c.data.format, "\" must be \"text\" or \"tokens\""));
  }
  for (size_t i = 0; i < c.data.paths.size(); ++i) {
    if (c.data.paths[i].empty()) {
      return FieldError(absl::StrCat("data.paths[", i, "]"), "\"\" is not a path");
    }
  }
  if (c.data.format == "text" && c.data.paths.size() > 1) {
    return FieldError("data.paths",
                      absl::StrCat(c.data.paths.size(),
                                   " paths: format \"text\" takes one file or folder (put the "
                                   "files in one folder)"));
  }
  s = InUnit(c.data.validation_fraction, "data.validation_fraction", false);
  if (!s.ok()) return s;
  for (const auto& [value, path] : std::vector<std::pair<int64_t, const char*>>{
           {c.seq_len, "seq_len"},
           {c.batch_size, "batch_size"},
           {c.micro_batches, "micro_batches"},
           {c.steps, "steps"},
           {c.eval.batches, "eval.batches"},
           {c.log_every, "log_every"},
           {c.checkpoint.keep_last, "checkpoint.keep_last"},
           {c.optimizer.max_consecutive_skips, "optimizer.max_consecutive_skips"}}) {
    s = AtLeast(value, 1, path);
    if (!s.ok()) return s;
  }
  if (c.batch_size % c.micro_batches != 0) {
    return FieldError("micro_batches",
                      absl::StrCat(c.micro_batches, " does not divide batch_size ", c.batch_size));
  }
  for (const auto& [value, path] : std::vector<std::pair<int64_t, const char*>>{
           {c.eval.every, "eval.every"},
           {c.checkpoint.every, "checkpoint.every"},
           {c.optimizer.warmup_steps, "optimizer.warmup_steps"},
           {c.retrieval.examples, "retrieval.examples"},
           {c.retrieval.seq_len, "retrieval.seq_len"},
           {c.retrieval.distractors, "retrieval.distractors"}}) {
    s = AtLeast(value, 0, path);
    if (!s.ok()) return s;
  }
  // The optimizer: each value on its own, named as this config's field.
  const std::vector<std::pair<double, const char*>> positive = {
      {c.optimizer.lr, "optimizer.lr"}, {c.optimizer.epsilon, "optimizer.epsilon"}};
  for (const auto& [value, path] : positive) {
    if (!std::isfinite(value) || value <= 0) {
      return FieldError(path, absl::StrCat(value, " must be finite and > 0"));
    }
  }
  if (!std::isfinite(c.optimizer.min_lr) || c.optimizer.min_lr < 0 ||
      c.optimizer.min_lr > c.optimizer.lr) {
    return FieldError(
        "optimizer.min_lr",
        absl::StrCat(c.optimizer.min_lr, " must be in [0, lr = ", c.optimizer.lr, "]"));
  }
  if (c.optimizer.warmup_steps > c.steps) {
    return FieldError("optimizer.warmup_steps",
                      absl::StrCat(c.optimizer.warmup_steps, " exceeds steps = ", c.steps));
  }
  for (const auto& [value, path] : std::vector<std::pair<double, const char*>>{
           {c.optimizer.beta1, "optimizer.beta1"}, {c.optimizer.beta2, "optimizer.beta2"}}) {
    s = InUnit(value, path, false);
    if (!s.ok()) return s;
  }
  if (!std::isfinite(c.optimizer.weight_decay) || c.optimizer.weight_decay < 0) {
    return FieldError("optimizer.weight_decay",
                      absl::StrCat(c.optimizer.weight_decay, " must be finite and >= 0"));
  }
  if (std::isnan(c.optimizer.max_grad_norm) || c.optimizer.max_grad_norm <= 0) {
    return FieldError("optimizer.max_grad_norm",
                      absl::StrCat(c.optimizer.max_grad_norm, " must be > 0 (null: no clipping)"));
  }
  // The library's own checks, in case they know more (their messages name their fields).
  s = ValidateAdamWConfig(c.adamw());
  if (!s.ok()) return OptimizerError(s, "optimizer");
  s = ValidateLrSchedule(c.schedule());
  if (!s.ok()) return OptimizerError(s, "optimizer");
  // Retrieval.
  const TrainerConfig::Retrieval& r = c.retrieval;
  if (!(r.depth >= 0 && r.depth <= 1)) {
    return FieldError("retrieval.depth", absl::StrCat(r.depth, " must be in [0, 1]"));
  }
  for (const auto& [value, path] : std::vector<std::pair<int64_t, const char*>>{
           {r.key_length, "retrieval.key_length"}, {r.value_length, "retrieval.value_length"}}) {
    if (value < 1 || value > 64) return FieldError(path, absl::StrCat(value, " must be in 1..64"));
  }
  s = InUnit(r.train_fraction, "retrieval.train_fraction", true);
  if (!s.ok()) return s;
  if ((r.examples > 0 || r.train_fraction > 0) && !c.byte_level()) {
    return FieldError(r.examples > 0 ? "retrieval.examples" : "retrieval.train_fraction",
                      "the retrieval task needs byte-level data (data.format \"text\")");
  }
  if (r.examples > 0 && c.data.validation_fraction == 0) {
    return FieldError(
        "retrieval.examples",
        absl::StrCat(r.examples, " examples need held-out text: data.validation_fraction is 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainerConfig> ParseTrainerConfigJson(const std::string& text) {
  Json document;
  try {
    document = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("trainer config: not valid JSON: ", e.what()));
  }
  TrainerConfig c;
  std::map<std::string, FieldReader> data = {
      {"paths",
       [&](const Json& v, const std::string& p) { return ReadStringList(v, p, &c.data.paths); }},
      {"format",
       [&](const Json& v, const std::string& p) { return ReadString(v, p, &c.data.format); }},
      {"validation_fraction", Double(&c.data.validation_fraction)},
  };
  std::map<std::string, FieldReader> optimizer = {
      {"lr", Double(&c.optimizer.lr)},
      {"min_lr", Double(&c.optimizer.min_lr)},
      {"warmup_steps", Int(&c.optimizer.warmup_steps)},
      {"beta1", Double(&c.optimizer.beta1)},
      {"beta2", Double(&c.optimizer.beta2)},
      {"epsilon", Double(&c.optimizer.epsilon)},
      {"weight_decay", Double(&c.optimizer.weight_decay)},
      {"decay_embeddings", Bool(&c.optimizer.decay_embeddings)},
      {"max_grad_norm",
       [&](const Json& v, const std::string& p) {
         if (v.is_null()) {
           c.optimizer.max_grad_norm = std::numeric_limits<double>::infinity();
           return absl::OkStatus();
         }
         return ReadDouble(v, p, &c.optimizer.max_grad_norm);
       }},
      {"max_consecutive_skips", Int(&c.optimizer.max_consecutive_skips)},
  };
  std::map<std::string, FieldReader> eval = {
      {"every", Int(&c.eval.every)},
      {"batches", Int(&c.eval.batches)},
  };
  std::map<std::string, FieldReader> retrieval = {
      {"examples", Int(&c.retrieval.examples)},
      {"depth", Double(&c.retrieval.depth)},
      {"seq_len", Int(&c.retrieval.seq_len)},
      {"key_length", Int(&c.retrieval.key_length)},
      {"value_length", Int(&c.retrieval.value_length)},
      {"distractors", Int(&c.retrieval.distractors)},
      {"train_fraction", Double(&c.retrieval.train_fraction)},
  };
  std::map<std::string, FieldReader> checkpoint = {
      {"every", Int(&c.checkpoint.every)},
      {"keep_last", Int(&c.checkpoint.keep_last)},
  };
  std::map<std::string, FieldReader> top = {
      {"model",
       [&](const Json& v, const std::string& p) {
         if (!v.is_object()) return FieldError(p, absl::StrCat(Shown(v), " must be a JSON object"));
         absl::StatusOr<LongNetConfig> model = ParseConfigJson(v.dump());
         if (!model.ok()) return ModelError(model.status());
         c.model = *std::move(model);
         return absl::OkStatus();
       }},
      {"device", [&](const Json& v, const std::string& p) { return ReadString(v, p, &c.device); }},
      {"threads", Int(&c.threads)},
      {"data", [&](const Json& v, const std::string& p) { return ReadObject(v, p, data); }},
      {"seq_len", Int(&c.seq_len)},
      {"batch_size", Int(&c.batch_size)},
      {"micro_batches", Int(&c.micro_batches)},
      {"steps", Int(&c.steps)},
      {"seed", [&](const Json& v, const std::string& p) { return ReadU64(v, p, &c.seed); }},
      {"checkpoint_activations", Bool(&c.checkpoint_activations)},
      {"optimizer",
       [&](const Json& v, const std::string& p) { return ReadObject(v, p, optimizer); }},
      {"eval", [&](const Json& v, const std::string& p) { return ReadObject(v, p, eval); }},
      {"retrieval",
       [&](const Json& v, const std::string& p) { return ReadObject(v, p, retrieval); }},
      {"checkpoint",
       [&](const Json& v, const std::string& p) { return ReadObject(v, p, checkpoint); }},
      {"log_every", Int(&c.log_every)},
  };
  absl::Status s = ReadObject(document, "", top);
  if (!s.ok()) return s;
  s = ValidateTrainerConfig(c);
  if (!s.ok()) return s;
  return c;
}

std::string TrainerConfigToJson(const TrainerConfig& c) {
  nlohmann::ordered_json j;
  j["model"] = nlohmann::ordered_json::parse(ConfigToJson(c.model));
  j["device"] = c.device;
  j["threads"] = c.threads;
  j["data"]["paths"] = c.data.paths;
  j["data"]["format"] = c.data.format;
  j["data"]["validation_fraction"] = c.data.validation_fraction;
  j["seq_len"] = c.seq_len;
  j["batch_size"] = c.batch_size;
  j["micro_batches"] = c.micro_batches;
  j["steps"] = c.steps;
  j["seed"] = c.seed;
  j["checkpoint_activations"] = c.checkpoint_activations;
  auto& o = j["optimizer"];
  o["lr"] = c.optimizer.lr;
  o["min_lr"] = c.optimizer.min_lr;
  o["warmup_steps"] = c.optimizer.warmup_steps;
  o["beta1"] = c.optimizer.beta1;
  o["beta2"] = c.optimizer.beta2;
  o["epsilon"] = c.optimizer.epsilon;
  o["weight_decay"] = c.optimizer.weight_decay;
  o["decay_embeddings"] = c.optimizer.decay_embeddings;
  if (std::isinf(c.optimizer.max_grad_norm)) {
    o["max_grad_norm"] = nullptr;
  } else {
    o["max_grad_norm"] = c.optimizer.max_grad_norm;
  }
  o["max_consecutive_skips"] = c.optimizer.max_consecutive_skips;
  j["eval"]["every"] = c.eval.every;
  j["eval"]["batches"] = c.eval.batches;
  auto& r = j["retrieval"];
  r["examples"] = c.retrieval.examples;
  r["depth"] = c.retrieval.depth;
  r["seq_len"] = c.retrieval.seq_len;
  r["key_length"] = c.retrieval.key_length;
  r["value_length"] = c.retrieval.value_length;
  r["distractors"] = c.retrieval.distractors;
  r["train_fraction"] = c.retrieval.train_fraction;
  j["checkpoint"]["every"] = c.checkpoint.every;
  j["checkpoint"]["keep_last"] = c.checkpoint.keep_last;
  j["log_every"] = c.log_every;
  return j.dump(2);
}

absl::Status CheckParallelDegrees(const TrainerConfig& config, int data_parallel,
                                  int sequence_parallel) {
  const int dp = data_parallel, sp = sequence_parallel;
  if (config.seq_len % sp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer config field \"seq_len\": ", config.seq_len,
                     " is not a multiple of the sequence-parallel degree ", sp));
  }
  if (config.retrieval.examples > 0 && config.retrieval_seq_len() % sp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer config field \"retrieval.seq_len\": ", config.retrieval_seq_len(),
                     " is not a multiple of the sequence-parallel degree ", sp));
  }
  if (config.batch_size % (config.micro_batches * dp) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer config field \"batch_size\": ", config.batch_size,
                     " is not a multiple of micro_batches (", config.micro_batches,
                     ") x data-parallel ranks (", dp, ")"));
  }
  return absl::OkStatus();
}

bool operator==(const TrainerConfig& a, const TrainerConfig& b) {
  // The JSON form writes every field exactly (doubles round-trip), so it is the comparison.
  return TrainerConfigToJson(a) == TrainerConfigToJson(b);
}

}  // namespace model
}  // namespace dattn
