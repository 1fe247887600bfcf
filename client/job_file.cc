#include "client/job_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/format.h"
#include "client/suggest.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

namespace dattn {
namespace client {
namespace {

// A job file is three levels deep (the top level, attention:, a list). A JSON document is converted
// recursively, so one nested deeper than this is refused first: 300,000 '[' (600 KB, under the
// 1 MiB limit) exhausted the stack, and a few thousand took seconds.
constexpr int kMaxJsonDepth = 32;

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

// JSON documents are converted to a YAML tree so that one walker checks both formats. Numbers and
// booleans keep their JSON spelling as the scalar text, which the settings' parsers then read.
// `value` is at most kMaxJsonDepth deep.
YAML::Node JsonToYaml(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object: {
      YAML::Node node(YAML::NodeType::Map);
      for (auto it = value.begin(); it != value.end(); ++it)
        node[it.key()] = JsonToYaml(it.value());
      return node;
    }
    case nlohmann::json::value_t::array: {
      YAML::Node node(YAML::NodeType::Sequence);
      for (const auto& item : value) node.push_back(JsonToYaml(item));
      return node;
    }
    case nlohmann::json::value_t::string:
      return YAML::Node(value.get<std::string>());
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

class Walker {
 public:
  explicit Walker(std::string source) : source_(std::move(source)) {}

  absl::Status Error(const YAML::Node& node, const std::string& path, const std::string& what) {
    std::string where = source_;
    const YAML::Mark mark = node.Mark();
    if (mark.line >= 0) absl::StrAppend(&where, ":", mark.line + 1);
    if (!path.empty()) absl::StrAppend(&where, ": ", path);
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
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

  // Applies every key of `map` (the top level or the attention section) to `options`.
  absl::Status Apply(const YAML::Node& map, bool attention_section, SubmitOptions* options) {
    const std::string prefix = attention_section ? "attention." : "";
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string raw_key = it->first.as<std::string>();
      const std::string key = NormalizeKey(raw_key);
      const std::string path = prefix + raw_key;
      // A copy (a handle): `it->second` lives in a proxy that dies with this statement, and a
      // reference to it dangled (AddressSanitizer: stack-use-after-scope).
      const YAML::Node value = it->second;
      if (!attention_section && key == "attention") {
        if (!value.IsMap()) {
          return Error(value, path, "must be a mapping of attention settings (seq_len: ..., ...)");
        }
        absl::Status status = Apply(value, /*attention_section=*/true, options);
        if (!status.ok()) return status;
        continue;
      }
      if (!attention_section && key == "kind") {
        absl::StatusOr<std::string> kind = ValueText(value, path, false);
        if (!kind.ok()) return kind.status();
        if (*kind != "attention") {
          return Error(
              value, path,
              absl::StrCat("'", *kind, "' is not a job kind this CLI submits: use attention"));
        }
        continue;
      }
      const SubmitField* field = nullptr;
      for (const SubmitField& f : SubmitFields()) {
        if (f.key == key && f.in_attention == attention_section) field = &f;
      }
      if (field == nullptr) return UnknownKey(it->first, path, key, attention_section);
      absl::StatusOr<std::string> text = ValueText(value, path, field->is_list);
      if (!text.ok()) return text.status();
      absl::Status status = field->set(*text, options);
      if (!status.ok()) return Error(value, path, std::string(status.message()));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status UnknownKey(const YAML::Node& node, const std::string& path, const std::string& key,
                          bool attention_section) {
    std::vector<std::string> keys;
    if (!attention_section) keys = {"kind", "attention"};
    for (const SubmitField& f : SubmitFields()) {
      if (f.in_attention == attention_section) keys.push_back(f.key);
      // A setting placed at the wrong level is a common slip: say where it belongs.
      if (f.key == key) {
        return Error(node, path,
                     attention_section ? absl::StrCat("'", key,
                                                      "' belongs at the top level, not "
                                                      "under attention:")
                                       : absl::StrCat("'", key, "' belongs under attention:"));
      }
    }
    return Error(node, path,
                 absl::StrCat("unknown key", DidYouMean(Suggest(key, keys)), "; the keys here are ",
                              absl::StrJoin(keys, ", ")));
  }

  std::string source_;
};

}  // namespace

absl::StatusOr<SubmitOptions> ParseJobFile(const std::string& text, const std::string& source,
                                           bool json) {
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
                       " levels deep; a job file has 3 (the top level, attention:, a list)"));
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
        source, ": a job file is a mapping of settings (name: ..., attention: {...}), not a ",
        root.IsSequence() ? "list" : "single value"));
  }
  SubmitOptions options;
  Walker walker(source);
  try {
    absl::Status status = walker.Apply(root, /*attention_section=*/false, &options);
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
  return ParseJobFile(text, path, json);
}

}  // namespace client
}  // namespace dattn
