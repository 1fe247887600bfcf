// Test helper: the plan the coordinator would put in an assignment (api/attention_job.h), so that
// worker tests hand workers assignments like the real ones.
#ifndef DATTN_WORKER_TEST_PLANS_H_
#define DATTN_WORKER_TEST_PLANS_H_

#include "dattn/v1/worker.pb.h"

namespace dattn {
namespace worker {

// `task` with its attention_plan filled for its rank on a device of kind `gpu`, from its spec as
// it is now. A spec the coordinator would refuse leaves the task as it is (no plan).
v1::TaskAssignment Planned(v1::TaskAssignment task, bool gpu = false);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_TEST_PLANS_H_
