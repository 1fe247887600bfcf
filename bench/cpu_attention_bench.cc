// CPU attention benchmark: effective GFLOP/s of the CPU backend next to this machine's own OpenBLAS
// sgemm rate, measured in the same run.
//
// Effective FLOPs count the attended blocks only (dilation::NominalForwardFlops: sum over patterns
// of 4 * B * heads_i * N * D * w_i / r_i^2, x3.5 for forward plus backward), so that a faster
// algorithm shows as a higher rate. Each row is the median of --iters timed runs after --warmup
// runs. One sgemm is timed before each of them and the row reports the best of those (a neighbour
// that slows one sgemm does not flatter the ratio); "CPU share" (process CPU time over wall time x
// threads, 100% when every thread ran all the time) tells whether other processes took cores.
//
// Usage: cpu_attention_bench [--n=65536] [--h=16] [--d=64] [--b=1] [--mode=grouped|mixture]
//          [--w=2048,4096,8192,16384] [--r=1,2,4,8] [--causal] [--dtype=fp32|fp64] [--iters=3]
//          [--warmup=1] [--threads=0] [--small_n=16384] [--sgemm_size=4096] [--rows=fwd,fwdbwd,mix]
// --n/--h/--d/--b/--mode/--w/--r/--causal/--dtype shape the main forward row; the fwd+bwd row and
// the mixture row use --small_n positions (and the other mode for "mix" when --mode=mixture is the
// main).
#include <cblas.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/attention_spec.h"
#include "engine/cpu_backend.h"
#include "engine/openblas_core.h"
#include "engine/validate.h"

namespace dattn {
namespace {

struct Flags {
  int64_t n = 65536, h = 16, d = 64, b = 1;
  std::string mode = "grouped";
  std::vector<int64_t> w = {2048, 4096, 8192, 16384};
  std::vector<int64_t> r = {1, 2, 4, 8};
  bool causal = false;
  std::string dtype = "fp32";
  int iters = 3, warmup = 1, threads = 0;
  int64_t small_n = 16384;
  int64_t sgemm_size = 4096;
  std::vector<std::string> rows = {"fwd", "fwdbwd", "mix"};
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "cpu_attention_bench: %s\nflags: --n= --h= --d= --b= --mode=grouped|mixture "
               "--w=a,b,.. --r=a,b,.. --causal --dtype=fp32|fp64 --iters= --warmup= --threads= "
               "--small_n= --sgemm_size= --rows=fwd,fwdbwd,mix\n",
               why.c_str());
  std::exit(2);
}

int64_t ParseInt(const std::string& flag, const std::string& value) {
  int64_t x = 0;
  if (!absl::SimpleAtoi(value, &x)) Usage(absl::StrCat(flag, ": not an integer: '", value, "'"));
  return x;
}

std::vector<int64_t> ParseList(const std::string& flag, const std::string& value) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    out.push_back(ParseInt(flag, std::string(part)));
  }
  return out;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--n")
      f.n = ParseInt(key, value);
    else if (key == "--h")
      f.h = ParseInt(key, value);
    else if (key == "--d")
      f.d = ParseInt(key, value);
    else if (key == "--b")
      f.b = ParseInt(key, value);
    else if (key == "--mode")
      f.mode = value;
    else if (key == "--w")
      f.w = ParseList(key, value);
    else if (key == "--r")
      f.r = ParseList(key, value);
    else if (key == "--causal")
      f.causal = true;
    else if (key == "--dtype")
      f.dtype = value;
    else if (key == "--iters")
      f.iters = static_cast<int>(ParseInt(key, value));
    else if (key == "--warmup")
      f.warmup = static_cast<int>(ParseInt(key, value));
    else if (key == "--threads")
      f.threads = static_cast<int>(ParseInt(key, value));
    else if (key == "--small_n")
      f.small_n = ParseInt(key, value);
    else if (key == "--sgemm_size")
      f.sgemm_size = ParseInt(key, value);
    else if (key == "--rows")
      f.rows = absl::StrSplit(value, ',');
    else
      Usage(absl::StrCat("unknown flag '", arg, "'"));
  }
  if (f.iters < 1) Usage("--iters must be >= 1");
  if (f.threads <= 0) f.threads = static_cast<int>(std::thread::hardware_concurrency());
  return f;
}

// Page-aligned memory with transparent huge pages requested: the dilated rows are r*H*D elements
// apart, and 4 KiB pages would make every row a TLB miss.
struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t n) : bytes(((n + (2u << 20) - 1) >> 21) << 21) {
    ptr = std::aligned_alloc(2u << 20, bytes);
    if (ptr == nullptr) Usage(absl::StrCat("out of memory allocating ", bytes, " bytes"));
    madvise(ptr, bytes, MADV_HUGEPAGE);
  }
  ~Buffer() { std::free(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

void FillRandom(Buffer& buf, DType dtype, int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == DType::kFloat64) {
      static_cast<double*>(buf.ptr)[i] = normal(rng);
    } else {
      static_cast<float*>(buf.ptr)[i] = static_cast<float>(normal(rng));
    }
  }
}

// OpenBLAS sgemm on all threads, square matrices: the machine's achievable fp32 matmul rate. Timed
// once per attention iteration, interleaved with it, so that both see the same machine (this host
// is shared; a busy neighbour slows both alike).
class Sgemm {
 public:
  explicit Sgemm(int64_t size, int threads)
      : size_(size),
        threads_(threads),
        a_(size * size * 4),
        b_(size * size * 4),
        c_(size * size * 4) {
    FillRandom(a_, DType::kFloat32, size * size, 1);
    FillRandom(b_, DType::kFloat32, size * size, 2);
    Seconds();  // Warm-up: OpenBLAS starts its threads and touches its buffers.
  }

  double Seconds() {
    openblas_set_num_threads(threads_);
    const int n = static_cast<int>(size_);
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                static_cast<float*>(a_.ptr), n, static_cast<float*>(b_.ptr), n, 0.0f,
                static_cast<float*>(c_.ptr), n);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  double Flops() const { return 2.0 * size_ * size_ * size_; }

 private:
  const int64_t size_;
  const int threads_;
  Buffer a_, b_, c_;
};

// User plus system CPU seconds of this process so far (all threads).
double ProcessCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  std::string name;
  AttentionSpec spec;
  int64_t b, n, h, d;
  DType dtype;
  bool backward;
};

struct Result {
  double ms;
  double gflops;
  double sgemm_gflops;
  double cpu_share;  // CPU seconds / (wall seconds x threads) over the timed attention runs.
};

Result RunRow(const Row& row, const Flags& f, AttentionBackend& backend, Sgemm& sgemm) {
  const int64_t count = row.b * row.n * row.h * row.d;
  const size_t bytes = count * DTypeSize(row.dtype);
  Buffer q(bytes), k(bytes), v(bytes), out(bytes), lse(row.b * row.h * row.n * 8);
  FillRandom(q, row.dtype, count, 11);
  FillRandom(k, row.dtype, count, 12);
  FillRandom(v, row.dtype, count, 13);
  const std::vector<int64_t> shape = {row.b, row.n, row.h, row.d};
  ForwardArgs fwd;
  fwd.q = TensorView::Contiguous(q.ptr, row.dtype, shape);
  fwd.k = TensorView::Contiguous(k.ptr, row.dtype, shape);
  fwd.v = TensorView::Contiguous(v.ptr, row.dtype, shape);
  fwd.out = TensorView::Contiguous(out.ptr, row.dtype, shape);
  fwd.lse = TensorView::Contiguous(lse.ptr, LseDType(row.dtype), {row.b, row.h, row.n});
  std::unique_ptr<Buffer> dout, dq, dk, dv;
  BackwardArgs bwd;
  if (row.backward) {
    dout = std::make_unique<Buffer>(bytes);
    dq = std::make_unique<Buffer>(bytes);
    dk = std::make_unique<Buffer>(bytes);
    dv = std::make_unique<Buffer>(bytes);
    FillRandom(*dout, row.dtype, count, 14);
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = fwd.out;
    bwd.lse = fwd.lse;
    bwd.dout = TensorView::Contiguous(dout->ptr, row.dtype, shape);
    bwd.dq = TensorView::Contiguous(dq->ptr, row.dtype, shape);
    bwd.dk = TensorView::Contiguous(dk->ptr, row.dtype, shape);
    bwd.dv = TensorView::Contiguous(dv->ptr, row.dtype, shape);
  }
  absl::Status status;
  auto run = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    status.Update(backend.Forward(row.spec, fwd));
    if (row.backward) status.Update(backend.Backward(row.spec, bwd));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < f.warmup; ++i) run();
  std::vector<double> times, sgemm_rates;
  double cpu = 0;
  for (int i = 0; i < f.iters; ++i) {
    sgemm_rates.push_back(sgemm.Flops() / sgemm.Seconds() / 1e9);
    const double cpu0 = ProcessCpuSeconds();
    times.push_back(run());
    cpu += ProcessCpuSeconds() - cpu0;
  }
  double wall = 0;
  for (double t : times) wall += t;
  const double sec = Median(times);
  if (!status.ok()) {
    std::fprintf(stderr, "cpu_attention_bench: %s: %s\n", row.name.c_str(),
                 status.ToString().c_str());
    std::exit(1);
  }
  const double flops = dilation::NominalForwardFlops(row.spec, row.b, row.n, row.h, row.d) *
                       (row.backward ? 3.5 : 1.0);
  return {sec * 1e3, flops / sec / 1e9, *std::max_element(sgemm_rates.begin(), sgemm_rates.end()),
          cpu / (wall * f.threads)};
}

// /proc/loadavg's first three fields and a newline: whether something else shared the CPU.
std::string LoadAverage() {
  FILE* file = std::fopen("/proc/loadavg", "r");
  if (file == nullptr) return "unknown\n";
  double a = 0, b = 0, c = 0;
  const int got = std::fscanf(file, "%lf %lf %lf", &a, &b, &c);
  std::fclose(file);
  if (got != 3) return "unknown\n";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %.2f %.2f\n", a, b, c);
  return buf;
}

int Main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  absl::StatusOr<DType> dtype = ParseDType(f.dtype);
  if (!dtype.ok()) Usage(dtype.status().ToString());
  absl::StatusOr<AttentionMode> mode = ParseAttentionMode(f.mode);
  if (!mode.ok()) Usage(mode.status().ToString());

  AttentionSpec spec;
  spec.segment_lengths = f.w;
  spec.dilation_rates = f.r;
  spec.causal = f.causal;
  spec.mode = *mode;
  AttentionSpec other = spec;
  other.mode = *mode == AttentionMode::kGrouped ? AttentionMode::kMixture : AttentionMode::kGrouped;

  std::vector<Row> rows;
  for (const std::string& name : f.rows) {
    if (name == "fwd") {
      rows.push_back({"fwd", spec, f.b, f.n, f.h, f.d, *dtype, false});
    } else if (name == "fwdbwd") {
      rows.push_back({"fwd+bwd", spec, f.b, f.small_n, f.h, f.d, *dtype, true});
    } else if (name == "mix") {
      rows.push_back({"fwd", other, f.b, f.small_n, f.h, f.d, *dtype, false});
    } else {
      Usage(absl::StrCat("unknown row '", name, "'; rows: fwd, fwdbwd, mix"));
    }
  }

  std::printf("OpenBLAS: %s (core %s%s)\n", openblas_get_config(), openblas_get_corename(),
              std::getenv("OPENBLAS_CORETYPE") != nullptr ? ", from OPENBLAS_CORETYPE" : "");
  std::printf("threads: %d; load average before the run: %s", f.threads, LoadAverage().c_str());
  Sgemm sgemm(f.sgemm_size, f.threads);
  std::printf(
      "sgemm reference: %ldx%ldx%ld on %d threads, timed once before each attention iteration; "
      "the best of them is reported\n\n",
      f.sgemm_size, f.sgemm_size, f.sgemm_size, f.threads);

  CpuBackendOptions options;
  options.num_threads = f.threads;
  std::unique_ptr<AttentionBackend> backend = NewCpuBackend(options);
  std::printf(
      "| pass | mode | dtype | B | N | H | D | w | r | causal | ms (median of %d) | "
      "GFLOP/s | sgemm GFLOP/s | ratio | CPU share |\n",
      f.iters);
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& row : rows) {
    const Result res = RunRow(row, f, *backend, sgemm);
    std::printf(
        "| %s | %s | %s | %ld | %ld | %ld | %ld | %s | %s | %s | %.1f | %.1f | %.1f | %.2f | "
        "%.0f%% |\n",
        row.name.c_str(), AttentionModeName(row.spec.mode), DTypeName(row.dtype), row.b, row.n,
        row.h, row.d, absl::StrJoin(row.spec.segment_lengths, ",").c_str(),
        absl::StrJoin(row.spec.dilation_rates, ",").c_str(), row.spec.causal ? "yes" : "no", res.ms,
        res.gflops, res.sgemm_gflops, res.gflops / res.sgemm_gflops, 100 * res.cpu_share);
    std::fflush(stdout);
  }
  std::printf("\nload average after the run: %s", LoadAverage().c_str());
  return 0;
}

}  // namespace
}  // namespace dattn

int main(int argc, char** argv) {
  // Off OpenBLAS's generic kernels where it did not recognise the CPU (as the CPU workers do).
  dattn::ReexecWithBestOpenBlasCore("cpu_attention_bench", argv);
  return dattn::Main(argc, argv);
}
