// A test client of JobService.Attend: sends a call's start and inputs in chunks and reads its whole
// answer, and the element codings the calls use. Shared by tests/attend_e2e_test (CPU workers) and
// tests/attend_check (the GPU check, scripts/gpu-attend-check.sh). Thread-compatible.
#ifndef DATTN_TESTS_ATTEND_CLIENT_H_
#define DATTN_TESTS_ATTEND_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/shared_region.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace dattn::testing {

// What an Attend call returned.
struct AttendAnswer {
  grpc::Status status;
  v1::AttendAccepted accepted;
  std::vector<std::string> outputs;  // out (, dq, dk, dv) bytes, in order.
  v1::AttentionJobResult done;
  bool has_done = false;
  // Protocol breaches seen in the answer (an output chunk out of order or over 4 MiB): empty when
  // none.
  std::string protocol_error;
  double seconds = 0;  // The whole call, wall time.
};

// Sends `start`, then `inputs` (none when start.shared_memory places the tensors) (q, k, v, dout:
// whole tensors' bytes) in chunks of `chunk` bytes from a thread of its own while the answer is
// read, and returns the answer.
AttendAnswer CallAttend(v1::JobService::Stub& stub, const v1::AttendStart& start,
                        const std::vector<std::string>& inputs, int64_t chunk = int64_t{4} << 20,
                        std::chrono::seconds timeout = std::chrono::seconds(120));

// The shared-memory region of a call (the CLI's, client/shared_region.h).
using client::SharedRegion;

// Little-endian bytes of `values` rounded to `dtype` (fp64, fp32, fp16, bf16), and back.
std::string EncodeElements(const std::vector<double>& values, v1::DType dtype);
std::vector<double> DecodeElements(const std::string& bytes, v1::DType dtype);

}  // namespace dattn::testing

#endif  // DATTN_TESTS_ATTEND_CLIENT_H_
