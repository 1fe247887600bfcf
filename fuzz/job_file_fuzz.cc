// Fuzzes the `dattn submit -f` job file parser (client/job_file.h): each input is parsed as YAML
// and as JSON, as ReadJobFile would for a .yaml and a .json name. Every outcome must be a value or
// an INVALID_ARGUMENT naming the document.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "client/job_file.h"

namespace {

void CheckOutcome(const absl::StatusOr<dattn::client::SubmitOptions>& parsed, const char* source) {
  if (parsed.ok()) return;
  if (!absl::IsInvalidArgument(parsed.status()) ||
      !absl::StartsWith(parsed.status().message(), source)) {
    __builtin_trap();  // Another code, or an error that does not name the file.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // ReadJobFile reads at most this much.
  if (size > static_cast<size_t>(dattn::client::kMaxJobFileBytes)) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  CheckOutcome(dattn::client::ParseJobFile(text, "job.yaml", /*json=*/false), "job.yaml");
  CheckOutcome(dattn::client::ParseJobFile(text, "job.json", /*json=*/true), "job.json");
  return 0;
}
