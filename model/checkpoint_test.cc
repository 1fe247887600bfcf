#include "model/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/file_io.h"
#include "model/rng.h"

namespace dattn {
namespace model {
namespace {

namespace fs = std::filesystem;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return JoinPath(dir != nullptr ? dir : "/tmp", name);
}

ParamLayout Layout() {
  ParamLayout layout;
  EXPECT_TRUE(layout.Add("embed.weight", {16, 4}).ok());
  EXPECT_TRUE(layout.Add("blocks.0.ln.weight", {4}).ok());
  EXPECT_TRUE(layout.Add("blocks.0.mlp.weight", {4, 8}).ok());
  return layout;
}

std::vector<float> Random(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.Uniform() - 0.5);
  return v;
}

struct Saved {
  ParamLayout layout = Layout();
  std::vector<float> params;
  AdamWState state;
  TrainerState trainer;
  std::string config = "{\n  \"d_model\": 4,\n  \"layers\": 1\n}\n";
};

Saved MakeSaved(int64_t step) {
  Saved s;
  s.params = Random(s.layout.total(), 1);
  s.state.m = Random(s.layout.total(), 2);
  s.state.v = Random(s.layout.total(), 3);
  for (float& x : s.state.v) x = x * x;
  s.state.step = step - 1;
  s.trainer.step = step;
  s.trainer.tokens_seen = 4096 * step;
  s.trainer.sampler = SamplerCursor{0xfedcba9876543210ULL, true, 128, 4, 0, 100000, 2, 17, 40};
  s.trainer.rng_state = Rng(99).state();
  s.trainer.schedule = LrSchedule{3e-4, 3e-5, 100, 10000};
  s.trainer.adamw = AdamWConfig{0.9, 0.95, 1e-8, 0.1};
  s.trainer.max_grad_norm = 1.0;
  s.trainer.extra_json = R"({"accumulation": 2})";
  return s;
}

absl::StatusOr<std::string> Save(const std::string& root, const Saved& s) {
  CheckpointContents c;
  c.layout = &s.layout;
  c.params = s.params;
  c.optimizer = &s.state;
  c.model_config_json = s.config;
  c.trainer = s.trainer;
  return SaveCheckpoint(root, c);
}

// A copy of a saved checkpoint folder to damage.
std::string CopyOf(const std::string& dir, const std::string& name) {
  const std::string copy = TempPath(name);
  fs::remove_all(copy);
  fs::copy(dir, copy, fs::copy_options::recursive);
  return copy;
}

void Overwrite(const std::string& path, const std::string& content) {
  ASSERT_TRUE(WriteWholeFile(path, content, false).ok());
}
std::string Read(const std::string& path) { return *ReadSmallFile(path, 1 << 30); }

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& file,
                 const std::string& words) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(file), std::string::npos) << "want file " << file << ": " << s;
  EXPECT_NE(s.message().find(words), std::string::npos) << "want \"" << words << "\": " << s;
}

TEST(CheckpointTest, SaveAndRestoreEverything) {
  const std::string root = TempPath("ckpt_roundtrip");
  const Saved s = MakeSaved(5);
  absl::StatusOr<std::string> dir = Save(root, s);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root + "/step-00000005");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"step-00000005"});  // No temporary left behind.
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(*dir)) files.push_back(e.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files,
            (std::vector<std::string>{"MANIFEST.json", "config.json", "optimizer.safetensors",
                                      "trainer_state.json", "weights.safetensors"}));

  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(*dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->step(), 5);
  EXPECT_EQ(ck->optimizer_step(), 4);
  EXPECT_EQ(ck->model_config_json(), s.config);  // Verbatim.
  const TrainerState& t = ck->trainer_state();
  EXPECT_EQ(t.tokens_seen, s.trainer.tokens_seen);
  EXPECT_EQ(t.sampler, s.trainer.sampler);
  EXPECT_EQ(t.rng_state, s.trainer.rng_state);
  EXPECT_EQ(t.schedule.peak_lr, 3e-4);  // Doubles round-trip exactly.
  EXPECT_EQ(t.schedule.min_lr, 3e-5);
  EXPECT_EQ(t.schedule.warmup_steps, 100);
  EXPECT_EQ(t.schedule.total_steps, 10000);
  EXPECT_EQ(t.adamw.beta2, 0.95);
  EXPECT_EQ(t.adamw.epsilon, 1e-8);
  EXPECT_EQ(t.max_grad_norm, 1.0);
  EXPECT_EQ(t.extra_json, R"({"accumulation":2})");

  std::vector<float> params(s.layout.total());
  AdamWState state;
  ASSERT_TRUE(ck->Restore(s.layout, absl::MakeSpan(params), &state).ok());
  EXPECT_EQ(std::memcmp(params.data(), s.params.data(), params.size() * 4), 0);
  EXPECT_EQ(std::memcmp(state.m.data(), s.state.m.data(), params.size() * 4), 0);
  EXPECT_EQ(std::memcmp(state.v.data(), s.state.v.data(), params.size() * 4), 0);
  EXPECT_EQ(state.step, 4);

  // A shard that cuts through entries (a data-parallel rank's range).
  std::vector<float> shard(30), m(30), v(30);
  ASSERT_TRUE(ck->ReadWeights(s.layout, 50, absl::MakeSpan(shard)).ok());
  ASSERT_TRUE(ck->ReadMoments(s.layout, 50, absl::MakeSpan(m), absl::MakeSpan(v)).ok());
  for (int i = 0; i < 30; ++i) {
    EXPECT_EQ(shard[i], s.params[50 + i]);
    EXPECT_EQ(m[i], s.state.m[50 + i]);
    EXPECT_EQ(v[i], s.state.v[50 + i]);
  }
  EXPECT_TRUE(absl::IsInvalidArgument(ck->ReadWeights(s.layout, 90, absl::MakeSpan(shard))));

  // The weights file is plain safetensors: one tensor per entry, metadata format "pt".
  EXPECT_EQ(ck->weights_file().tensors().size(), 3u);
  EXPECT_EQ(ck->weights_file().metadata().at("format"), "pt");

  // The same step twice is refused; nothing is overwritten.
  absl::Status again = Save(root, s).status();
  EXPECT_TRUE(absl::IsAlreadyExists(again)) << again;

  // Clipping off is stored as null and read back as infinity.
  Saved off = MakeSaved(6);
  off.trainer.max_grad_norm = std::numeric_limits<double>::infinity();
  ASSERT_TRUE(Save(root, off).ok());
  EXPECT_TRUE(std::isinf(Checkpoint::Open(root + "/step-00000006")->trainer_state().max_grad_norm));
}

TEST(CheckpointTest, BadContentsAreRefusedBeforeWriting) {
  const std::string root = TempPath("ckpt_bad_contents");
  Saved s = MakeSaved(1);
  s.config = "{not json";
  absl::Status st = Save(root, s).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("the model config: not valid JSON"), std::string::npos) << st;
  s = MakeSaved(1);
  s.trainer.extra_json = "[1]";
  EXPECT_TRUE(absl::IsInvalidArgument(Save(root, s).status()));
  s = MakeSaved(1);
  s.state.m.pop_back();
  EXPECT_TRUE(absl::IsInvalidArgument(Save(root, s).status()));
  s = MakeSaved(1);
  s.trainer.step = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(Save(root, s).status()));
  EXPECT_FALSE(fs::exists(root));  // Nothing was created.
}

// Every kind of damage is an error naming the file and what is wrong.
TEST(CheckpointTest, DamagedCheckpointsAreClearErrors) {
  const std::string root = TempPath("ckpt_damage");
  const Saved s = MakeSaved(3);
  const std::string dir = *Save(root, s);

  std::string d = CopyOf(dir, "no_manifest");
  fs::remove(d + "/MANIFEST.json");
  ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss, "MANIFEST.json",
              "is missing: the checkpoint is incomplete");

  for (const char* file : {kWeightsFile, kOptimizerFile, kConfigFile, kTrainerStateFile}) {
    d = CopyOf(dir, std::string("missing_") + file);
    fs::remove(d + "/" + file);
    ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss, d + "/" + file,
                "is missing");
  }

  d = CopyOf(dir, "short");
  fs::resize_file(d + "/optimizer.safetensors", fs::file_size(d + "/optimizer.safetensors") - 5);
  ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss, "optimizer.safetensors",
              "(truncated)");

  d = CopyOf(dir, "flipped");
  std::string w = Read(d + "/weights.safetensors");
  w[w.size() - 3] ^= 0x10;  // One bit of one weight.
  Overwrite(d + "/weights.safetensors", w);
  ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss, "weights.safetensors",
              "(the file is corrupt)");

  // A flipped hex digit inside the manifest: still JSON, but not what it was.
  d = CopyOf(dir, "manifest_digit");
  std::string m = Read(d + "/MANIFEST.json");
  const size_t at = m.find("\"sha256\": \"") + 11;
  m[at] = m[at] == '0' ? '1' : '0';
  Overwrite(d + "/MANIFEST.json", m);
  ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss, "MANIFEST.json",
              "the manifest is corrupt");
  d = CopyOf(dir, "manifest_json");
  m = Read(d + "/MANIFEST.json");
  m[0] = '[';
  Overwrite(d + "/MANIFEST.json", m);
  ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss, "MANIFEST.json",
              "not valid JSON");

  // Bad JSON of the right size: the checksum catches it; without checksums, the parser does.
  d = CopyOf(dir, "state_json");
  std::string t = Read(d + "/trainer_state.json");
  t[0] = 'x';
  Overwrite(d + "/trainer_state.json", t);
  ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss, "trainer_state.json",
              "SHA-256");
  ExpectError(Checkpoint::Open(d, /*verify_checksums=*/false).status(), absl::StatusCode::kDataLoss,
              "trainer_state.json", "not valid JSON");

  d = CopyOf(dir, "state_field");
  t = Read(d + "/trainer_state.json");
  t.replace(t.find("\"tokens_seen\""), 13, "\"tokens_xxxx\"");
  Overwrite(d + "/trainer_state.json", t);
  ExpectError(Checkpoint::Open(d, false).status(), absl::StatusCode::kDataLoss,
              "trainer_state.json", "field \"tokens_seen\" is missing");
  d = CopyOf(dir, "state_type");
  t = Read(d + "/trainer_state.json");
  t.replace(t.find("\"epoch\": 2"), 10, "\"epoch\":\"\"");
  Overwrite(d + "/trainer_state.json", t);
  ExpectError(Checkpoint::Open(d, false).status(), absl::StatusCode::kDataLoss,
              "trainer_state.json", "field \"sampler.epoch\" is not an integer");

  d = CopyOf(dir, "config_json");
  std::string c = Read(d + "/config.json");
  c[0] = '}';
  Overwrite(d + "/config.json", c);
  ExpectError(Checkpoint::Open(d, false).status(), absl::StatusCode::kDataLoss, "config.json",
              "not valid JSON");

  d = CopyOf(dir, "safetensors_header");
  w = Read(d + "/weights.safetensors");
  w[8] = '[';
  Overwrite(d + "/weights.safetensors", w);
  ExpectError(Checkpoint::Open(d, false).status(), absl::StatusCode::kDataLoss,
              "weights.safetensors", "not a valid safetensors file");

  ExpectError(Checkpoint::Open(TempPath("nowhere")).status(), absl::StatusCode::kNotFound,
              "nowhere", "no checkpoint");
}

// An intact checkpoint of another model: every mismatch with the layout is named.
// Found by fuzzing (fuzz/checkpoint_fuzz, docs/FUZZING.md): a trainer_state.json whose "extra" held
// a list nested 300,000 deep (600 KB, under the 64 MiB limit of a JSON file) parsed, then
// extra->dump() recursed until the stack overflowed (SIGSEGV); a manifest as deep did the same in
// its digest. fuzz/corpus/checkpoint_fuzz/deep-extra is 4,000 deep.
TEST(CheckpointTest, DeeplyNestedJsonIsRefusedNotRecursedInto) {
  const std::string deep = std::string(300000, '[') + std::string(300000, ']');
  std::string text = TrainerStateToJson(TrainerState());
  const size_t extra = text.find("\"extra\": {}");
  ASSERT_NE(extra, std::string::npos) << text;
  text.replace(extra, 11, "\"extra\": {\"a\": " + deep + "}");
  absl::StatusOr<TrainerState> state = TrainerStateFromJson(text, "deep/trainer_state.json");
  EXPECT_TRUE(absl::IsDataLoss(state.status())) << state.status();
  EXPECT_NE(state.status().message().find(
                "deep/trainer_state.json: JSON nested more than 64 levels deep"),
            std::string::npos)
      << state.status();
  // 64 levels are read.
  text = TrainerStateToJson(TrainerState());
  text.replace(text.find("\"extra\": {}"), 11,
               "\"extra\": {\"a\": " + std::string(62, '[') + std::string(62, ']') + "}");
  EXPECT_TRUE(TrainerStateFromJson(text, "ok").ok());
  // A manifest as deep: the checkpoint is refused as damaged.
  const std::string dir = TempPath("ckpt_deep/step-00000001");
  fs::create_directories(dir);
  ASSERT_TRUE(WriteWholeFile(dir + "/MANIFEST.json", "{\"a\": " + deep + "}", false).ok());
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(dir);
  EXPECT_TRUE(absl::IsDataLoss(ck.status())) << ck.status();
  EXPECT_NE(ck.status().message().find("MANIFEST.json: JSON nested more than 64 levels deep"),
            std::string::npos)
      << ck.status();
}

TEST(CheckpointTest, LayoutMismatchesAreClearErrors) {
  const std::string root = TempPath("ckpt_layout");
  const Saved s = MakeSaved(2);
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(*Save(root, s));
  ASSERT_TRUE(ck.ok());
  std::vector<float> buffer(1000);
  AdamWState state;

  ParamLayout wider;
  ASSERT_TRUE(wider.Add("embed.weight", {16, 4}).ok());
  ASSERT_TRUE(wider.Add("blocks.0.ln.weight", {4}).ok());
  ASSERT_TRUE(wider.Add("blocks.0.mlp.weight", {4, 16}).ok());
  ExpectError(ck->ReadWeights(wider, 0, absl::MakeSpan(buffer).subspan(0, wider.total())),
              absl::StatusCode::kFailedPrecondition, "weights.safetensors",
              "\"blocks.0.mlp.weight\" has shape [4, 8], the model's layout [4, 16]");
  ExpectError(ck->Restore(wider, absl::MakeSpan(buffer).subspan(0, wider.total()), &state),
              absl::StatusCode::kFailedPrecondition, "weights.safetensors", "[4, 16]");

  ParamLayout more = Layout();
  ASSERT_TRUE(more.Add("head.weight", {4, 16}).ok());
  ExpectError(ck->ReadWeights(more, 0, absl::MakeSpan(buffer).subspan(0, more.total())),
              absl::StatusCode::kFailedPrecondition, "weights.safetensors",
              "no tensor \"head.weight\"");
  std::vector<float> m(more.total()), v(more.total());
  ExpectError(ck->ReadMoments(more, 0, absl::MakeSpan(m), absl::MakeSpan(v)),
              absl::StatusCode::kFailedPrecondition, "optimizer.safetensors",
              "no tensor \"exp_avg.head.weight\"");

  ParamLayout fewer;
  ASSERT_TRUE(fewer.Add("embed.weight", {16, 4}).ok());
  ExpectError(ck->ReadWeights(fewer, 0, absl::MakeSpan(buffer).subspan(0, fewer.total())),
              absl::StatusCode::kFailedPrecondition, "weights.safetensors",
              "\"blocks.0.ln.weight\" is not in the model's layout");
}

TEST(CheckpointTest, ListLatestAndPrune) {
  const std::string root = TempPath("ckpt_list");
  for (int64_t step : {1, 2, 3, 10, 100}) ASSERT_TRUE(Save(root, MakeSaved(step)).ok());
  // An incomplete folder, a damaged newest one, a leftover temporary, an unrelated folder.
  fs::create_directories(root + "/step-00000200");
  const std::string damaged = CopyOf(root + "/step-00000100", "ckpt_list/step-00000300");
  fs::remove(damaged + "/weights.safetensors");
  fs::create_directories(root + "/.step-00000004.tmp");
  fs::create_directories(root + "/notes");

  absl::StatusOr<std::vector<CheckpointEntry>> list = ListCheckpoints(root);
  ASSERT_TRUE(list.ok()) << list.status();
  std::vector<int64_t> steps;
  for (const CheckpointEntry& e : *list) steps.push_back(e.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 10, 100, 200, 300}));  // By number.
  EXPECT_FALSE((*list)[5].has_manifest);
  EXPECT_TRUE((*list)[6].has_manifest);

  std::vector<std::string> skipped;
  absl::StatusOr<CheckpointEntry> latest = LatestCheckpoint(root, &skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 100);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find("step-00000300/weights.safetensors is missing"), std::string::npos)
      << skipped[0];
  EXPECT_NE(skipped[1].find("MANIFEST.json is missing"), std::string::npos) << skipped[1];

  // Keep the 2 newest with a manifest (100 and 300): everything older goes, 200 stays.
  absl::StatusOr<std::vector<std::string>> removed = PruneCheckpoints(root, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->size(), 5u);  // Steps 1, 2, 3, 10 and the temporary of step 4.
  list = ListCheckpoints(root);
  steps.clear();
  for (const CheckpointEntry& e : *list) steps.push_back(e.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{100, 200, 300}));
  EXPECT_FALSE(fs::exists(root + "/.step-00000004.tmp"));
  EXPECT_TRUE(fs::exists(root + "/notes"));
  EXPECT_TRUE(absl::IsInvalidArgument(PruneCheckpoints(root, 0).status()));

  EXPECT_TRUE(ListCheckpoints(TempPath("no_root"))->empty());
  EXPECT_TRUE(absl::IsNotFound(LatestCheckpoint(TempPath("no_root")).status()));
}

TEST(CheckpointTest, CrashedSaveLeavesNoCheckpoint) {
  // A save that died after creating its temporary: the step is not listed, and the next save of
  // that step replaces the leftover.
  const std::string root = TempPath("ckpt_crash");
  fs::create_directories(root + "/.step-00000007.tmp");
  Overwrite(root + "/.step-00000007.tmp/weights.safetensors", "partial");
  EXPECT_TRUE(ListCheckpoints(root)->empty());
  EXPECT_TRUE(absl::IsNotFound(LatestCheckpoint(root).status()));
  ASSERT_TRUE(Save(root, MakeSaved(7)).ok());
  EXPECT_FALSE(fs::exists(root + "/.step-00000007.tmp"));
  EXPECT_TRUE(Checkpoint::Open(root + "/step-00000007").ok());
}

// A pin outlives the pruning of its step, holds the same bytes (checksums verified) and is not a
// step to ListCheckpoints; an incomplete or missing step cannot be pinned, nor a pin made twice;
// a damaged step leaves no pin behind.
TEST(CheckpointTest, APinnedStepOutlivesPruning) {
  const std::string root = TempPath("ckpt_pin");
  fs::remove_all(root);
  const Saved saved = MakeSaved(2);
  absl::StatusOr<std::string> step2 = Save(root, saved);
  ASSERT_TRUE(step2.ok()) << step2.status();
  const std::string pin = root + "/pinned/d-1";
  ASSERT_TRUE(PinCheckpoint(*step2, pin).ok());
  for (int64_t step : {3, 4}) ASSERT_TRUE(Save(root, MakeSaved(step)).ok());
  absl::StatusOr<std::vector<std::string>> removed = PruneCheckpoints(root, 1);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->size(), 2u);  // Steps 2 and 3; the pin is not a step.
  EXPECT_FALSE(fs::exists(*step2));
  absl::StatusOr<std::vector<CheckpointEntry>> list = ListCheckpoints(root);
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 4);

  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(pin, /*verify_checksums=*/true);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->trainer_state().step, 2);
  std::vector<float> weights(static_cast<size_t>(saved.layout.total()));
  ASSERT_TRUE(ck->ReadWeights(saved.layout, 0, absl::MakeSpan(weights)).ok());
  EXPECT_EQ(weights, saved.params);

  EXPECT_TRUE(absl::IsNotFound(PinCheckpoint(*step2, root + "/pinned/d-2")));  // Pruned.
  EXPECT_FALSE(fs::exists(root + "/pinned/d-2"));
  const std::string step4 = root + "/step-00000004";
  EXPECT_TRUE(absl::IsAlreadyExists(PinCheckpoint(step4, pin)));
  // A step whose listed file is gone: the pin is refused and nothing is left.
  const std::string damaged = CopyOf(step4, "ckpt_pin/step-00000005");
  fs::remove(damaged + "/optimizer.safetensors");
  absl::Status s = PinCheckpoint(damaged, root + "/pinned/d-3");
  ExpectError(s, absl::StatusCode::kDataLoss, "optimizer.safetensors", "changed while");
  EXPECT_FALSE(fs::exists(root + "/pinned/d-3"));
  EXPECT_FALSE(fs::exists(root + "/pinned/d-3.tmp"));

  ASSERT_TRUE(RemoveCheckpointPin(pin).ok());
  EXPECT_FALSE(fs::exists(pin));
  EXPECT_TRUE(RemoveCheckpointPin(pin).ok());  // None: OK.
}

// ---- Version 2: sharded ----

// Five entries of different sizes, so that shards hold different numbers of tensors.
ParamLayout ShardedLayout() {
  ParamLayout layout;
  EXPECT_TRUE(layout.Add("embed.weight", {16, 4}).ok());
  EXPECT_TRUE(layout.Add("blocks.0.ln.weight", {4}).ok());
  EXPECT_TRUE(layout.Add("blocks.0.mlp.weight", {4, 8}).ok());
  EXPECT_TRUE(layout.Add("blocks.1.mlp.weight", {8, 4}).ok());
  EXPECT_TRUE(layout.Add("final.bias", {3}).ok());
  return layout;
}

// What W ranks write, each its part (as the trainer does, one after another here).
absl::StatusOr<std::string> SaveSharded(const std::string& root, const Saved& s,
                                        const ParamLayout& layout, int world) {
  absl::StatusOr<std::string> tmp = BeginShardedCheckpoint(root, s.trainer.step);
  if (!tmp.ok()) return tmp.status();
  ShardedCheckpointCommit commit;
  commit.layout = &layout;
  commit.shards = world;
  commit.model_config_json = s.config;
  commit.trainer = s.trainer;
  const int64_t total = layout.total();
  for (int r = 0; r < world; ++r) {
    CheckpointShard shard;
    shard.layout = &layout;
    shard.shard = r;
    shard.shards = world;
    shard.step = s.trainer.step;
    const ElementRange w = WeightsShardRange(layout, r, world);
    shard.weights_begin = w.begin;
    shard.params = absl::MakeConstSpan(s.params).subspan(w.begin, w.size());
    const int64_t begin = total * r / world, end = total * (r + 1) / world;
    shard.moments_begin = begin;
    shard.m = absl::MakeConstSpan(s.state.m).subspan(begin, end - begin);
    shard.v = absl::MakeConstSpan(s.state.v).subspan(begin, end - begin);
    shard.optimizer_step = s.state.step;
    absl::StatusOr<std::vector<CheckpointFile>> files = WriteCheckpointShard(*tmp, shard);
    if (!files.ok()) return files.status();
    commit.shard_files.insert(commit.shard_files.end(), files->begin(), files->end());
  }
  return CommitShardedCheckpoint(root, commit);
}

Saved MakeShardedSaved(int64_t step) {
  Saved s = MakeSaved(step);
  s.layout = ShardedLayout();
  s.params = Random(s.layout.total(), 11);
  s.state.m = Random(s.layout.total(), 12);
  s.state.v = Random(s.layout.total(), 13);
  return s;
}

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

bool SameBits(absl::Span<const float> a, absl::Span<const float> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Bits(a[i]) != Bits(b[i])) return false;
  }
  return true;
}

TEST(CheckpointTest, ShardsSplitWholeTensorsBalancedByBytes) {
  const ParamLayout layout = ShardedLayout();  // 64, 4, 32, 32, 3 elements: 135.
  EXPECT_EQ(WeightsShardOfEntries(layout, 1), (std::vector<int>{0, 0, 0, 0, 0}));
  // Midpoints 32, 66, 84, 116, 133.5 of 135.
  EXPECT_EQ(WeightsShardOfEntries(layout, 2), (std::vector<int>{0, 0, 1, 1, 1}));
  EXPECT_EQ(WeightsShardOfEntries(layout, 3), (std::vector<int>{0, 1, 1, 2, 2}));
  // More files than the entries' midpoints reach: empty files, at the next entry.
  EXPECT_EQ(WeightsShardOfEntries(layout, 8), (std::vector<int>{1, 3, 4, 6, 7}));
  const ElementRange empty = WeightsShardRange(layout, 2, 8);
  EXPECT_EQ(empty.begin, 64);
  EXPECT_EQ(empty.size(), 0);
  EXPECT_EQ(WeightsShardRange(layout, 0, 8).begin, 0);
  EXPECT_EQ(WeightsShardRange(layout, 0, 8).size(), 0);
  const ElementRange last = WeightsShardRange(layout, 2, 3);
  EXPECT_EQ(last.begin, 100);
  EXPECT_EQ(last.end, 135);
  // All shards at once: as a walk over the entries for each shard finds them (empty shards at the
  // next entry, or at the end).
  for (int shards = 1; shards <= 12; ++shards) {
    const std::vector<int> of = WeightsShardOfEntries(layout, shards);
    const std::vector<ElementRange> ranges = WeightsShardRanges(layout, shards);
    ASSERT_EQ(ranges.size(), static_cast<size_t>(shards));
    for (int s = 0; s < shards; ++s) {
      ElementRange want{layout.total(), layout.total()};
      bool any = false;
      for (size_t i = 0; i < of.size(); ++i) {
        const ParamEntry& e = layout.entries()[i];
        if (of[i] == s) {
          if (!any) want.begin = e.offset;
          want.end = e.offset + e.numel;
          any = true;
        } else if (of[i] > s && !any) {
          want = {e.offset, e.offset};
          break;
        }
      }
      EXPECT_EQ(ranges[s].begin, want.begin) << shards << " shards, shard " << s;
      EXPECT_EQ(ranges[s].end, want.end) << shards << " shards, shard " << s;
      EXPECT_EQ(WeightsShardRange(layout, s, shards).begin, want.begin);
      EXPECT_EQ(WeightsShardRange(layout, s, shards).end, want.end);
    }
  }
  EXPECT_EQ(WeightsShardFileName(3, 4), "weights-00003-of-00004.safetensors");
  EXPECT_EQ(OptimizerShardFileName(0, 12), "optimizer-00000-of-00012.safetensors");
}

TEST(CheckpointTest, ShardedSaveReadsBackAnyRange) {
  for (int world : {2, 3, 8}) {
    SCOPED_TRACE(world);
    const std::string root = TempPath("ckpt_sharded_" + std::to_string(world));
    fs::remove_all(root);
    const Saved s = MakeShardedSaved(5);
    absl::StatusOr<std::string> dir = SaveSharded(root, s, s.layout, world);
    ASSERT_TRUE(dir.ok()) << dir.status();
    EXPECT_EQ(*dir, root + "/step-00000005");
    EXPECT_FALSE(fs::exists(root + "/.step-00000005.tmp"));
    absl::StatusOr<Checkpoint> ck = Checkpoint::Open(*dir);
    ASSERT_TRUE(ck.ok()) << ck.status();
    EXPECT_EQ(ck->version(), 2);
    EXPECT_EQ(ck->world(), world);
    EXPECT_EQ(ck->step(), 5);
    EXPECT_EQ(ck->optimizer_step(), 4);
    EXPECT_EQ(ck->model_config_json(), s.config);
    EXPECT_EQ(ck->trainer_state().sampler, s.trainer.sampler);
    EXPECT_EQ(static_cast<int>(ck->weights_files().size()), world);
    // Every tensor is in exactly one file, and every file opens alone.
    size_t tensors = 0;
    for (const SafetensorsFile& f : ck->weights_files()) {
      tensors += f.tensors().size();
      EXPECT_EQ(f.metadata().at("format"), "pt");
      EXPECT_TRUE(SafetensorsFile::Open(f.name()).ok());
    }
    EXPECT_EQ(tensors, s.layout.entries().size());
    // Everything, as one process resumes.
    std::vector<float> params(s.layout.total());
    AdamWState state;
    ASSERT_TRUE(ck->Restore(s.layout, absl::MakeSpan(params), &state).ok());
    EXPECT_TRUE(SameBits(params, s.params));
    EXPECT_TRUE(SameBits(state.m, s.state.m));
    EXPECT_TRUE(SameBits(state.v, s.state.v));
    EXPECT_EQ(state.step, 4);
    // Ranges across shard boundaries (another world's shards).
    for (int64_t begin : {0, 7, 60, 66, 99, 130}) {
      for (int64_t len : {1, 5, 40}) {
        if (begin + len > s.layout.total()) continue;
        std::vector<float> w(len), m(len), v(len);
        ASSERT_TRUE(ck->ReadWeights(s.layout, begin, absl::MakeSpan(w)).ok());
        ASSERT_TRUE(ck->ReadMoments(s.layout, begin, absl::MakeSpan(m), absl::MakeSpan(v)).ok());
        EXPECT_TRUE(SameBits(w, absl::MakeConstSpan(s.params).subspan(begin, len))) << begin;
        EXPECT_TRUE(SameBits(m, absl::MakeConstSpan(s.state.m).subspan(begin, len))) << begin;
        EXPECT_TRUE(SameBits(v, absl::MakeConstSpan(s.state.v).subspan(begin, len))) << begin;
      }
    }
    // The index in Hugging Face's form.
    const std::string index = Read(*dir + "/" + kWeightsIndexFile);
    EXPECT_NE(index.find("\"total_size\": 540"), std::string::npos) << index;
    EXPECT_NE(index.find("\"final.bias\": \"" + WeightsShardFileName(world - 1, world) + "\""),
              std::string::npos)
        << index;
    // Listing, latest and pruning see it like a version 1 checkpoint.
    EXPECT_EQ(LatestCheckpoint(root)->step, 5);
    EXPECT_EQ(SaveSharded(root, s, s.layout, world).status().code(),
              absl::StatusCode::kAlreadyExists);
  }
}

TEST(CheckpointTest, DamagedShardsAreDataLossNamingTheFile) {
  const std::string root = TempPath("ckpt_sharded_damage");
  fs::remove_all(root);
  const Saved s = MakeShardedSaved(2);
  const std::string dir = *SaveSharded(root, s, s.layout, 3);
  ASSERT_TRUE(Checkpoint::Open(dir).ok());

  std::string d = CopyOf(dir, "sharded_short");
  const std::string opt = d + "/" + OptimizerShardFileName(1, 3);
  fs::resize_file(opt, fs::file_size(opt) - 4);
  ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss, opt, "(truncated)");

  d = CopyOf(dir, "sharded_flipped");
  const std::string weights = d + "/" + WeightsShardFileName(2, 3);
  std::string w = Read(weights);
  w[w.size() - 2] ^= 0x01;
  Overwrite(weights, w);
  ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss, weights,
              "(the file is corrupt)");
  // Without checksums the flip passes (it is a valid float): the digest is what catches it.
  EXPECT_TRUE(Checkpoint::Open(d, /*verify_checksums=*/false).ok());

  d = CopyOf(dir, "sharded_missing");
  fs::remove(d + "/" + WeightsShardFileName(0, 3));
  ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss,
              d + "/" + WeightsShardFileName(0, 3), "is missing");

  d = CopyOf(dir, "sharded_no_index");
  fs::remove(d + "/" + kWeightsIndexFile);
  ExpectError(Checkpoint::Open(d).status(), absl::StatusCode::kDataLoss, kWeightsIndexFile,
              "is missing");
}

TEST(CheckpointTest, ShardedSaveRefusesWhatDoesNotFit) {
  const std::string root = TempPath("ckpt_sharded_refuse");
  fs::remove_all(root);
  const Saved s = MakeShardedSaved(4);
  absl::StatusOr<std::string> tmp = BeginShardedCheckpoint(root, 4);
  ASSERT_TRUE(tmp.ok());
  CheckpointShard shard;
  shard.layout = &s.layout;
  shard.shard = 1;
  shard.shards = 2;
  shard.params = absl::MakeConstSpan(s.params).subspan(0, 10);  // File 1 holds [68, 135).
  ExpectError(WriteCheckpointShard(*tmp, shard).status(), absl::StatusCode::kInvalidArgument,
              "params cover elements [0, 10)", "holds [68, 135)");
  shard.shard = 2;
  ExpectError(WriteCheckpointShard(*tmp, shard).status(), absl::StatusCode::kInvalidArgument,
              "shard 2 of 2", "");
  // A commit without every shard's digests.
  ShardedCheckpointCommit commit;
  commit.layout = &s.layout;
  commit.shards = 2;
  commit.model_config_json = s.config;
  commit.trainer = s.trainer;
  commit.shard_files = {{WeightsShardFileName(0, 2), 10, "ab"}};
  ExpectError(CommitShardedCheckpoint(root, commit).status(), absl::StatusCode::kInvalidArgument,
              "no digest of", OptimizerShardFileName(0, 2));
  ASSERT_TRUE(AbortShardedCheckpoint(root, 4).ok());
  EXPECT_FALSE(fs::exists(*tmp));
  EXPECT_TRUE(AbortShardedCheckpoint(root, 4).ok());

  // Reading with another layout.
  const std::string dir = *SaveSharded(root, s, s.layout, 2);
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  ParamLayout more = s.layout;
  ASSERT_TRUE(more.Add("head.weight", {4, 16}).ok());
  std::vector<float> buffer(more.total()), v(more.total());
  ExpectError(ck->ReadWeights(more, 0, absl::MakeSpan(buffer)),
              absl::StatusCode::kFailedPrecondition, kWeightsIndexFile,
              "no tensor \"head.weight\"");
  ExpectError(ck->ReadMoments(more, 0, absl::MakeSpan(buffer), absl::MakeSpan(v)),
              absl::StatusCode::kFailedPrecondition, OptimizerShardFileName(0, 2),
              "moments of 135 elements, the model's layout has 199");
  ParamLayout reshaped;
  ASSERT_TRUE(reshaped.Add("embed.weight", {16, 4}).ok());
  ASSERT_TRUE(reshaped.Add("blocks.0.ln.weight", {4}).ok());
  ASSERT_TRUE(reshaped.Add("blocks.0.mlp.weight", {8, 4}).ok());
  ASSERT_TRUE(reshaped.Add("blocks.1.mlp.weight", {8, 4}).ok());
  ASSERT_TRUE(reshaped.Add("final.bias", {3}).ok());
  ExpectError(ck->ReadWeights(reshaped, 0, absl::MakeSpan(buffer).subspan(0, 135)),
              absl::StatusCode::kFailedPrecondition, WeightsShardFileName(1, 2),
              "\"blocks.0.mlp.weight\" has shape [4, 8], the model's layout [8, 4]");
}

}  // namespace
}  // namespace model
}  // namespace dattn
