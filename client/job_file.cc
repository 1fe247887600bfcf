#include "client/job_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/format.h"
#include "client/suggest.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

namespace dattn {
namespace client {
namespace {

// A job file's own settings are three levels deep (the top level, attention:, a list); a trainer
// config under training.config adds its own nesting (model.attention.segment_lengths: four more).
// A JSON document is converted recursively, so one nested deeper than this is refused first:
// 300,000 '[' (600 KB, under the 1 MiB limit) exhausted the stack, and a few thousand took seconds.
// The same bound applies to a YAML trainer config, from its own top.
constexpr int kMaxJsonDepth = 32;

// A trainer config written in a job file is converted to JSON; YAML aliases can repeat a large
// value many times, so the conversion stops at this many bytes of keys and scalars (the coordinator
// takes 16 KiB of config) or this many values.
constexpr int64_t kMaxConfigJsonBytes = int64_t{1} << 20;
constexpr int64_t kMaxConfigValues = 100000;

// The depth of `value`'s nesting (a scalar is 0), counted without recursion, up to `limit` + 1.
int JsonDepth(const nlohmann::json& value, int limit) {
  std::vector<std::pair<const nlohmann::json*, int>> stack = {{&value, 0}};
  int deepest = 0;
  while (!stack.empty()) {
    const auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    if (deepest > limit) return deepest;
    for (const nlohmann::json& child : *node) stack.push_back({&child, depth + 1});
  }
  return deepest;
}

// The tag yaml-cpp gives a quoted scalar; a plain one has "?". JSON strings are tagged so too, so
// that a trainer config in a JSON job file keeps "1" a string and 1 a number.
constexpr char kQuotedTag[] = "!";

// JSON documents are converted to a YAML tree so that one walker checks both formats. Numbers and
// booleans keep their JSON spelling as the scalar text, which the settings' parsers then read.
// An object's keys come in sorted order (nlohmann::json keeps them so) and are unique, so they are
// appended without a lookup (yaml-cpp's node[key] searches the keys so far: quadratic in a wide
// object). `value` is at most kMaxJsonDepth deep.
YAML::Node JsonToYaml(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object: {
      YAML::Node node(YAML::NodeType::Map);
      for (auto it = value.begin(); it != value.end(); ++it) {
        node.force_insert(it.key(), JsonToYaml(it.value()));
      }
      return node;
    }
    case nlohmann::json::value_t::array: {
      YAML::Node node(YAML::NodeType::Sequence);
      for (const auto& item : value) node.push_back(JsonToYaml(item));
      return node;
    }
    case nlohmann::json::value_t::string: {
      YAML::Node node(value.get<std::string>());
      node.SetTag(kQuotedTag);
      return node;
    }
    case nlohmann::json::value_t::null:
      return YAML::Node(YAML::NodeType::Null);
    default:
      return YAML::Node(value.dump());
  }
}

std::string NormalizeKey(std::string key) {
  std::replace(key.begin(), key.end(), '-', '_');
  return absl::AsciiStrToLower(key);
}

bool AllOf(absl::string_view text, const char* digits) {
  return !text.empty() && text.find_first_not_of(digits) == absl::string_view::npos;
}

// YAML 1.2 core schema: [-+]?[0-9]+, 0o[0-7]+, 0x[0-9a-fA-F]+.
bool IsYamlInteger(absl::string_view text) {
  if (absl::StartsWith(text, "0o")) return AllOf(text.substr(2), "01234567");
  if (absl::StartsWith(text, "0x")) return AllOf(text.substr(2), "0123456789abcdefABCDEF");
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) text.remove_prefix(1);
  return AllOf(text, "0123456789");
}

// YAML 1.2 core schema: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?.
bool IsYamlFloat(absl::string_view text) {
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) text.remove_prefix(1);
  const size_t e = text.find_first_of("eE");
  absl::string_view mantissa = text.substr(0, e);
  if (e != absl::string_view::npos) {
    absl::string_view exponent = text.substr(e + 1);
    if (!exponent.empty() && (exponent[0] == '-' || exponent[0] == '+')) exponent.remove_prefix(1);
    if (!AllOf(exponent, "0123456789")) return false;
  }
  const size_t dot = mantissa.find('.');
  if (dot == absl::string_view::npos) return AllOf(mantissa, "0123456789");
  const absl::string_view whole = mantissa.substr(0, dot);
  const absl::string_view fraction = mantissa.substr(dot + 1);
  if (whole.empty()) return AllOf(fraction, "0123456789");
  return AllOf(whole, "0123456789") && (fraction.empty() || AllOf(fraction, "0123456789"));
}

bool IsYamlInfinityOrNan(absl::string_view text) {
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) text.remove_prefix(1);
  for (const char* name : {".inf", ".Inf", ".INF", ".nan", ".NaN", ".NAN"}) {
    if (text == name) return true;
  }
  return false;
}

class Walker {
 public:
  Walker(std::string source, std::string base_dir)
      : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

  // "job.yaml:12: training.config_file": where `node` is, for messages.
  std::string Where(const YAML::Node& node, const std::string& path) const {
    std::string where = source_;
    const YAML::Mark mark = node.Mark();
    if (mark.line >= 0) absl::StrAppend(&where, ":", mark.line + 1);
    if (!path.empty()) absl::StrAppend(&where, ": ", path);
    return where;
  }

  absl::Status Error(const YAML::Node& node, const std::string& path, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(Where(node, path), ": ", what));
  }

  // The text of a scalar, or of a sequence of scalars joined by commas when `list` allows it.
  absl::StatusOr<std::string> ValueText(const YAML::Node& node, const std::string& path,
                                        bool list) {
    if (node.IsScalar()) return node.Scalar();
    if (list && node.IsSequence()) {
      std::vector<std::string> parts;
      for (const YAML::Node& item : node) {
        if (!item.IsScalar()) return Error(item, path, "list entries must be plain values");
        parts.push_back(item.Scalar());
      }
      if (parts.empty()) return Error(node, path, "the list is empty");
      return absl::StrJoin(parts, ",");
    }
    if (node.IsNull()) return Error(node, path, "has no value");
    return Error(node, path,
                 list ? "must be a list of integers like [2048, 4096]"
                      : "must be a single value, not a list or mapping");
  }

  // Applies the document's top level, and the one section it may have, to `options`.
  absl::Status ApplyDocument(const YAML::Node& root, SubmitOptions* options) {
    absl::Status status = Apply(root, kTopLevel, options);
    if (!status.ok()) return status;
    if (sections_.size() > 1) {
      return Error(
          sections_[1].second, sections_[1].first,
          absl::StrCat("the file has both ", sections_[0].first, ": and ", sections_[1].first,
                       ": sections, but a job is one kind of work: keep one"));
    }
    if (kind_.has_value()) {
      if (!sections_.empty() && sections_[0].first != JobKindName(*kind_)) {
        return Error(kind_node_, "kind",
                     absl::StrCat("'", JobKindName(*kind_), "' but the file has a ",
                                  sections_[0].first, ": section"));
      }
      options->kind = *kind_;
      options->kind_source = absl::StrCat("kind: ", JobKindName(*kind_), " in ", source_);
    } else if (!sections_.empty()) {
      options->kind = sections_[0].first == "training" ? JobKind::kTraining : JobKind::kAttention;
      options->kind_source = absl::StrCat(sections_[0].first, ": in ", source_);
    }
    return absl::OkStatus();
  }

 private:
  // Applies every key of `map` (the top level, or the attention or training section) to `options`.
  absl::Status Apply(const YAML::Node& map, unsigned section, SubmitOptions* options) {
    const std::string prefix = section == kAttentionSection  ? "attention."
                               : section == kTrainingSection ? "training."
                                                             : "";
    bool have_config = false;       // training.config
    bool have_config_file = false;  // training.config_file
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string raw_key = it->first.as<std::string>();
      const std::string key = NormalizeKey(raw_key);
      const std::string path = prefix + raw_key;
      // A copy (a handle): `it->second` lives in a proxy that dies with this statement, and a
      // reference to it dangled (AddressSanitizer: stack-use-after-scope).
      const YAML::Node value = it->second;
      if (section == kTopLevel && (key == "attention" || key == "training")) {
        if (!value.IsMap()) {
          return Error(value, path,
                       key == "attention"
                           ? "must be a mapping of attention settings (seq_len: ..., ...)"
                           : "must be a mapping of training settings (config: ..., "
                             "data_parallel: ..., ...)");
        }
        sections_.emplace_back(key, value);
        absl::Status status =
            Apply(value, key == "attention" ? kAttentionSection : kTrainingSection, options);
        if (!status.ok()) return status;
        continue;
      }
      if (section == kTopLevel && key == "kind") {
        absl::StatusOr<std::string> kind = ValueText(value, path, false);
        if (!kind.ok()) return kind.status();
        const std::string name = absl::AsciiStrToLower(*kind);
        if (name != "attention" && name != "training") {
          return Error(value, path,
                       absl::StrCat("'", *kind, "' is not a job kind this CLI submits",
                                    DidYouMean(Suggest(name, {"attention", "training"})),
                                    ": use attention or training"));
        }
        kind_ = name == "training" ? JobKind::kTraining : JobKind::kAttention;
        kind_node_ = value;
        continue;
      }
      const bool config_key = section == kTrainingSection && key == "config";
      const bool config_file_key = section == kTrainingSection && key == "config_file";
      if ((config_key && have_config_file) || (config_file_key && have_config)) {
        return Error(value, path,
                     "config and config_file both give the trainer config: keep one (config: "
                     "the config itself, config_file: a JSON file of it)");
      }
      if (config_key) {
        if (!value.IsMap()) {
          return Error(value, path,
                       "must be a mapping: the trainer config itself (model: ..., data: ..., "
                       "steps: ...); a JSON file of it goes in config_file");
        }
        absl::StatusOr<std::string> json = ConfigJson(value, path);
        if (!json.ok()) return json.status();
        options->train_config = TrainingConfigSource{*std::move(json), "", Where(value, path)};
        have_config = true;
        continue;
      }
      const SubmitField* field = nullptr;
      for (const SubmitField& f : SubmitFields()) {
        if (f.key == key && (f.sections & section) != 0) field = &f;
      }
      if (field == nullptr) return UnknownKey(it->first, path, key, section);
      absl::StatusOr<std::string> text = ValueText(value, path, field->is_list);
      if (!text.ok()) return text.status();
      if (config_file_key && !text->empty() && (*text)[0] != '/' && !base_dir_.empty()) {
        // Relative to the job file, wherever `dattn submit` runs.
        *text = absl::StrCat(base_dir_, absl::EndsWith(base_dir_, "/") ? "" : "/", *text);
      }
      absl::Status status = field->set(*text, options);
      if (!status.ok()) return Error(value, path, std::string(status.message()));
      if (config_file_key) {
        options->train_config->origin = Where(value, path);
        have_config_file = true;
      }
    }
    return absl::OkStatus();
  }

  // What the key `key` found in `section` is not, with the keys that section takes.
  absl::Status UnknownKey(const YAML::Node& node, const std::string& path, const std::string& key,
                          unsigned section) {
    std::vector<std::string> keys;
    if (section == kTopLevel) keys = {"kind", "attention", "training"};
    if (section == kTrainingSection) keys = {"config"};
    unsigned belongs = 0;  // The sections where `key` is a setting.
    if (key == "kind" || key == "attention" || key == "training") belongs = kTopLevel;
    if (key == "config") belongs = kTrainingSection;
    for (const SubmitField& f : SubmitFields()) {
      if ((f.sections & section) != 0) keys.push_back(f.key);
      if (f.key == key) belongs = f.sections;
    }
    // A setting placed at the wrong level is a common slip: say where it belongs.
    if (belongs != 0) {
      std::vector<std::string> where;
      if (belongs & kTopLevel) where.push_back("at the top level");
      if (belongs & kAttentionSection) where.push_back("under attention:");
      if (belongs & kTrainingSection) where.push_back("under training:");
      std::string message = absl::StrCat("'", key, "' belongs ", absl::StrJoin(where, " or "));
      if (section == kAttentionSection) absl::StrAppend(&message, ", not under attention:");
      if (section == kTrainingSection) absl::StrAppend(&message, ", not under training:");
      return Error(node, path, message);
    }
    return Error(node, path,
                 absl::StrCat("unknown key", DidYouMean(Suggest(key, keys)), "; the keys here are ",
                              absl::StrJoin(keys, ", ")));
  }

  // The trainer config written as a mapping, as compact JSON text (keys in the file's order).
  absl::StatusOr<std::string> ConfigJson(const YAML::Node& node, const std::string& path) {
    std::string json;
    int64_t values = 0;
    absl::Status status = AppendJson(node, path, 1, &values, &json);
    if (!status.ok()) return status;
    return json;
  }

  // Appends `node` as JSON to `out`. Written as text rather than built as a JSON value: a mapping
  // of many keys is then linear to convert (nlohmann's ordered objects look every key up in a
  // list), and the bounds below see the size as it grows.
  absl::Status AppendJson(const YAML::Node& node, const std::string& path, int depth,
                          int64_t* values, std::string* out) {
    if (depth > kMaxJsonDepth) {
      return Error(
          node, path,
          absl::StrCat("the trainer config is nested more than ", kMaxJsonDepth, " levels deep"));
    }
    if (++*values > kMaxConfigValues || static_cast<int64_t>(out->size()) > kMaxConfigJsonBytes) {
      return Error(node, path,
                   absl::StrCat("the trainer config grows past ", kMaxConfigValues,
                                " values or 1 MiB of JSON (YAML aliases repeated?); the "
                                "coordinator takes at most 16 KiB"));
    }
    switch (node.Type()) {
      case YAML::NodeType::Null:
        out->append("null");
        return absl::OkStatus();
      case YAML::NodeType::Scalar: {
        absl::StatusOr<nlohmann::json> value = ScalarToJson(node, path);
        if (!value.ok()) return value.status();
        return AppendDump(*value, node, path, out);
      }
      case YAML::NodeType::Sequence: {
        out->push_back('[');
        size_t i = 0;
        for (const YAML::Node& item : node) {
          if (i > 0) out->push_back(',');
          absl::Status status =
              AppendJson(item, absl::StrCat(path, "[", i++, "]"), depth + 1, values, out);
          if (!status.ok()) return status;
        }
        out->push_back(']');
        return absl::OkStatus();
      }
      case YAML::NodeType::Map: {
        out->push_back('{');
        absl::flat_hash_set<std::string> keys;
        for (auto it = node.begin(); it != node.end(); ++it) {
          const YAML::Node key_node = it->first;
          const YAML::Node value = it->second;
          if (!key_node.IsScalar()) {
            return Error(key_node, path, "keys must be names, not lists or mappings");
          }
          const std::string& key = key_node.Scalar();
          const std::string key_path = absl::StrCat(path, ".", key);
          if (!keys.insert(key).second) return Error(key_node, key_path, "the key appears twice");
          if (keys.size() > 1) out->push_back(',');
          absl::Status status = AppendDump(nlohmann::json(key), key_node, key_path, out);
          if (!status.ok()) return status;
          out->push_back(':');
          status = AppendJson(value, key_path, depth + 1, values, out);
          if (!status.ok()) return status;
        }
        out->push_back('}');
        return absl::OkStatus();
      }
      default:
        return Error(node, path, "has no value");
    }
  }

  // Appends a scalar's JSON text (a string quoted and escaped).
  absl::Status AppendDump(const nlohmann::json& value, const YAML::Node& node,
                          const std::string& path, std::string* out) {
    try {
      out->append(value.dump());
    } catch (const nlohmann::json::exception&) {
      // JSON text is UTF-8; YAML does not check that its scalars are.
      return Error(node, path, "is not valid UTF-8 text");
    }
    return absl::OkStatus();
  }

  // A scalar of the trainer config as JSON: a quoted scalar (or !!str) is a string; a plain one is
  // null, a boolean, an integer or a number where YAML 1.2's core schema says so (null, ~, true,
  // False, 42, 0x2a, 3e-4, ...), else a string.
  absl::StatusOr<nlohmann::json> ScalarToJson(const YAML::Node& node, const std::string& path) {
    const std::string& tag = node.Tag();
    const std::string& text = node.Scalar();
    if (tag == kQuotedTag || tag == "tag:yaml.org,2002:str") return nlohmann::json(text);
    if (tag != "?" && !tag.empty()) {
      return Error(node, path,
                   absl::StrCat("the YAML tag '", tag,
                                "' is not supported in a trainer config: write the value plainly, "
                                "or quoted for a string"));
    }
    if (text == "null" || text == "Null" || text == "NULL" || text == "~" || text.empty()) {
      return nlohmann::json(nullptr);
    }
    if (text == "true" || text == "True" || text == "TRUE") return nlohmann::json(true);
    if (text == "false" || text == "False" || text == "FALSE") return nlohmann::json(false);
    if (IsYamlInteger(text)) {
      const bool octal = absl::StartsWith(text, "0o");
      const bool hex = absl::StartsWith(text, "0x");
      int64_t signed_value = 0;
      uint64_t unsigned_value = 0;
      if (!octal && !hex && absl::SimpleAtoi(text, &signed_value)) {
        return nlohmann::json(signed_value);
      }
      if (!octal && !hex && text[0] != '-' && absl::SimpleAtoi(text, &unsigned_value)) {
        return nlohmann::json(unsigned_value);
      }
      if (octal || hex) {
        errno = 0;
        char* end = nullptr;
        unsigned_value = std::strtoull(text.c_str() + 2, &end, octal ? 8 : 16);
        if (errno == 0 && end == text.c_str() + text.size()) {
          return nlohmann::json(unsigned_value);
        }
      }
      return Error(node, path,
                   absl::StrCat("the integer ", text,
                                " is out of range (-2^63 .. 2^64-1); quote it for a string"));
    }
    if (IsYamlInfinityOrNan(text)) {
      return Error(node, path,
                   absl::StrCat(text, " is not a finite number, and JSON has no infinity or NaN"));
    }
    if (IsYamlFloat(text)) {
      double value = 0;
      const std::string unsigned_text = text[0] == '+' ? text.substr(1) : text;
      if (!absl::SimpleAtod(unsigned_text, &value) || !std::isfinite(value)) {
        return Error(node, path, absl::StrCat("the number ", text, " is out of range"));
      }
      return nlohmann::json(value);
    }
    return nlohmann::json(text);
  }

  const std::string source_;
  const std::string base_dir_;
  // What the top level held: its sections, in order ("attention" or "training", and the node), and
  // its `kind:`.
  std::vector<std::pair<std::string, YAML::Node>> sections_;
  std::optional<JobKind> kind_;
  YAML::Node kind_node_;
};

}  // namespace

absl::StatusOr<SubmitOptions> ParseJobFile(const std::string& text, const std::string& source,
                                           bool json, const std::string& base_dir) {
  YAML::Node root;
  if (json) {
    nlohmann::json document;
    try {
      document = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
    }
    if (JsonDepth(document, kMaxJsonDepth) > kMaxJsonDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": nested more than ", kMaxJsonDepth,
                       " levels deep; a job file has 3 (the top level, attention:, a list), a "
                       "training job's file under 10 (its trainer config's own nesting)"));
    }
    root = JsonToYaml(document);
  } else {
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": not valid YAML: ", e.msg));
    }
  }
  if (root.IsNull()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the job file is empty"));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": a job file is a mapping of settings (name: ..., attention: {...} or training: {...}), "
        "not a ",
        root.IsSequence() ? "list" : "single value"));
  }
  SubmitOptions options;
  Walker walker(source, base_dir);
  try {
    absl::Status status = walker.ApplyDocument(root, &options);
    if (!status.ok()) return status;
  } catch (const YAML::Exception& e) {
    // Non-scalar keys ({a: 1}: 2) are the only way to get here.
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ": ", e.msg));
  }
  return options;
}

absl::StatusOr<SubmitOptions> ReadJobFile(const std::string& path) {
  const std::string limit = absl::StrCat("job files may be at most 1 MiB (", kMaxJobFileBytes,
                                         " bytes): --file takes the job's settings, not data");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("job file '", path, "' is a directory: --file takes a YAML or JSON file"));
    }
    if (S_ISREG(st.st_mode) && st.st_size > kMaxJobFileBytes) {
      return absl::InvalidArgumentError(absl::StrCat("job file '", path, "' is ", st.st_size,
                                                     " bytes (", FormatBytes(st.st_size), "); ",
                                                     limit));
    }
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read job file '", path, "': check the path given to --file"));
  }
  // Read one byte past the limit: a file that grew since the stat, or a pipe, is caught here.
  std::string text(static_cast<size_t>(kMaxJobFileBytes) + 1, '\0');
  in.read(&text[0], static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<int64_t>(text.size()) > kMaxJobFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job file '", path, "' is more than ", kMaxJobFileBytes, " bytes; ", limit));
  }
  const bool json = absl::EndsWithIgnoreCase(path, ".json");
  const size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  return ParseJobFile(text, path, json, folder);
}

}  // namespace client
}  // namespace dattn
