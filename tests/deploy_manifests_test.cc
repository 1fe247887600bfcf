// The Kubernetes manifests in deploy/ as rendered (deploy/render.sh, every overlay), checked for
// what Kubernetes itself would only find out on a cluster, and run: each container's command, args
// and environment started as a local process the way the kubelet would (tests/manifests.h), its
// probes and metrics port asked as the manifest says, a job run through it, and SIGTERM within its
// grace period.
//
// - Pods run as the non-root user the images declare, with startup, readiness and liveness probes
//   on the metrics ports (plaintext /healthz and /readyz: kubelet's gRPC probes cannot speak TLS),
//   resource requests, a read-only root; every daemon runs TLS from its Secret (the coordinator's
//   certificate and tokens, the workers' fleet certificate), none says --insecure.
// - Grace periods cover the drains configured in dattn-config; every $(VAR) resolves.
// - Services, monitors and the PodDisruptionBudgets select pods that exist, on ports that exist;
//   the monitors name the jobs the alert rules and dashboards use; the PrometheusRule is the rules
//   file; the ConfigMaps carry the files they are made of.
// - The Containerfiles agree with the manifests (entrypoint, user, ports).
// - cpu-demo: with Secrets made as docs/DEPLOY.md says (scripts/make-certs.sh, `dattn token new`),
//   the coordinator and a CPU worker from their manifests pass their probes, serve metrics, run a
//   job submitted with the CA and a token, and stop on SIGTERM (the worker leaving first). gpu: the
//   coordinator likewise; the GPU worker's flags are accepted and it stops at the missing GPU (no
//   GPU on CI machines).
//
// The containers listen on their manifests' fixed ports: the BUILD rule gives this test a network
// namespace of its own (tag block-network), as a pod has.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "tests/http_client.h"
#include "tests/manifests.h"
#include "tests/process.h"

namespace dattn::testing {
namespace {

using std::chrono::seconds;

std::string Str(const YAML::Node& node) {
  return node && node.IsScalar() ? node.as<std::string>() : "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The dashboards' file names (deploy/grafana/dashboards/*.json, the //deploy:dashboards glob).
std::set<std::string> DashboardFiles() {
  std::set<std::string> files;
  for (const auto& entry :
       std::filesystem::directory_iterator(testutil::RunfilePath("deploy/grafana/dashboards"))) {
    if (entry.path().extension() == ".json") files.insert(entry.path().filename().string());
  }
  return files;
}

// Structural equality of two YAML trees (maps compared by key, whatever their order).
bool SameYaml(const YAML::Node& a, const YAML::Node& b) {
  if (a.Type() != b.Type()) return false;
  switch (a.Type()) {
    case YAML::NodeType::Scalar:
      return a.as<std::string>() == b.as<std::string>();
    case YAML::NodeType::Sequence:
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!SameYaml(a[i], b[i])) return false;
      }
      return true;
    case YAML::NodeType::Map:
      if (a.size() != b.size()) return false;
      for (const auto& kv : a) {
        const std::string key = kv.first.as<std::string>();
        if (!b[key] || !SameYaml(kv.second, b[key])) return false;
      }
      return true;
    default:
      return true;
  }
}

// The Containerfile's instructions we check.
struct Containerfile {
  std::string entrypoint;  // ENTRYPOINT ["x"]
  std::string user;        // USER
  std::set<int> exposed;   // EXPOSE
  std::vector<std::string> copy_lines;
};

Containerfile ParseContainerfile(const std::string& text) {
  Containerfile c;
  std::istringstream in(text);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, std::regex(R"re(ENTRYPOINT \["([^"]+)"\])re")))
      c.entrypoint = m[1];
    if (std::regex_match(line, m, std::regex(R"(USER (\S+))"))) c.user = m[1];
    if (line.rfind("EXPOSE ", 0) == 0) {
      std::istringstream ports(line.substr(7));
      int p;
      while (ports >> p) c.exposed.insert(p);
    }
    if (line.rfind("COPY ", 0) == 0) c.copy_lines.push_back(line);
  }
  return c;
}

class DeployManifestsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTestDir("deploy-manifests"));
    overlays_ = new std::map<std::string, Objects>();
    error_ = new std::string();
    RenderOverlays(*dir_, overlays_, error_);
  }
  void SetUp() override { ASSERT_TRUE(error_->empty()) << *error_; }

  static const Objects& Overlay(const std::string& name) { return (*overlays_)[name]; }
  // The overlays that run dattn (the monitoring one only watches it).
  static std::vector<std::string> Workloads() { return {"gpu", "cpu-demo"}; }

  // The container's local form, its $(VAR)s all resolved.
  static LocalContainer Local(const std::string& overlay, const std::string& set,
                              const std::string& container, const std::string& run) {
    LocalPodOptions options;
    options.bin_dir = BinDir();
    options.volumes_dir = *dir_ + "/" + run + "-volumes";
    LocalContainer local;
    std::string error;
    EXPECT_TRUE(Localize(Overlay(overlay), Overlay(overlay).Find("StatefulSet", set), container, 0,
                         options, &local, &error))
        << overlay << " " << set << ": " << error;
    return local;
  }

  // The Secrets of docs/DEPLOY.md ("TLS") in the volumes of run `run` (Local's folders): the
  // certificates from scripts/make-certs.sh (the coordinator's and the workers' fleet certificate
  // share the folder standing for both pods' "tls" volume) and a token file from `dattn token new`.
  // Returns the admin token the CLI then passes; "" on failure (with a test failure).
  static std::string MakeSecrets(const std::string& run) {
    const std::string volumes = *dir_ + "/" + run + "-volumes";
    const std::string make = "bash " + testutil::RunfilePath("scripts/make-certs.sh") + " " +
                             volumes + "/tls --worker 'worker:dattn-worker-*' > " + volumes +
                             "-make-certs.log 2>&1";
    EXPECT_EQ(std::system(make.c_str()), 0) << make;
    ProcessOptions o;
    o.name = run + "-token-new";
    o.log_dir = *dir_;
    o.argv = {BinDir() + "/dattn", "token", "new", "--tenant=ops", "--role=admin", "--name=test"};
    ProcessResult r = RunCommand(o, seconds(30));
    std::vector<std::string> lines;
    std::istringstream out(r.out);
    for (std::string line; std::getline(out, line);) lines.push_back(line);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    if (r.exit_code != 0 || lines.size() < 5) return "";
    std::filesystem::create_directories(volumes + "/tokens");
    std::ofstream(volumes + "/tokens/tokens") << lines[4] << "\n";
    return lines[1];
  }

  // A folder standing for the images' /usr/local/bin: the built binaries under their image names.
  static std::string BinDir() {
    const std::string bin = *dir_ + "/usr-local-bin";
    if (!std::filesystem::exists(bin)) {
      std::filesystem::create_directories(bin);
      for (const char* b : {"server/dattn-coordinator", "worker/dattn-worker",
                            "worker/dattn-worker-gpu", "client/dattn"}) {
        std::filesystem::create_symlink(testutil::RunfilePath(b),
                                        bin + "/" + std::filesystem::path(b).filename().string());
      }
    }
    return bin;
  }

  static std::string* dir_;
  static std::map<std::string, Objects>* overlays_;
  static std::string* error_;
};

std::string* DeployManifestsTest::dir_ = nullptr;
std::map<std::string, Objects>* DeployManifestsTest::overlays_ = nullptr;
std::string* DeployManifestsTest::error_ = nullptr;

TEST_F(DeployManifestsTest, TheOverlaysHoldWhatTheySay) {
  for (const char* name : {"gpu", "cpu-demo", "monitoring"}) {
    ASSERT_EQ(overlays_->count(name), 1u) << name;
  }
  EXPECT_TRUE(Overlay("gpu").Find("StatefulSet", "dattn-coordinator"));
  EXPECT_TRUE(Overlay("gpu").Find("StatefulSet", "dattn-worker-gpu"));
  EXPECT_FALSE(Overlay("gpu").Find("StatefulSet", "dattn-worker"));
  EXPECT_TRUE(Overlay("cpu-demo").Find("StatefulSet", "dattn-worker"));
  EXPECT_FALSE(Overlay("cpu-demo").Find("StatefulSet", "dattn-worker-gpu"));
  for (const char* kind : {"ServiceMonitor", "PodMonitor", "PrometheusRule"}) {
    EXPECT_EQ(Overlay("monitoring").OfKind(kind).size(), 1u) << kind;
  }
  for (const auto& [name, objects] : *overlays_) {
    for (const YAML::Node& o : objects.items) {
      EXPECT_EQ(Str(o["metadata"]["namespace"]), "dattn") << name << " " << o["metadata"]["name"];
      EXPECT_EQ(Str(o["metadata"]["labels"]["app.kubernetes.io/part-of"]), "dattn")
          << name << " " << o["kind"] << " " << o["metadata"]["name"];
    }
  }
}

TEST_F(DeployManifestsTest, PodsRunAsNonRootWithHttpProbesRequestsAndTls) {
  for (const std::string& overlay : Workloads()) {
    for (const YAML::Node& set : Overlay(overlay).OfKind("StatefulSet")) {
      const std::string name = Str(set["metadata"]["name"]);
      SCOPED_TRACE(overlay + " " + name);
      const YAML::Node pod = set["spec"]["template"]["spec"];
      EXPECT_EQ(Str(pod["securityContext"]["runAsNonRoot"]), "true");
      EXPECT_EQ(Str(pod["securityContext"]["runAsUser"]), "65532");
      EXPECT_EQ(Str(pod["securityContext"]["runAsGroup"]), "65532");
      ASSERT_EQ(pod["containers"].size(), 1u);
      const YAML::Node c = pod["containers"][0];
      EXPECT_EQ(Str(c["securityContext"]["allowPrivilegeEscalation"]), "false");
      EXPECT_EQ(Str(c["securityContext"]["readOnlyRootFilesystem"]), "true");
      EXPECT_TRUE(c["resources"]["requests"]["cpu"]);
      EXPECT_TRUE(c["resources"]["requests"]["memory"]);
      EXPECT_TRUE(c["resources"]["limits"]["memory"]);
      // Every probe is plaintext HTTP on the metrics port: the gRPC ports speak TLS.
      for (const char* probe : {"startupProbe", "readinessProbe", "livenessProbe"}) {
        ASSERT_TRUE(c[probe]) << probe;
        EXPECT_FALSE(c[probe]["grpc"]) << probe << ": kubelet's gRPC probes cannot speak TLS";
        ASSERT_TRUE(c[probe]["httpGet"]) << probe;
        EXPECT_EQ(Str(c[probe]["httpGet"]["port"]), "metrics") << probe;
      }
      EXPECT_GT(ContainerPort(c, "metrics"), 0) << "no port named metrics";
      EXPECT_EQ(Str(c["readinessProbe"]["httpGet"]["path"]), "/readyz");
      EXPECT_EQ(Str(c["livenessProbe"]["httpGet"]["path"]), "/healthz");
      EXPECT_FALSE(c["lifecycle"]) << "no preStop hook: SIGTERM is the drain";
      const bool worker = name != "dattn-coordinator";
      // TLS: the pod's own Secret (never the other's), mounted read-only, not optional; the
      // flags read the files it holds.
      std::map<std::string, std::string> mounted;  // mountPath -> Secret.
      for (const YAML::Node& m : c["volumeMounts"]) {
        for (const YAML::Node& v : pod["volumes"]) {
          if (Str(v["name"]) != Str(m["name"]) || !v["secret"]) continue;
          EXPECT_EQ(Str(m["readOnly"]), "true") << Str(m["mountPath"]);
          EXPECT_NE(Str(v["secret"]["optional"]), "true") << "a daemon cannot run without it";
          mounted[Str(m["mountPath"])] = Str(v["secret"]["secretName"]);
        }
      }
      std::map<std::string, std::string> want = {
          {"/etc/dattn/tls", worker ? "dattn-worker-tls" : "dattn-coordinator-tls"}};
      if (!worker) want["/etc/dattn/tokens"] = "dattn-tokens";
      EXPECT_EQ(mounted, want);
      std::set<std::string> args;
      for (const char* key : {"command", "args"}) {
        for (const YAML::Node& a : c[key]) args.insert(Str(a));
      }
      EXPECT_EQ(args.count("--insecure"), 0u) << "the manifests run secure";
      const std::string cert = worker ? "worker" : "coordinator";
      for (const std::string& flag : {std::string("--tls-ca=/etc/dattn/tls/ca.pem"),
                                      "--tls-cert=/etc/dattn/tls/" + cert + ".pem",
                                      "--tls-key=/etc/dattn/tls/" + cert + "-key.pem"}) {
        EXPECT_EQ(args.count(flag), 1u) << flag;
      }
      EXPECT_EQ(args.count("--token-file=/etc/dattn/tokens/tokens"), worker ? 0u : 1u);
      if (worker) {
        EXPECT_EQ(Str(c["startupProbe"]["httpGet"]["path"]), "/healthz");
      } else {
        EXPECT_EQ(Str(c["startupProbe"]["httpGet"]["path"]), "/readyz");
        ASSERT_TRUE(set["spec"]["volumeClaimTemplates"]);
        EXPECT_EQ(Str(set["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]), "data");
        EXPECT_TRUE(
            set["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]);
        EXPECT_EQ(Str(set["spec"]["replicas"]), "1") << "one coordinator per store";
      }
      if (name == "dattn-worker-gpu") {
        EXPECT_EQ(Str(c["resources"]["limits"]["nvidia.com/gpu"]), "1");
      }
      for (const YAML::Node& p : c["ports"]) {
        EXPECT_EQ(Str(p["name"]).find("https"), std::string::npos) << "named by role";
      }
    }
  }
}

// Training jobs need storage every worker reads and writes (their data, their checkpoints, which
// any worker must read when a job resumes elsewhere): each workload overlay has a ReadWriteMany
// claim, and every worker pod mounts it read-write at /shared. So does the coordinator: it reads a
// deployment's checkpoint at submit, at the path the workers load it from, and pins a running
// training job's step there (docs/SERVING.md, "Pinned steps").
TEST_F(DeployManifestsTest, WorkersAndTheCoordinatorShareOneReadWriteManyVolumeAtShared) {
  for (const std::string& overlay : Workloads()) {
    SCOPED_TRACE(overlay);
    const YAML::Node claim = Overlay(overlay).Find("PersistentVolumeClaim", "dattn-shared");
    ASSERT_TRUE(claim) << "no PersistentVolumeClaim dattn-shared";
    ASSERT_EQ(claim["spec"]["accessModes"].size(), 1u);
    EXPECT_EQ(Str(claim["spec"]["accessModes"][0]), "ReadWriteMany");
    EXPECT_TRUE(claim["spec"]["resources"]["requests"]["storage"]);
    for (const YAML::Node& set : Overlay(overlay).OfKind("StatefulSet")) {
      const std::string name = Str(set["metadata"]["name"]);
      SCOPED_TRACE(name);
      const YAML::Node pod = set["spec"]["template"]["spec"];
      std::string claimed;  // The volume backed by the claim.
      for (const YAML::Node& v : pod["volumes"]) {
        if (v["persistentVolumeClaim"] &&
            Str(v["persistentVolumeClaim"]["claimName"]) == "dattn-shared") {
          claimed = Str(v["name"]);
        }
      }
      ASSERT_NE(claimed, "") << "the pod does not mount dattn-shared";
      bool mounted = false;
      for (const YAML::Node& m : pod["containers"][0]["volumeMounts"]) {
        if (Str(m["name"]) != claimed) continue;
        mounted = true;
        EXPECT_EQ(Str(m["mountPath"]), "/shared");
        EXPECT_NE(Str(m["readOnly"]), "true") << "checkpoints are written there";
      }
      EXPECT_TRUE(mounted);
    }
  }
}

TEST_F(DeployManifestsTest, GracePeriodsCoverTheDrainsAndEveryVariableResolves) {
  for (const std::string& overlay : Workloads()) {
    SCOPED_TRACE(overlay);
    const YAML::Node config = Overlay(overlay).Find("ConfigMap", "dattn-config");
    ASSERT_TRUE(config) << "no dattn-config";
    auto number = [&](const char* key) {
      EXPECT_TRUE(config["data"][key]) << key;
      return config["data"][key] ? std::stod(config["data"][key].as<std::string>()) : 0.0;
    };
    const LocalContainer coordinator =
        Local(overlay, "dattn-coordinator", "coordinator", overlay + "-check");
    EXPECT_TRUE(coordinator.unexpanded.empty())
        << "undefined: " << ::testing::PrintToString(coordinator.unexpanded);
    // The drain timeout, then 5 s for calls in flight, then the store's close and the metrics.
    EXPECT_GE(coordinator.grace_seconds, number("DATTN_DRAIN_TIMEOUT_MS") / 1000 + 15);
    EXPECT_NE(std::find(coordinator.argv.begin(), coordinator.argv.end(),
                        "--drain-timeout-ms=" +
                            config["data"]["DATTN_DRAIN_TIMEOUT_MS"].as<std::string>()),
              coordinator.argv.end())
        << "the coordinator does not take its drain timeout from dattn-config";
    for (const YAML::Node& set : Overlay(overlay).OfKind("StatefulSet")) {
      const std::string name = Str(set["metadata"]["name"]);
      if (name == "dattn-coordinator") continue;
      const LocalContainer worker = Local(overlay, name, "worker", overlay + "-check");
      EXPECT_TRUE(worker.unexpanded.empty())
          << name << " undefined: " << ::testing::PrintToString(worker.unexpanded);
      // SIGTERM: the worker leaves for up to the drain wait, then its reports get the shutdown
      // timeout.
      EXPECT_GE(worker.grace_seconds, number("DATTN_WORKER_DRAIN_WAIT_S") +
                                          number("DATTN_WORKER_SHUTDOWN_TIMEOUT_S") + 20)
          << name;
      for (const auto& [flag, key] :
           {std::pair<std::string, std::string>{"--drain-wait-s=", "DATTN_WORKER_DRAIN_WAIT_S"},
            {"--shutdown-timeout-s=", "DATTN_WORKER_SHUTDOWN_TIMEOUT_S"}}) {
        EXPECT_NE(std::find(worker.argv.begin(), worker.argv.end(),
                            flag + config["data"][key].as<std::string>()),
                  worker.argv.end())
            << name << " does not take " << flag << " from dattn-config";
      }
      // Workers find the coordinator through its Service (DATTN_COORDINATOR), here resolved to
      // this machine, on the port the coordinator listens on.
      EXPECT_EQ(worker.env.at("DATTN_COORDINATOR"), "127.0.0.1:7070");
    }
  }
}

TEST_F(DeployManifestsTest, ServicesBudgetsAndMonitorsSelectWhatExists) {
  for (const std::string& overlay : Workloads()) {
    const Objects& objects = Overlay(overlay);
    auto pods_selected = [&](const YAML::Node& selector) {
      std::vector<YAML::Node> containers;
      for (const YAML::Node& set : objects.OfKind("StatefulSet")) {
        if (Selects(selector, set["spec"]["template"]["metadata"]["labels"])) {
          containers.push_back(set["spec"]["template"]["spec"]["containers"][0]);
        }
      }
      return containers;
    };
    for (const YAML::Node& service : objects.OfKind("Service")) {
      const std::string name = Str(service["metadata"]["name"]);
      SCOPED_TRACE(overlay + " Service " + name);
      const std::vector<YAML::Node> containers = pods_selected(service["spec"]["selector"]);
      ASSERT_FALSE(containers.empty()) << "selects no pod";
      for (const YAML::Node& port : service["spec"]["ports"]) {
        for (const YAML::Node& c : containers) {
          EXPECT_GT(ContainerPort(c, Str(port["targetPort"])), 0) << Str(port["targetPort"]);
        }
      }
    }
    for (const YAML::Node& set : objects.OfKind("StatefulSet")) {
      const YAML::Node service = objects.Find("Service", Str(set["spec"]["serviceName"]));
      EXPECT_TRUE(service) << overlay << " " << set["metadata"]["name"]
                           << ": no serviceName Service";
      EXPECT_TRUE(Selects(set["spec"]["selector"]["matchLabels"],
                          set["spec"]["template"]["metadata"]["labels"]));
      if (Str(set["metadata"]["name"]) != "dattn-coordinator") {
        EXPECT_EQ(Str(service["spec"]["clusterIP"]), "None") << "workers' Service is headless";
        EXPECT_EQ(Str(service["spec"]["publishNotReadyAddresses"]), "true");
      }
    }
    EXPECT_EQ(Str(objects.Find("Service",
                               "dattn-coordinator-metrics")["spec"]["publishNotReadyAddresses"]),
              "true")
        << "an unready coordinator must still be scraped";
    const std::vector<YAML::Node> budgets = objects.OfKind("PodDisruptionBudget");
    ASSERT_EQ(budgets.size(), 1u) << overlay << ": one PDB, for the workers";
    const std::vector<YAML::Node> budgeted =
        pods_selected(budgets[0]["spec"]["selector"]["matchLabels"]);
    EXPECT_EQ(budgeted.size(), 1u);
    EXPECT_EQ(Str(budgets[0]["spec"]["maxUnavailable"]), "1");
  }

  // The monitors, against both workload overlays: they select the coordinator's metrics Service
  // and the worker pods, on ports named there, with the job names the rules and dashboards use.
  const Objects& monitoring = Overlay("monitoring");
  const YAML::Node service_monitor = monitoring.OfKind("ServiceMonitor")[0];
  const YAML::Node pod_monitor = monitoring.OfKind("PodMonitor")[0];
  for (const std::string& overlay : Workloads()) {
    SCOPED_TRACE(overlay);
    int services = 0;
    for (const YAML::Node& service : Overlay(overlay).OfKind("Service")) {
      if (!Selects(service_monitor["spec"]["selector"]["matchLabels"],
                   service["metadata"]["labels"]))
        continue;
      ++services;
      EXPECT_EQ(Str(service["metadata"]["labels"][Str(service_monitor["spec"]["jobLabel"])]),
                "dattn-coordinator");
      bool port = false;
      for (const YAML::Node& p : service["spec"]["ports"]) {
        port |= Str(p["name"]) == Str(service_monitor["spec"]["endpoints"][0]["port"]);
      }
      EXPECT_TRUE(port);
    }
    EXPECT_EQ(services, 1) << "the ServiceMonitor must select exactly the metrics Service";
    int pods = 0;
    for (const YAML::Node& set : Overlay(overlay).OfKind("StatefulSet")) {
      const YAML::Node labels = set["spec"]["template"]["metadata"]["labels"];
      if (!Selects(pod_monitor["spec"]["selector"]["matchLabels"], labels)) continue;
      ++pods;
      EXPECT_EQ(Str(labels[Str(pod_monitor["spec"]["jobLabel"])]), "dattn-worker");
      EXPECT_GT(ContainerPort(set["spec"]["template"]["spec"]["containers"][0],
                              Str(pod_monitor["spec"]["podMetricsEndpoints"][0]["port"])),
                0);
    }
    EXPECT_EQ(pods, 1) << "the PodMonitor must select the worker pods";
  }

  // The PrometheusRule is the rules file; the ConfigMaps carry their files unchanged.
  const YAML::Node rules =
      YAML::LoadFile(testutil::RunfilePath("deploy/prometheus/rules/dattn.rules.yml"));
  EXPECT_TRUE(SameYaml(monitoring.OfKind("PrometheusRule")[0]["spec"]["groups"], rules["groups"]))
      << "deploy/prometheus/prometheusrule.yaml differs from rules/dattn.rules.yml";
  const YAML::Node prometheus = monitoring.Find("ConfigMap", "dattn-prometheus");
  EXPECT_EQ(Str(prometheus["data"]["prometheus.yml"]),
            ReadFile(testutil::RunfilePath("deploy/prometheus/prometheus.yml")));
  EXPECT_EQ(Str(prometheus["data"]["dattn.rules.yml"]),
            ReadFile(testutil::RunfilePath("deploy/prometheus/rules/dattn.rules.yml")));
  const YAML::Node dashboards = monitoring.Find("ConfigMap", "dattn-grafana-dashboards");
  EXPECT_EQ(Str(dashboards["metadata"]["labels"]["grafana_dashboard"]), "1");
  // Every dashboard file is in it, unchanged, and nothing else.
  const std::set<std::string> files = DashboardFiles();
  EXPECT_GE(files.size(), 4u);
  std::set<std::string> keys;
  for (const auto& kv : dashboards["data"]) keys.insert(kv.first.as<std::string>());
  EXPECT_EQ(keys, files) << "deploy/grafana/kustomization.yaml must list every dashboard";
  for (const std::string& file : files) {
    if (keys.count(file) == 0) continue;  // Reported above.
    EXPECT_EQ(Str(dashboards["data"][file]),
              ReadFile(testutil::RunfilePath("deploy/grafana/dashboards/" + file)))
        << file;
  }
  EXPECT_FALSE(monitoring.Find(
      "ConfigMap", "dattn-grafana-provisioning")["metadata"]["labels"]["grafana_dashboard"])
      << "the provisioning file is not a dashboard";
}

TEST_F(DeployManifestsTest, ContainerfilesAgreeWithTheManifests) {
  for (const std::string& overlay : Workloads()) {
    for (const YAML::Node& set : Overlay(overlay).OfKind("StatefulSet")) {
      const YAML::Node pod = set["spec"]["template"]["spec"];
      const YAML::Node c = pod["containers"][0];
      const std::string image = Str(c["image"]);
      SCOPED_TRACE(overlay + " " + image);
      std::smatch m;
      ASSERT_TRUE(std::regex_match(image, m, std::regex(R"(localhost/dattn-([a-z-]+):dev)")))
          << "the overlays name the images build.sh tags by default";
      const std::string path =
          testutil::RunfilePath("deploy/images/" + m[1].str() + ".Containerfile");
      ASSERT_TRUE(std::filesystem::exists(path)) << path;
      const Containerfile file = ParseContainerfile(ReadFile(path));
      EXPECT_EQ(file.entrypoint, Str(c["command"][0]));
      EXPECT_EQ(file.user, Str(pod["securityContext"]["runAsUser"]) + ":" +
                               Str(pod["securityContext"]["runAsGroup"]));
      std::set<int> ports;
      for (const YAML::Node& p : c["ports"]) ports.insert(p["containerPort"].as<int>());
      EXPECT_EQ(file.exposed, ports);
      // The container's program is copied into the image.
      std::string copied;
      for (const std::string& line : file.copy_lines) copied += line + "\n";
      const std::string program = std::filesystem::path(Str(c["command"][0])).filename().string();
      EXPECT_NE(copied.find("bin/" + program + " "), std::string::npos)
          << program << " is not copied into the image";
    }
  }
}

// Starts `local` as a process, named `name`, logs in `dir`.
std::unique_ptr<Process> StartLocal(const LocalContainer& local, const std::string& name,
                                    const std::string& dir) {
  ProcessOptions o;
  o.name = name;
  o.log_dir = dir;
  o.argv = local.argv;
  o.env = local.env;
  auto p = std::make_unique<Process>(o);
  std::string error;
  EXPECT_TRUE(p->Start(&error)) << name << ": " << error;
  return p;
}

// The kubelet's view of a started container: the startup probe within its budget (at most 60 s
// here), then readiness within its own, and liveness at once; and its metrics port answers.
void ExpectProbesAndMetrics(const LocalContainer& local, Process& process,
                            const std::string& want_in_metrics) {
  const YAML::Node& c = local.spec;
  std::string detail;
  ASSERT_TRUE(WaitForProbe(
      c["startupProbe"], c, "127.0.0.1",
      std::min<std::chrono::milliseconds>(ProbeBudget(c["startupProbe"]), seconds(60)), &detail))
      << local.pod_name << " startup: " << detail << "\n"
      << process.ReadStderr();
  ASSERT_TRUE(
      WaitForProbe(c["readinessProbe"], c, "127.0.0.1", ProbeBudget(c["readinessProbe"]), &detail))
      << local.pod_name << " readiness: " << detail << "\n"
      << process.ReadStderr();
  EXPECT_TRUE(ProbeOnce(c["livenessProbe"], c, "127.0.0.1", &detail))
      << local.pod_name << " liveness: " << detail;
  const HttpResult metrics =
      HttpGet("127.0.0.1:" + std::to_string(ContainerPort(c, "metrics")), "/metrics");
  EXPECT_EQ(metrics.status, 200) << local.pod_name << " metrics: " << metrics.error;
  EXPECT_NE(metrics.body.find(want_in_metrics), std::string::npos)
      << local.pod_name << " metrics lack " << want_in_metrics;
}

// SIGTERM, as the kubelet sends it; the process must exit 0 within `grace`.
void ExpectStopsWithin(Process& process, std::chrono::milliseconds grace, const std::string& name) {
  process.Signal(SIGTERM);
  std::optional<ProcessResult> r = process.Wait(grace);
  ASSERT_TRUE(r.has_value()) << name << " did not stop within its grace period";
  EXPECT_EQ(r->exit_code, 0) << name << "\n" << r->err;
}

TEST_F(DeployManifestsTest, CpuDemoRunsLocallyAsTheManifestsSay) {
  const LocalContainer coordinator = Local("cpu-demo", "dattn-coordinator", "coordinator", "cpu");
  const LocalContainer worker = Local("cpu-demo", "dattn-worker", "worker", "cpu");
  const std::string token = MakeSecrets("cpu");
  ASSERT_FALSE(token.empty());
  auto c = StartLocal(coordinator, "cpu-coordinator", *dir_);
  ExpectProbesAndMetrics(coordinator, *c, "# TYPE dattn_jobs gauge");
  auto w = StartLocal(worker, "cpu-worker", *dir_);
  ExpectProbesAndMetrics(worker, *w, "dattn_worker_ready 1");
  if (HasFatalFailure()) return;

  // A job through the address the manifests give clients, on the worker the manifests started.
  ProcessOptions cli;
  cli.name = "cli";
  cli.log_dir = *dir_;
  cli.argv = {BinDir() + "/dattn", "submit",         "--seq-len=256", "--heads=2",
              "--head-dim=16",     "--segments=64",  "--rates=1",     "--dtype=fp32",
              "--device=cpu",      "--iterations=2", "--wait"};
  cli.env["DATTN_COORDINATOR"] = worker.env.at("DATTN_COORDINATOR");
  cli.env["DATTN_TLS_CA"] = *dir_ + "/cpu-volumes/tls/ca.pem";
  cli.env["DATTN_TOKEN"] = token;
  ProcessResult job = RunCommand(cli, seconds(60));
  EXPECT_EQ(job.exit_code, 0) << job.out << job.err << w->ReadStderr();
  EXPECT_NE(job.out.find("SUCCEEDED"), std::string::npos) << job.out;
  const HttpResult metrics =
      HttpGet("127.0.0.1:" + std::to_string(ContainerPort(worker.spec, "metrics")), "/metrics");
  EXPECT_NE(metrics.body.find("dattn_worker_ranks_total{outcome=\"succeeded\"} 1"),
            std::string::npos)
      << metrics.body;

  // SIGTERM: the worker leaves (the coordinator drains it; nothing runs, so at once), turns not
  // ready, and stops within its grace period.
  ExpectStopsWithin(*w, seconds(worker.grace_seconds), "cpu worker");
  EXPECT_NE(w->ReadStderr().find("leaving: drained and idle"), std::string::npos)
      << w->ReadStderr();
  EXPECT_NE(c->ReadStderr().find("is leaving: drained at its own request"), std::string::npos)
      << c->ReadStderr();
  ExpectStopsWithin(*c, seconds(coordinator.grace_seconds), "coordinator");
}

// The value of a container's `FLAG=value` argument; "(no FLAG=)" when it has none.
std::string FlagValue(const LocalContainer& container, const std::string& flag) {
  for (const std::string& a : container.argv) {
    if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  }
  return "(no " + flag + "=)";
}

// The local folders the emulation puts in are not mapped again: with Bazel's output root under
// /tmp, the GPU worker's /tmp volume once turned its binary's local path into one that does not
// exist ("exec failed" on every run of a cold CI output root in /tmp).
TEST_F(DeployManifestsTest, LocalPathsUnderTmpAreNotRemapped) {
  LocalPodOptions options;
  options.bin_dir = "/tmp/root/usr-local-bin";
  options.volumes_dir = *dir_ + "/remap-volumes";
  LocalContainer local;
  std::string error;
  ASSERT_TRUE(Localize(Overlay("gpu"), Overlay("gpu").Find("StatefulSet", "dattn-worker-gpu"),
                       "worker", 0, options, &local, &error))
      << error;
  ASSERT_FALSE(local.argv.empty());
  EXPECT_EQ(local.argv[0], "/tmp/root/usr-local-bin/dattn-worker-gpu");
  // The volumes themselves under /tmp (the GPU worker mounts /tmp): its TLS files are mapped once.
  const std::string under_tmp = "/tmp/dattn-remap-" + std::to_string(getpid());
  options.volumes_dir = under_tmp + "/volumes";
  LocalContainer tmp_volumes;
  ASSERT_TRUE(Localize(Overlay("gpu"), Overlay("gpu").Find("StatefulSet", "dattn-worker-gpu"),
                       "worker", 0, options, &tmp_volumes, &error))
      << error;
  std::filesystem::remove_all(under_tmp);
  EXPECT_EQ(FlagValue(tmp_volumes, "--tls-ca"), options.volumes_dir + "/tls/ca.pem");
  options.volumes_dir = *dir_ + "/remap-volumes";
  options.bin_dir = *dir_ + "/bin";
  LocalContainer coordinator;
  ASSERT_TRUE(Localize(Overlay("gpu"), Overlay("gpu").Find("StatefulSet", "dattn-coordinator"),
                       "coordinator", 0, options, &coordinator, &error))
      << error;
  EXPECT_EQ(FlagValue(coordinator, "--data-dir"), options.volumes_dir + "/data/data");
}

TEST_F(DeployManifestsTest, GpuOverlayRunsLocallyUpToTheGpu) {
  const LocalContainer coordinator = Local("gpu", "dattn-coordinator", "coordinator", "gpu");
  const LocalContainer worker = Local("gpu", "dattn-worker-gpu", "worker", "gpu");
  ASSERT_FALSE(MakeSecrets("gpu").empty());
  auto c = StartLocal(coordinator, "gpu-coordinator", *dir_);
  ExpectProbesAndMetrics(coordinator, *c, "# TYPE dattn_jobs gauge");
  auto w = StartLocal(worker, "gpu-worker", *dir_);
  // Without a GPU the worker exits 2 at its device, after its flags were parsed (a bad flag
  // exits 2 too, saying so, not "cannot use GPU"). With one, it runs as the CPU worker does.
  std::optional<ProcessResult> ended = w->Wait(seconds(20));
  if (ended.has_value()) {
    EXPECT_EQ(ended->exit_code, 2) << ended->err;
    EXPECT_NE(ended->err.find("cannot use GPU 0"), std::string::npos) << ended->err;
    std::cout << "no GPU here: dattn-worker-gpu took its manifest's flags and stopped at the "
                 "device: "
              << ended->err.substr(0, ended->err.find('\n')) << "\n";
  } else {
    ExpectProbesAndMetrics(worker, *w, "dattn_worker_ready 1");
    ExpectStopsWithin(*w, seconds(worker.grace_seconds), "gpu worker");
  }
  ExpectStopsWithin(*c, seconds(coordinator.grace_seconds), "coordinator");
}

}  // namespace
}  // namespace dattn::testing
