// Unit tests of the CLI's building blocks: value parsers, job files, tables and formatting.
// client/cli_test.cc covers them end to end through RunCli.
#include <set>
#include <sstream>
#include <string>

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
  EXPECT_THAT(ParseJobFile("kind: training\n", "k.yaml", false).status().message(),
              HasSubstr("'training' is not a job kind"));
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
    // The file key is the flag without dashes, '-' -> '_': one name to learn.
    std::string expected = f.flag.substr(2);
    std::replace(expected.begin(), expected.end(), '-', '_');
    EXPECT_EQ(f.key, expected);
  }
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
