// Fuzzes the coordinator's request validation (server/requests.h) with its kinds (attention and
// training jobs: the trainer config's JSON included): the input is a serialized SubmitJobRequest
// (as gRPC hands it over); a request that validates is carried through everything the coordinator
// derives from its analysis (each rank's plan on each device kind, the output layout and shard
// headers, a result accumulator, the sizes a spec sized to the cluster offers, the rungs of its
// out-of-memory ladder). The same bytes are
// also read as a ListJobsRequest and a CancelJobRequest and validated.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dattn/v1/job_service.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "server/attention_kind.h"
#include "server/metrics.h"
#include "server/requests.h"
#include "server/training_kind.h"

namespace {

using dattn::server::WorkKinds;

const WorkKinds& Kinds() {
  // protobuf logs every string field that is not UTF-8 on stderr: millions of lines, and time.
  static bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  static dattn::server::Metrics* metrics = new dattn::server::Metrics();
  static WorkKinds* kinds = [] {
    auto* k = new WorkKinds();
    k->Add(std::make_unique<dattn::server::AttentionKind>(metrics));
    k->Add(std::make_unique<dattn::server::TrainingKind>(metrics));
    return k;
  }();
  return *kinds;
}

// A failed check of the harness's own: abort, so that libFuzzer saves the input.
void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const WorkKinds& kinds = Kinds();
  dattn::v1::SubmitJobRequest request;
  if (request.ParseFromArray(data, static_cast<int>(size))) {
    absl::StatusOr<dattn::server::AnalyzedSpec> spec =
        dattn::server::ValidateSubmitJobRequest(request, kinds);
    if (spec.ok()) {
      const dattn::server::JobAnalysis& a = *spec->analysis;
      Check(a.num_ranks >= 1 && !a.devices.empty());
      for (size_t d = 0; d < a.devices.size(); ++d) {
        // The first and last ranks: the ring's edges (a plan per rank is the same arithmetic).
        for (int rank : {0, a.num_ranks - 1}) {
          dattn::v1::TaskAssignment assignment;
          spec->kind->PlanRank(a, d, rank, &assignment);
        }
        std::unique_ptr<dattn::server::AttemptResults> attempt = spec->kind->NewAttempt(a, d);
        dattn::scheduler::RecoveryInput recovery;
        spec->kind->DescribeRecovery(a, d, &recovery);
      }
      if (a.keeps_output) {
        const dattn::server::OutputLayout layout = spec->kind->Output(a);
        Check(layout.ranks == a.num_ranks);
        spec->kind->ShardHeader(a, 0);
        spec->kind->ShardHeader(a, a.num_ranks - 1);
      }
      // A spec sized to the cluster (auto_data_parallel): every size offered is a valid spec of a
      // fixed size, largest first.
      int previous = 0;
      for (const dattn::v1::JobSpec& sized : spec->kind->Sizes(request.spec(), a)) {
        absl::StatusOr<dattn::server::AnalyzedSpec> s = dattn::server::AnalyzeJobSpec(sized, kinds);
        Check(s.ok() && !sized.training().auto_data_parallel());
        Check(previous == 0 || s->analysis->num_ranks < previous);
        previous = s->analysis->num_ranks;
      }
      // The out-of-memory ladder: a bounded list of specs, each of the same kind and tenant, each
      // analysed or refused like any submitted spec (a rung may break another rule of the spec).
      const std::vector<dattn::server::LadderRung> rungs = spec->kind->Ladder(request.spec(), a);
      Check(rungs.size() <= 64);
      for (const dattn::server::LadderRung& rung : rungs) {
        Check(rung.spec.work_case() == request.spec().work_case() && !rung.change.empty());
        Check(rung.spec.tenant() == request.spec().tenant());
        absl::StatusOr<dattn::server::AnalyzedSpec> r =
            dattn::server::AnalyzeJobSpec(rung.spec, kinds);
        Check(r.ok() || !r.status().message().empty());
      }
      // A stored job is analysed again after a restart: the same answer.
      absl::StatusOr<dattn::server::AnalyzedSpec> again =
          dattn::server::AnalyzeJobSpec(request.spec(), kinds);
      Check(again.ok() && again->analysis->num_ranks == a.num_ranks);
    } else {
      Check(!spec.status().message().empty());
    }
  }
  dattn::v1::ListJobsRequest list;
  if (list.ParseFromArray(data, static_cast<int>(size))) {
    (void)dattn::server::ValidateListJobsRequest(list, kinds);
  }
  dattn::v1::CancelJobRequest cancel;
  if (cancel.ParseFromArray(data, static_cast<int>(size))) {
    (void)dattn::server::ValidateCancelJobRequest(cancel);
  }
  return 0;
}
