// The coordinator's security with the real binaries (docs/SECURITY.md): TLS with a cluster CA,
// workers with certificates, clients with tokens, tenants apart, admin actions audited.
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "client/connection.h"
#include "dattn/v1/admin.grpc.pb.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "dattn/v1/worker.grpc.pb.h"
#include "engine/testing/test_util.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "security/tls.h"
#include "tests/cluster_fixture.h"

namespace dattn::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;
using ::testing::Not;

const std::vector<std::string> kLongJob = {"--seq-len=96",        "--heads=3",   "--head-dim=8",
                                           "--segments=16,32",    "--rates=1,2", "--dtype=fp64",
                                           "--iterations=1000000"};

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + seconds(10));
  return context;
}

class Security : public ClusterTest {
 protected:
  std::unique_ptr<v1::JobService::Stub> JobsAs(const std::string& who) {
    return v1::JobService::NewStub(cluster_->ChannelWithToken(cluster_->token(who)));
  }
  std::unique_ptr<v1::AdminService::Stub> AdminAs(const std::string& who) {
    return v1::AdminService::NewStub(cluster_->ChannelWithToken(cluster_->token(who)));
  }
  // `dattn` as `who` (its token in DATTN_TOKEN).
  ProcessResult CliAs(const std::string& who, const std::vector<std::string>& args) {
    return cluster_->Cli(args, seconds(60), {{"DATTN_TOKEN", cluster_->token(who)}});
  }
  std::string Submit(const std::string& who) {
    std::vector<std::string> args = {"submit"};
    args.insert(args.end(), kLongJob.begin(), kLongJob.end());
    ProcessResult r = CliAs(who, args);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
    return JobIdFrom(r.out);
  }
  // Another CA and its certificates (scripts/make-certs.sh), in the cluster's folder; "" on
  // failure.
  std::string MakeForeignCerts() {
    const std::string dir = cluster_->dir() + "/foreign";
    const std::string make =
        "bash " + testutil::RunfilePath("scripts/make-certs.sh") + " " + dir + " > /dev/null 2>&1";
    return std::system(make.c_str()) == 0 ? dir : "";
  }
  std::string AuditLog() {
    std::ifstream in(cluster_->data_dir() + "/audit.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

TEST_F(Security, ClientsWithoutAValidTokenAreRefused) {
  StartCluster(0);
  // No token, a wrong token, over TLS.
  for (const std::string& token : {std::string(""), std::string("dattn_not-a-real-token")}) {
    auto stub = v1::JobService::NewStub(cluster_->ChannelWithToken(token));
    v1::ListJobsRequest request;
    v1::ListJobsResponse response;
    grpc::Status s = stub->ListJobs(Context().get(), request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    auto admin = v1::AdminService::NewStub(cluster_->ChannelWithToken(token));
    v1::ListWorkersResponse workers;
    s = admin->ListWorkers(Context().get(), v1::ListWorkersRequest(), &workers);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }
  ProcessResult r = cluster_->Cli({"list"}, seconds(30), {{"DATTN_TOKEN", "dattn_wrong"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("does not know who you are")) << r.err;
  EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED")) << r.err;
  r = cluster_->Cli({"list"}, seconds(30), {{"DATTN_TOKEN", ""}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("no bearer token")) << r.err;

  // The CLI will not send a token in plaintext, and plaintext against the TLS port fails.
  r = cluster_->Cli({"list"}, seconds(30), {{"DATTN_TLS_CA", ""}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("a bearer token goes only over TLS")) << r.err;
  r = cluster_->Cli({"--insecure", "list"}, seconds(30));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE")) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--tls-ca")) << r.err;

  // A client that trusts another CA does not talk to this coordinator.
  const std::string foreign = MakeForeignCerts();
  ASSERT_FALSE(foreign.empty());
  r = cluster_->Cli({"list"}, seconds(30), {{"DATTN_TLS_CA", foreign + "/ca.pem"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE")) << r.err;

  // The right token works.
  r = cluster_->Cli({"list"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// Tenant B cannot see, watch, read, cancel or delete tenant A's job: each answer is the NOT_FOUND
// of a job that does not exist. A job's tenant comes from the token.
TEST_F(Security, TenantsSeeOnlyTheirOwnJobs) {
  StartCluster(1);
  const std::string job_id = Submit(kAlice);
  ASSERT_FALSE(job_id.empty());
  const std::string missing = "j-00000000deadbeef";

  auto alice = JobsAs(kAlice);
  auto bob = JobsAs(kBob);
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  v1::Job job;
  grpc::Status s = alice->GetJob(Context().get(), get, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.spec().tenant(), "alice");

  v1::GetJobRequest get_missing;
  get_missing.set_job_id(missing);
  grpc::Status absent = bob->GetJob(Context().get(), get_missing, &job);
  ASSERT_EQ(absent.error_code(), grpc::StatusCode::NOT_FOUND);
  const std::string want = absl::StrReplaceAll(absent.error_message(), {{missing, job_id}});

  s = bob->GetJob(Context().get(), get, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), want);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  s = bob->CancelJob(Context().get(), cancel, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), want);
  v1::DeleteJobRequest del;
  del.set_job_id(job_id);
  v1::DeleteJobResponse deleted;
  s = bob->DeleteJob(Context().get(), del, &deleted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), want);
  {
    v1::WatchJobRequest watch;
    watch.set_job_id(job_id);
    auto context = Context();
    auto reader = bob->WatchJob(context.get(), watch);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event)) << "bob read an event of alice's job";
    s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(s.error_message(), want);
  }
  {
    v1::ReadOutputRequest read;
    read.set_job_id(job_id);
    auto context = Context();
    auto reader = bob->ReadOutput(context.get(), read);
    v1::TensorChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(s.error_message(), want);
  }
  {
    // Generate and Score treat another tenant's job as one that does not exist; its owner is
    // told it is not a deployment.
    v1::GenerateRequest generate;
    generate.set_deployment_id(job_id);
    generate.set_prompt_text("x");
    auto context = Context();
    auto reader = bob->Generate(context.get(), generate);
    v1::GenerateResponse response;
    EXPECT_FALSE(reader->Read(&response));
    s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(s.error_message(), want);
    v1::ScoreRequest score;
    score.set_deployment_id(job_id);
    score.set_text("xy");
    v1::ScoreResponse scored;
    s = bob->Score(Context().get(), score, &scored);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(s.error_message(), want);
    s = alice->Score(Context().get(), score, &scored);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("not a deployment"));
  }
  // Lists: bob's own tenant only; asking for alice's is refused.
  v1::ListJobsRequest list;
  v1::ListJobsResponse listed;
  s = bob->ListJobs(Context().get(), list, &listed);
  ASSERT_TRUE(s.ok()) << s.error_message();
  for (const v1::Job& j : listed.jobs()) EXPECT_NE(j.job_id(), job_id);
  list.set_tenant("alice");
  s = bob->ListJobs(Context().get(), list, &listed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  // A spec naming another tenant is refused, naming both.
  ProcessResult r = CliAs(kBob, {"submit", "--seq-len=96", "--heads=3", "--head-dim=8",
                                 "--segments=16", "--rates=1", "--tenant=alice"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED")) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tenant \"bob\"")) << r.err;

  // Alice's job is untouched by all that; the admin sees it and may cancel it, which is audited.
  s = alice->GetJob(Context().get(), get, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(job.state(), v1::JOB_STATE_CANCELLED);
  r = cluster_->Cli({"list", "--all"});
  EXPECT_THAT(r.out, HasSubstr(job_id)) << r.out << r.err;
  r = cluster_->Cli({"cancel", job_id});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string audit = AuditLog();
  EXPECT_THAT(audit, HasSubstr("\"method\":\"/dattn.v1.JobService/CancelJob\"")) << audit;
  EXPECT_THAT(audit, HasSubstr("\"target\":\"" + job_id + "\"")) << audit;
  EXPECT_THAT(audit, HasSubstr("\"tenant\":\"ops\"")) << audit;
  // Bob's refused attempts were not admin actions: not in the audit log.
  EXPECT_THAT(audit, Not(HasSubstr("\"name\":\"bob\""))) << audit;
}

TEST_F(Security, AdminServiceNeedsTheAdminRoleAndIsAudited) {
  StartCluster(1);
  ProcessResult r = CliAs(kAlice, {"workers"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED")) << r.err;
  EXPECT_THAT(r.err, HasSubstr("needs the admin role")) << r.err;

  auto admin = AdminAs(kAdmin);
  v1::ListWorkersResponse workers;
  grpc::Status s = admin->ListWorkers(Context().get(), v1::ListWorkersRequest(), &workers);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(workers.workers_size(), 1);
  const std::string worker_id = workers.workers(0).worker_id();
  v1::DrainWorkerRequest drain;
  drain.set_worker_id(worker_id);
  v1::Worker drained;
  s = AdminAs(kAlice)->DrainWorker(Context().get(), drain, &drained);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  s = admin->DrainWorker(Context().get(), drain, &drained);
  EXPECT_TRUE(s.ok()) << s.error_message();

  const std::string audit = AuditLog();
  EXPECT_THAT(audit, HasSubstr("\"method\":\"/dattn.v1.AdminService/DrainWorker\"")) << audit;
  EXPECT_THAT(audit, HasSubstr("\"name\":\"alice\",\"peer\"")) << audit;
  EXPECT_THAT(audit, HasSubstr("\"code\":\"PERMISSION_DENIED\"")) << audit;
  EXPECT_THAT(audit, HasSubstr("\"target\":\"" + worker_id + "\"")) << audit;
}

// Only a peer with a certificate of the cluster CA may use WorkerRegistry; tokens do not open it.
TEST_F(Security, WorkersNeedAClusterCertificate) {
  StartCluster(0);
  // TLS without a client certificate, with an admin token: UNAUTHENTICATED.
  auto registry = v1::WorkerRegistry::NewStub(cluster_->ChannelWithToken(cluster_->token(kAdmin)));
  v1::RegisterWorkerRequest request;
  request.set_name("intruder");
  v1::RegisterWorkerResponse response;
  grpc::Status s = registry->RegisterWorker(Context().get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("certificate signed by the cluster CA"));
  v1::TaskReport report;
  report.set_worker_id("w-1");
  report.set_task_id("j-1/1/0");
  report.set_state(v1::TASK_STATE_SUCCEEDED);
  v1::ReportTaskResponse reported;
  s = registry->ReportTask(Context().get(), report, &reported);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();

  // A worker whose certificate another CA signed never registers.
  const std::string foreign = MakeForeignCerts();
  ASSERT_FALSE(foreign.empty());
  ProcessOptions o;
  o.name = "foreign-worker";
  o.log_dir = cluster_->dir();
  o.argv = {testutil::RunfilePath("worker/dattn-worker"),
            "--coordinator=" + cluster_->address(),
            "--name=foreign",
            "--health-port=0",
            "--tls-ca=" + cluster_->ca_file(),
            "--tls-cert=" + foreign + "/worker.pem",
            "--tls-key=" + foreign + "/worker-key.pem"};
  Process intruder(o);
  std::string error;
  ASSERT_TRUE(intruder.Start(&error)) << error;
  EXPECT_TRUE(intruder.WaitForStderr("registration with .* failed", seconds(20)).has_value())
      << intruder.ReadStderr();
  v1::ListWorkersRequest all;
  all.set_include_dead(true);
  v1::ListWorkersResponse workers;
  s = cluster_->admin().ListWorkers(Context().get(), all, &workers);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(workers.workers_size(), 0);
  intruder.Kill();

  // A worker without a certificate does not start; one with the cluster's registers.
  o.name = "no-cert-worker";
  o.argv = {testutil::RunfilePath("worker/dattn-worker"), "--coordinator=" + cluster_->address(),
            "--name=nocert", "--health-port=0", "--tls-ca=" + cluster_->ca_file()};
  ProcessResult r = RunCommand(o, seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("give --tls-ca, --tls-cert and --tls-key")) << r.err;
  ASSERT_GE(cluster_->AddWorker(1, &error), 0) << error;
  EXPECT_TRUE(cluster_->WaitForReadyWorkers(1, seconds(30))) << cluster_->Logs();
}

// A worker certificate binds the names it may act as (scripts/make-certs.sh --worker
// NAME[:PATTERN]): registering as another worker, or heartbeating, streaming, reporting or
// uploading for another worker's registration, is PERMISSION_DENIED, and that worker keeps its
// place.
TEST_F(Security, AWorkerCertificateActsOnlyForTheNamesItBinds) {
  StartCluster(0);
  std::string error;
  ASSERT_GE(cluster_->AddWorker(1, &error, "victim"), 0) << error;
  ASSERT_TRUE(cluster_->WaitForReadyWorkers(1, seconds(30))) << cluster_->Logs();
  v1::ListWorkersResponse workers;
  grpc::Status s = cluster_->admin().ListWorkers(Context().get(), {}, &workers);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(workers.workers_size(), 1);
  const std::string victim_id = workers.workers(0).worker_id();

  // Certificates of the cluster's CA for one name and for a prefix.
  const std::string certs = cluster_->ca_file().substr(0, cluster_->ca_file().rfind('/'));
  const std::string make = "bash " + testutil::RunfilePath("scripts/make-certs.sh") + " " + certs +
                           " --worker host-a --worker 'gpus:gpu-*' > /dev/null 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0);
  auto registry_as = [&](const std::string& name) {
    security::TlsFiles files;
    files.ca_file = cluster_->ca_file();
    files.cert_file = certs + "/" + name + ".pem";
    files.key_file = certs + "/" + name + "-key.pem";
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        security::ChannelCredentials(files);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return v1::WorkerRegistry::NewStub(grpc::CreateChannel(cluster_->address(), *credentials));
  };
  auto register_as = [&](v1::WorkerRegistry::Stub* registry, const std::string& name) {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.mutable_capabilities()->set_max_ranks(1);
    request.mutable_capabilities()->add_dtypes(v1::DTYPE_FP64);
    v1::RegisterWorkerResponse response;
    return registry->RegisterWorker(Context().get(), request, &response);
  };
  auto denied = [](const grpc::Status& status, const std::string& name) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr("does not bind the worker name \"" + name + "\""));
  };

  std::unique_ptr<v1::WorkerRegistry::Stub> host_a = registry_as("host-a");
  denied(register_as(host_a.get(), "victim"), "victim");
  denied(register_as(host_a.get(), "host-a2"), "host-a2");
  s = register_as(host_a.get(), "host-a");
  EXPECT_TRUE(s.ok()) << s.error_message();

  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id(victim_id);
  v1::HeartbeatResponse beat;
  denied(host_a->Heartbeat(Context().get(), heartbeat, &beat), "victim");
  v1::TaskReport report;
  report.set_worker_id(victim_id);
  report.set_task_id("j-1/1/0");
  report.set_state(v1::TASK_STATE_FAILED);
  v1::ReportTaskResponse reported;
  denied(host_a->ReportTask(Context().get(), report, &reported), "victim");
  v1::StreamAssignmentsRequest stream_request;
  stream_request.set_worker_id(victim_id);
  auto context = Context();
  std::unique_ptr<grpc::ClientReader<v1::WorkerCommand>> stream =
      host_a->StreamAssignments(context.get(), stream_request);
  v1::WorkerCommand command;
  EXPECT_FALSE(stream->Read(&command));
  denied(stream->Finish(), "victim");
  auto upload_context = Context();
  v1::UploadOutputResponse uploaded;
  std::unique_ptr<grpc::ClientWriter<v1::UploadOutputRequest>> upload =
      host_a->UploadOutput(upload_context.get(), &uploaded);
  v1::UploadOutputRequest first;
  first.set_worker_id(victim_id);
  first.set_task_id("j-1/1/0");
  upload->Write(first);
  upload->WritesDone();
  denied(upload->Finish(), "victim");

  // A prefix binds the names that start with it; the coordinator's certificate binds none.
  std::unique_ptr<v1::WorkerRegistry::Stub> gpus = registry_as("gpus");
  s = register_as(gpus.get(), "gpu-7");
  EXPECT_TRUE(s.ok()) << s.error_message();
  denied(register_as(gpus.get(), "gpx-7"), "gpx-7");
  denied(register_as(registry_as("coordinator").get(), "anything"), "anything");

  // The victim was neither evicted nor touched (still ready under its id); three registrations in
  // all (the two made here stop heartbeating and may be dead by now).
  v1::ListWorkersRequest all;
  all.set_include_dead(true);
  s = cluster_->admin().ListWorkers(Context().get(), all, &workers);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::vector<std::string> names;
  for (const v1::Worker& w : workers.workers()) {
    names.push_back(w.name());
    if (w.name() == "victim") {
      EXPECT_EQ(w.worker_id(), victim_id);
      EXPECT_EQ(w.state(), v1::WORKER_STATE_READY);
    }
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("victim", "host-a", "gpu-7"));
}

// One client cannot hold every stream: its WatchJob/ReadOutput streams are bounded
// (--max-streams-per-client); another client is not affected, and a closed stream frees its slot.
TEST_F(Security, StreamsPerClientAreBounded) {
  ClusterOptions options;
  options.coordinator_flags = {"--max-streams-per-client=2"};
  StartCluster(0, options);
  const std::string alice_job = Submit(kAlice);
  const std::string bob_job = Submit(kBob);
  ASSERT_FALSE(alice_job.empty());
  ASSERT_FALSE(bob_job.empty());

  struct Watch {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;
  };
  auto watch = [](v1::JobService::Stub* stub, const std::string& job_id) {
    Watch w{Context(), nullptr};
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    w.reader = stub->WatchJob(w.context.get(), request);
    return w;
  };
  auto alice = JobsAs(kAlice);
  std::vector<Watch> open;
  for (int i = 0; i < 2; ++i) {
    open.push_back(watch(alice.get(), alice_job));
    v1::JobEvent event;
    ASSERT_TRUE(open.back().reader->Read(&event)) << "the watch replays the job's history first";
  }
  Watch third = watch(alice.get(), alice_job);
  v1::JobEvent event;
  EXPECT_FALSE(third.reader->Read(&event));
  grpc::Status s = third.reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("token alice (tenant alice) has 2 WatchJob and "
                                           "ReadOutput streams open, its limit "
                                           "(--max-streams-per-client)"));

  // Another client still watches.
  auto bob = JobsAs(kBob);
  Watch bobs = watch(bob.get(), bob_job);
  EXPECT_TRUE(bobs.reader->Read(&event)) << bobs.reader->Finish().error_message();

  // Closing one of alice's streams frees its slot (once the server sees the cancel).
  open[0].context->TryCancel();
  open[0].reader->Finish();
  bool reopened = false;
  for (int i = 0; i < 50 && !reopened; ++i) {
    Watch again = watch(alice.get(), alice_job);
    reopened = again.reader->Read(&event);
    if (!reopened) {
      again.reader->Finish();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } else {
      again.context->TryCancel();
      again.reader->Finish();
    }
  }
  EXPECT_TRUE(reopened) << "a closed stream's slot was not given back within 5 s";
  for (Watch* w : {&open[1], &bobs}) {
    w->context->TryCancel();
    w->reader->Finish();
  }
}

TEST_F(Security, DaemonsRefuseToStartWithoutTlsOrAnExplicitInsecure) {
  ProcessOptions o;
  o.name = "bare-coordinator";
  o.log_dir = ::testing::TempDir();
  o.argv = {testutil::RunfilePath("server/dattn-coordinator"), "--listen=127.0.0.1:0",
            "--metrics-listen=127.0.0.1:0", "--data-dir=" + ::testing::TempDir() + "/bare"};
  ProcessResult r = RunCommand(o, seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--insecure")) << r.err;
  o.argv.push_back("--insecure");
  o.argv.push_back("--tls-ca=/nonexistent");
  r = RunCommand(o, seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("contradict")) << r.err;
  o.name = "bare-worker";
  o.argv = {testutil::RunfilePath("worker/dattn-worker"), "--coordinator=127.0.0.1:1",
            "--health-port=0"};
  r = RunCommand(o, seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--insecure")) << r.err;
}

}  // namespace
}  // namespace dattn::testing
