#include "server/coordinator_options.h"

#include <arpa/inet.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace server {
namespace {

bool IsIpv4(const std::string& host) {
  in_addr addr{};
  return ::inet_pton(AF_INET, host.c_str(), &addr) == 1;
}

}  // namespace

absl::Status ValidateCoordinatorOptions(const CoordinatorOptions& o) {
  if (o.data_dir.empty()) return absl::InvalidArgumentError("data_dir: required");
  if (o.quotas.max_queued_jobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("quotas.max_queued_jobs: must be >= 0, got ", o.quotas.max_queued_jobs));
  }
  if (o.quotas.max_running_ranks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("quotas.max_running_ranks: must be >= 0, got ", o.quotas.max_running_ranks));
  }
  if (!(o.quotas.submits_per_second >= 0)) {  // Also refuses NaN.
    return absl::InvalidArgumentError(
        absl::StrCat("quotas.submits_per_second: must be >= 0, got ", o.quotas.submits_per_second));
  }
  const std::pair<const char*, absl::Duration> positive[] = {
      {"dead_after", o.dead_after},
      {"heartbeat_interval", o.heartbeat_interval},
      {"ring_formation_timeout", o.ring_formation_timeout},
      {"ring_comm_timeout", o.ring_comm_timeout},
      {"store_probe_interval", o.store_probe_interval},
      {"retention", o.retention}};
  for (const auto& [name, value] : positive) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": must be > 0, got ", absl::FormatDuration(value)));
    }
  }
  if (o.feasibility_settle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("feasibility_settle: must be >= 0, got ",
                                                   absl::FormatDuration(o.feasibility_settle)));
  }
  if (o.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: must be >= 1, got ", o.max_attempts));
  }
  if (o.max_watch_streams < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_watch_streams: must be >= 1, got ", o.max_watch_streams));
  }
  if (!IsIpv4(o.rendezvous_host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous_host: must be a numeric IPv4 address, got \"", o.rendezvous_host, "\""));
  }
  if (!o.rendezvous_advertise.empty() && !IsIpv4(o.rendezvous_advertise)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous_advertise: must be a numeric IPv4 address, got \"",
                     o.rendezvous_advertise, "\""));
  }
  if (o.rendezvous_advertise.empty() && o.rendezvous_host == "0.0.0.0") {
    return absl::InvalidArgumentError(
        "rendezvous_advertise: required when the rendezvous stores listen on 0.0.0.0 (workers "
        "need an address they can dial)");
  }
  return absl::OkStatus();
}

}  // namespace server
}  // namespace dattn
