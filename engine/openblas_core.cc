#include "engine/openblas_core.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dattn {
namespace {

bool CpuHasAvx512() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

bool CpuHasAvx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace

std::string OpenBlasCore() {
  const char* core = openblas_get_corename();
  return core != nullptr ? core : "";
}

std::string BetterOpenBlasCore() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  const char* fix = std::getenv("DATTN_OPENBLAS_FIX");
  if (fix != nullptr && std::strcmp(fix, "0") == 0) return "";
  if (OpenBlasCore() != "Prescott") return "";
  if (CpuHasAvx512()) return "SkylakeX";
  if (CpuHasAvx2()) return "Haswell";
  return "";
}

void ReexecWithBestOpenBlasCore(const char* program, char** argv) {
  const std::string core = BetterOpenBlasCore();
  if (core.empty()) return;
  if (setenv("OPENBLAS_CORETYPE", core.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Still here: the exec failed. Go on as we are, without the variable that did not take effect.
  const int error = errno;
  unsetenv("OPENBLAS_CORETYPE");
  std::fprintf(stderr,
               "%s: OpenBLAS runs its generic kernels on this CPU; restarting with "
               "OPENBLAS_CORETYPE=%s failed (%s); going on with the generic kernels\n",
               program, core.c_str(), std::strerror(error));
}

}  // namespace dattn
