// dattn-generate: see trainer/generate_cli.h and docs/TRAINING.md ("Generating text").
#include <iostream>

#include "engine/openblas_core.h"
#include "trainer/generate_cli.h"

int main(int argc, char** argv) {
  // OpenBLAS off its generic kernels where it did not recognise the CPU (restarts the process).
  dattn::ReexecWithBestOpenBlasCore("dattn-generate", argv);
  return dattn::trainer::RunGenerateCli(argc, argv, std::cout, std::cerr);
}
