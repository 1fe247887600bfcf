// ReexecWithBestOpenBlasCore, through a probe process: where OpenBLAS falls back to its generic
// kernels on a CPU with AVX2 (or AVX-512), the probe ends up on the better core; an operator's
// OPENBLAS_CORETYPE and DATTN_OPENBLAS_FIX=0 are honoured.
#include "engine/openblas_core.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"

namespace dattn {
namespace {

// The probe's output line, run under `env` with `env_args` (e.g. "-u OPENBLAS_CORETYPE").
std::string RunProbe(const std::string& env_args) {
  const std::string command =
      absl::StrCat("env ", env_args, " ", testutil::RunfilePath("engine/openblas_core_probe"));
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  const int status = pclose(pipe);
  if (status != 0) return absl::StrCat("exit status ", status, ": ", out);
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool CpuHasAvx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

TEST(OpenBlasCoreTest, ProcessEndsUpOffTheGenericKernels) {
  const std::string native = RunProbe("-u OPENBLAS_CORETYPE DATTN_OPENBLAS_FIX=0");
  std::printf("without the fix: %s\n", native.c_str());
  ASSERT_EQ(native.rfind("core=", 0), 0u) << native;
  EXPECT_NE(native.find(" env=-"), std::string::npos) << native;

  const std::string fixed = RunProbe("-u OPENBLAS_CORETYPE -u DATTN_OPENBLAS_FIX");
  std::printf("with the fix: %s\n", fixed.c_str());
  if (native.rfind("core=Prescott ", 0) == 0 && CpuHasAvx2()) {
    // OpenBLAS did not recognise this CPU: the probe restarted itself on a core it supports.
    const std::string want = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                                 ? "SkylakeX"
                                 : "Haswell";
    EXPECT_EQ(fixed, absl::StrCat("core=", want, " env=", want));
  } else {
    // OpenBLAS chose by itself (or the CPU has nothing better): nothing to do.
    EXPECT_EQ(fixed, native);
  }
}

TEST(OpenBlasCoreTest, AnOperatorsChoiceIsKept) {
  EXPECT_EQ(RunProbe("OPENBLAS_CORETYPE=Prescott"), "core=Prescott env=Prescott");
}

}  // namespace
}  // namespace dattn
