#include "security/tls.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "dattn/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "security/test_certs.h"

namespace dattn {
namespace security {
namespace {

// Answers RegisterWorker with the peer's certificate name as the worker id, UNAUTHENTICATED when
// the peer presented no verified certificate: what the coordinator's registry checks.
class EchoRegistry final : public v1::WorkerRegistry::Service {
  grpc::Status RegisterWorker(grpc::ServerContext* context, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    if (!PeerHasClusterCertificate(*context)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no client certificate");
    }
    response->set_worker_id(PeerCommonName(*context));
    return grpc::Status::OK;
  }
};

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<TestCerts> made = MakeTestCerts();
    ASSERT_TRUE(made.ok()) << made.status();
    certs_ = new TestCerts(*made);
  }

  // A server on 127.0.0.1 with `files`; returns its address.
  std::string Serve(const TlsFiles& files, absl::Duration refresh = kDefaultRefresh) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        ServerCredentials(files, refresh);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    if (!credentials.ok()) return "";
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", *credentials, &port);
    builder.RegisterService(&registry_);
    server_ = builder.BuildAndStart();
    EXPECT_NE(port, 0);
    return absl::StrCat("127.0.0.1:", port);
  }

  TlsFiles ClusterServer() const {
    TlsFiles f;
    f.ca_file = certs_->ca;
    f.cert_file = certs_->coordinator_cert;
    f.key_file = certs_->coordinator_key;
    return f;
  }

  // RegisterWorker over `credentials`, with a 5 s deadline.
  static grpc::Status Call(const std::string& address,
                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                           std::string* name = nullptr) {
    auto stub = v1::WorkerRegistry::NewStub(grpc::CreateChannel(address, credentials));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::RegisterWorkerRequest request;
    v1::RegisterWorkerResponse response;
    grpc::Status status = stub->RegisterWorker(&context, request, &response);
    if (name != nullptr) *name = response.worker_id();
    return status;
  }

  static std::shared_ptr<grpc::ChannelCredentials> Client(const std::string& ca,
                                                          const std::string& cert = "",
                                                          const std::string& key = "") {
    TlsFiles f;
    f.ca_file = ca;
    f.cert_file = cert;
    f.key_file = key;
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> c = ChannelCredentials(f);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }

  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  static TestCerts* certs_;
  EchoRegistry registry_;
  std::unique_ptr<grpc::Server> server_;
};

TestCerts* TlsTest::certs_ = nullptr;

TEST_F(TlsTest, AWorkerWithAClusterCertificateIsKnownByName) {
  const std::string address = Serve(ClusterServer());
  std::string name;
  grpc::Status s =
      Call(address, Client(certs_->ca, certs_->worker_cert, certs_->worker_key), &name);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(name, "dattn-worker worker");
}

TEST_F(TlsTest, AClientWithoutACertificateConnectsButIsNoWorker) {
  const std::string address = Serve(ClusterServer());
  grpc::Status s = Call(address, Client(certs_->ca));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
}

TEST_F(TlsTest, AForeignCertificateFailsTheHandshake) {
  const std::string address = Serve(ClusterServer());
  grpc::Status s =
      Call(address, Client(certs_->ca, certs_->foreign_worker_cert, certs_->foreign_worker_key));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(TlsTest, AnExpiredCertificateIsRefusedByBothEnds) {
  // Our own credentials refuse to present it, naming the file...
  TlsFiles f;
  f.ca_file = certs_->ca;
  f.cert_file = certs_->expired_cert;
  f.key_file = certs_->expired_key;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ours = ChannelCredentials(f);
  ASSERT_FALSE(ours.ok());
  EXPECT_NE(ours.status().message().find("has expired"), std::string::npos) << ours.status();
  EXPECT_NE(ours.status().message().find(certs_->expired_cert), std::string::npos);
  // ... and a client that presents it anyway fails the handshake.
  const std::string address = Serve(ClusterServer());
  grpc::SslCredentialsOptions raw;
  raw.pem_root_certs = Read(certs_->ca);
  raw.pem_cert_chain = Read(certs_->expired_cert);
  raw.pem_private_key = Read(certs_->expired_key);
  grpc::Status s = Call(address, grpc::SslCredentials(raw));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(TlsTest, PlaintextAgainstATlsPortFails) {
  const std::string address = Serve(ClusterServer());
  grpc::Status s = Call(address, grpc::InsecureChannelCredentials());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(TlsTest, AClientTrustingAnotherCaRefusesTheServer) {
  const std::string address = Serve(ClusterServer());
  grpc::Status s = Call(address, Client(certs_->foreign_ca));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(TlsTest, BadFilesAreNamedWithTheirFlag) {
  TlsFiles f = ClusterServer();
  f.key_file = certs_->worker_key;  // Another certificate's key.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> s = ServerCredentials(f);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--tls-key"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("is not the key of the certificate"), std::string::npos);

  f = ClusterServer();
  f.cert_file = certs_->dir + "/missing.pem";
  s = ServerCredentials(f);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--tls-cert " + f.cert_file + ": cannot be read"),
            std::string::npos)
      << s.status();

  f = ClusterServer();
  f.ca_file = certs_->coordinator_key;  // A key where a certificate belongs.
  s = ServerCredentials(f);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--tls-ca"), std::string::npos) << s.status();

  TlsFiles client;
  client.cert_file = certs_->worker_cert;
  EXPECT_FALSE(ChannelCredentials(client).ok()) << "no CA";
  client.ca_file = certs_->ca;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> half = ChannelCredentials(client);
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("go together"), std::string::npos) << half.status();
}

// A rotated server certificate is used by new connections without a restart.
TEST_F(TlsTest, ARotatedCertificateIsServedWithoutARestart) {
  const std::string dir = certs_->dir + "/rotating";
  std::filesystem::create_directories(dir);
  TlsFiles f;
  f.ca_file = dir + "/ca.pem";
  f.cert_file = dir + "/cert.pem";
  f.key_file = dir + "/key.pem";
  auto install = [&](const std::string& ca, const std::string& cert, const std::string& key) {
    // Written beside and renamed into place, as a Kubernetes Secret update does (atomically).
    for (const auto& [from, to] :
         {std::pair{ca, f.ca_file}, {cert, f.cert_file}, {key, f.key_file}}) {
      std::filesystem::copy_file(from, to + ".new",
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::rename(to + ".new", to);
    }
  };
  install(certs_->ca, certs_->coordinator_cert, certs_->coordinator_key);
  const std::string address = Serve(f, absl::Seconds(1));
  ASSERT_TRUE(Call(address, Client(certs_->ca, certs_->worker_cert, certs_->worker_key)).ok());

  install(certs_->foreign_ca, certs_->dir + "/foreign/coordinator.pem",
          certs_->dir + "/foreign/coordinator-key.pem");
  bool rotated = false;
  for (int i = 0; i < 40 && !rotated; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    rotated = Call(address, Client(certs_->foreign_ca, certs_->foreign_worker_cert,
                                   certs_->foreign_worker_key))
                  .ok();
  }
  EXPECT_TRUE(rotated) << "new connections did not get the new certificate within 10 s";
}

TEST(WorkerNames, ACertificateBindsOneNameAPrefixOrAny) {
  EXPECT_EQ(WorkerNamePattern("dattn-worker host-a"), "host-a");
  EXPECT_EQ(WorkerNamePattern("dattn-worker gpu-*"), "gpu-*");
  EXPECT_EQ(WorkerNamePattern("dattn-coordinator"), "");
  EXPECT_EQ(WorkerNamePattern("dattn-worker "), "");
  EXPECT_EQ(WorkerNamePattern("x dattn-worker host-a"), "");

  EXPECT_TRUE(WorkerNameAllowed("host-a", "host-a"));
  EXPECT_FALSE(WorkerNameAllowed("host-a", "host-a2"));
  EXPECT_FALSE(WorkerNameAllowed("host-a", "host-"));
  EXPECT_TRUE(WorkerNameAllowed("gpu-*", "gpu-0"));
  EXPECT_TRUE(WorkerNameAllowed("gpu-*", "gpu-"));
  EXPECT_FALSE(WorkerNameAllowed("gpu-*", "gpx-0"));
  EXPECT_FALSE(WorkerNameAllowed("gpu-*", "gpu"));
  EXPECT_TRUE(WorkerNameAllowed("*", "anything"));
  EXPECT_FALSE(WorkerNameAllowed("", "anything"));
  EXPECT_FALSE(WorkerNameAllowed("*", ""));
}

TEST(TransportFlags, TlsOrAnExplicitInsecureButNotBoth) {
  TlsFiles all;
  all.ca_file = "ca.pem";
  all.cert_file = "c.pem";
  all.key_file = "k.pem";
  EXPECT_TRUE(CheckTransportFlags(all, false, {"tokens"}, "missing").ok());
  EXPECT_TRUE(CheckTransportFlags(TlsFiles(), true, {}, "missing").ok());
  absl::Status s = CheckTransportFlags(all, false, {""}, "give them");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "give them");
  TlsFiles no_key = all;
  no_key.key_file.clear();
  EXPECT_EQ(CheckTransportFlags(no_key, false, {}, "give them").message(), "give them");
  EXPECT_EQ(CheckTransportFlags(TlsFiles(), false, {}, "give them").message(), "give them");
  s = CheckTransportFlags(no_key, true, {}, "give them");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--insecure and --tls-* contradict each other: choose one");
}

}  // namespace
}  // namespace security
}  // namespace dattn
