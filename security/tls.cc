#include "security/tls.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace dattn {
namespace security {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot be read"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

Bio MemBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM file, with its validity checked.
absl::StatusOr<Cert> FirstCertificate(const std::string& path, const std::string& flag,
                                      const std::string& what) {
  absl::StatusOr<std::string> pem = ReadFile(path, flag);
  if (!pem.ok()) return pem.status();
  Bio bio = MemBio(*pem);
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", path, ": no PEM ", what, " in it (expected \"-----BEGIN CERTIFICATE-----\")"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": the ", what, " has expired; make a new one"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": the ", what, " is not valid yet (check the clock)"));
  }
  return cert;
}

absl::StatusOr<Key> PrivateKey(const std::string& path, const std::string& flag) {
  absl::StatusOr<std::string> pem = ReadFile(path, flag);
  if (!pem.ok()) return pem.status();
  Bio bio = MemBio(*pem);
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path,
                     ": no unencrypted PEM private key in it (\"-----BEGIN PRIVATE KEY-----\")"));
  }
  return key;
}

// Both files given, both parse, the key is the certificate's.
absl::Status CheckIdentity(const TlsFiles& files) {
  if (files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.cert_flag, " and ", files.key_flag, " go together: ",
                     files.cert_file.empty() ? files.cert_flag : files.key_flag, " is missing"));
  }
  absl::StatusOr<Cert> cert = FirstCertificate(files.cert_file, files.cert_flag, "certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<Key> key = PrivateKey(files.key_file, files.key_flag);
  if (!key.ok()) return key.status();
  if (X509_check_private_key(cert->get(), key->get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(files.key_flag, " ", files.key_file,
                                                   " is not the key of the certificate in ",
                                                   files.cert_flag, " ", files.cert_file));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::experimental::CertificateProviderInterface> Provider(const TlsFiles& files,
                                                                           absl::Duration refresh) {
  const auto seconds =
      static_cast<unsigned int>(std::max<int64_t>(1, absl::ToInt64Seconds(refresh)));
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key_file, files.cert_file, files.ca_file, seconds);
}

}  // namespace

absl::Status CheckPemFile(const std::string& path, const std::string& flag,
                          const std::string& what) {
  if (what == "private key") return PrivateKey(path, flag).status();
  return FirstCertificate(path, flag, what).status();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& files,
                                                                           absl::Duration refresh) {
  if (absl::Status s = CheckIdentity(files); !s.ok()) return s;
  if (!files.ca_file.empty()) {
    if (absl::Status s = CheckPemFile(files.ca_file, files.ca_flag, "CA certificate"); !s.ok()) {
      return s;
    }
  }
  grpc::experimental::TlsServerCredentialsOptions options(Provider(files, refresh));
  options.watch_identity_key_cert_pairs();
  if (!files.ca_file.empty()) {
    options.watch_root_certs();
    // Ask, verify what is presented, do not require: users come with tokens, workers with
    // certificates (checked per call by PeerHasClusterCertificate).
    options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& files, absl::Duration refresh) {
  if (files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.ca_flag, " is needed to verify the server's certificate"));
  }
  if (absl::Status s = CheckPemFile(files.ca_file, files.ca_flag, "CA certificate"); !s.ok()) {
    return s;
  }
  const bool identity = !files.cert_file.empty() || !files.key_file.empty();
  if (identity) {
    if (absl::Status s = CheckIdentity(files); !s.ok()) return s;
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  TlsFiles provided = files;
  if (!identity) provided.cert_file = provided.key_file = "";
  options.set_certificate_provider(Provider(provided, refresh));
  options.watch_root_certs();
  if (identity) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

bool PeerHasClusterCertificate(const grpc::ServerContext& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return false;
  // A TLS peer is "authenticated" only when it presented a certificate that verified.
  return !auth->FindPropertyValues("x509_pem_cert").empty();
}

std::string PeerCommonName(const grpc::ServerContext& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return "";
  std::vector<grpc::string_ref> names = auth->FindPropertyValues("x509_common_name");
  if (names.empty()) return "";
  return std::string(names[0].data(), names[0].size());
}

absl::Status CheckTransportFlags(const TlsFiles& files, bool insecure,
                                 const std::vector<std::string>& other_required,
                                 const std::string& missing) {
  if (insecure) {
    if (files.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError("--insecure and --tls-* contradict each other: choose one");
  }
  bool complete = !files.ca_file.empty() && !files.cert_file.empty() && !files.key_file.empty();
  for (const std::string& value : other_required) complete &= !value.empty();
  return complete ? absl::OkStatus() : absl::InvalidArgumentError(missing);
}

std::string WorkerNamePattern(const std::string& common_name) {
  const absl::string_view prefix = kWorkerCommonNamePrefix;
  if (!absl::StartsWith(common_name, prefix) || common_name.size() == prefix.size()) return "";
  return common_name.substr(prefix.size());
}

bool WorkerNameAllowed(const std::string& pattern, const std::string& name) {
  if (pattern.empty() || name.empty()) return false;
  if (pattern.back() == '*') {
    return absl::StartsWith(name, absl::string_view(pattern).substr(0, pattern.size() - 1));
  }
  return name == pattern;
}

}  // namespace security
}  // namespace dattn
