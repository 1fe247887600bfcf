// Switches off OpenSSL's exit-time cleanup in every binary that links OpenSSL
// (third_party/BUILD.bazel says why). Linked by :crypto, :ssl and :grpc with alwayslink, so no code
// has to remember it.
#include <openssl/crypto.h>

namespace {

// Runs during static initialization, before main() and so before gRPC, the rendezvous store or a
// token file first use OpenSSL: OPENSSL_INIT_NO_ATEXIT only counts on the first initialization of
// the process. security/openssl_exit_test fails if it did not take effect.
struct NoOpenSslCleanupAtExit {
  NoOpenSslCleanupAtExit() { OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr); }
};
const NoOpenSslCleanupAtExit kNoOpenSslCleanupAtExit;

}  // namespace
