// Rendered Kubernetes manifests (kubectl kustomize output, deploy/render.sh) read for tests, and a
// container of them turned into a local process the way the kubelet would start it: its command
// and args with $(VAR) expanded from its environment (env and envFrom, the downward API, the
// ConfigMaps rendered beside it), Service names resolved to this machine, /usr/local/bin mapped to
// the built binaries and each volume's mount path to a local folder; and its probes run as the
// kubelet runs them (grpc, httpGet).
//
// What the emulation covers is what dattn's manifests use; anything else (a fieldRef, a probe kind,
// a resource it does not know) is an error naming it rather than a guess. Not thread-safe.
#ifndef DATTN_TESTS_MANIFESTS_H_
#define DATTN_TESTS_MANIFESTS_H_

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "yaml-cpp/yaml.h"

namespace dattn::testing {

// The objects of one rendered overlay.
struct Objects {
  std::vector<YAML::Node> items;

  // Every object of `kind`.
  std::vector<YAML::Node> OfKind(const std::string& kind) const;
  // The object of `kind` named `name` (or, for generated ConfigMaps, `name` plus kustomize's hash
  // suffix); an undefined node (false as a bool) when there is none.
  YAML::Node Find(const std::string& kind, const std::string& name) const;
};

// Renders every overlay with deploy/render.sh into `dir` and loads them: overlay name -> objects.
// False with the reason in *error when rendering or parsing fails.
bool RenderOverlays(const std::string& dir, std::map<std::string, Objects>* overlays,
                    std::string* error);

// Whether every key of `match_labels` (a map) is in `labels` with the same value.
bool Selects(const YAML::Node& match_labels, const YAML::Node& labels);

// A Kubernetes quantity ("500m", "2", "2Gi", "512Mi", "1G") in base units (cores, bytes); false
// for what it cannot read.
bool ParseQuantity(const std::string& text, double* value);

struct LocalPodOptions {
  std::string pod_ip = "127.0.0.1";
  std::string ns = "default";  // metadata.namespace when the object has none.
  // Folder standing for the image's /usr/local/bin: command paths under /usr/local/bin/ are
  // rewritten to it.
  std::string bin_dir;
  // Folder under which each volume gets a folder of its own (mount paths in args are rewritten).
  std::string volumes_dir;
};

// Container `container_name` of replica `ordinal` of the StatefulSet `statefulset`, as a process.
struct LocalContainer {
  std::string pod_name;
  YAML::Node spec;                         // The container as rendered.
  std::vector<std::string> argv;           // command + args, expanded and mapped.
  std::map<std::string, std::string> env;  // Its environment, resolved.
  int grace_seconds = 30;                  // terminationGracePeriodSeconds.
  // $(VAR) references left unexpanded (the kubelet leaves an unknown one as it is).
  std::vector<std::string> unexpanded;
};
bool Localize(const Objects& objects, const YAML::Node& statefulset,
              const std::string& container_name, int ordinal, const LocalPodOptions& options,
              LocalContainer* out, std::string* error);

// One run of `probe` (a container's startupProbe, readinessProbe or livenessProbe) against a
// container listening on `ip`: true when it succeeds (grpc: SERVING for its service; httpGet: a
// 2xx or 3xx answer), else false with what happened in *detail.
bool ProbeOnce(const YAML::Node& probe, const YAML::Node& container, const std::string& ip,
               std::string* detail);
// Runs the probe every 100 ms until it succeeds or `budget` passes.
bool WaitForProbe(const YAML::Node& probe, const YAML::Node& container, const std::string& ip,
                  std::chrono::milliseconds budget, std::string* detail);
// How long the kubelet would let the probe fail in a row: periodSeconds x failureThreshold
// (Kubernetes' defaults 10 and 3).
std::chrono::milliseconds ProbeBudget(const YAML::Node& probe);

// The containerPort named `name` in `container`, or -1.
int ContainerPort(const YAML::Node& container, const std::string& name);

}  // namespace dattn::testing

#endif  // DATTN_TESTS_MANIFESTS_H_
