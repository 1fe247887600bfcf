// The job store's group commit under load, on this disk and on a simulated slow flush: throughput
// and latency are printed, never asserted (timing depends on the machine).
#include "server/job_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/job_state.h"
#include "server/job_store_test_util.h"

namespace dattn {
namespace server {
namespace {

using store_test::Ev;
using store_test::MakeJob;
using store_test::OpenOrDie;
using store_test::TestDir;

// A VFS that forwards everything to SQLite's default VFS but sleeps in every xSync: a stand-in for
// a disk whose flush is slow (network volumes, many SSDs without power-loss protection), so the
// benefit of group commit shows on a VM whose fsync is nearly free. Installed as the default VFS
// only for the duration of one benchmark case.
namespace slow_sync {

sqlite3_vfs* real_vfs = nullptr;
std::atomic<int64_t> delay_us{0};
sqlite3_vfs vfs;
sqlite3_io_methods io;

struct File {
  sqlite3_file base;
  sqlite3_file* real;  // Lives right after this struct (szOsFile covers both).
};

sqlite3_file* Real(sqlite3_file* f) { return reinterpret_cast<File*>(f)->real; }

int Close(sqlite3_file* f) { return Real(f)->pMethods->xClose(Real(f)); }
int Read(sqlite3_file* f, void* b, int n, sqlite3_int64 o) {
  return Real(f)->pMethods->xRead(Real(f), b, n, o);
}
int Write(sqlite3_file* f, const void* b, int n, sqlite3_int64 o) {
  return Real(f)->pMethods->xWrite(Real(f), b, n, o);
}
int Truncate(sqlite3_file* f, sqlite3_int64 n) { return Real(f)->pMethods->xTruncate(Real(f), n); }
int Sync(sqlite3_file* f, int flags) {
  std::this_thread::sleep_for(std::chrono::microseconds(delay_us.load()));
  return Real(f)->pMethods->xSync(Real(f), flags);
}
int FileSize(sqlite3_file* f, sqlite3_int64* n) { return Real(f)->pMethods->xFileSize(Real(f), n); }
int Lock(sqlite3_file* f, int l) { return Real(f)->pMethods->xLock(Real(f), l); }
int Unlock(sqlite3_file* f, int l) { return Real(f)->pMethods->xUnlock(Real(f), l); }
int CheckReservedLock(sqlite3_file* f, int* out) {
  return Real(f)->pMethods->xCheckReservedLock(Real(f), out);
}
int FileControl(sqlite3_file* f, int op, void* arg) {
  return Real(f)->pMethods->xFileControl(Real(f), op, arg);
}
int SectorSize(sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); }
int DeviceCharacteristics(sqlite3_file* f) {
  return Real(f)->pMethods->xDeviceCharacteristics(Real(f));
}
int ShmMap(sqlite3_file* f, int i, int sz, int extend, void volatile** p) {
  return Real(f)->pMethods->xShmMap(Real(f), i, sz, extend, p);
}
int ShmLock(sqlite3_file* f, int off, int n, int flags) {
  return Real(f)->pMethods->xShmLock(Real(f), off, n, flags);
}
void ShmBarrier(sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); }
int ShmUnmap(sqlite3_file* f, int del) { return Real(f)->pMethods->xShmUnmap(Real(f), del); }
int Fetch(sqlite3_file* f, sqlite3_int64 o, int n, void** p) {
  return Real(f)->pMethods->xFetch(Real(f), o, n, p);
}
int Unfetch(sqlite3_file* f, sqlite3_int64 o, void* p) {
  return Real(f)->pMethods->xUnfetch(Real(f), o, p);
}

int Open(sqlite3_vfs*, const char* name, sqlite3_file* f, int flags, int* out_flags) {
  File* file = reinterpret_cast<File*>(f);
  file->real = reinterpret_cast<sqlite3_file*>(file + 1);
  int rc = real_vfs->xOpen(real_vfs, name, file->real, flags, out_flags);
  // SQLite calls xClose iff pMethods is set, so mirror the real file.
  file->base.pMethods = file->real->pMethods != nullptr ? &io : nullptr;
  return rc;
}
int Delete(sqlite3_vfs*, const char* n, int d) { return real_vfs->xDelete(real_vfs, n, d); }
int Access(sqlite3_vfs*, const char* n, int f, int* o) {
  return real_vfs->xAccess(real_vfs, n, f, o);
}
int FullPathname(sqlite3_vfs*, const char* n, int sz, char* o) {
  return real_vfs->xFullPathname(real_vfs, n, sz, o);
}
void* DlOpen(sqlite3_vfs*, const char* n) { return real_vfs->xDlOpen(real_vfs, n); }
void DlError(sqlite3_vfs*, int n, char* m) { real_vfs->xDlError(real_vfs, n, m); }
void (*DlSym(sqlite3_vfs*, void* h, const char* s))(void) {
  return real_vfs->xDlSym(real_vfs, h, s);
}
void DlClose(sqlite3_vfs*, void* h) { real_vfs->xDlClose(real_vfs, h); }
int Randomness(sqlite3_vfs*, int n, char* o) { return real_vfs->xRandomness(real_vfs, n, o); }
int Sleep(sqlite3_vfs*, int us) { return real_vfs->xSleep(real_vfs, us); }
int CurrentTime(sqlite3_vfs*, double* t) { return real_vfs->xCurrentTime(real_vfs, t); }
int GetLastError(sqlite3_vfs*, int n, char* m) { return real_vfs->xGetLastError(real_vfs, n, m); }
int CurrentTimeInt64(sqlite3_vfs*, sqlite3_int64* t) {
  return real_vfs->xCurrentTimeInt64(real_vfs, t);
}

// Makes the slow VFS the default for new connections (0 = restore SQLite's own).
void SetDelay(absl::Duration delay) {
  if (real_vfs == nullptr) {
    real_vfs = sqlite3_vfs_find(nullptr);
    io = sqlite3_io_methods{};
    io.iVersion = 3;
    io.xClose = Close;
    io.xRead = Read;
    io.xWrite = Write;
    io.xTruncate = Truncate;
    io.xSync = Sync;
    io.xFileSize = FileSize;
    io.xLock = Lock;
    io.xUnlock = Unlock;
    io.xCheckReservedLock = CheckReservedLock;
    io.xFileControl = FileControl;
    io.xSectorSize = SectorSize;
    io.xDeviceCharacteristics = DeviceCharacteristics;
    io.xShmMap = ShmMap;
    io.xShmLock = ShmLock;
    io.xShmBarrier = ShmBarrier;
    io.xShmUnmap = ShmUnmap;
    io.xFetch = Fetch;
    io.xUnfetch = Unfetch;
    vfs = sqlite3_vfs{};
    vfs.iVersion = 2;
    vfs.szOsFile = static_cast<int>(sizeof(File)) + real_vfs->szOsFile;
    vfs.mxPathname = real_vfs->mxPathname;
    vfs.zName = "dattn-slow-sync";
    vfs.xOpen = Open;
    vfs.xDelete = Delete;
    vfs.xAccess = Access;
    vfs.xFullPathname = FullPathname;
    vfs.xDlOpen = DlOpen;
    vfs.xDlError = DlError;
    vfs.xDlSym = DlSym;
    vfs.xDlClose = DlClose;
    vfs.xRandomness = Randomness;
    vfs.xSleep = Sleep;
    vfs.xCurrentTime = CurrentTime;
    vfs.xGetLastError = GetLastError;
    vfs.xCurrentTimeInt64 = CurrentTimeInt64;
  }
  delay_us = absl::ToInt64Microseconds(delay);
  if (delay > absl::ZeroDuration()) {
    sqlite3_vfs_register(&vfs, /*makeDflt=*/1);
  } else {
    sqlite3_vfs_register(real_vfs, /*makeDflt=*/1);
  }
}

}  // namespace slow_sync

struct LoadResult {
  double seconds = 0;
  int64_t ops = 0;
  std::vector<double> latencies_ms;
  std::vector<double> read_latencies_ms;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// `clients` threads each submit `per_client` jobs, and with `with_updates` move each job through
// placed, running and succeeded right after; one more thread reads (GetJob + a List page) all
// along.
LoadResult RunLoad(JobStore& store, int clients, int per_client, bool with_updates) {
  LoadResult r;
  std::vector<std::vector<double>> lat(clients);
  std::atomic<bool> writers_done{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (int i = 0; i < per_client; ++i) {
        const std::string id = absl::StrCat("j-", c, "-", i);
        v1::Job job = MakeJob(id, "k" + id, absl::StrCat("tenant", c % 3), i % 5);
        auto t = std::chrono::steady_clock::now();
        absl::StatusOr<SubmitOutcome> out = store.Submit(job, Ev("submitted"));
        lat[c].push_back(MsSince(t));
        ASSERT_TRUE(out.ok()) << out.status();
        if (!with_updates) continue;
        for (v1::JobState st :
             {v1::JOB_STATE_PLACED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED}) {
          job.set_state(st);
          t = std::chrono::steady_clock::now();
          absl::StatusOr<int64_t> seq = store.Update(job, Ev(std::string(StateName(st))));
          lat[c].push_back(MsSince(t));
          ASSERT_TRUE(seq.ok()) << seq.status();
        }
      }
    });
  }
  std::thread reader([&] {
    for (int i = 0; !writers_done.load(); ++i) {
      auto t = std::chrono::steady_clock::now();
      store.GetJob(absl::StrCat("j-0-", i % std::max(1, per_client))).IgnoreError();
      absl::StatusOr<ListPage> page = store.List({}, 50, "");
      EXPECT_TRUE(page.ok()) << page.status();
      r.read_latencies_ms.push_back(MsSince(t));
      // About 500 reads/s: a busy coordinator's GetJob/ListJobs traffic, not a CPU hog competing
      // with the writers for this machine's two cores.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  for (auto& th : threads) th.join();
  r.seconds = MsSince(t0) / 1000;
  writers_done = true;
  reader.join();
  for (auto& l : lat) r.latencies_ms.insert(r.latencies_ms.end(), l.begin(), l.end());
  r.ops = static_cast<int64_t>(r.latencies_ms.size());
  return r;
}

// DATTN_STORE_BENCH_SCALE (default 1) multiplies the work for a longer run outside the test suite:
//   DATTN_STORE_BENCH_SCALE=10 bazel-bin/server/job_store_throughput_test
//   --gtest_filter='*Throughput*'
TEST(JobStoreTest, GroupCommitThroughput) {
  int scale = 1;
  if (const char* s = std::getenv("DATTN_STORE_BENCH_SCALE")) scale = std::max(1, std::atoi(s));
  const std::string dir = TestDir();
  struct Case {
    const char* name;
    int sync_delay_ms;
    int max_batch;
    bool updates;
    int per_client;
  } cases[] = {
      {"this disk, group commit, submits", 0, 512, false, 300},
      {"this disk, fsync per write, submits", 0, 1, false, 300},
      {"this disk, group commit, submit+3 upd", 0, 512, true, 100},
      {"4ms flush, group commit, submits", 4, 512, false, 150},
      {"4ms flush, fsync per write, submits", 4, 1, false, 20},
      {"4ms flush, group commit, submit+3 upd", 4, 512, true, 40},
  };
  std::printf("8 client threads + 1 reader thread; latency = one Submit/Update call\n");
  int n = 0;
  for (const Case& c : cases) {
    slow_sync::SetDelay(absl::Milliseconds(c.sync_delay_ms));
    JobStoreOptions o;
    o.max_batch_writes = c.max_batch;
    auto store = OpenOrDie(absl::StrCat(dir, "/bench", n++, ".db"), o);
    ASSERT_NE(store, nullptr);
    LoadResult r = RunLoad(*store, 8, c.per_client * scale, c.updates);
    const JobStoreStats st = store->Stats();
    ASSERT_TRUE(store->Close().ok());
    slow_sync::SetDelay(absl::ZeroDuration());
    std::printf(
        "%-40s %6lld writes %5.2f s %7.0f/s | ms p50 %5.2f p99 %5.2f max %5.2f | %5.1f writes/txn "
        "| reads %5zu p99 %5.2f ms\n",
        c.name, static_cast<long long>(r.ops), r.seconds, r.ops / r.seconds,
        Percentile(r.latencies_ms, 0.5), Percentile(r.latencies_ms, 0.99),
        Percentile(r.latencies_ms, 1.0),
        st.transactions > 0 ? double(st.writes) / double(st.transactions) : 0.0,
        r.read_latencies_ms.size(), Percentile(r.read_latencies_ms, 0.99));
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace server
}  // namespace dattn
