// Whether the code being compiled is built with AddressSanitizer, for tests whose measurements it
// changes (it keeps freed memory in quarantine, 256 MiB by default, and adds redzones), in either
// compiler of the build: gcc (the plain build's) defines __SANITIZE_ADDRESS__, clang (.bazelrc's
// --config=sanitize and --config=fuzz) answers __has_feature(address_sanitizer) instead.
// Header-only; testonly.
#ifndef DATTN_ENGINE_TESTING_SANITIZERS_H_
#define DATTN_ENGINE_TESTING_SANITIZERS_H_

#if defined(__SANITIZE_ADDRESS__)
#define DATTN_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DATTN_ADDRESS_SANITIZER 1
#endif
#endif
#ifndef DATTN_ADDRESS_SANITIZER
#define DATTN_ADDRESS_SANITIZER 0
#endif

#endif  // DATTN_ENGINE_TESTING_SANITIZERS_H_
