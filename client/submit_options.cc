#include "client/submit_options.h"

#include <cstdio>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/parse.h"

namespace dattn {
namespace client {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();

using Setter = std::function<absl::Status(const std::string&, SubmitOptions*)>;

// Setters built from a parser and the member it fills; each keeps the parser's error message.
template <typename T, typename Parse>
Setter Set(std::optional<T> SubmitOptions::*member, Parse parse) {
  return [member, parse](const std::string& text, SubmitOptions* options) -> absl::Status {
    auto value = parse(text);
    if (!value.ok()) return value.status();
    options->*member = static_cast<T>(*value);
    return absl::OkStatus();
  };
}

Setter SetText(std::optional<std::string> SubmitOptions::*member) {
  return [member](const std::string& text, SubmitOptions* options) {
    options->*member = text;
    return absl::OkStatus();
  };
}

template <typename T>
Setter SetInt(std::optional<T> SubmitOptions::*member, int64_t min, int64_t max) {
  return Set(member, [min, max](const std::string& text) { return ParseInt(text, min, max); });
}

Setter SetList(std::optional<std::vector<int64_t>> SubmitOptions::*member) {
  return Set(member, [](const std::string& text) { return ParseIntList(text, 1, kInt64Max); });
}

std::string ListText(const std::vector<int64_t>& values) { return absl::StrJoin(values, ","); }

}  // namespace

const std::vector<SubmitField>& SubmitFields() {
  // clang-format off
  static const std::vector<SubmitField>* const kFields = new std::vector<SubmitField>{
      {"--name", "", "name", false, false, false, "TEXT",
       "Label shown by `dattn list` (at most 128 characters)", SetText(&SubmitOptions::name)},
      {"--tenant", "", "tenant", false, false, false, "NAME",
       "Owner for per-tenant fairness ([A-Za-z0-9._-], at most 64; default \"default\")",
       SetText(&SubmitOptions::tenant)},
      {"--priority", "", "priority", false, false, false, "INT",
       "Higher runs first, -100 .. 100 (default 0)",
       SetInt(&SubmitOptions::priority, kInt32Min, kInt32Max)},
      {"--idempotency-key", "", "idempotency_key", false, false, false, "KEY",
       "Resubmitting with the same key returns the first job (default: a random UUID, printed)",
       SetText(&SubmitOptions::idempotency_key)},
      {"--seq-len", "-n", "seq_len", true, false, false, "N",
       "Sequence length N (required; the number of ranks must divide it)",
       SetInt(&SubmitOptions::seq_len, 1, kInt64Max)},
      {"--batch", "", "batch", true, false, false, "B", "Batch size (default 1)",
       SetInt(&SubmitOptions::batch, 1, kInt64Max)},
      {"--heads", "", "heads", true, false, false, "H", "Number of heads (required)",
       SetInt(&SubmitOptions::heads, 1, kInt64Max)},
      {"--head-dim", "", "head_dim", true, false, false, "D", "Head dimension (required)",
       SetInt(&SubmitOptions::head_dim, 1, kInt64Max)},
      {"--segments", "", "segments", true, false, true, "LIST",
       "Segment lengths w_i, comma-separated, e.g. 2048,4096 (required)",
       SetList(&SubmitOptions::segments)},
      {"--rates", "", "rates", true, false, true, "LIST",
       "Dilation rates r_i, one per segment length, e.g. 1,2 (required)",
       SetList(&SubmitOptions::rates)},
      {"--mode", "", "mode", true, false, false, "MODE",
       "grouped (heads split across patterns) or mixture (LongNet); default grouped",
       Set(&SubmitOptions::mode, ParseMode)},
      {"--head-offsets", "", "head_offsets", true, false, false, "RULE",
       "modulo or blocked (mixture mode only); default: the server's (modulo)",
       Set(&SubmitOptions::head_offsets, ParseHeadOffsets)},
      {"--causal", "", "causal", true, true, false, "",
       "Causal inside each dilated segment (row j sees selected keys 0..j)",
       Set(&SubmitOptions::causal, ParseBool)},
      {"--scale", "", "scale", true, false, false, "X",
       "Softmax scale, finite and > 0 (default 1/sqrt(head_dim))",
       Set(&SubmitOptions::scale, ParsePositiveDouble)},
      {"--dtype", "", "dtype", true, false, false, "TYPE", "fp32, fp64, fp16 or bf16 (default fp32)",
       Set(&SubmitOptions::dtype, ParseDType)},
      {"--ranks", "", "ranks", true, false, false, "P",
       "Ranks of the sequence-parallel ring (default 1)",
       SetInt(&SubmitOptions::ranks, 1, kInt32Max)},
      {"--pass", "", "pass", true, false, false, "PASS", "fwd or fwd-bwd (default fwd)",
       Set(&SubmitOptions::pass, ParsePass)},
      {"--iterations", "", "iterations", true, false, false, "N",
       "Engine steps to run, 1 .. 1000000 (default 1)",
       SetInt(&SubmitOptions::iterations, 1, kInt32Max)},
      {"--seed", "", "seed", true, false, false, "S", "Seed of the generated q, k, v (default 0)",
       Set(&SubmitOptions::seed, ParseUint64)},
      {"--return-output", "", "return_output", true, true, false, "",
       "Return the output tensor (at most 64 MiB) in the result",
       Set(&SubmitOptions::return_output, ParseBool)},
      {"--device", "", "device", true, false, false, "KIND", "any, cpu or gpu (default any)",
       Set(&SubmitOptions::device, ParseDevice)},
  };
  // clang-format on
  return *kFields;
}

void MergeSubmitOptions(const SubmitOptions& over, SubmitOptions* base) {
#define DATTN_MERGE(field) \
  if (over.field.has_value()) base->field = over.field
  DATTN_MERGE(name);
  DATTN_MERGE(tenant);
  DATTN_MERGE(priority);
  DATTN_MERGE(idempotency_key);
  DATTN_MERGE(seq_len);
  DATTN_MERGE(batch);
  DATTN_MERGE(heads);
  DATTN_MERGE(head_dim);
  DATTN_MERGE(segments);
  DATTN_MERGE(rates);
  DATTN_MERGE(mode);
  DATTN_MERGE(head_offsets);
  DATTN_MERGE(causal);
  DATTN_MERGE(scale);
  DATTN_MERGE(dtype);
  DATTN_MERGE(ranks);
  DATTN_MERGE(pass);
  DATTN_MERGE(iterations);
  DATTN_MERGE(seed);
  DATTN_MERGE(return_output);
  DATTN_MERGE(device);
#undef DATTN_MERGE
}

absl::StatusOr<v1::JobSpec> BuildJobSpec(const SubmitOptions& o) {
  std::vector<std::string> missing;
  if (!o.seq_len) missing.push_back("--seq-len (seq_len)");
  if (!o.heads) missing.push_back("--heads (heads)");
  if (!o.head_dim) missing.push_back("--head-dim (head_dim)");
  if (!o.segments) missing.push_back("--segments (segments)");
  if (!o.rates) missing.push_back("--rates (rates)");
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing ", absl::StrJoin(missing, ", "),
                     ": give each as a flag or under `attention:` in the --file job file"));
  }
  if (o.segments->size() != o.rates->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--segments has ", o.segments->size(), " value(s) (", ListText(*o.segments),
                     ") but --rates has ", o.rates->size(), " (", ListText(*o.rates),
                     "): give exactly one dilation rate per segment length"));
  }

  v1::JobSpec spec;
  spec.set_name(o.name.value_or(""));
  spec.set_tenant(o.tenant.value_or(""));
  spec.set_priority(o.priority.value_or(0));
  v1::AttentionJobSpec* job = spec.mutable_attention();
  v1::AttentionSpec* attention = job->mutable_attention();
  for (int64_t w : *o.segments) attention->add_segment_lengths(w);
  for (int64_t r : *o.rates) attention->add_dilation_rates(r);
  if (o.scale) attention->set_scale(*o.scale);
  attention->set_causal(o.causal.value_or(false));
  attention->set_mode(o.mode.value_or(v1::ATTENTION_MODE_GROUPED));
  attention->set_head_offsets(o.head_offsets.value_or(v1::HEAD_OFFSETS_UNSPECIFIED));
  v1::TensorShape* shape = job->mutable_shape();
  shape->set_batch(o.batch.value_or(1));
  shape->set_seq_len(*o.seq_len);
  shape->set_num_heads(*o.heads);
  shape->set_head_dim(*o.head_dim);
  job->set_dtype(o.dtype.value_or(v1::DTYPE_FP32));
  job->set_num_ranks(o.ranks.value_or(1));
  job->set_pass(o.pass.value_or(v1::PASS_FORWARD));
  job->set_iterations(o.iterations.value_or(1));
  job->set_seed(o.seed.value_or(0));
  job->set_return_output(o.return_output.value_or(false));
  job->set_device(o.device.value_or(v1::DEVICE_PREFERENCE_ANY));
  return spec;
}

std::string RandomIdempotencyKey() {
  std::random_device device;
  std::mt19937_64 rng((static_cast<uint64_t>(device()) << 32) ^ device());
  uint64_t hi = rng();
  uint64_t lo = rng();
  hi = (hi & ~0xF000ULL) | 0x4000ULL;              // Version 4.
  lo = (lo & ~(0xC0ULL << 56)) | (0x80ULL << 56);  // RFC 4122 variant.
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", hi >> 32, (hi >> 16) & 0xFFFF, hi & 0xFFFF,
                         lo >> 48, lo & 0xFFFFFFFFFFFFULL);
}

}  // namespace client
}  // namespace dattn
