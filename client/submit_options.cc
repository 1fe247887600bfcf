#include "client/submit_options.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "api/limits.h"
#include "client/format.h"
#include "client/parse.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace client {
namespace {

// JobSpec.recovery from the settings given (unset ones stay unset: the kind's default).
void SetRecovery(const SubmitOptions& o, v1::JobSpec* spec) {
  if (o.split_batch) spec->mutable_recovery()->set_split_batch(*o.split_batch);
  if (o.more_ranks) spec->mutable_recovery()->set_more_ranks(*o.more_ranks);
  if (o.lower_precision) spec->mutable_recovery()->set_lower_precision(*o.lower_precision);
  if (o.stall_seconds) spec->mutable_recovery()->set_stall_seconds(*o.stall_seconds);
  if (o.shrink_ring) spec->mutable_recovery()->set_shrink_ring(*o.shrink_ring);
  if (o.single_device) spec->mutable_recovery()->set_single_device(*o.single_device);
}

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();

using Setter = std::function<absl::Status(const std::string&, SubmitOptions*)>;
using IsSet = std::function<bool(const SubmitOptions&)>;

// How a setting reaches its member of SubmitOptions: the setter (the parser's error message kept)
// and the test of whether it was given.
struct Binding {
  Setter set;
  IsSet is_set;
};

template <typename T, typename Parse>
Binding Bind(std::optional<T> SubmitOptions::*member, Parse parse) {
  return {[member, parse](const std::string& text, SubmitOptions* options) -> absl::Status {
            auto value = parse(text);
            if (!value.ok()) return value.status();
            options->*member = static_cast<T>(*value);
            return absl::OkStatus();
          },
          [member](const SubmitOptions& options) { return (options.*member).has_value(); }};
}

Binding BindText(std::optional<std::string> SubmitOptions::*member) {
  return Bind(member, [](const std::string& text) { return absl::StatusOr<std::string>(text); });
}

template <typename T>
Binding BindInt(std::optional<T> SubmitOptions::*member, int64_t min, int64_t max) {
  return Bind(member, [min, max](const std::string& text) { return ParseInt(text, min, max); });
}

Binding BindList(std::optional<std::vector<int64_t>> SubmitOptions::*member) {
  return Bind(member, [](const std::string& text) { return ParseIntList(text, 1, kInt64Max); });
}

// A folder as the workers see it: absolute (or empty, for none). The CLI's own working directory
// means nothing to them.
Binding BindWorkerPath(std::optional<std::string> SubmitOptions::*member) {
  return Bind(member, [](const std::string& text) -> absl::StatusOr<std::string> {
    if (!text.empty() && text[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", text,
          "' is not an absolute path: give the folder as the workers see it, on storage they "
          "share (e.g. /shared/checkpoints)"));
    }
    return text;
  });
}

Binding BindTrainingConfigFile() {
  return Bind(&SubmitOptions::train_config,
              [](const std::string& text) -> absl::StatusOr<TrainingConfigSource> {
                if (text.empty()) {
                  return absl::InvalidArgumentError(
                      "the path is empty: give the trainer config's JSON file");
                }
                return TrainingConfigSource{"", text, "--train-config"};
              });
}

SubmitField Field(std::string flag, std::string short_flag, std::string key, unsigned sections,
                  bool is_bool, bool is_list, std::string value_name, std::string help,
                  Binding binding) {
  return {std::move(flag),
          std::move(short_flag),
          std::move(key),
          sections,
          is_bool,
          is_list,
          std::move(value_name),
          std::move(help),
          std::move(binding.set),
          std::move(binding.is_set)};
}

std::string ListText(const std::vector<int64_t>& values) { return absl::StrJoin(values, ","); }

// The text of the trainer config: `source.json`, or the file `source.path`; checked to be a JSON
// object, and otherwise as it was written.
absl::StatusOr<std::string> TrainingConfigJson(const TrainingConfigSource& source) {
  std::string text = source.json;
  std::string what = absl::StrCat(source.origin, ": the trainer config");
  if (!source.path.empty()) {
    what = absl::StrCat(source.origin, ": trainer config '", source.path, "'");
    struct stat st {};
    if (::stat(source.path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " is a directory: give the trainer config's JSON file"));
      }
      if (S_ISREG(st.st_mode) && st.st_size > kMaxTrainingConfigFileBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " is ", st.st_size, " bytes (", FormatBytes(st.st_size),
            "); a trainer config is a few KiB (the coordinator takes at most 16 KiB)"));
      }
    }
    std::ifstream in(source.path, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " cannot be read: ", std::strerror(errno)));
    }
    text.assign(static_cast<size_t>(kMaxTrainingConfigFileBytes) + 1, '\0');
    in.read(&text[0], static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(text.size()) > kMaxTrainingConfigFileBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is more than ", kMaxTrainingConfigFileBytes,
                       " bytes; a trainer config is a few KiB (the coordinator takes at most "
                       "16 KiB)"));
    }
  }
  text = std::string(absl::StripAsciiWhitespace(text));
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", e.what()));
  }
  if (!document.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is a JSON ", document.type_name(),
                     ", not an object: a trainer config is {\"model\": {...}, \"data\": {...}, "
                     "\"steps\": ..., ...} (docs/TRAINING.md)"));
  }
  return text;
}

absl::StatusOr<v1::JobSpec> BuildTrainingJobSpec(const SubmitOptions& o) {
  if (!o.train_config.has_value()) {
    return absl::InvalidArgumentError(
        "missing --train-config (training.config or training.config_file): a training job needs "
        "the trainer config, the JSON object `dattn-train --config` takes");
  }
  absl::StatusOr<std::string> config = TrainingConfigJson(*o.train_config);
  if (!config.ok()) return config.status();
  v1::JobSpec spec;
  spec.set_name(o.name.value_or(""));
  spec.set_tenant(o.tenant.value_or(""));
  spec.set_priority(o.priority.value_or(0));
  SetRecovery(o, &spec);
  v1::TrainingJobSpec* job = spec.mutable_training();
  job->set_config_json(*std::move(config));
  if (o.data_parallel == 0) {
    job->set_auto_data_parallel(true);  // The coordinator picks D (data_parallel stays 0).
  } else {
    job->set_data_parallel(o.data_parallel.value_or(1));
  }
  job->set_sequence_parallel(o.sequence_parallel.value_or(1));
  job->set_device(o.device.value_or(v1::DEVICE_PREFERENCE_ANY));
  job->set_checkpoint_dir(o.checkpoint_dir.value_or(""));
  job->set_init_from(o.init_from.value_or(""));
  return spec;
}

}  // namespace

std::string JobKindName(JobKind kind) {
  return kind == JobKind::kTraining ? "training" : "attention";
}

std::string FieldName(const SubmitField& field) {
  std::vector<std::string> keys;
  if (field.sections & kTopLevel) keys.push_back(field.key);
  if (field.sections & kAttentionSection) keys.push_back("attention." + field.key);
  if (field.sections & kTrainingSection) {
    // The trainer config may also be written inline, as a mapping.
    if (field.flag == "--train-config") keys.push_back("training.config");
    keys.push_back("training." + field.key);
  }
  return absl::StrCat(field.flag, " (",
                      absl::StrJoin(keys, field.flag == "--train-config" ? " or " : ", "), ")");
}

const std::vector<SubmitField>& SubmitFields() {
  constexpr unsigned kTop = kTopLevel;
  constexpr unsigned kAtt = kAttentionSection;
  constexpr unsigned kTrain = kTrainingSection;
  // clang-format off
  static const std::vector<SubmitField>* const kFields = new std::vector<SubmitField>{
      Field("--name", "", "name", kTop, false, false, "TEXT",
            "Label shown by `dattn list` (at most 128 characters)", BindText(&SubmitOptions::name)),
      Field("--tenant", "", "tenant", kTop, false, false, "NAME",
            "Owner for per-tenant fairness ([A-Za-z0-9._-], at most 64; default \"default\")",
            BindText(&SubmitOptions::tenant)),
      Field("--priority", "", "priority", kTop, false, false, "INT",
            "Higher runs first, -100 .. 100 (default 0)",
            BindInt(&SubmitOptions::priority, kInt32Min, kInt32Max)),
      Field("--idempotency-key", "", "idempotency_key", kTop, false, false, "KEY",
            "Resubmitting with the same key returns the first job (default: a random UUID, "
            "printed)",
            BindText(&SubmitOptions::idempotency_key)),
      Field("--seq-len", "-n", "seq_len", kAtt, false, false, "N",
            "Sequence length N (required; the number of ranks must divide it)",
            BindInt(&SubmitOptions::seq_len, 1, kInt64Max)),
      Field("--batch", "", "batch", kAtt, false, false, "B", "Batch size (default 1)",
            BindInt(&SubmitOptions::batch, 1, kInt64Max)),
      Field("--heads", "", "heads", kAtt, false, false, "H", "Number of heads (required)",
            BindInt(&SubmitOptions::heads, 1, kInt64Max)),
      Field("--head-dim", "", "head_dim", kAtt, false, false, "D", "Head dimension (required)",
            BindInt(&SubmitOptions::head_dim, 1, kInt64Max)),
      Field("--segments", "", "segments", kAtt, false, true, "LIST",
            "Segment lengths w_i, comma-separated, e.g. 2048,4096 (required)",
            BindList(&SubmitOptions::segments)),
      Field("--rates", "", "rates", kAtt, false, true, "LIST",
            "Dilation rates r_i, one per segment length, e.g. 1,2 (required)",
            BindList(&SubmitOptions::rates)),
      Field("--mode", "", "mode", kAtt, false, false, "MODE",
            "grouped (heads split across patterns) or mixture (LongNet); default grouped",
            Bind(&SubmitOptions::mode, ParseMode)),
      Field("--head-offsets", "", "head_offsets", kAtt, false, false, "RULE",
            "modulo or blocked (mixture mode only); default: the server's (modulo)",
            Bind(&SubmitOptions::head_offsets, ParseHeadOffsets)),
      Field("--causal", "", "causal", kAtt, true, false, "",
            "Causal inside each dilated segment (row j sees selected keys 0..j)",
            Bind(&SubmitOptions::causal, ParseBool)),
      Field("--scale", "", "scale", kAtt, false, false, "X",
            "Softmax scale, finite and > 0 (default 1/sqrt(head_dim))",
            Bind(&SubmitOptions::scale, ParsePositiveDouble)),
      Field("--dtype", "", "dtype", kAtt, false, false, "TYPE",
            "fp32, fp64, fp16 or bf16 (default fp32)", Bind(&SubmitOptions::dtype, ParseDType)),
      Field("--ranks", "", "ranks", kAtt, false, false, "P",
            "Ranks of the sequence-parallel ring (default 1)",
            BindInt(&SubmitOptions::ranks, 1, kInt32Max)),
      Field("--pass", "", "pass", kAtt, false, false, "PASS", "fwd or fwd-bwd (default fwd)",
            Bind(&SubmitOptions::pass, ParsePass)),
      Field("--iterations", "", "iterations", kAtt, false, false, "N",
            "Engine steps to run, 1 .. 1000000 (default 1)",
            BindInt(&SubmitOptions::iterations, 1, kInt32Max)),
      Field("--seed", "", "seed", kAtt, false, false, "S",
            "Seed of the generated q, k, v (default 0)", Bind(&SubmitOptions::seed, ParseUint64)),
      Field("--return-output", "", "return_output", kAtt, true, false, "",
            "Keep the output tensor (at most 16 GiB) on the coordinator; `dattn output JOB PATH` "
            "saves it as .npy",
            Bind(&SubmitOptions::return_output, ParseBool)),
      Field("--device", "", "device", kAtt | kTrain, false, false, "KIND",
            "any, cpu or gpu (default any); attention and training jobs",
            Bind(&SubmitOptions::device, ParseDevice)),
      Field("--train-config", "", "config_file", kTrain, false, false, "FILE",
            "Trainer config: the JSON object `dattn-train --config` takes (docs/TRAINING.md); "
            "makes this a training job",
            BindTrainingConfigFile()),
      Field("--data-parallel", "", "data_parallel", kTrain, false, false, "D",
            "Data-parallel groups, each taking its rows of every batch (default 1), or auto: as "
            "many as the ready workers can hold (the coordinator picks D at submit)",
            Bind(&SubmitOptions::data_parallel,
                 [](const std::string& text) -> absl::StatusOr<int64_t> {
                   if (text == "auto") return 0;
                   return ParseInt(text, 1, kInt32Max);
                 })),
      Field("--sequence-parallel", "", "sequence_parallel", kTrain, false, false, "S",
            "Ranks sharing every sequence, a ring (default 1); D x S ranks in all",
            BindInt(&SubmitOptions::sequence_parallel, 1, kInt32Max)),
      Field("--checkpoint-dir", "", "checkpoint_dir", kTrain, false, false, "DIR",
            "Absolute folder the workers share; checkpoints go to DIR/JOB_ID/ "
            "(default: none, and a requeued job starts again)",
            BindWorkerPath(&SubmitOptions::checkpoint_dir)),
      Field("--init-from", "", "init_from", kTrain, false, false, "DIR",
            "Start from the weights of this checkpoint (absolute path)",
            BindWorkerPath(&SubmitOptions::init_from)),
      Field("--split-batch", "", "split_batch", kTop, false, false, "BOOL",
            "Out of memory as asked: may the job run in more micro-batches? (training; default "
            "true for training jobs)",
            Bind(&SubmitOptions::split_batch, ParseBool)),
      Field("--more-ranks", "", "more_ranks", kTop, false, false, "BOOL",
            "Out of memory as asked: may the job spread each sequence over more ranks? (default "
            "true for training jobs, false for attention jobs)",
            Bind(&SubmitOptions::more_ranks, ParseBool)),
      Field("--lower-precision", "", "lower_precision", kTop, false, false, "BOOL",
            "Out of memory as asked: may an fp32 attention job run in bf16 on GPUs? Changes the "
            "results (default false)",
            Bind(&SubmitOptions::lower_precision, ParseBool)),
      Field("--stall-seconds", "", "stall_seconds", kTop, false, false, "N",
            "A running job that finishes no step for N seconds is stopped and retried (default: "
            "30 minutes, or ten steps at 10 GFLOP/s when longer)",
            BindInt(&SubmitOptions::stall_seconds, 1, api::kMaxStallSeconds)),
      Field("--shrink-ring", "", "shrink_ring", kTop, false, false, "BOOL",
            "A worker lost for good: may the job continue on fewer ranks (2 or more) of the "
            "workers left? (default true for training jobs, false for attention jobs)",
            Bind(&SubmitOptions::shrink_ring, ParseBool)),
      Field("--single-device", "", "single_device", kTop, false, false, "BOOL",
            "A worker lost for good: may the job continue on one rank when no ring of the "
            "workers left holds it? (default true for training jobs, false for attention jobs)",
            Bind(&SubmitOptions::single_device, ParseBool)),
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
  DATTN_MERGE(train_config);
  DATTN_MERGE(data_parallel);
  DATTN_MERGE(sequence_parallel);
  DATTN_MERGE(checkpoint_dir);
  DATTN_MERGE(init_from);
  DATTN_MERGE(split_batch);
  DATTN_MERGE(more_ranks);
  DATTN_MERGE(lower_precision);
  DATTN_MERGE(stall_seconds);
  DATTN_MERGE(shrink_ring);
  DATTN_MERGE(single_device);
  if (over.kind.has_value()) {
    base->kind = over.kind;
    base->kind_source = over.kind_source;
  }
#undef DATTN_MERGE
}

absl::StatusOr<JobKind> JobKindOf(const SubmitOptions& o) {
  // The settings given that only one kind of job takes.
  std::vector<std::string> attention;
  std::vector<std::string> training;
  for (const SubmitField& f : SubmitFields()) {
    if (!f.is_set(o)) continue;
    if (f.sections == kAttentionSection) attention.push_back(FieldName(f));
    if (f.sections == kTrainingSection) training.push_back(FieldName(f));
  }
  if (o.kind.has_value()) {
    const JobKind other = *o.kind == JobKind::kTraining ? JobKind::kAttention : JobKind::kTraining;
    const std::vector<std::string>& wrong = other == JobKind::kAttention ? attention : training;
    if (!wrong.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          absl::StrJoin(wrong, ", "), wrong.size() == 1 ? " is a setting" : " are settings", " of ",
          JobKindName(other), " jobs, but this is ",
          *o.kind == JobKind::kTraining ? "a training" : "an attention", " job (", o.kind_source,
          "): leave ", wrong.size() == 1 ? "it" : "them", " out"));
    }
    return *o.kind;
  }
  if (!attention.empty() && !training.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        absl::StrJoin(attention, ", "), " (attention) and ", absl::StrJoin(training, ", "),
        " (training) are settings of different kinds of job: a job is either an "
        "attention job or a training job"));
  }
  return training.empty() ? JobKind::kAttention : JobKind::kTraining;
}

absl::StatusOr<v1::JobSpec> BuildJobSpec(const SubmitOptions& o) {
  absl::StatusOr<JobKind> kind = JobKindOf(o);
  if (!kind.ok()) return kind.status();
  if (*kind == JobKind::kTraining) return BuildTrainingJobSpec(o);
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
  SetRecovery(o, &spec);
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
