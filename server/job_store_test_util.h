// What the job store's tests share (job_store_test, job_store_failure_test,
// job_store_throughput_test): a fresh directory per test, a small valid job, events, and opening a
// store with the failure reported to gtest.
#ifndef DATTN_SERVER_JOB_STORE_TEST_UTIL_H_
#define DATTN_SERVER_JOB_STORE_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "server/job_store.h"

namespace dattn {
namespace server {
namespace store_test {

// A fresh directory per test under bazel's TEST_TMPDIR.
std::string TestDir();

// A QUEUED attention job. A retry has a new id but the same spec: the spec depends on `key`,
// `tenant`, `priority` and `seed` only.
v1::Job MakeJob(const std::string& id, const std::string& key, const std::string& tenant = "t",
                int priority = 0, uint64_t seed = 1);

// An event of kind `kind`.
v1::JobEvent Ev(const std::string& kind);

// Moves `job` to `state` through the store and returns the event's seq (-1 and a test failure if
// the update failed).
int64_t Move(JobStore& store, v1::Job& job, v1::JobState state, const std::string& kind);

// The store at `path`, or nullptr and a test failure.
std::unique_ptr<JobStore> OpenOrDie(const std::string& path, const JobStoreOptions& options = {});

}  // namespace store_test
}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_JOB_STORE_TEST_UTIL_H_
