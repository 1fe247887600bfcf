// OpenBLAS picks its kernels once, when the library loads, from the CPU model. Debian's 0.3.21 does
// not recognise some recent Xeons (family 6 model 207, for one) and falls back to its SSE3
// ("Prescott") kernels, 4-5x slower than the AVX-512 ones the CPU runs
// (docs/PERFORMANCE_HISTORY.md, "CPU engine"). The only remedy is the environment variable
// OPENBLAS_CORETYPE, read at load time, so a process that wants the right kernels has to be started
// with it: ReexecWithBestOpenBlasCore does that for a main().
//
// Thread-safety: call from main() before any other thread exists.
#ifndef DATTN_ENGINE_OPENBLAS_CORE_H_
#define DATTN_ENGINE_OPENBLAS_CORE_H_

#include <string>

namespace dattn {

// The core OpenBLAS runs on ("Prescott", "SkylakeX", ...).
std::string OpenBlasCore();

// The OPENBLAS_CORETYPE this process should have been started with: "SkylakeX" (AVX-512 F, CD,
// BW, DQ, VL) or "Haswell" (AVX2 and FMA) when OpenBLAS fell back to its generic x86-64 kernels
// ("Prescott") on a CPU that has those; "" when OpenBLAS chose by itself, when OPENBLAS_CORETYPE is
// already set (the operator's choice is kept), or when DATTN_OPENBLAS_FIX=0 turns this off.
std::string BetterOpenBlasCore();

// When BetterOpenBlasCore() names a core: sets OPENBLAS_CORETYPE to it and replaces the process
// with a fresh run of its own executable (/proc/self/exe) with the same arguments. Returns when
// there is nothing to do, or when the exec failed (the reason goes to stderr, prefixed with
// `program`; the process then goes on with the slow kernels). Call first thing in main(): the
// process restarts from the top.
void ReexecWithBestOpenBlasCore(const char* program, char** argv);

}  // namespace dattn

#endif  // DATTN_ENGINE_OPENBLAS_CORE_H_
