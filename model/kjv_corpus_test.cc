// The built-in corpus (//model:kjv_corpus, from the Debian packages bible-kjv and bible-kjv-text)
// goes through the whole data path: corpus, split, sampler, retrieval task.
#include <string>

#include "gtest/gtest.h"
#include "model/corpus.h"
#include "model/retrieval.h"
#include "model/sampler.h"

namespace dattn {
namespace model {
namespace {

constexpr char kPath[] = "model/kjv.txt";

TEST(KjvCorpusTest, LoadsSplitsSamplesAndHidesKeys) {
  CorpusReport report;
  absl::StatusOr<TokenCorpus> corpus = TokenCorpus::FromText(kPath, {}, &report);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ(report.files, 1);
  // 4,298,239 bytes from Debian 12's bible-kjv 4.38; allow another release's small edits.
  EXPECT_GT(corpus->size(), 4200000);
  EXPECT_LT(corpus->size(), 4400000);
  const std::string first =
      "\nGenesis 1\n\n  1 In the beginning God created the heaven and the earth.\n";
  EXPECT_EQ(*corpus->ReadBytes(0, static_cast<int64_t>(first.size())), first);
  const std::string tail = *corpus->ReadBytes(corpus->size() - 60, 60);
  EXPECT_NE(tail.find("The grace of our Lord Jesus Christ be with you all. Amen."),
            std::string::npos)
      << tail;

  absl::StatusOr<DataSplit> split = SplitTrainValidation(corpus->size(), 0.01, 4097);
  ASSERT_TRUE(split.ok()) << split.status();
  absl::StatusOr<WindowSampler> sampler =
      WindowSampler::Create(*corpus, split->train, {1024, 4, 1, true});
  ASSERT_TRUE(sampler.ok());
  Batch batch;
  ASSERT_TRUE(sampler->Next(&batch).ok());
  int letters = 0;
  for (int32_t t : batch.inputs) letters += (t >= 'a' && t <= 'z');
  EXPECT_GT(letters, 4 * 1024 / 2);  // English text, not noise.

  RetrievalOptions options;
  options.seq_len = 4096;
  options.depth = 0.25;
  absl::StatusOr<RetrievalTask> task = RetrievalTask::Create(*corpus, split->validation, options);
  ASSERT_TRUE(task.ok()) << task.status();
  absl::StatusOr<RetrievalExample> ex = task->Example(0);
  ASSERT_TRUE(ex.ok());
  EXPECT_NEAR(static_cast<double>(ex->needle_begin), 0.25 * 4000, 30);
  EXPECT_GE(ex->text_begin, split->validation.begin);
}

}  // namespace
}  // namespace model
}  // namespace dattn
