// RingRendezvous on its own: each attempt's store gets a secret of its own, handed to every rank in
// its RingInfo, and the store admits only connections that present it.
#include "server/ring_rendezvous.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "engine/comm/tcp_store.h"
#include "gtest/gtest.h"
#include "server/metrics.h"

namespace dattn {
namespace server {
namespace {

comm::TcpStoreOptions Quick(const std::string& secret) {
  comm::TcpStoreOptions options;
  options.connect_timeout = absl::Seconds(2);
  options.request_timeout = absl::Seconds(2);
  options.secret = secret;
  return options;
}

TEST(RingRendezvousTest, EveryAttemptHasASecretOfItsOwnThatItsStoreRequires) {
  Metrics metrics;
  RingRendezvous rings(RingOptions{}, &metrics);
  absl::StatusOr<const Ring*> first = rings.Start("job", 1, "gloo", 2);
  ASSERT_TRUE(first.ok()) << first.status();
  const v1::RingInfo rank0 = rings.Info("job", 0);
  const v1::RingInfo rank1 = rings.Info("job", 1);
  EXPECT_EQ(rank0.store_secret().size(), 32u);
  EXPECT_EQ(rank0.store_secret(), rank1.store_secret());
  EXPECT_EQ(rank0.store_secret(), (*first)->secret);
  EXPECT_NE(rank0.store_secret(), std::string(32, '\0'));

  // The store admits the secret and nothing else.
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> admitted =
      comm::TcpStore::Connect(rank0.store_address(), Quick(rank0.store_secret()));
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_TRUE((*admitted)->Set("k", "v").ok());
  EXPECT_TRUE(
      absl::IsPermissionDenied(comm::TcpStore::Connect(rank0.store_address(), Quick("")).status()));
  EXPECT_EQ(RingRendezvous::ProbeMissingRanks(rank0.store_address(), rank0.store_secret(), {},
                                              rank0.ring_id(), 2),
            std::vector<int>({0, 1}));
  EXPECT_EQ(RingRendezvous::ProbeMissingRanks(rank0.store_address(), "", {}, rank0.ring_id(), 2),
            std::nullopt);

  // The next attempt: a new store with a new secret, which the old one does not open.
  absl::StatusOr<const Ring*> second = rings.Start("job", 2, "gloo", 2);
  ASSERT_TRUE(second.ok()) << second.status();
  const v1::RingInfo again = rings.Info("job", 0);
  EXPECT_EQ(again.store_secret().size(), 32u);
  EXPECT_NE(again.store_secret(), rank0.store_secret());
  EXPECT_TRUE(absl::IsPermissionDenied(
      comm::TcpStore::Connect(again.store_address(), Quick(rank0.store_secret())).status()));
  EXPECT_TRUE(comm::TcpStore::Connect(again.store_address(), Quick(again.store_secret())).ok());

  // Another job's ring has its own secret too.
  ASSERT_TRUE(rings.Start("other", 1, "gloo", 3).ok());
  EXPECT_NE(rings.Info("other", 0).store_secret(), again.store_secret());
  admitted->reset();
  rings.End("job", "");
  rings.End("other", "");
  rings.TakeRetired();
}

// RingOptions::tls: every attempt's store requires mutual TLS (with the cluster CA) on top of the
// secret; the files are read as each store starts.
TEST(RingRendezvousTest, StoresUseTheConfiguredTls) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/ring_rendezvous_pki";
  const std::string command = "engine/comm/testdata/make_test_pki.sh '" + dir + "'";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto files = [&](const std::string& name) {
    comm::StoreTls tls;
    tls.ca_file = dir + "/ca.pem";
    tls.cert_file = dir + "/" + name + ".pem";
    tls.key_file = dir + "/" + name + ".key";
    return tls;
  };
  Metrics metrics;
  RingOptions options;
  options.tls = files("server");
  RingRendezvous rings(options, &metrics);
  ASSERT_TRUE(rings.Start("job", 1, "gloo", 2).ok());
  const v1::RingInfo info = rings.Info("job", 0);

  comm::TcpStoreOptions rank = Quick(info.store_secret());
  rank.tls = files("client");
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> admitted =
      comm::TcpStore::Connect(info.store_address(), rank);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_TRUE((*admitted)->Set("k", "v").ok());
  // The secret without TLS is not enough, nor TLS with a certificate of another CA.
  EXPECT_FALSE(comm::TcpStore::Connect(info.store_address(), Quick(info.store_secret())).ok());
  comm::TcpStoreOptions rogue = rank;
  rogue.tls = files("rogue");
  EXPECT_TRUE(
      absl::IsPermissionDenied(comm::TcpStore::Connect(info.store_address(), rogue).status()));
  // The coordinator's own probe connects with the coordinator's files.
  EXPECT_EQ(RingRendezvous::ProbeMissingRanks(info.store_address(), info.store_secret(),
                                              options.tls, info.ring_id(), 2),
            std::vector<int>({0, 1}));

  // A store that cannot read its files does not start (and says which file).
  rings.End("job", "");
  RingOptions broken = options;
  broken.tls.cert_file = dir + "/missing.pem";
  RingRendezvous broken_rings(broken, &metrics);
  absl::StatusOr<const Ring*> failed = broken_rings.Start("job", 2, "gloo", 2);
  EXPECT_TRUE(absl::IsInvalidArgument(failed.status())) << failed.status();
  EXPECT_NE(failed.status().message().find("missing.pem"), std::string::npos) << failed.status();
  admitted->reset();
  rings.TakeRetired();
}

}  // namespace
}  // namespace server
}  // namespace dattn
