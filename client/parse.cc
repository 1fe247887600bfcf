#include "client/parse.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/suggest.h"

namespace dattn {
namespace client {
namespace {

// Lower case, '_' -> '-', surrounding whitespace removed: the form names are compared in.
std::string NormalizeName(const std::string& text) {
  std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

template <typename Enum>
struct NamedValue {
  const char* name;
  Enum value;
};

// Looks `text` up in `names`; the error lists `choices` (the canonical spellings).
template <typename Enum, size_t N>
absl::StatusOr<Enum> ParseNamed(const std::string& text, const NamedValue<Enum> (&names)[N],
                                const char* choices) {
  const std::string name = NormalizeName(text);
  std::vector<std::string> known;
  for (const auto& entry : names) {
    if (name == entry.name) return entry.value;
    known.push_back(entry.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not one of ", choices, DidYouMean(Suggest(name, known))));
}

}  // namespace

absl::StatusOr<int64_t> ParseInt(const std::string& text, int64_t min, int64_t max) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not an integer"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is out of range: must be ", min, " .. ", max));
  }
  return value;
}

absl::StatusOr<uint64_t> ParseUint64(const std::string& text) {
  uint64_t value = 0;
  // SimpleAtoi would accept "-1" for an unsigned type on some versions; refuse a sign explicitly.
  if (absl::StrContains(text, '-') || !absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a non-negative integer (0 .. 18446744073709551615)"));
  }
  return value;
}

absl::StatusOr<std::vector<int64_t>> ParseIntList(const std::string& text, int64_t min,
                                                  int64_t max) {
  std::vector<int64_t> values;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("the list is empty: give comma-separated integers");
  }
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    const std::string entry(absl::StripAsciiWhitespace(part));
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "empty entry in '", text, "': give comma-separated integers like 2048,4096"));
    }
    int64_t value = 0;
    if (!absl::SimpleAtoi(entry, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", entry, "' is not an integer (in '", text, "')"));
    }
    if (value < min || value > max) {
      return absl::InvalidArgumentError(absl::StrCat("'", entry, "' is out of range (in '", text,
                                                     "'): every entry must be ", min, " .. ", max));
    }
    values.push_back(value);
  }
  return values;
}

absl::StatusOr<double> ParsePositiveDouble(const std::string& text) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a number"));
  }
  if (!std::isfinite(value) || value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' must be a finite number > 0"));
  }
  return value;
}

absl::StatusOr<bool> ParseBool(const std::string& text) {
  static const NamedValue<bool> kNames[] = {{"true", true}, {"yes", true},    {"on", true},
                                            {"1", true},    {"false", false}, {"no", false},
                                            {"off", false}, {"0", false}};
  return ParseNamed(text, kNames, "true, false");
}

absl::StatusOr<v1::DType> ParseDType(const std::string& text) {
  static const NamedValue<v1::DType> kNames[] = {
      {"fp16", v1::DTYPE_FP16},    {"float16", v1::DTYPE_FP16},  {"half", v1::DTYPE_FP16},
      {"bf16", v1::DTYPE_BF16},    {"bfloat16", v1::DTYPE_BF16}, {"fp32", v1::DTYPE_FP32},
      {"float32", v1::DTYPE_FP32}, {"float", v1::DTYPE_FP32},    {"fp64", v1::DTYPE_FP64},
      {"float64", v1::DTYPE_FP64}, {"double", v1::DTYPE_FP64}};
  return ParseNamed(text, kNames, "fp16, bf16, fp32, fp64");
}

absl::StatusOr<v1::AttentionMode> ParseMode(const std::string& text) {
  static const NamedValue<v1::AttentionMode> kNames[] = {{"grouped", v1::ATTENTION_MODE_GROUPED},
                                                         {"mixture", v1::ATTENTION_MODE_MIXTURE}};
  return ParseNamed(text, kNames, "grouped, mixture");
}

absl::StatusOr<v1::HeadOffsets> ParseHeadOffsets(const std::string& text) {
  static const NamedValue<v1::HeadOffsets> kNames[] = {{"modulo", v1::HEAD_OFFSETS_MODULO},
                                                       {"blocked", v1::HEAD_OFFSETS_BLOCKED}};
  return ParseNamed(text, kNames, "modulo, blocked");
}

absl::StatusOr<v1::Pass> ParsePass(const std::string& text) {
  static const NamedValue<v1::Pass> kNames[] = {{"fwd", v1::PASS_FORWARD},
                                                {"forward", v1::PASS_FORWARD},
                                                {"fwd-bwd", v1::PASS_FORWARD_BACKWARD},
                                                {"forward-backward", v1::PASS_FORWARD_BACKWARD}};
  return ParseNamed(text, kNames, "fwd, fwd-bwd");
}

absl::StatusOr<v1::DevicePreference> ParseDevice(const std::string& text) {
  static const NamedValue<v1::DevicePreference> kNames[] = {{"any", v1::DEVICE_PREFERENCE_ANY},
                                                            {"cpu", v1::DEVICE_PREFERENCE_CPU},
                                                            {"gpu", v1::DEVICE_PREFERENCE_GPU}};
  return ParseNamed(text, kNames, "any, cpu, gpu");
}

absl::StatusOr<ModelRef> ParseModelRef(const std::string& text) {
  ModelRef ref;
  const size_t colon = text.rfind(':');
  ref.name = text.substr(0, colon);
  if (ref.name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" names no model (NAME or NAME:VERSION)"));
  }
  if (colon != std::string::npos) {
    absl::StatusOr<int64_t> version = ParseInt(text.substr(colon + 1), 1, INT64_MAX);
    if (!version.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", text, "\": the version after ':' ", version.status().message()));
    }
    ref.version = *version;
  }
  return ref;
}

absl::StatusOr<std::vector<v1::JobState>> ParseJobStates(const std::string& text) {
  static const NamedValue<int> kNames[] = {
      {"queued", 1 << v1::JOB_STATE_QUEUED},
      {"placed", 1 << v1::JOB_STATE_PLACED},
      {"running", 1 << v1::JOB_STATE_RUNNING},
      {"succeeded", 1 << v1::JOB_STATE_SUCCEEDED},
      {"failed", 1 << v1::JOB_STATE_FAILED},
      {"cancelled", 1 << v1::JOB_STATE_CANCELLED},
      {"canceled", 1 << v1::JOB_STATE_CANCELLED},
      {"active",
       (1 << v1::JOB_STATE_QUEUED) | (1 << v1::JOB_STATE_PLACED) | (1 << v1::JOB_STATE_RUNNING)},
      {"ended", (1 << v1::JOB_STATE_SUCCEEDED) | (1 << v1::JOB_STATE_FAILED) |
                    (1 << v1::JOB_STATE_CANCELLED)}};
  int mask = 0;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    const std::string normalized = NormalizeName(std::string(part));
    absl::string_view name = normalized;
    // Accept the enum's own spelling too ("JOB_STATE_RUNNING"), as printed by --json.
    absl::ConsumePrefix(&name, "job-state-");
    absl::StatusOr<int> bits = ParseNamed(std::string(name), kNames,
                                          "queued, placed, running, succeeded, failed, cancelled, "
                                          "active, ended");
    if (!bits.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", std::string(absl::StripAsciiWhitespace(part)), "' is not a job state",
                       DidYouMean(Suggest(name, {"queued", "placed", "running", "succeeded",
                                                 "failed", "cancelled", "active", "ended"})),
                       ": use queued, placed, running, succeeded, failed, cancelled, active or "
                       "ended (comma-separated)"));
    }
    mask |= *bits;
  }
  std::vector<v1::JobState> states;
  for (int s = v1::JOB_STATE_QUEUED; s <= v1::JOB_STATE_CANCELLED; ++s) {
    if (mask & (1 << s)) states.push_back(static_cast<v1::JobState>(s));
  }
  return states;
}

}  // namespace client
}  // namespace dattn
