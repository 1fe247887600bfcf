// Certificates for tests, made at test time (no key is checked in): a cluster CA with a coordinator
// and worker certificates from scripts/make-certs.sh, a second "foreign" CA with its own
// certificates, and an expired certificate signed by the cluster CA (made with OpenSSL's API: the
// openssl CLI will not make one).
//
// Thread-safety: none; make them once per test binary.
#ifndef DATTN_SECURITY_TEST_CERTS_H_
#define DATTN_SECURITY_TEST_CERTS_H_

#include <string>

#include "absl/status/statusor.h"

namespace dattn {
namespace security {

struct TestCerts {
  std::string dir;  // Everything below lives here.
  // The cluster: ca.pem; coordinator.pem/-key.pem (SAN localhost, 127.0.0.1); worker.pem/-key.pem.
  std::string ca, coordinator_cert, coordinator_key, worker_cert, worker_key;
  // Another CA and a worker certificate it signed.
  std::string foreign_ca, foreign_worker_cert, foreign_worker_key;
  // Signed by the cluster CA, valid from two days ago until yesterday.
  std::string expired_cert, expired_key;
};

// Makes them under a new folder of $TEST_TMPDIR (or /tmp). INTERNAL with the script's output when
// openssl fails.
absl::StatusOr<TestCerts> MakeTestCerts();

}  // namespace security
}  // namespace dattn

#endif  // DATTN_SECURITY_TEST_CERTS_H_
