// For openblas_core_test: restarts itself with the better OpenBLAS core where one applies, then
// prints "core=<OpenBLAS core> env=<OPENBLAS_CORETYPE or ->".
#include <cstdio>
#include <cstdlib>

#include "engine/openblas_core.h"

int main(int /*argc*/, char** argv) {
  dattn::ReexecWithBestOpenBlasCore("openblas_core_probe", argv);
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  std::printf("core=%s env=%s\n", dattn::OpenBlasCore().c_str(), env != nullptr ? env : "-");
  return 0;
}
