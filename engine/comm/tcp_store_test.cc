#include "engine/comm/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "gtest/gtest.h"

namespace dattn {
namespace comm {
namespace {

std::unique_ptr<TcpStoreServer> StartServer() {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start();
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(*server);
}

std::unique_ptr<TcpStore> Client(const TcpStoreServer& server,
                                 absl::Duration request_timeout = absl::Seconds(5)) {
  absl::StatusOr<std::unique_ptr<TcpStore>> c =
      TcpStore::Connect(server.address(), absl::Seconds(5), request_timeout);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

TEST(TcpStoreTest, SetGetAcrossClients) {
  auto server = StartServer();
  EXPECT_GT(server->port(), 0);
  auto a = Client(*server);
  auto b = Client(*server);
  ASSERT_TRUE(a->Set("k", std::string("v\0w", 3)).ok());
  absl::StatusOr<std::string> got = b->Get("k", absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("v\0w", 3));
  ASSERT_TRUE(b->Set("k", "second").ok());
  EXPECT_EQ(*a->Get("k", absl::Seconds(1)), "second");
}

TEST(TcpStoreTest, GetWaitsForALaterSet) {
  auto server = StartServer();
  auto a = Client(*server);
  auto b = Client(*server);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(b->Set("late", "here").ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = a->Get("late", absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
}

// CPU time of the calling thread: a wait that blocks in poll uses almost none, one that spins
// through poll(0) uses about as much as it waits.
absl::Duration ThreadCpuTime() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}

// Sets `key` from another client after `delay`.
std::thread SetLater(TcpStore* client, const std::string& key, absl::Duration delay) {
  return std::thread([client, key, delay] {
    absl::SleepFor(delay);
    EXPECT_TRUE(client->Set(key, "here").ok());
  });
}

TEST(TcpStoreTest, GetWithoutATimeoutBlocksUntilTheSet) {
  auto server = StartServer();
  auto a = Client(*server);
  auto b = Client(*server);
  std::thread setter = SetLater(b.get(), "late", absl::Milliseconds(400));
  const absl::Time start = absl::Now();
  const absl::Duration cpu_start = ThreadCpuTime();
  absl::StatusOr<std::string> got = a->Get("late", absl::InfiniteDuration());
  const absl::Duration cpu = ThreadCpuTime() - cpu_start;
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(350));
  EXPECT_LT(cpu, absl::Milliseconds(100)) << "the wait spun instead of blocking";
}

TEST(TcpStoreTest, WaitWithoutATimeoutBlocksUntilTheSet) {
  auto server = StartServer();
  auto a = Client(*server);
  auto b = Client(*server);
  ASSERT_TRUE(b->Set("early", "").ok());
  std::thread setter = SetLater(b.get(), "late", absl::Milliseconds(400));
  const absl::Time start = absl::Now();
  const absl::Duration cpu_start = ThreadCpuTime();
  absl::Status s = a->Wait({"early", "late"}, absl::InfiniteDuration());
  const absl::Duration cpu = ThreadCpuTime() - cpu_start;
  setter.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(*a->Get("late", absl::ZeroDuration()), "here");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(350));
  EXPECT_LT(cpu, absl::Milliseconds(100)) << "the wait spun instead of blocking";
}

TEST(TcpStoreTest, GetTimesOutNamingTheKey) {
  auto server = StartServer();
  auto a = Client(*server);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = a->Get("missing-key", absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("missing-key"), std::string::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  // The connection is still usable after a wait that ran out.
  EXPECT_TRUE(a->Set("x", "1").ok());
}

TEST(TcpStoreTest, WaitNamesEveryMissingKey) {
  auto server = StartServer();
  auto a = Client(*server);
  ASSERT_TRUE(a->Set("present", "").ok());
  absl::Status s = a->Wait({"present", "gone1", "gone2"}, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("gone1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("gone2"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("\"present\""), std::string::npos) << s;
  EXPECT_TRUE(a->Wait({"present"}, absl::Milliseconds(200)).ok());
}

TEST(TcpStoreTest, AddIsAtomicAcrossThreads) {
  auto server = StartServer();
  constexpr int kThreads = 4, kAdds = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto c = Client(*server);
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(c->Add("counter", 2).ok());
    });
  }
  for (auto& t : threads) t.join();
  auto c = Client(*server);
  EXPECT_EQ(*c->Add("counter", 0), kThreads * kAdds * 2);
  EXPECT_EQ(*c->Get("counter", absl::ZeroDuration()), std::to_string(kThreads * kAdds * 2));
  ASSERT_TRUE(c->Set("text", "abc").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(c->Add("text", 1).status()));
}

TEST(TcpStoreTest, ServerShutdownWakesAWaiterWithAnError) {
  auto server = StartServer();
  auto a = Client(*server, absl::Milliseconds(500));
  std::atomic<bool> done{false};
  absl::Status result;
  std::thread waiter([&] {
    result = a->Get("never", absl::Seconds(30)).status();
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  server.reset();
  waiter.join();
  EXPECT_TRUE(done);
  EXPECT_TRUE(absl::IsUnavailable(result)) << result;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Later requests fail quickly too: the server is gone.
  EXPECT_FALSE(a->Set("k", "v").ok());
}

TEST(TcpStoreTest, ConnectToNothingFailsWithinTheTimeout) {
  int port = 0;
  {
    auto server = StartServer();
    port = server->port();
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<TcpStore>> c =
      TcpStore::Connect("127.0.0.1:" + std::to_string(port), absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsUnavailable(c.status())) << c.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(absl::IsInvalidArgument(TcpStore::Connect("no-port").status()));
}

const std::string kSecret(
    "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10"
    "\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f\x00",
    32);

std::unique_ptr<TcpStoreServer> StartServerWithSecret(
    absl::Duration admission_timeout = absl::Seconds(10)) {
  TcpStoreServerOptions options;
  options.secret = kSecret;
  options.admission_timeout = admission_timeout;
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(*server);
}

absl::StatusOr<std::unique_ptr<TcpStore>> ConnectWithSecret(const TcpStoreServer& server,
                                                            const std::string& secret) {
  TcpStoreOptions options;
  options.connect_timeout = absl::Seconds(5);
  options.request_timeout = absl::Seconds(5);
  options.secret = secret;
  return TcpStore::Connect(server.address(), options);
}

// A raw TCP connection to `port` on loopback that sends nothing; -1 on failure.
int RawConnect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` (end of stream) within `timeout`.
bool ClosedByPeerWithin(int fd, absl::Duration timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) return false;
  char byte;
  return ::recv(fd, &byte, 1, 0) == 0;
}

TEST(TcpStoreSecretTest, TheRightSecretIsServed) {
  auto server = StartServerWithSecret();
  absl::StatusOr<std::unique_ptr<TcpStore>> a = ConnectWithSecret(*server, kSecret);
  absl::StatusOr<std::unique_ptr<TcpStore>> b = ConnectWithSecret(*server, kSecret);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*a)->Set("k", "v").ok());
  EXPECT_EQ(*(*b)->Get("k", absl::Seconds(1)), "v");
}

TEST(TcpStoreSecretTest, AWrongOrMissingSecretIsDeniedAndOthersAreStillServed) {
  auto server = StartServerWithSecret();
  absl::StatusOr<std::unique_ptr<TcpStore>> good = ConnectWithSecret(*server, kSecret);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE((*good)->Set("before", "1").ok());

  std::string wrong = kSecret;
  wrong[0] ^= 1;
  for (const std::string& secret : {wrong, std::string(), kSecret.substr(0, 31)}) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<TcpStore>> bad = ConnectWithSecret(*server, secret);
    EXPECT_TRUE(absl::IsPermissionDenied(bad.status())) << bad.status();
    EXPECT_NE(bad.status().message().find("wrong or missing ring secret"), std::string::npos)
        << bad.status();
    // Refused at once, not retried until the connect timeout.
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  }
  // The old-style Connect (no secret) is refused the same way.
  EXPECT_TRUE(absl::IsPermissionDenied(TcpStore::Connect(server->address()).status()));

  // The admitted client and new admitted clients are still served.
  EXPECT_EQ(*(*good)->Get("before", absl::Seconds(1)), "1");
  absl::StatusOr<std::unique_ptr<TcpStore>> later = ConnectWithSecret(*server, kSecret);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(*(*later)->Get("before", absl::Seconds(1)), "1");
}

TEST(TcpStoreSecretTest, AStoreWithoutASecretServesAClientThatSendsOne) {
  auto server = StartServer();
  absl::StatusOr<std::unique_ptr<TcpStore>> c = ConnectWithSecret(*server, kSecret);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->Set("k", "v").ok());
}

TEST(TcpStoreSecretTest, ASilentConnectionIsClosedAtItsDeadlineAndBlocksNobody) {
  auto server = StartServerWithSecret(absl::Milliseconds(500));
  const int silent = RawConnect(server->port());
  ASSERT_GE(silent, 0);
  // Others are admitted and served while the silent connection waits.
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<TcpStore>> c = ConnectWithSecret(*server, kSecret);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->Set("k", "v").ok());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(400));
  // The server ends the silent connection once its admission deadline passes.
  EXPECT_TRUE(ClosedByPeerWithin(silent, absl::Seconds(5)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400));
  ::close(silent);
}

// A flood of connections that never say hello: beyond max_admitting they are closed at once (no
// thread each), the connections in admission end at their deadline, and then ranks are served.
TEST(TcpStoreSecretTest, AFloodOfSilentConnectionsIsBounded) {
  TcpStoreServerOptions options;
  options.secret = kSecret;
  options.admission_timeout = absl::Seconds(4);
  options.max_admitting = 4;
  options.max_connections = 6;
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> started = TcpStoreServer::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  TcpStoreServer& server = **started;
  std::vector<int> flood;
  for (int i = 0; i < 20; ++i) {
    const int fd = RawConnect(server.port());
    ASSERT_GE(fd, 0);
    flood.push_back(fd);
  }
  // 4 are in admission; the other 16 are closed by the server at once, well before the deadline.
  absl::SleepFor(absl::Seconds(1));
  int closed_at_once = 0;
  for (int fd : flood) closed_at_once += ClosedByPeerWithin(fd, absl::ZeroDuration());
  EXPECT_EQ(closed_at_once, 16);
  EXPECT_EQ(server.refused_connections(), 16);
  // The 4 are closed at their admission deadline; then a rank with the secret is admitted.
  for (int fd : flood) EXPECT_TRUE(ClosedByPeerWithin(fd, absl::Seconds(10)));
  absl::StatusOr<std::unique_ptr<TcpStore>> c = ConnectWithSecret(server, kSecret);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->Set("k", "v").ok());
  for (int fd : flood) ::close(fd);
  absl::SleepFor(absl::Milliseconds(1500));  // Refused connections linger up to 1 s.

  // max_connections bounds admitted connections too: 6 ranks are served, a 7th is closed.
  std::vector<std::unique_ptr<TcpStore>> ranks;
  ranks.push_back(*std::move(c));
  for (int i = 1; i < 6; ++i) {
    absl::StatusOr<std::unique_ptr<TcpStore>> more = ConnectWithSecret(server, kSecret);
    ASSERT_TRUE(more.ok()) << i << ": " << more.status();
    ranks.push_back(*std::move(more));
  }
  const int seventh = RawConnect(server.port());
  ASSERT_GE(seventh, 0);
  EXPECT_TRUE(ClosedByPeerWithin(seventh, absl::Milliseconds(500)));
  ::close(seventh);
  TcpStoreServerOptions none;
  none.max_admitting = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(TcpStoreServer::Start(none).status()));
}

// Mutual TLS, with a PKI that engine/comm/testdata/make_test_pki.sh writes for this run.
class TcpStoreTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = new std::string(std::string(tmp != nullptr ? tmp : "/tmp") + "/tcp_store_test_pki");
    const std::string command = "engine/comm/testdata/make_test_pki.sh '" + *dir_ + "'";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // `name`'s certificate and key (empty: none), trusting `ca`.
  static StoreTls Files(const std::string& name, const std::string& ca = "ca") {
    StoreTls tls;
    tls.ca_file = *dir_ + "/" + ca + ".pem";
    if (!name.empty()) {
      tls.cert_file = *dir_ + "/" + name + ".pem";
      tls.key_file = *dir_ + "/" + name + ".key";
    }
    return tls;
  }

  static std::unique_ptr<TcpStoreServer> StartTlsServer(
      absl::Duration admission_timeout = absl::Seconds(10)) {
    TcpStoreServerOptions options;
    options.secret = kSecret;
    options.tls = Files("server");
    options.admission_timeout = admission_timeout;
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  static absl::StatusOr<std::unique_ptr<TcpStore>> ConnectTls(const TcpStoreServer& server,
                                                              const StoreTls& tls,
                                                              const std::string& secret = kSecret) {
    TcpStoreOptions options;
    options.connect_timeout = absl::Seconds(5);
    options.request_timeout = absl::Seconds(5);
    options.secret = secret;
    options.tls = tls;
    return TcpStore::Connect(server.address(), options);
  }

  // A client of the CA with the secret is still served (the refusals did not stop the server).
  static void ExpectServed(const TcpStoreServer& server) {
    absl::StatusOr<std::unique_ptr<TcpStore>> c = ConnectTls(server, Files("client"));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE((*c)->Set("still", "served").ok());
    EXPECT_EQ(*(*c)->Get("still", absl::Seconds(1)), "served");
  }

  static std::string* dir_;
};

std::string* TcpStoreTlsTest::dir_ = nullptr;

TEST_F(TcpStoreTlsTest, ClientsWithCertificatesOfTheCaAreServed) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<TcpStore>> a = ConnectTls(*server, Files("client"));
  absl::StatusOr<std::unique_ptr<TcpStore>> b = ConnectTls(*server, Files("client"));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string big(1 << 20, 'x');  // Many TLS records.
  ASSERT_TRUE((*a)->Set("k", big).ok());
  EXPECT_EQ(*(*b)->Get("k", absl::Seconds(1)), big);
  EXPECT_EQ(*(*a)->Add("n", 2), 2);
  std::thread setter = SetLater(b->get(), "late", absl::Milliseconds(200));
  EXPECT_EQ(*(*a)->Get("late", absl::Seconds(5)), "here");
  setter.join();
}

TEST_F(TcpStoreTlsTest, TheSecretIsStillRequiredOverTls) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<TcpStore>> c = ConnectTls(*server, Files("client"), "wrong");
  EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("wrong or missing ring secret"), std::string::npos);
  ExpectServed(*server);
}

TEST_F(TcpStoreTlsTest, AClientWithoutACertificateIsRefused) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<TcpStore>> c = ConnectTls(*server, Files(""));
  EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << c.status();
  ExpectServed(*server);
}

TEST_F(TcpStoreTlsTest, AClientCertificateOfAnotherCaIsRefused) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  // The rogue client trusts the real CA (it can verify the server) but its own certificate is
  // signed by another CA.
  absl::StatusOr<std::unique_ptr<TcpStore>> c = ConnectTls(*server, Files("rogue"));
  EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << c.status();
  ExpectServed(*server);
}

TEST_F(TcpStoreTlsTest, AServerCertificateOfAnotherCaIsRefusedByTheClient) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<TcpStore>> c =
      ConnectTls(*server, Files("client", /*ca=*/"other-ca"));
  EXPECT_TRUE(absl::IsUnauthenticated(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("does not verify"), std::string::npos) << c.status();
  ExpectServed(*server);
}

TEST_F(TcpStoreTlsTest, PlaintextAgainstTlsIsRefusedEitherWay) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<TcpStore>> plain = ConnectWithSecret(*server, kSecret);
  EXPECT_FALSE(plain.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ExpectServed(*server);

  // A TLS client of a plaintext store.
  auto plain_server = StartServerWithSecret();
  absl::StatusOr<std::unique_ptr<TcpStore>> tls = ConnectTls(*plain_server, Files("client"));
  EXPECT_FALSE(tls.ok());
  absl::StatusOr<std::unique_ptr<TcpStore>> good = ConnectWithSecret(*plain_server, kSecret);
  ASSERT_TRUE(good.ok()) << good.status();
}

TEST_F(TcpStoreTlsTest, AStalledHandshakeBlocksNobodyAndIsClosedAtItsDeadline) {
  auto server = StartTlsServer(absl::Milliseconds(500));
  ASSERT_NE(server, nullptr);
  const int silent = RawConnect(server->port());
  ASSERT_GE(silent, 0);
  // A connection that sends half a TLS record and stops.
  const int half = RawConnect(server->port());
  ASSERT_GE(half, 0);
  ASSERT_EQ(::send(half, "\x16\x03\x01", 3, MSG_NOSIGNAL), 3);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<TcpStore>> c = ConnectTls(*server, Files("client"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->Set("k", "v").ok());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(400));
  EXPECT_TRUE(ClosedByPeerWithin(silent, absl::Seconds(5)));
  EXPECT_TRUE(ClosedByPeerWithin(half, absl::Seconds(5)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400));
  ::close(silent);
  ::close(half);
  // The admitted connection outlives the others' deadlines.
  EXPECT_EQ(*(*c)->Get("k", absl::Seconds(1)), "v");
}

TEST_F(TcpStoreTlsTest, UnreadableFilesAreInvalidArguments) {
  TcpStoreServerOptions options;
  options.tls = Files("server");
  options.tls.key_file = *dir_ + "/client.key";  // Not the certificate's key.
  EXPECT_TRUE(absl::IsInvalidArgument(TcpStoreServer::Start(options).status()));
  options.tls = Files("server");
  options.tls.cert_file = *dir_ + "/missing.pem";
  EXPECT_TRUE(absl::IsInvalidArgument(TcpStoreServer::Start(options).status()));
  options.tls = Files("");  // A server needs a certificate.
  EXPECT_TRUE(absl::IsInvalidArgument(TcpStoreServer::Start(options).status()));
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  StoreTls tls = Files("client");
  tls.ca_file = *dir_ + "/missing-ca.pem";
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectTls(*server, tls).status()));
  tls = Files("client");
  tls.ca_file.clear();  // A client needs the CA.
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectTls(*server, tls).status()));
}

}  // namespace
}  // namespace comm
}  // namespace dattn
