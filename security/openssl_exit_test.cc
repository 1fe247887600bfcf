// OpenSSL must not clean up at process exit (third_party/BUILD.bazel's openssl_no_atexit says why):
// a thread that used OpenSSL and finishes after exit() began must still find OpenSSL's state alive.
//
// The scenario, deterministic: an exit handler registered before OpenSSL starts runs after
// OpenSSL's own exit handler would have (handlers run last-registered first). It lets a thread that
// queued an OpenSSL error finish only then, and then asks OpenSSL whether it is still initialized.
// Had OpenSSL cleaned up, the handler exits with status 1 (and the sanitized build also reports the
// thread's error queue as leaked, as CI once saw for a gRPC thread in security:tls_test).
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "gtest/gtest.h"

namespace {

std::atomic<bool> release_thread{false};
std::atomic<bool> error_queued{false};
std::thread* late_thread = nullptr;  // Joined by the exit handler, after the test body returned.

void FinishTheThreadAfterOpenSslsExitHandler() {
  release_thread = true;
  late_thread->join();
  if (OPENSSL_init_crypto(0, nullptr) != 1) {
    std::fprintf(stderr,
                 "openssl_exit_test: OpenSSL cleaned up at exit while a thread was still using it; "
                 "third_party:openssl_no_atexit did not take effect\n");
    _exit(1);
  }
}

TEST(OpenSslAtExit, AThreadFinishingAfterExitBeganFindsOpenSslAlive) {
  ASSERT_EQ(std::atexit(FinishTheThreadAfterOpenSslsExitHandler), 0);
  late_thread = new std::thread([] {
    // Not a certificate: OpenSSL queues an error (with data) on this thread's error queue.
    static const char kGarbage[] = "not a certificate";
    BIO* bio = BIO_new_mem_buf(kGarbage, sizeof kGarbage - 1);
    X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    EXPECT_EQ(cert, nullptr);
    EXPECT_NE(ERR_peek_error(), 0u);
    error_queued = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!release_thread && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!error_queued && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(error_queued) << "the thread did not reach OpenSSL within 30 s";
}

}  // namespace
