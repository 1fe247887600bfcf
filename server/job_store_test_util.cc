#include "server/job_store_test_util.h"

#include <cstdlib>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dattn {
namespace server {
namespace store_test {

// A fresh directory per test under bazel's TEST_TMPDIR.
std::string TestDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/job_store_test/",
                                 info->test_suite_name(), ".", info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

v1::Job MakeJob(const std::string& id, const std::string& key, const std::string& tenant,
                int priority, uint64_t seed) {
  v1::Job job;
  job.set_job_id(id);
  job.set_idempotency_key(key);
  job.set_state(v1::JOB_STATE_QUEUED);
  v1::JobSpec* spec = job.mutable_spec();
  spec->set_name("job " + key);  // A retry has a new id but the same spec.
  spec->set_tenant(tenant);
  spec->set_priority(priority);
  v1::AttentionJobSpec* att = spec->mutable_attention();
  att->set_num_ranks(2);
  att->set_iterations(3);
  att->set_seed(seed);
  att->mutable_shape()->set_seq_len(4096);
  return job;
}

v1::JobEvent Ev(const std::string& kind) {
  v1::JobEvent e;
  e.set_kind(kind);
  e.set_message("test " + kind);
  return e;
}

// Moves `job` to `state` through the store and returns the event's seq.
int64_t Move(JobStore& store, v1::Job& job, v1::JobState state, const std::string& kind) {
  job.set_state(state);
  absl::StatusOr<int64_t> seq = store.Update(job, Ev(kind));
  EXPECT_TRUE(seq.ok()) << seq.status();
  return seq.ok() ? *seq : -1;
}

std::unique_ptr<JobStore> OpenOrDie(const std::string& path, const JobStoreOptions& options) {
  auto store = JobStore::Open(path, options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

}  // namespace store_test
}  // namespace server
}  // namespace dattn
