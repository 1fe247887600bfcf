#include "tests/manifests.h"

#include <grpcpp/grpcpp.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <set>
#include <thread>

#include "engine/testing/test_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/http_client.h"
#include "tests/process.h"

namespace dattn::testing {
namespace {

std::string Str(const YAML::Node& node, const std::string& fallback = "") {
  return node && node.IsScalar() ? node.as<std::string>() : fallback;
}

// Kubernetes' $(VAR) expansion: $(NAME) becomes the variable's value when it is defined, "$$"
// becomes "$", and anything else stays as it is (an undefined $(NAME) included, recorded).
std::string Expand(const std::string& text, const std::map<std::string, std::string>& env,
                   std::vector<std::string>* unexpanded) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '$') {
      out += '$';
      ++i;
    } else if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '(') {
      const size_t close = text.find(')', i);
      if (close == std::string::npos) {
        out += text.substr(i);
        break;
      }
      const std::string name = text.substr(i + 2, close - i - 2);
      auto it = env.find(name);
      if (it != env.end()) {
        out += it->second;
      } else {
        out += text.substr(i, close - i + 1);
        if (unexpanded != nullptr) unexpanded->push_back(name);
      }
      i = close;
    } else {
      out += text[i];
    }
  }
  return out;
}

// "SERVICE:PORT" (SERVICE optionally with .NAMESPACE[.svc[.cluster.local]]) naming a rendered
// Service's port becomes 127.0.0.1:CONTAINER_PORT: what cluster DNS and the Service would route to
// when every pod runs on this machine.
std::string ResolveServices(const Objects& objects, const std::string& text) {
  static const std::regex re(
      R"(^([a-z0-9-]+)(\.[a-z0-9-]+(\.svc(\.cluster\.local)?)?)?:([0-9]+)$)");
  std::smatch m;
  if (!std::regex_match(text, m, re)) return text;
  const YAML::Node service = objects.Find("Service", m[1].str());
  if (!service) return text;
  for (const YAML::Node& port : service["spec"]["ports"]) {
    if (Str(port["port"]) != m[5].str()) continue;
    const YAML::Node target = port["targetPort"];
    std::string container_port = Str(target, m[5].str());
    if (!container_port.empty() && !std::isdigit(static_cast<unsigned char>(container_port[0]))) {
      // A named port: find it in the pods the Service selects.
      for (const YAML::Node& set : objects.OfKind("StatefulSet")) {
        const YAML::Node tmpl = set["spec"]["template"];
        if (!Selects(service["spec"]["selector"], tmpl["metadata"]["labels"])) continue;
        for (const YAML::Node& c : tmpl["spec"]["containers"]) {
          const int p = ContainerPort(c, container_port);
          if (p > 0) return "127.0.0.1:" + std::to_string(p);
        }
      }
      return text;
    }
    return "127.0.0.1:" + container_port;
  }
  return text;
}

bool ResourceValue(const YAML::Node& container, const YAML::Node& ref, std::string* value,
                   std::string* error) {
  const std::string resource = Str(ref["resource"]);
  const size_t dot = resource.find('.');
  if (dot == std::string::npos) {
    *error = "resourceFieldRef " + resource;
    return false;
  }
  const std::string which = resource.substr(0, dot), name = resource.substr(dot + 1);
  const YAML::Node q = container["resources"][which][name];
  double amount = 0, divisor = 1;
  if (!q || !ParseQuantity(Str(q), &amount)) {
    *error = "resourceFieldRef " + resource + ": the container sets no such resource";
    return false;
  }
  if (ref["divisor"] && !ParseQuantity(Str(ref["divisor"]), &divisor)) {
    *error = "resourceFieldRef divisor " + Str(ref["divisor"]);
    return false;
  }
  // The kubelet rounds up to whole divisors.
  *value = std::to_string(static_cast<int64_t>(std::ceil(amount / divisor)));
  return true;
}

}  // namespace

std::vector<YAML::Node> Objects::OfKind(const std::string& kind) const {
  std::vector<YAML::Node> out;
  for (const YAML::Node& o : items) {
    if (Str(o["kind"]) == kind) out.push_back(o);
  }
  return out;
}

YAML::Node Objects::Find(const std::string& kind, const std::string& name) const {
  static const std::regex hashed("-[a-z0-9]{10}$");
  for (const YAML::Node& o : items) {
    if (Str(o["kind"]) != kind) continue;
    const std::string n = Str(o["metadata"]["name"]);
    if (n == name) return o;
    if (kind == "ConfigMap" && n.size() == name.size() + 11 &&
        n.compare(0, name.size(), name) == 0 && std::regex_search(n, hashed)) {
      return o;
    }
  }
  // An undefined node (false as a bool; lookups in it give undefined nodes), not a null one (which
  // is true).
  static const YAML::Node* const empty = new YAML::Node(YAML::Load("{}"));
  return (*empty)["absent"];
}

bool RenderOverlays(const std::string& dir, std::map<std::string, Objects>* overlays,
                    std::string* error) {
  ProcessOptions o;
  o.name = "render";
  o.log_dir = dir;
  o.argv = {testutil::RunfilePath("deploy/render.sh"), dir + "/rendered"};
  ProcessResult r = RunCommand(o, std::chrono::seconds(60));
  if (r.exit_code != 0) {
    *error = "deploy/render.sh failed:\n" + r.out + r.err;
    return false;
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/rendered")) {
    if (entry.path().extension() != ".yaml") continue;
    Objects objects;
    try {
      for (const YAML::Node& doc : YAML::LoadAllFromFile(entry.path().string())) {
        if (doc && doc.IsMap()) objects.items.push_back(doc);
      }
    } catch (const YAML::Exception& e) {
      *error = entry.path().string() + ": " + e.what();
      return false;
    }
    (*overlays)[entry.path().stem().string()] = objects;
  }
  if (overlays->empty()) {
    *error = "no overlay rendered";
    return false;
  }
  return true;
}

bool Selects(const YAML::Node& match_labels, const YAML::Node& labels) {
  if (!match_labels || !match_labels.IsMap() || match_labels.size() == 0) return false;
  for (const auto& kv : match_labels) {
    if (!labels || !labels[kv.first.as<std::string>()] ||
        labels[kv.first.as<std::string>()].as<std::string>() != kv.second.as<std::string>()) {
      return false;
    }
  }
  return true;
}

bool ParseQuantity(const std::string& text, double* value) {
  static const std::regex re(R"(^([0-9]+(\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$)");
  std::smatch m;
  if (!std::regex_match(text, m, re)) return false;
  const std::map<std::string, double> scale = {{"", 1},
                                               {"m", 1e-3},
                                               {"k", 1e3},
                                               {"M", 1e6},
                                               {"G", 1e9},
                                               {"T", 1e12},
                                               {"Ki", 1024.0},
                                               {"Mi", 1048576.0},
                                               {"Gi", 1073741824.0},
                                               {"Ti", 1099511627776.0}};
  *value = std::stod(m[1].str()) * scale.at(m[3].str());
  return true;
}

int ContainerPort(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& p : container["ports"]) {
    if (Str(p["name"]) == name) return p["containerPort"].as<int>();
  }
  return -1;
}

bool Localize(const Objects& objects, const YAML::Node& statefulset,
              const std::string& container_name, int ordinal, const LocalPodOptions& options,
              LocalContainer* out, std::string* error) {
  const YAML::Node pod = statefulset["spec"]["template"]["spec"];
  YAML::Node container;
  for (const YAML::Node& c : pod["containers"]) {
    if (Str(c["name"]) == container_name) container = c;
  }
  if (!container.IsMap()) {
    *error = "no container " + container_name;
    return false;
  }
  out->spec = container;
  out->pod_name = Str(statefulset["metadata"]["name"]) + "-" + std::to_string(ordinal);
  out->grace_seconds =
      pod["terminationGracePeriodSeconds"] ? pod["terminationGracePeriodSeconds"].as<int>() : 30;
  const std::string ns = Str(statefulset["metadata"]["namespace"], options.ns);

  // envFrom first, then env (which wins), each value as the kubelet resolves it.
  std::map<std::string, std::string>& env = out->env;
  for (const YAML::Node& from : container["envFrom"]) {
    if (!from["configMapRef"]) {
      *error = "envFrom other than configMapRef";
      return false;
    }
    const YAML::Node cm = objects.Find("ConfigMap", Str(from["configMapRef"]["name"]));
    if (!cm) {
      *error = "envFrom ConfigMap " + Str(from["configMapRef"]["name"]) + " is not rendered";
      return false;
    }
    for (const auto& kv : cm["data"]) env[kv.first.as<std::string>()] = kv.second.as<std::string>();
  }
  for (const YAML::Node& e : container["env"]) {
    const std::string name = Str(e["name"]);
    if (e["value"]) {
      env[name] = Expand(Str(e["value"]), env, &out->unexpanded);
      continue;
    }
    const YAML::Node from = e["valueFrom"];
    if (from["fieldRef"]) {
      const std::string path = Str(from["fieldRef"]["fieldPath"]);
      if (path == "metadata.name") {
        env[name] = out->pod_name;
      } else if (path == "metadata.namespace") {
        env[name] = ns;
      } else if (path == "status.podIP") {
        env[name] = options.pod_ip;
      } else {
        *error = "fieldRef " + path;
        return false;
      }
    } else if (from["resourceFieldRef"]) {
      if (!ResourceValue(container, from["resourceFieldRef"], &env[name], error)) return false;
    } else if (from["configMapKeyRef"]) {
      const YAML::Node cm = objects.Find("ConfigMap", Str(from["configMapKeyRef"]["name"]));
      const std::string key = Str(from["configMapKeyRef"]["key"]);
      if (!cm || !cm["data"][key]) {
        *error = "configMapKeyRef " + key;
        return false;
      }
      env[name] = cm["data"][key].as<std::string>();
    } else {
      *error = "env " + name + ": unsupported valueFrom";
      return false;
    }
  }
  for (auto& [name, value] : env) value = ResolveServices(objects, value);

  std::map<std::string, std::string> mounts;  // mountPath -> local folder.
  for (const YAML::Node& m : container["volumeMounts"]) {
    const std::string local = options.volumes_dir + "/" + Str(m["name"]);
    std::filesystem::create_directories(local);
    mounts[Str(m["mountPath"])] = local;
  }
  // The container's paths to local ones, each path once: a path starts where the argument does or
  // after an '=' (as in --data-dir=/var/lib/dattn/data) and is mapped by the longest mount path it
  // begins with (whole components: the path ends there or goes on with '/'), else /usr/local/bin/
  // becomes the binaries' folder. The local folders put in (under $TEST_TMPDIR, which may itself
  // lie under /tmp) are never looked at again: mapping a /tmp mount inside them once made every
  // binary, and later every TLS file, of a pod that mounts /tmp unreadable when Bazel's output root
  // was under /tmp.
  auto map_paths = [&](const std::string& s) {
    std::string out;
    size_t begin = 0;
    for (;;) {
      const size_t eq = s.find('=', begin);
      std::string part = s.substr(begin, eq == std::string::npos ? std::string::npos : eq - begin);
      const std::pair<const std::string, std::string>* best = nullptr;
      for (const auto& mount : mounts) {
        const std::string& path = mount.first;
        const bool prefix = part.compare(0, path.size(), path) == 0 &&
                            (part.size() == path.size() || part[path.size()] == '/');
        if (prefix && (best == nullptr || path.size() > best->first.size())) best = &mount;
      }
      const std::string bin = "/usr/local/bin/";
      if (best != nullptr) {
        part.replace(0, best->first.size(), best->second);
      } else {
        for (size_t at = part.find(bin); at != std::string::npos;
             at = part.find(bin, at + options.bin_dir.size() + 1)) {
          part.replace(at, bin.size(), options.bin_dir + "/");
        }
      }
      out += part;
      if (eq == std::string::npos) break;
      out += '=';
      begin = eq + 1;
    }
    return out;
  };
  for (const char* key : {"command", "args"}) {
    for (const YAML::Node& a : container[key]) {
      out->argv.push_back(
          map_paths(ResolveServices(objects, Expand(Str(a), env, &out->unexpanded))));
    }
  }
  if (out->argv.empty()) {
    *error = "container " + container_name + " has no command (the image's ENTRYPOINT is implied)";
    return false;
  }
  if (container["lifecycle"]) {
    *error = "container " + container_name +
             ": lifecycle hooks are not emulated (dattn's manifests use none: SIGTERM drains)";
    return false;
  }
  return true;
}

bool ProbeOnce(const YAML::Node& probe, const YAML::Node& container, const std::string& ip,
               std::string* detail) {
  const int timeout_s = probe["timeoutSeconds"] ? probe["timeoutSeconds"].as<int>() : 1;
  if (probe["grpc"]) {
    const int port = probe["grpc"]["port"].as<int>();
    const std::string service = Str(probe["grpc"]["service"]);
    auto channel =
        grpc::CreateChannel(ip + ":" + std::to_string(port), grpc::InsecureChannelCredentials());
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
    context.set_wait_for_ready(true);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = stub->Check(&context, request, &response);
    if (status.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    *detail =
        "grpc " + std::to_string(port) + " service \"" + service + "\": " +
        (status.ok() ? "status " + std::to_string(response.status()) : status.error_message());
    return false;
  }
  if (probe["httpGet"]) {
    const YAML::Node port_node = probe["httpGet"]["port"];
    const std::string port_text = Str(port_node);
    const int port = std::isdigit(static_cast<unsigned char>(port_text[0]))
                         ? std::stoi(port_text)
                         : ContainerPort(container, port_text);
    if (port <= 0) {
      *detail = "httpGet port " + port_text + " is not a port of the container";
      return false;
    }
    const std::string path = Str(probe["httpGet"]["path"], "/");
    HttpResult r = HttpGet(ip + ":" + std::to_string(port), path, std::chrono::seconds(timeout_s));
    if (r.status >= 200 && r.status < 400) return true;
    *detail = "httpGet " + std::to_string(port) + path + ": " +
              (r.status < 0 ? r.error : "status " + std::to_string(r.status));
    return false;
  }
  *detail = "a probe kind this emulation does not run (only grpc and httpGet)";
  return false;
}

bool WaitForProbe(const YAML::Node& probe, const YAML::Node& container, const std::string& ip,
                  std::chrono::milliseconds budget, std::string* detail) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (;;) {
    if (ProbeOnce(probe, container, ip, detail)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::chrono::milliseconds ProbeBudget(const YAML::Node& probe) {
  const int period = probe["periodSeconds"] ? probe["periodSeconds"].as<int>() : 10;
  const int failures = probe["failureThreshold"] ? probe["failureThreshold"].as<int>() : 3;
  return std::chrono::seconds(period * failures);
}

}  // namespace dattn::testing
