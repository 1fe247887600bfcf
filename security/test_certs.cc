#include "security/test_certs.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace security {
namespace {

std::string Runfile(const std::string& relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return relative;
  return absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "dattn", "/", relative);
}

absl::Status Run(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
  char buffer[512];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    return absl::InternalError(absl::StrCat(command, " failed (", status, "): ", output));
  }
  return absl::OkStatus();
}

template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};

// A certificate signed by `ca` that expired yesterday, and its key.
absl::Status MakeExpired(const std::string& ca_cert, const std::string& ca_key,
                         const std::string& cert_out, const std::string& key_out) {
  FILE* f = std::fopen(ca_cert.c_str(), "r");
  if (f == nullptr) return absl::InternalError("cannot read " + ca_cert);
  std::unique_ptr<X509, Deleter<X509, X509_free>> ca(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  f = std::fopen(ca_key.c_str(), "r");
  if (f == nullptr) return absl::InternalError("cannot read " + ca_key);
  std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>> signer(
      PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>> key(EVP_EC_gen("P-256"));
  std::unique_ptr<X509, Deleter<X509, X509_free>> cert(X509_new());
  if (!ca || !signer || !key || !cert) return absl::InternalError("OpenSSL could not start");
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 4242);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -2 * 86400);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), -86400);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("expired worker"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca.get()));
  if (X509_sign(cert.get(), signer.get(), EVP_sha256()) == 0) {
    return absl::InternalError("X509_sign failed");
  }
  f = std::fopen(cert_out.c_str(), "w");
  if (f == nullptr) return absl::InternalError("cannot write " + cert_out);
  PEM_write_X509(f, cert.get());
  std::fclose(f);
  f = std::fopen(key_out.c_str(), "w");
  if (f == nullptr) return absl::InternalError("cannot write " + key_out);
  PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TestCerts> MakeTestCerts() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/certs.XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError("mkdtemp failed under " + pattern);
  }
  TestCerts c;
  c.dir = pattern;
  const std::string script = Runfile("scripts/make-certs.sh");
  if (absl::Status s =
          Run(absl::StrCat("bash ", script, " ", c.dir, "/cluster --hosts localhost,127.0.0.1"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          Run(absl::StrCat("bash ", script, " ", c.dir, "/foreign --hosts localhost,127.0.0.1"));
      !s.ok()) {
    return s;
  }
  c.ca = c.dir + "/cluster/ca.pem";
  c.coordinator_cert = c.dir + "/cluster/coordinator.pem";
  c.coordinator_key = c.dir + "/cluster/coordinator-key.pem";
  c.worker_cert = c.dir + "/cluster/worker.pem";
  c.worker_key = c.dir + "/cluster/worker-key.pem";
  c.foreign_ca = c.dir + "/foreign/ca.pem";
  c.foreign_worker_cert = c.dir + "/foreign/worker.pem";
  c.foreign_worker_key = c.dir + "/foreign/worker-key.pem";
  c.expired_cert = c.dir + "/cluster/expired.pem";
  c.expired_key = c.dir + "/cluster/expired-key.pem";
  if (absl::Status s =
          MakeExpired(c.ca, c.dir + "/cluster/ca-key.pem", c.expired_cert, c.expired_key);
      !s.ok()) {
    return s;
  }
  return c;
}

}  // namespace security
}  // namespace dattn
