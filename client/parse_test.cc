// Unit tests of the CLI's building blocks: value parsers, job files, tables and formatting.
// client/cli_test.cc covers them end to end through RunCli.
#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/format.h"
#include "client/job_file.h"
#include "client/parse.h"
#include "client/submit_options.h"
#include "client/suggest.h"
#include "client/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseTest, Integers) {
  EXPECT_EQ(*ParseInt(" 42 ", 1, 100), 42);
  EXPECT_THAT(ParseInt("0", 1, 100).status().message(),
              HasSubstr("'0' is out of range: must be 1"));
  EXPECT_THAT(ParseInt("4k", 1, 100).status().message(), HasSubstr("'4k' is not an integer"));
  EXPECT_EQ(*ParseUint64("18446744073709551615"), 18446744073709551615ULL);
  EXPECT_FALSE(ParseUint64("-1").ok());
  EXPECT_FALSE(ParseUint64("18446744073709551616").ok());
}

TEST(ParseTest, IntegerLists) {
  EXPECT_THAT(*ParseIntList("2048, 4096 ,8192", 1, 1 << 20), ElementsAre(2048, 4096, 8192));
  EXPECT_THAT(*ParseIntList("7", 1, 10), ElementsAre(7));
  EXPECT_THAT(ParseIntList("1,,2", 1, 10).status().message(), HasSubstr("empty entry in '1,,2'"));
  EXPECT_THAT(ParseIntList("", 1, 10).status().message(), HasSubstr("empty"));
  EXPECT_THAT(ParseIntList("1,2.5", 1, 10).status().message(),
              HasSubstr("'2.5' is not an integer (in '1,2.5')"));
  EXPECT_THAT(ParseIntList("1,-2", 1, 10).status().message(), HasSubstr("'-2' is out of range"));
}

TEST(ParseTest, NumbersBoolsAndEnums) {
  EXPECT_DOUBLE_EQ(*ParsePositiveDouble("0.125"), 0.125);
  EXPECT_FALSE(ParsePositiveDouble("0").ok());
  EXPECT_FALSE(ParsePositiveDouble("inf").ok());
  EXPECT_FALSE(ParsePositiveDouble("nan").ok());
  EXPECT_TRUE(*ParseBool("Yes"));
  EXPECT_FALSE(*ParseBool("false"));
  EXPECT_FALSE(ParseBool("maybe").ok());
  EXPECT_EQ(*ParseDType("BF16"), v1::DTYPE_BF16);
  EXPECT_EQ(*ParseDType("double"), v1::DTYPE_FP64);
  EXPECT_THAT(ParseDType("int8").status().message(),
              HasSubstr("'int8' is not one of fp16, bf16, fp32, fp64"));
  EXPECT_EQ(*ParsePass("fwd_bwd"), v1::PASS_FORWARD_BACKWARD);
  EXPECT_EQ(*ParsePass("forward"), v1::PASS_FORWARD);
  EXPECT_EQ(*ParseMode("Mixture"), v1::ATTENTION_MODE_MIXTURE);
  EXPECT_EQ(*ParseHeadOffsets("blocked"), v1::HEAD_OFFSETS_BLOCKED);
  EXPECT_EQ(*ParseDevice("GPU"), v1::DEVICE_PREFERENCE_GPU);
  EXPECT_FALSE(ParseDevice("tpu").ok());
}

TEST(ParseTest, JobStates) {
  EXPECT_THAT(*ParseJobStates("running,queued,running"),
              ElementsAre(v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING));
  EXPECT_THAT(*ParseJobStates("active"),
              ElementsAre(v1::JOB_STATE_QUEUED, v1::JOB_STATE_PLACED, v1::JOB_STATE_RUNNING));
  EXPECT_THAT(*ParseJobStates("ended"),
              ElementsAre(v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED));
  EXPECT_THAT(*ParseJobStates("JOB_STATE_FAILED"), ElementsAre(v1::JOB_STATE_FAILED));
  EXPECT_THAT(ParseJobStates("running,done").status().message(), HasSubstr("'done'"));
}

TEST(JobFileTest, YamlListsAsSequencesOrTextAndLineNumbers) {
  absl::StatusOr<SubmitOptions> options = ParseJobFile(
      "attention:\n  segments: 1024,2048\n  rates: [1, 2]\n  head-dim: 64\n", "a.yaml", false);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(*options->segments, ElementsAre(1024, 2048));
  EXPECT_THAT(*options->rates, ElementsAre(1, 2));
  EXPECT_EQ(*options->head_dim, 64);
  EXPECT_FALSE(options->seq_len.has_value());  // Only what the file gives.

  absl::StatusOr<SubmitOptions> bad =
      ParseJobFile("name: x\nattention:\n  heads: -3\n", "b.yaml", false);
  EXPECT_THAT(bad.status().message(), HasSubstr("b.yaml:3: attention.heads: '-3' is out of range"));
}

TEST(JobFileTest, StructuralErrors) {
  EXPECT_THAT(ParseJobFile("", "e.yaml", false).status().message(), HasSubstr("empty"));
  EXPECT_THAT(ParseJobFile("- 1\n- 2\n", "l.yaml", false).status().message(),
              HasSubstr("not a list"));
  EXPECT_THAT(ParseJobFile("attention: 5\n", "s.yaml", false).status().message(),
              HasSubstr("must be a mapping"));
  EXPECT_THAT(ParseJobFile("kind: inference\n", "k.yaml", false).status().message(),
              HasSubstr("'inference' is not a job kind this CLI submits: use attention or "
                        "training"));
  EXPECT_THAT(ParseJobFile("kind: trainig\n", "k.yaml", false).status().message(),
              HasSubstr("(did you mean 'training'?)"));
  EXPECT_THAT(ParseJobFile("attention:\n  name: x\n", "n.yaml", false).status().message(),
              HasSubstr("'name' belongs at the top level"));
  EXPECT_THAT(ParseJobFile("attention:\n  heads: [1, 2]\n", "h.yaml", false).status().message(),
              HasSubstr("must be a single value"));
  EXPECT_THAT(ParseJobFile("attention:\n  heads:\n", "v.yaml", false).status().message(),
              HasSubstr("has no value"));
  EXPECT_THAT(ParseJobFile("[1]", "a.json", true).status().message(), HasSubstr("not a list"));
  EXPECT_THAT(
      ParseJobFile("{\"attention\": {\"mode\": \"sparse\"}}", "m.json", true).status().message(),
      HasSubstr("m.json: attention.mode: 'sparse' is not one of grouped, mixture"));
}

// Found while fuzzing the job file parser (fuzz/job_file_fuzz, docs/FUZZING.md): a JSON document
// nested 300,000 deep (600 KB, under the 1 MiB limit) overflowed the stack in the recursive
// conversion to YAML (a segmentation fault of `dattn submit -f deep.json`); 4,000 deep took 0.7 s.
// fuzz/corpus/job_file_fuzz/deep-json is 4,000 deep.
TEST(JobFileTest, DeeplyNestedJsonIsRefusedNotRecursedInto) {
  const std::string deep =
      "{\"attention\": " + std::string(300000, '[') + std::string(300000, ']') + "}";
  absl::StatusOr<SubmitOptions> parsed = ParseJobFile(deep, "deep.json", true);
  EXPECT_TRUE(absl::IsInvalidArgument(parsed.status()));
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("deep.json: nested more than 32 levels deep; a job file has 3"));
  // 32 levels still parse as JSON and fail on what they say, not on their depth.
  const std::string ok_depth =
      "{\"attention\": {\"segments\": " + std::string(30, '[') + "1" + std::string(30, ']') + "}}";
  EXPECT_THAT(ParseJobFile(ok_depth, "ok.json", true).status().message(),
              HasSubstr("ok.json: attention.segments: list entries must be plain values"));
}

TEST(SubmitOptionsTest, MergeAndBuild) {
  SubmitOptions file;
  file.seq_len = 8192;
  file.heads = 8;
  file.head_dim = 64;
  file.segments = std::vector<int64_t>{2048};
  file.rates = std::vector<int64_t>{1};
  file.causal = true;
  SubmitOptions flags;
  flags.causal = false;
  flags.seq_len = 4096;
  MergeSubmitOptions(flags, &file);
  absl::StatusOr<v1::JobSpec> spec = BuildJobSpec(file);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->attention().shape().seq_len(), 4096);
  EXPECT_EQ(spec->attention().shape().num_heads(), 8);
  EXPECT_FALSE(spec->attention().attention().causal());

  file.rates = std::vector<int64_t>{1, 2};
  EXPECT_THAT(BuildJobSpec(file).status().message(),
              HasSubstr("--segments has 1 value(s) (2048) but --rates has 2 (1,2)"));
  EXPECT_THAT(BuildJobSpec(SubmitOptions()).status().message(),
              HasSubstr("missing --seq-len (seq_len), --heads (heads), --head-dim (head_dim)"));
}

TEST(SubmitOptionsTest, FieldTableIsConsistent) {
  std::set<std::string> flags, keys;
  for (const SubmitField& f : SubmitFields()) {
    EXPECT_TRUE(flags.insert(f.flag).second) << f.flag;
    EXPECT_TRUE(keys.insert(f.key).second) << f.key;
    EXPECT_NE(f.sections, 0u) << f.flag;
    // The one exception: the trainer config's file is `config_file` beside `config`, the config
    // written inline; its flag says what it is among the others of `dattn submit`.
    if (f.flag == "--train-config") {
      EXPECT_EQ(f.key, "config_file");
      EXPECT_EQ(f.sections, static_cast<unsigned>(kTrainingSection));
      continue;
    }
    // The file key is the flag without dashes, '-' -> '_': one name to learn.
    std::string expected = f.flag.substr(2);
    std::replace(expected.begin(), expected.end(), '-', '_');
    EXPECT_EQ(f.key, expected);
  }
}

// A trainer config written as a YAML mapping becomes a JSON object with YAML 1.2's types: plain
// scalars are null, booleans, integers or numbers where the core schema says so, strings
// otherwise; quoted scalars stay strings; keys keep the file's order.
TEST(JobFileTest, TrainingConfigMappingBecomesJsonWithItsTypes) {
  absl::StatusOr<SubmitOptions> options = ParseJobFile(R"(name: t
training:
  data_parallel: 2
  sequence-parallel: 4
  device: gpu
  checkpoint_dir: /shared/ckpt
  config:
    steps: 1000
    seq_len: 0x100
    model: {d_model: 128, attention: {segment_lengths: [64, 128], mode: grouped}}
    optimizer: {lr: 2e-3, min_lr: .5, warmup_steps: +20, max_grad_norm: ~, beta1: 9.0E-1}
    checkpoint_activations: true
    threads: "2"
    seed: '18446744073709551615'
    big: 18446744073709551615
    negative: -7
    data: {paths: [kjv.txt, "123", yes, null], format: text, quoted_null: "null"}
    empty:
    block: |
      two
      lines
)",
                                                       "t.yaml", false);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->kind, JobKind::kTraining);
  EXPECT_EQ(options->kind_source, "training: in t.yaml");
  EXPECT_EQ(*options->data_parallel, 2);
  EXPECT_EQ(*options->sequence_parallel, 4);
  EXPECT_EQ(*options->device, v1::DEVICE_PREFERENCE_GPU);
  EXPECT_EQ(*options->checkpoint_dir, "/shared/ckpt");
  ASSERT_TRUE(options->train_config.has_value());
  EXPECT_EQ(options->train_config->path, "");
  EXPECT_EQ(options->train_config->origin, "t.yaml:8: training.config");
  EXPECT_EQ(options->train_config->json,
            R"({"steps":1000,"seq_len":256,)"
            R"("model":{"d_model":128,"attention":{"segment_lengths":[64,128],"mode":"grouped"}},)"
            R"("optimizer":{"lr":0.002,"min_lr":0.5,"warmup_steps":20,"max_grad_norm":null,)"
            R"("beta1":0.9},"checkpoint_activations":true,"threads":"2",)"
            R"("seed":"18446744073709551615","big":18446744073709551615,"negative":-7,)"
            R"("data":{"paths":["kjv.txt","123","yes",null],"format":"text","quoted_null":"null"},)"
            R"("empty":null,"block":"two\nlines\n"})");
  // The same file as JSON: its strings stay strings, its numbers numbers (the keys come sorted, as
  // nlohmann::json holds them).
  absl::StatusOr<SubmitOptions> json = ParseJobFile(
      R"({"kind": "training", "training": {"config": {"steps": 10, "threads": "2", "lr": 2e-3,
          "on": true, "off": "false", "none": null, "list": [1, "1", 1.5]}}})",
      "t.json", true);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->kind_source, "kind: training in t.json");
  EXPECT_EQ(json->train_config->json,
            R"({"list":[1,"1",1.5],"lr":0.002,"none":null,"off":"false","on":true,"steps":10,)"
            R"("threads":"2"})");
}

TEST(JobFileTest, TrainingConfigErrorsNameTheKey) {
  struct Case {
    std::string yaml;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"training:\n  config:\n    optimizer: {lr: .inf}\n",
       "c.yaml:3: training.config.optimizer.lr: .inf is not a finite number"},
      {"training:\n  config:\n    seed: 99999999999999999999\n",
       "training.config.seed: the integer 99999999999999999999 is out of range"},
      {"training:\n  config:\n    steps: !!int 5\n",
       "training.config.steps: the YAML tag 'tag:yaml.org,2002:int' is not supported"},
      {"training:\n  config:\n    steps: 1\n    steps: 2\n",
       "c.yaml:4: training.config.steps: the key appears twice"},
      {"training:\n  config: [1, 2]\n", "training.config: must be a mapping"},
      {"training:\n  config: {steps: 1}\n  config_file: a.json\n",
       "c.yaml:3: training.config_file: config and config_file both give the trainer config"},
      {"training:\n  config_file: a.json\n  config: {steps: 1}\n",
       "c.yaml:3: training.config: config and config_file both give the trainer config"},
      {"training:\n  config: {steps: 1}\nattention:\n  seq_len: 64\n",
       "c.yaml:4: attention: the file has both training: and attention: sections"},
      {"kind: attention\ntraining:\n  config: {steps: 1}\n",
       "c.yaml:1: kind: 'attention' but the file has a training: section"},
      {"training:\n  data_paralel: 2\n",
       "training.data_paralel: unknown key (did you mean 'data_parallel'?); the keys here are "
       "config, device, config_file, data_parallel, sequence_parallel, checkpoint_dir, init_from"},
      {"training:\n  seq_len: 64\n", "'seq_len' belongs under attention:, not under training:"},
      {"attention:\n  data_parallel: 2\n",
       "'data_parallel' belongs under training:, not under attention:"},
      {"config_file: a.json\n", "'config_file' belongs under training:"},
      {"config: {steps: 1}\n", "'config' belongs under training:"},
      {"device: cpu\n", "'device' belongs under attention: or under training:"},
      {"training:\n  checkpoint_dir: ckpt\n",
       "training.checkpoint_dir: 'ckpt' is not an absolute path"},
      {"training:\n  data_parallel: 0\n", "training.data_parallel: '0' is out of range"},
      {"training: 5\n", "training: must be a mapping of training settings"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SubmitOptions> parsed = ParseJobFile(c.yaml, "c.yaml", false);
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << c.yaml;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.expected)) << c.yaml;
  }
}

// YAML aliases can repeat a value without end, and nesting has no bound in YAML itself: the
// conversion to JSON stops at its limits instead of running out of memory or stack.
TEST(JobFileTest, TrainingConfigBombsAreRefused) {
  std::string aliases = "training:\n  config:\n    a0: &a0 [" + std::string(1000, 'x') + "]\n";
  for (int i = 1; i <= 12; ++i) {
    aliases += absl::StrCat("    a", i, ": &a", i, " [*a", i - 1, ", *a", i - 1, ", *a", i - 1,
                            ", *a", i - 1, "]\n");
  }
  absl::StatusOr<SubmitOptions> parsed = ParseJobFile(aliases, "bomb.yaml", false);
  EXPECT_TRUE(absl::IsInvalidArgument(parsed.status()));
  EXPECT_THAT(parsed.status().message(), HasSubstr("grows past 100000 values or 1 MiB of JSON"));

  std::string deep = "training:\n  config:\n    a: ";
  for (int i = 0; i < 40; ++i) deep += "[";
  for (int i = 0; i < 40; ++i) deep += "]";
  parsed = ParseJobFile(deep + "\n", "deep.yaml", false);
  EXPECT_TRUE(absl::IsInvalidArgument(parsed.status()));
  EXPECT_THAT(parsed.status().message(), HasSubstr("nested more than 32 levels deep"));
}

// A relative config_file is relative to the job file's folder; an absolute one stays as it is. The
// file is read by BuildJobSpec, not by the parser.
TEST(JobFileTest, ConfigFileIsRelativeToTheJobFile) {
  absl::StatusOr<SubmitOptions> options =
      ParseJobFile("training:\n  config_file: configs/kjv.json\n", "dir/job.yaml", false, "dir/");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->train_config->path, "dir/configs/kjv.json");
  EXPECT_EQ(options->train_config->json, "");
  EXPECT_EQ(options->train_config->origin, "dir/job.yaml:2: training.config_file");
  options = ParseJobFile("training:\n  config_file: /etc/kjv.json\n", "j.yaml", false, "dir");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->train_config->path, "/etc/kjv.json");
  options = ParseJobFile("training:\n  config_file: kjv.json\n", "j.yaml", false);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->train_config->path, "kjv.json");
}

TEST(SubmitOptionsTest, BuildTrainingSpec) {
  SubmitOptions options;
  options.train_config =
      TrainingConfigSource{"  {\"steps\": 5}\n", "", "t.yaml:3: training.config"};
  options.data_parallel = 2;
  options.checkpoint_dir = "/shared/ckpt";
  options.name = "t";
  absl::StatusOr<v1::JobSpec> spec = BuildJobSpec(options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->has_training());
  EXPECT_EQ(spec->name(), "t");
  EXPECT_EQ(spec->training().config_json(), "{\"steps\": 5}");
  EXPECT_EQ(spec->training().data_parallel(), 2);
  EXPECT_EQ(spec->training().sequence_parallel(), 1);
  EXPECT_EQ(spec->training().device(), v1::DEVICE_PREFERENCE_ANY);
  EXPECT_EQ(spec->training().checkpoint_dir(), "/shared/ckpt");
  EXPECT_EQ(spec->training().init_from(), "");

  options.train_config->json = "[1, 2]";
  EXPECT_THAT(BuildJobSpec(options).status().message(),
              HasSubstr("t.yaml:3: training.config: the trainer config is a JSON array, not an "
                        "object"));
  options.train_config = TrainingConfigSource{"", "/no/such/config.json", "--train-config"};
  EXPECT_THAT(BuildJobSpec(options).status().message(),
              HasSubstr("--train-config: trainer config '/no/such/config.json' cannot be read: No "
                        "such file or directory"));

  // A training setting without the config.
  SubmitOptions partial;
  partial.sequence_parallel = 2;
  EXPECT_EQ(*JobKindOf(partial), JobKind::kTraining);
  EXPECT_THAT(BuildJobSpec(partial).status().message(),
              HasSubstr("missing --train-config (training.config or training.config_file)"));
  // Settings of both kinds.
  partial.seq_len = 64;
  EXPECT_THAT(JobKindOf(partial).status().message(),
              HasSubstr("--seq-len (attention.seq_len) (attention) and --sequence-parallel "
                        "(training.sequence_parallel) (training) are settings of different kinds"));
  partial.kind = JobKind::kTraining;
  partial.kind_source = "training: in t.yaml";
  EXPECT_THAT(JobKindOf(partial).status().message(),
              HasSubstr("--seq-len (attention.seq_len) is a setting of attention jobs, but this is "
                        "a training job (training: in t.yaml): leave it out"));
  // --device belongs to both.
  SubmitOptions device;
  device.device = v1::DEVICE_PREFERENCE_CPU;
  device.kind = JobKind::kTraining;
  EXPECT_EQ(*JobKindOf(device), JobKind::kTraining);
}

TEST(SubmitOptionsTest, RandomKeysAreUuidV4) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string key = RandomIdempotencyKey();
    ASSERT_EQ(key.size(), 36u);
    EXPECT_EQ(key[14], '4');
    EXPECT_NE(std::string("89ab").find(key[19]), std::string::npos) << key;
    seen.insert(key);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(TableTest, AlignsColumnsByCodePoints) {
  Table table({"A", "BB", "C"});
  table.AddRow({"xxxx", "ü", ""});
  table.AddRow({"y"});
  std::ostringstream out;
  table.Print(out);
  EXPECT_EQ(out.str(),
            "A     BB  C\n"
            "xxxx  ü\n"
            "y\n");
}

TEST(FormatTest, Units) {
  EXPECT_EQ(HumanDuration(absl::Milliseconds(850)), "850ms");
  EXPECT_EQ(HumanDuration(absl::Seconds(12.34)), "12.3s");
  EXPECT_EQ(HumanDuration(absl::Seconds(192)), "3m12s");
  EXPECT_EQ(HumanDuration(absl::Minutes(62)), "1h02m");
  EXPECT_EQ(HumanDuration(absl::Hours(51)), "2d03h");
  EXPECT_EQ(HumanDuration(-absl::Seconds(1)), "0ms");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(8LL << 20), "8.0 MiB");
  EXPECT_EQ(FormatSeconds(0.0123), "12.30 ms");
  EXPECT_EQ(FormatSeconds(2.5), "2.500 s");
  EXPECT_EQ(FormatSeconds(0.00085), "850.0 us");
  EXPECT_EQ(ProgressBar(5, 10, 10), "[#####-----]");
  EXPECT_EQ(ProgressBar(20, 10, 4), "[####]");
  EXPECT_EQ(ProgressBar(3, 0, 4), "[----]");
  v1::JobProgress progress;
  EXPECT_EQ(FormatProgress(progress), "-");
  progress.set_steps_done(3);
  progress.set_steps_total(7);
  EXPECT_EQ(FormatProgress(progress), "3/7");
  google::protobuf::Timestamp ts;
  EXPECT_EQ(FormatTimestamp(ts), "-");
  ts.set_seconds(1714564800);
  EXPECT_EQ(FormatTimestamp(ts), "2024-05-01 12:00:00 UTC");
}

// The loss curve is the same text for the same points: 8 rows, the extremes labelled, the steps
// below; ASCII marks one '*' per column, Unicode fills eighths of a row.
TEST(FormatTest, LossChartIsDeterministic) {
  google::protobuf::RepeatedPtrField<v1::LossPoint> points;
  const double losses[] = {4.0, 3.0, 2.5, 2.0, 1.75, 1.5, 1.25, 1.0};
  for (int i = 0; i < 8; ++i) {
    v1::LossPoint* point = points.Add();
    point->set_step(10 * (i + 1));
    point->set_loss(losses[i]);
  }
  EXPECT_THAT(LossChart(points, 60, 4, /*unicode=*/false),
              ElementsAre("4.0000 |*",         //
                          "       | **",       //
                          "       |   ***",    //
                          "1.0000 |      **",  //
                          "       +--------",  //
                          "        10    80"));
  EXPECT_THAT(LossChart(points, 60, 2, /*unicode=*/true),
              ElementsAre("4.0000 \u2524\u2588\u2583\u2581",                                //
                          "1.0000 \u2524\u2588\u2588\u2588\u2586\u2585\u2584\u2582\u2581",  //
                          "       \u2514\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500",  //
                          "        10    80"));
  // Four columns: each the mean of two points; too narrow for both steps under the axis.
  EXPECT_THAT(LossChart(points, 4, 2, false),
              ElementsAre("3.5000 |*", "1.1250 | ***", "       +----", "        steps 10..80"));
  // Non-finite losses are left out; nothing finite, no chart.
  points.Mutable(0)->set_loss(std::nan(""));
  EXPECT_EQ(LossChart(points, 60, 4, false).front(), "3.0000 |*");
  google::protobuf::RepeatedPtrField<v1::LossPoint> none;
  EXPECT_TRUE(LossChart(none, 60, 8, false).empty());
}

TEST(SuggestTest, EditDistance) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("status", "status"), 0u);
  EXPECT_EQ(EditDistance("stauts", "status"), 1u);  // A swap of neighbours counts once.
  EXPECT_EQ(EditDistance("lst", "list"), 1u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("ca", "abc"), 3u);  // Optimal string alignment, not full Damerau.
}

TEST(SuggestTest, ClosestCandidates) {
  const std::vector<std::string> commands = {"submit",  "status", "list",    "watch", "cancel",
                                             "workers", "drain",  "undrain", "health"};
  EXPECT_THAT(Suggest("stauts", commands), ElementsAre("status"));
  EXPECT_THAT(Suggest("lst", commands), ElementsAre("list"));
  EXPECT_THAT(Suggest("wokers", commands), ElementsAre("workers"));
  EXPECT_THAT(Suggest("drian", commands), ElementsAre("drain"));
  EXPECT_THAT(Suggest("Submit", commands), ElementsAre());  // Itself, in another case.
  EXPECT_THAT(Suggest("frobnicate", commands), ElementsAre());
  EXPECT_THAT(Suggest("x", commands), ElementsAre());
  EXPECT_THAT(Suggest("undr", commands), ElementsAre("undrain"));  // A beginning.
  const std::vector<std::string> flags = {"--watch",    "--wait",       "--seq-len", "--heads",
                                          "--head-dim", "--iterations", "-f"};
  EXPECT_THAT(Suggest("--wach", flags), ElementsAre("--watch"));
  EXPECT_THAT(Suggest("--seqlen", flags), ElementsAre("--seq-len"));
  EXPECT_THAT(Suggest("--seq_len", flags), ElementsAre());  // Same name, '_' for '-'.
  EXPECT_THAT(Suggest("--head", flags), ElementsAre("--heads"));
  EXPECT_THAT(Suggest("--iter", flags), ElementsAre("--iterations"));
  EXPECT_THAT(Suggest("--wat", flags), ElementsAre("--wait"));  // wait 1 away, watch 2.
  EXPECT_EQ(DidYouMean({}), "");
  EXPECT_EQ(DidYouMean({"status"}), " (did you mean 'status'?)");
  EXPECT_EQ(DidYouMean({"a", "b", "c"}, ""), " (did you mean a, b or c?)");
}

TEST(PrintableTest, EscapesWhatATerminalWouldActOn) {
  // Plain text, and valid UTF-8 that shows as itself, pass unchanged.
  EXPECT_EQ(Printable("job-1 a_b.c (x) \\ 'q' \"q\""), "job-1 a_b.c (x) \\ 'q' \"q\"");
  EXPECT_EQ(Printable("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x9a\x80"),
            "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x9a\x80");
  // C0 controls and DEL.
  EXPECT_EQ(Printable("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(Printable("\x1b[2J\x1b]0;title\x07"), "\\x1b[2J\\x1b]0;title\\x07");
  EXPECT_EQ(Printable(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(Printable("del\x7f"), "del\\x7f");
  // C1 controls: U+009B is a one-character CSI on many terminals.
  EXPECT_EQ(Printable("\xc2\x9b"
                      "31m"),
            "\\u009b31m");
  EXPECT_EQ(Printable("\xc2\x85"), "\\u0085");
  EXPECT_EQ(Printable("\xc2\xa0"), "\xc2\xa0");  // U+00A0 shows (a space).
  // Bidi overrides and isolates, zero-width characters, line separators, BOM.
  EXPECT_EQ(Printable("abc\xe2\x80\xae"
                      "def"),
            "abc\\u202edef");
  EXPECT_EQ(Printable("\xe2\x81\xa6x\xe2\x81\xa9"), "\\u2066x\\u2069");
  EXPECT_EQ(Printable("a\xe2\x80\x8b"
                      "b"),
            "a\\u200bb");
  EXPECT_EQ(Printable("\xe2\x80\xa8"), "\\u2028");
  EXPECT_EQ(Printable("\xef\xbb\xbf"), "\\ufeff");
  // Bytes that are not UTF-8: stray continuation, a raw C1 byte, overlong, surrogate, truncated.
  EXPECT_EQ(Printable("\x80"), "\\x80");
  EXPECT_EQ(Printable("\x9b"
                      "1m"),
            "\\x9b1m");
  EXPECT_EQ(Printable("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(Printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(Printable("\xe6\x97"), "\\xe6\\x97");
  EXPECT_EQ(Printable("\xff"), "\\xff");
}

TEST(ParseTest, ModelRefs) {
  absl::StatusOr<ModelRef> newest = ParseModelRef("kjv");
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->name, "kjv");
  EXPECT_EQ(newest->version, 0);
  absl::StatusOr<ModelRef> third = ParseModelRef("kjv-small.v2:3");
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->name, "kjv-small.v2");
  EXPECT_EQ(third->version, 3);
  for (const char* bad : {"", ":3", "kjv:", "kjv:0", "kjv:-1", "kjv:x", "kjv:1.5"}) {
    absl::StatusOr<ModelRef> r = ParseModelRef(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
    EXPECT_THAT(std::string(r.status().message()),
                ::testing::HasSubstr(absl::StrCat("\"", bad, "\"")))
        << bad;
  }
}

// Table cells cannot break rows or carry control sequences.
TEST(PrintableTest, TableCellsArePrintable) {
  Table table({"NAME", "STATE"});
  table.AddRow({"evil\n\x1b[31mred", "READY"});
  std::ostringstream out;
  table.Print(out);
  EXPECT_EQ(out.str(), "NAME               STATE\nevil\\n\\x1b[31mred  READY\n");
}

}  // namespace
}  // namespace client
}  // namespace dattn
