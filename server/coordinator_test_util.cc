#include "server/coordinator_test_util.h"

#include <unistd.h>

#include <cstdlib>

namespace dattn {
namespace server {
namespace ctest {

// Polls `done` until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

std::string NewDataDir() {
  static std::atomic<int> counter{0};
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/coordinator_test_", getpid(), "_",
                      counter++);
}

// A small valid single-rank CPU job.
v1::SubmitJobRequest ValidRequest(const std::string& key) {
  v1::SubmitJobRequest request;
  request.set_idempotency_key(key);
  v1::JobSpec* spec = request.mutable_spec();
  spec->set_name("test job");
  v1::AttentionJobSpec* a = spec->mutable_attention();
  a->mutable_attention()->add_segment_lengths(64);
  a->mutable_attention()->add_dilation_rates(1);
  a->mutable_shape()->set_batch(1);
  a->mutable_shape()->set_seq_len(256);
  a->mutable_shape()->set_num_heads(2);
  a->mutable_shape()->set_head_dim(16);
  a->set_dtype(v1::DTYPE_FP32);
  a->set_num_ranks(1);
  a->set_iterations(4);
  a->set_device(v1::DEVICE_PREFERENCE_CPU);
  return request;
}

std::string LadderTrainingConfig(int micro) {
  return absl::StrCat(R"({
      "model": {"vocab_size": 256, "d_model": 64, "num_layers": 2, "num_heads": 4, "ffn_dim": 256,
                "attention": {"segment_lengths": [256], "dilation_rates": [1]}},
      "data": {"paths": ["/data/corpus.txt"]},
      "seq_len": 2048, "batch_size": 8, "micro_batches": )",
                      micro, R"(, "steps": 200})");
}

v1::SubmitJobRequest RingRequest(const std::string& key, int ranks) {
  v1::SubmitJobRequest request = ValidRequest(key);
  request.mutable_spec()->mutable_attention()->set_num_ranks(ranks);
  return request;
}

// A report of `task`'s rank with its ring formed.
v1::TaskReport FormedReport(const FakeWorker& worker, const std::string& task, v1::TaskState state,
                            double formation_seconds) {
  v1::TaskReport report;
  report.set_worker_id(worker.id());
  report.set_task_id(task);
  report.set_state(state);
  report.set_ring_formation_seconds(formation_seconds);
  return report;
}

// The ranks' assignments, by rank, from each worker's next command.
std::vector<v1::TaskAssignment> Assignments(const std::vector<FakeWorker*>& workers) {
  std::vector<v1::TaskAssignment> out(workers.size());
  for (FakeWorker* worker : workers) {
    std::optional<v1::WorkerCommand> command = worker->Next();
    EXPECT_TRUE(command.has_value() && command->has_assign());
    if (!command.has_value() || !command->has_assign()) return {};
    const int rank = command->assign().rank();
    EXPECT_LT(rank, static_cast<int>(out.size()));
    if (rank < static_cast<int>(out.size())) out[rank] = command->assign();
  }
  return out;
}

// The worker whose id is `id`.
FakeWorker* Holder(const std::vector<FakeWorker*>& workers, const std::string& id) {
  for (FakeWorker* w : workers) {
    if (w->id() == id) return w;
  }
  return nullptr;
}

}  // namespace ctest
}  // namespace server
}  // namespace dattn
