// A real Prometheus (Debian's package) scrapes a running cluster (a coordinator and three CPU
// workers with --metrics-listen) while jobs are in flight (an attention job and a training job
// running, a ring queued behind them), configured from deploy/prometheus/prometheus.yml itself: its
// Kubernetes service discovery swapped for file discovery of targets that carry the labels
// Kubernetes would give the pods (every pod port in one list, as role "pod" lists them), so the
// shipped relabelling decides what is scraped and how the jobs are named. It evaluates the shipped
// alert rules. Then:
// - the scrape configuration keeps exactly the metrics ports: one coordinator target and one per
//   worker, under the job names the rules and dashboards use;
// - every Grafana panel's query and every alert expression runs without error (none fails to parse
//   or to evaluate), and every metric name in them is one Prometheus has scraped;
// - every panel has data here, but for those listed with the reason they may be empty; no alert
//   expression has any (the cluster is healthy); every rule evaluates healthy;
// - ModelInfer requests (Attend calls inside the coordinator) fill the inference dashboard, and a
//   deployment with Generate and Score calls (on a third worker) the serving dashboard;
// - the dashboards' worker variable lists the three workers; docs/DEPLOY.md lists every panel with
// its
//   queries as they are;
// - no metric name is both the coordinator's and a worker's (a query never mixes the two).
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
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
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "model/config.h"
#include "model/testing/test_checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/cluster.h"
#include "tests/cluster_fixture.h"
#include "tests/http_client.h"
#include "yaml-cpp/yaml.h"

namespace dattn::testing {
namespace {

using std::chrono::seconds;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A small text corpus for the training job (numbered verses of a small vocabulary, 100 KB).
void WriteCorpus(const std::string& path) {
  static const char* const kWords[] = {"the",  "light", "and",  "darkness", "was",  "upon",
                                       "face", "of",    "deep", "waters",   "said", "let"};
  std::ofstream out(path);
  uint64_t x = 12345;
  for (int verse = 1; out.tellp() < 100000; ++verse) {
    out << (verse % 31 + 1) << ":" << verse << " ";
    for (int w = 0; w < 14; ++w) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      out << kWords[(x >> 33) % (sizeof(kWords) / sizeof(kWords[0]))] << (w == 13 ? ".\n" : " ");
    }
  }
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

// Metric names a PromQL expression mentions: dattn_* and up (label names are never dattn_*).
std::set<std::string> MetricNames(const std::string& expr) {
  std::set<std::string> names;
  static const std::regex re(R"(\b(dattn_[a-zA-Z0-9_]+|up)\b)");
  for (std::sregex_iterator it(expr.begin(), expr.end(), re), end; it != end; ++it) {
    names.insert((*it)[1].str());
  }
  return names;
}

// The names a /metrics page declares (# TYPE lines).
std::set<std::string> DeclaredNames(const std::string& text) {
  std::set<std::string> names;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) names.insert(line.substr(7, line.find(' ', 7) - 7));
  }
  return names;
}

// Grafana's variables as a dashboard sends them: every worker, Grafana's rate interval.
std::string GrafanaToPromQL(std::string expr) {
  for (const auto& [var, value] : std::vector<std::pair<std::string, std::string>>{
           {"$__rate_interval", "30s"}, {"$worker", ".*"}}) {
    for (size_t at = expr.find(var); at != std::string::npos; at = expr.find(var, at)) {
      expr.replace(at, var.size(), value);
    }
  }
  return expr;
}

struct NamedQuery {
  std::string where;  // "dashboard dattn-jobs.json panel 'Queue wait'" or "alert DattnX".
  std::string expr;   // As sent.
};

class PrometheusE2E : public ClusterTest {
 protected:
  void TearDown() override {
    if (prometheus_ != nullptr) {
      prometheus_->Signal(SIGTERM);
      prometheus_->Wait(seconds(10));
    }
  }

  // GET /api/v1/... of the Prometheus under test; the parsed answer.
  nlohmann::json Api(const std::string& target) {
    HttpResult r = HttpGet(prometheus_address_, target, seconds(10));
    if (r.status < 0) return {{"status", "error"}, {"error", r.error}};
    nlohmann::json j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return {{"status", "error"}, {"error", "not JSON: " + r.body}};
    return j;
  }
  nlohmann::json Query(const std::string& expr) {
    return Api("/api/v1/query?query=" + UrlEncode(expr));
  }
  // Polls `expr` until its first sample's value is at least `at_least` (30 s at most).
  bool WaitForValue(const std::string& expr, double at_least) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      nlohmann::json j = Query(expr);
      if (j["status"] == "success" && !j["data"]["result"].empty() &&
          std::stod(j["data"]["result"][0]["value"][1].get<std::string>()) >= at_least) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return false;
  }

  std::unique_ptr<Process> prometheus_;
  std::string prometheus_address_;
};

TEST_F(PrometheusE2E, DashboardsAndAlertsQueryWhatTheClusterExports) {
  StartCluster(0);
  std::vector<std::string> worker_metrics;
  std::vector<std::string> worker_health;
  for (int i = 0; i < 3; ++i) {
    std::string error;
    const int w = cluster_->AddWorker(1, &error, "", {"--metrics-listen=127.0.0.1:0"});
    ASSERT_GE(w, 0) << error;
    std::optional<std::string> m =
        cluster_->worker(w).WaitForStderr("metrics on ([0-9.]+:[0-9]+)", seconds(30));
    std::optional<std::string> h =
        cluster_->worker(w).WaitForStderr("health endpoint on ([0-9.]+:[0-9]+)", seconds(30));
    ASSERT_TRUE(m && h) << cluster_->Logs();
    worker_metrics.push_back(*m);
    worker_health.push_back(*h);
  }
  ASSERT_TRUE(cluster_->WaitForReadyWorkers(3, seconds(30))) << cluster_->Logs();
  const std::string dir = cluster_->dir();

  // The targets Kubernetes' pod discovery would list in namespace dattn: every port of every pod,
  // with the pod's labels; the shipped relabelling must keep only the metrics ports.
  nlohmann::json targets = nlohmann::json::array();
  auto pod_port = [&](const std::string& address, const std::string& pod, const std::string& app,
                      const std::string& port_name) {
    targets.push_back({{"targets", {address}},
                       {"labels",
                        {{"__meta_kubernetes_namespace", "dattn"},
                         {"__meta_kubernetes_pod_name", pod},
                         {"__meta_kubernetes_pod_node_name", "node-1"},
                         {"__meta_kubernetes_pod_label_app_kubernetes_io_name", app},
                         {"__meta_kubernetes_pod_container_port_name", port_name}}}});
  };
  pod_port(cluster_->address(), "dattn-coordinator-0", "dattn-coordinator", "grpc");
  pod_port(cluster_->metrics_address(), "dattn-coordinator-0", "dattn-coordinator", "metrics");
  for (int i = 0; i < 3; ++i) {
    const std::string pod = "dattn-worker-" + std::to_string(i);
    pod_port(worker_health[i], pod, "dattn-worker", "health");
    pod_port(worker_metrics[i], pod, "dattn-worker", "metrics");
  }
  std::ofstream(dir + "/pods.json") << targets.dump(2);

  // deploy/prometheus/prometheus.yml with file discovery instead of Kubernetes', a 1 s scrape and
  // evaluation interval, and the rules file where the test finds it.
  YAML::Node config =
      YAML::Load(ReadFile(testutil::RunfilePath("deploy/prometheus/prometheus.yml")));
  config["global"]["scrape_interval"] = "1s";
  config["global"]["scrape_timeout"] = "1s";
  config["global"]["evaluation_interval"] = "1s";
  const std::string rules_path = testutil::RunfilePath("deploy/prometheus/rules/dattn.rules.yml");
  config["rule_files"] = YAML::Node(YAML::NodeType::Sequence);
  config["rule_files"].push_back(rules_path);
  std::set<std::string> jobs;
  for (YAML::Node scrape : config["scrape_configs"]) {
    ASSERT_TRUE(scrape["kubernetes_sd_configs"]) << "each job discovers pods";
    scrape.remove("kubernetes_sd_configs");
    YAML::Node file_sd;
    file_sd["files"].push_back(dir + "/pods.json");
    file_sd["refresh_interval"] = "1s";
    scrape["file_sd_configs"].push_back(file_sd);
    jobs.insert(scrape["job_name"].as<std::string>());
  }
  EXPECT_EQ(jobs, (std::set<std::string>{"dattn-coordinator", "dattn-worker"}));
  YAML::Emitter emitter;
  emitter << config;
  const std::string config_path = dir + "/prometheus.yml";
  std::ofstream(config_path) << emitter.c_str();
  ProcessOptions check;
  check.name = "promtool-config";
  check.log_dir = dir;
  check.argv = {"/usr/bin/promtool", "check", "config", config_path};
  ProcessResult checked = RunCommand(check, seconds(30));
  ASSERT_EQ(checked.exit_code, 0) << checked.out << checked.err;

  const int port = FreePort();
  ASSERT_GT(port, 0);
  prometheus_address_ = "127.0.0.1:" + std::to_string(port);
  ProcessOptions p;
  p.name = "prometheus";
  p.log_dir = dir;
  p.argv = {"/usr/bin/prometheus", "--config.file=" + config_path,
            "--storage.tsdb.path=" + dir + "/tsdb", "--web.listen-address=" + prometheus_address_,
            "--log.level=warn"};
  prometheus_ = std::make_unique<Process>(p);
  std::string error;
  ASSERT_TRUE(prometheus_->Start(&error)) << error;

  // Jobs: one single-rank and one 2-rank ring (Gloo) that end, then one that runs for minutes, a
  // training job on the other worker (a tiny model that evaluates and checkpoints often, for
  // hours), and a ring that waits behind them: in flight while Prometheus is asked.
  const std::vector<std::string> small = {"--seq-len=256", "--heads=2",     "--head-dim=16",
                                          "--segments=64", "--rates=1",     "--dtype=fp32",
                                          "--device=cpu",  "--iterations=2"};
  std::vector<std::string> ring = small;
  ring.push_back("--ranks=2");
  std::vector<std::string> wait = {"--wait"};
  // A deployment of a tiny model, with Generate and Score calls: the serving dashboard's series.
  // It holds one of the three workers throughout.
  model::LongNetConfig tiny;
  tiny.vocab_size = 256;
  tiny.d_model = 16;
  tiny.num_layers = 1;
  tiny.num_heads = 2;
  tiny.ffn_dim = 32;
  tiny.segment_lengths = {8, 16};
  tiny.dilation_rates = {1, 2};
  absl::StatusOr<std::string> checkpoint =
      model::testing::SaveTestCheckpoint(dir + "/model", tiny, 3, 5, 0.1f);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ProcessResult deployed = cluster_->Cli(
      {"deploy", "--checkpoint", *checkpoint, "--max-context", "256", "--wait", "60"});
  ASSERT_EQ(deployed.exit_code, 0) << deployed.out << deployed.err << cluster_->Logs();
  const std::string deployment = JobIdFrom(deployed.out);
  for (const char* prompt : {"In the beginning", "Let there be"}) {
    ProcessResult generated =
        cluster_->Cli({"generate", deployment, "--prompt", prompt, "--max-tokens", "8"});
    ASSERT_EQ(generated.exit_code, 0) << generated.err;
  }
  ProcessResult scored = cluster_->Cli({"score", deployment, "--text", "light"});
  ASSERT_EQ(scored.exit_code, 0) << scored.err;

  Submit(small, wait);
  Submit(ring, wait);
  // Attention on the caller's tensors: ModelInfer requests (each an Attend call inside the
  // coordinator) at 1 and 2 ranks, and one refused for its own fault.
  {
    auto infer = inference::GRPCInferenceService::NewStub(
        cluster_->ChannelWithToken(cluster_->token(kAlice)));
    const int64_t b = 1, n = 64, h = 2, d = 8;
    for (int64_t ranks : {1, 2, 0}) {
      inference::ModelInferRequest request;
      request.set_model_name("dilated-attention");
      for (const char* name : {"q", "k", "v"}) {
        inference::ModelInferRequest::InferInputTensor* in = request.add_inputs();
        in->set_name(name);
        in->set_datatype("FP32");
        for (int64_t dim : {b, n, h, d}) in->add_shape(dim);
        std::string bytes(static_cast<size_t>(b * n * h * d * 4), '\0');
        for (size_t i = 0; i < bytes.size() / 4; ++i) {
          const float x = static_cast<float>((i * 37 + name[0]) % 17) / 17.0f - 0.5f;
          std::memcpy(&bytes[i * 4], &x, 4);
        }
        request.add_raw_input_contents(std::move(bytes));
      }
      (*request.mutable_parameters())["segment_lengths"].set_string_param("16,32");
      (*request.mutable_parameters())["dilation_rates"].set_string_param("1,2");
      (*request.mutable_parameters())["device"].set_string_param("cpu");
      // The third asks for 3 ranks, which do not divide N = 64: refused, the request's fault.
      (*request.mutable_parameters())["num_ranks"].set_int64_param(ranks == 0 ? 3 : ranks);
      inference::ModelInferResponse response;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + seconds(60));
      const grpc::Status status = infer->ModelInfer(&context, request, &response);
      if (ranks == 0) {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
            << status.error_message();
      } else {
        ASSERT_TRUE(status.ok()) << status.error_message() << cluster_->Logs();
      }
    }
  }
  const std::string running =
      Submit({"--seq-len=8192", "--heads=8", "--head-dim=64", "--segments=1024", "--rates=1",
              "--dtype=fp64", "--pass=fwd-bwd", "--device=cpu", "--iterations=100000"});
  dattn::v1::Job job;
  ASSERT_TRUE(cluster_->WaitForJobState(running, dattn::v1::JOB_STATE_RUNNING, seconds(30), &job))
      << cluster_->Logs();
  WriteCorpus(dir + "/corpus.txt");
  std::ofstream(dir + "/trainer.json") << R"({
  "model": {"vocab_size": 256, "d_model": 32, "num_layers": 2, "num_heads": 2, "ffn_dim": 64,
            "attention": {"mode": "grouped", "segment_lengths": [16, 32],
                          "dilation_rates": [1, 2]}},
  "threads": 1,
  "data": {"paths": [")" + dir + R"(/corpus.txt"], "format": "text", "validation_fraction": 0.05},
  "seq_len": 64, "batch_size": 4, "micro_batches": 1, "steps": 1000000, "seed": 7,
  "optimizer": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5},
  "eval": {"every": 20, "batches": 1},
  "checkpoint": {"every": 100, "keep_last": 2}
})";
  const std::string training = Submit({"--train-config", dir + "/trainer.json", "--device", "cpu",
                                       "--checkpoint-dir", dir + "/checkpoints"});
  ASSERT_TRUE(cluster_->WaitForJobState(training, dattn::v1::JOB_STATE_RUNNING, seconds(30), &job))
      << cluster_->Logs();
  const std::string waiting = Submit(ring);

  // Prometheus has scraped all of it, and the rules have been evaluated since.
  ASSERT_TRUE(WaitForValue(R"(sum(dattn_jobs_finished_total{state="succeeded"}))", 2))
      << prometheus_->ReadStderr();
  ASSERT_TRUE(WaitForValue(R"(sum(dattn_worker_ranks{phase="running"}))", 1));
  ASSERT_TRUE(WaitForValue("sum(dattn_queue_depth)", 1));
  ASSERT_TRUE(WaitForValue("sum(dattn_inference_requests_total)", 3));
  ASSERT_TRUE(WaitForValue("sum(dattn_attend_engine_seconds_count)", 2));
  ASSERT_TRUE(WaitForValue(R"(sum(dattn_worker_ranks_total{outcome="succeeded"}))", 3));
  // The training job's series: its loss and an evaluation, steps counted, a checkpoint written.
  ASSERT_TRUE(WaitForValue("count(dattn_training_validation_loss)", 1)) << cluster_->Logs();
  ASSERT_TRUE(WaitForValue("sum(dattn_training_steps_total)", 100));
  ASSERT_TRUE(WaitForValue("sum(dattn_training_checkpoint_seconds_count)", 1)) << cluster_->Logs();
  // The deployment's: its requests, and the gauges its rank reports.
  ASSERT_TRUE(WaitForValue("sum(dattn_serving_requests_total)", 3));
  ASSERT_TRUE(WaitForValue("sum(dattn_generated_tokens_total)", 16));
  ASSERT_TRUE(WaitForValue("count(dattn_deployment_sequences)", 1)) << cluster_->Logs();
  std::this_thread::sleep_for(seconds(2));  // Two more rule evaluations.

  // Exactly the metrics ports were kept, under the shipped job names, with the pod's labels.
  nlohmann::json up = Query("up");
  ASSERT_EQ(up["status"], "success") << up.dump();
  std::map<std::string, int> per_job;
  for (const auto& series : up["data"]["result"]) {
    ++per_job[series["metric"]["job"].get<std::string>()];
    EXPECT_EQ(series["value"][1], "1") << series.dump();
    EXPECT_EQ(series["metric"]["namespace"], "dattn") << series.dump();
    EXPECT_TRUE(series["metric"].contains("pod")) << series.dump();
  }
  EXPECT_EQ(per_job, (std::map<std::string, int>{{"dattn-coordinator", 1}, {"dattn-worker", 3}}));

  nlohmann::json names_json = Api("/api/v1/label/__name__/values");
  ASSERT_EQ(names_json["status"], "success") << names_json.dump();
  std::set<std::string> scraped;
  for (const auto& n : names_json["data"]) scraped.insert(n.get<std::string>());

  // Every query of every panel, and the dashboards' variable.
  std::vector<NamedQuery> queries;
  const std::string docs = ReadFile(testutil::RunfilePath("docs/DEPLOY.md"));
  ASSERT_FALSE(docs.empty());
  const std::set<std::string> dashboards = DashboardFiles();
  EXPECT_GE(dashboards.size(), 5u);
  for (const std::string& file : dashboards) {
    const nlohmann::json dashboard =
        nlohmann::json::parse(ReadFile(testutil::RunfilePath("deploy/grafana/dashboards/" + file)));
    ASSERT_FALSE(dashboard["panels"].empty()) << file;
    for (const auto& panel : dashboard["panels"]) {
      ASSERT_FALSE(panel["targets"].empty()) << file << " " << panel["title"];
      // docs/DEPLOY.md lists the panel with its queries (a table row; '|' escaped in cells).
      std::string row = "| " + panel["title"].get<std::string>() + " | ";
      for (size_t t = 0; t < panel["targets"].size(); ++t) {
        std::string expr = panel["targets"][t]["expr"].get<std::string>();
        for (size_t at = expr.find('|'); at != std::string::npos; at = expr.find('|', at + 2)) {
          expr.replace(at, 1, "\\|");
        }
        row += (t == 0 ? "`" : "<br>`") + expr + "`";
      }
      EXPECT_NE(docs.find(row + " |\n"), std::string::npos)
          << "docs/DEPLOY.md does not list this panel as it is: " << row << " |";
      for (const auto& target : panel["targets"]) {
        queries.push_back(
            {"dashboard " + file + " panel '" + panel["title"].get<std::string>() + "'",
             GrafanaToPromQL(target["expr"].get<std::string>())});
      }
    }
    for (const auto& variable : dashboard["templating"]["list"]) {
      if (variable["name"] != "worker") continue;
      EXPECT_EQ(variable["definition"], "label_values(dattn_worker_info, worker)");
      nlohmann::json values =
          Api("/api/v1/label/worker/values?match[]=" + UrlEncode("dattn_worker_info"));
      EXPECT_EQ(values["data"], nlohmann::json({"worker-0", "worker-1", "worker-2"}))
          << values.dump();
    }
  }
  const size_t panel_queries = queries.size();
  const YAML::Node rules = YAML::LoadFile(rules_path);
  for (const YAML::Node& group : rules["groups"]) {
    for (const YAML::Node& rule : group["rules"]) {
      queries.push_back(
          {"alert " + rule["alert"].as<std::string>(), rule["expr"].as<std::string>()});
    }
  }
  ASSERT_GE(panel_queries, 60u);
  ASSERT_GE(queries.size() - panel_queries, 14u);

  // Panels that may be empty here, and why.
  const std::set<std::string> may_be_empty = {
      // Only calls that did not end OK: a healthy run may have none.
      "dashboard dattn-jobs.json panel 'RPC errors per second'",
  };
  std::vector<std::string> empty;
  for (size_t i = 0; i < queries.size(); ++i) {
    const NamedQuery& q = queries[i];
    SCOPED_TRACE(q.where + ": " + q.expr);
    nlohmann::json r = Query(q.expr);
    EXPECT_EQ(r["status"], "success") << r.dump();
    if (r["status"] != "success") continue;
    for (const std::string& name : MetricNames(q.expr)) {
      EXPECT_EQ(scraped.count(name), 1u) << name << " is not a metric Prometheus scraped";
    }
    if (r["data"]["result"].empty()) {
      empty.push_back(q.where);
      if (i < panel_queries) {
        EXPECT_EQ(may_be_empty.count(q.where), 1u) << "no data for this panel";
      }
    } else if (i >= panel_queries && q.where != "alert DattnDeviceMemoryNearFull") {
      // This cluster is healthy: an alert that would fire here is wrong. (Device memory is this
      // machine's, which the test does not control.)
      ADD_FAILURE() << "fires on a healthy cluster: " << r["data"]["result"].dump();
    }
  }
  std::cout << queries.size() << " queries (" << panel_queries
            << " of panels); empty here: " << ::testing::PrintToString(empty) << "\n";

  // Every rule evaluated without error.
  nlohmann::json evaluated = Api("/api/v1/rules");
  ASSERT_EQ(evaluated["status"], "success") << evaluated.dump();
  int rule_count = 0;
  for (const auto& group : evaluated["data"]["groups"]) {
    for (const auto& rule : group["rules"]) {
      ++rule_count;
      EXPECT_EQ(rule["health"], "ok") << rule.dump();
    }
  }
  EXPECT_EQ(rule_count, static_cast<int>(queries.size() - panel_queries));

  // The coordinator's names and the workers' are apart.
  HttpResult coordinator_page = HttpGet(cluster_->metrics_address(), "/metrics");
  HttpResult worker_page = HttpGet(worker_metrics[0], "/metrics");
  ASSERT_EQ(coordinator_page.status, 200);
  ASSERT_EQ(worker_page.status, 200);
  const std::set<std::string> coordinator_names = DeclaredNames(coordinator_page.body);
  const std::set<std::string> worker_names = DeclaredNames(worker_page.body);
  EXPECT_GE(worker_names.size(), 15u);
  for (const std::string& name : worker_names) {
    EXPECT_EQ(coordinator_names.count(name), 0u) << name << " is exported by both";
    EXPECT_EQ(name.rfind("dattn_worker_", 0), 0u) << name;
  }

  // The queued ring first: once two of the other three are cancelled it is placed, and it ends
  // (successfully) before a cancel that came after them would reach it.
  for (const std::string& id : {waiting, running, training, deployment}) {
    ProcessResult r = cluster_->Cli({"cancel", id});
    EXPECT_EQ(r.exit_code, 0) << id << ": " << r.out << r.err;
  }
}

}  // namespace
}  // namespace dattn::testing
