// JobStore's reads (job_store.h): each takes a connection from the read pool (TakeReader, in
// job_store.cc with the pool's other uses), runs its query and gives the connection back. In WAL
// mode a read sees the last committed state and never waits for the writer.
#include "server/job_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "server/sqlite_db.h"

namespace dattn {
namespace server {

namespace {

using store_internal::Query;
using store_internal::SqliteDb;

constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;
constexpr absl::string_view kPageTokenPrefix = "dattn.jobs.v1:";

std::string EncodePageToken(int64_t submit_seq) {
  return absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, submit_seq));
}

absl::StatusOr<int64_t> DecodePageToken(absl::string_view token) {
  auto bad = [token] {
    return absl::InvalidArgumentError(
        absl::StrCat("page token \"", token, "\" is not a token returned by ListJobs"));
  };
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) return bad();
  absl::string_view rest = raw;
  int64_t seq = 0;
  if (!absl::ConsumePrefix(&rest, kPageTokenPrefix) || !absl::SimpleAtoi(rest, &seq) || seq < 1) {
    return bad();
  }
  return seq;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> JobStore::ListExpired(absl::Time before, int limit) {
  if (limit < 1) return absl::InvalidArgumentError(absl::StrCat("limit ", limit, " must be >= 1"));
  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  Query q(*db,
          "SELECT job_id FROM jobs WHERE state IN (?1, ?2, ?3) AND update_time_us < ?4 "
          "ORDER BY update_time_us LIMIT ?5");
  q.Int(v1::JOB_STATE_SUCCEEDED)
      .Int(v1::JOB_STATE_FAILED)
      .Int(v1::JOB_STATE_CANCELLED)
      .Int(absl::ToUnixMicros(before))
      .Int(limit);
  std::vector<std::string> ids;
  for (;;) {
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    ids.emplace_back(q.ColText(0));
  }
  return ids;
}

absl::StatusOr<StoredJob> JobStore::RowToJob(SqliteDb* db, absl::string_view blob,
                                             int64_t submit_seq) {
  StoredJob out;
  out.submit_seq = submit_seq;
  if (!out.job.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::DataLossError(absl::StrCat("job store ", db->path(), ": the job of submit_seq ",
                                            submit_seq, " is unreadable (", blob.size(),
                                            " bytes)"));
  }
  return out;
}

absl::StatusOr<StoredJob> JobStore::GetOne(absl::string_view sql, absl::string_view what,
                                           absl::string_view value) {
  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  Query q(*db, sql);
  absl::StatusOr<bool> row = q.Text(value).Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(what, " \"", value, "\" not found"));
  return RowToJob(*db, q.ColBlob(0), q.ColInt(1));
}

absl::StatusOr<StoredJob> JobStore::GetJob(absl::string_view job_id) {
  return GetOne("SELECT job, submit_seq FROM jobs WHERE job_id = ?1", "job", job_id);
}

absl::StatusOr<StoredJob> JobStore::GetJobByKey(absl::string_view tenant,
                                                absl::string_view idempotency_key) {
  absl::StatusOr<StoredJob> job =
      GetOne("SELECT job, submit_seq FROM jobs WHERE idempotency_key = ?1",
             "job with idempotency key", ScopedIdempotencyKey(tenant, idempotency_key));
  if (absl::IsNotFound(job.status())) {
    return absl::NotFoundError(
        absl::StrCat("job with idempotency key \"", idempotency_key, "\" not found"));
  }
  return job;
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::Events(absl::string_view job_id,
                                                           int64_t after_seq, int limit) {
  if (after_seq < 0) {
    return absl::InvalidArgumentError(absl::StrCat("after_seq ", after_seq, " must be >= 0"));
  }
  if (limit < 0) return absl::InvalidArgumentError(absl::StrCat("limit ", limit, " must be >= 0"));
  return ReadEvents(job_id, after_seq, limit, /*latest=*/false);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::LatestEvents(absl::string_view job_id,
                                                                 int limit) {
  if (limit < 1) return absl::InvalidArgumentError(absl::StrCat("limit ", limit, " must be >= 1"));
  return ReadEvents(job_id, 0, limit, /*latest=*/true);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::ReadEvents(absl::string_view job_id,
                                                               int64_t after_seq, int limit,
                                                               bool latest) {
  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  std::vector<v1::JobEvent> events;
  {
    // The latest `limit`: the newest first from the (job_id, seq) key, reordered below.
    Query q(*db, latest ? "SELECT event FROM events WHERE job_id = ?1 AND seq > ?2 "
                          "ORDER BY seq DESC LIMIT ?3"
                        : "SELECT event FROM events WHERE job_id = ?1 AND seq > ?2 "
                          "ORDER BY seq LIMIT ?3");
    q.Text(job_id).Int(after_seq).Int(limit == 0 ? -1 : limit);
    for (;;) {
      absl::StatusOr<bool> row = q.Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      absl::string_view blob = q.ColBlob(0);
      if (!events.emplace_back().ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
        return absl::DataLossError(absl::StrCat("job store ", path_, ": an event of job ", job_id,
                                                " is unreadable (", blob.size(), " bytes)"));
      }
    }
  }
  if (events.empty()) {
    // Tell "no such job" from "no new events"; every stored job has at least its submitted event.
    Query q(*db, "SELECT 1 FROM jobs WHERE job_id = ?1");
    absl::StatusOr<bool> row = q.Text(job_id).Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
  }
  if (latest) std::reverse(events.begin(), events.end());
  return events;
}

absl::StatusOr<ListPage> JobStore::List(const ListFilter& filter, int page_size,
                                        absl::string_view page_token) {
  if (page_size == 0) page_size = kDefaultPageSize;
  if (page_size < 1 || page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size ", page_size, " is outside 1 .. ", kMaxPageSize));
  }
  int64_t before = std::numeric_limits<int64_t>::max();
  if (!page_token.empty()) {
    absl::StatusOr<int64_t> seq = DecodePageToken(page_token);
    if (!seq.ok()) return seq.status();
    before = *seq;
  }
  std::set<int> states;
  for (v1::JobState st : filter.states) {
    if (st == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(st)) {
      return absl::InvalidArgumentError(
          absl::StrCat("state filter ", static_cast<int>(st), " is not a job state"));
    }
    states.insert(st);
  }
  // Only the shape of the query varies (which filters are present), so the statement cache stays
  // small; values are always bound.
  std::string sql = "SELECT job, submit_seq FROM jobs WHERE submit_seq < ?";
  if (!states.empty()) {
    absl::StrAppend(&sql, " AND state IN (",
                    absl::StrJoin(std::vector<std::string>(states.size(), "?"), ","), ")");
  }
  if (!filter.tenant.empty()) absl::StrAppend(&sql, " AND tenant = ?");
  if (!filter.kind.empty()) absl::StrAppend(&sql, " AND kind = ?");
  absl::StrAppend(&sql, " ORDER BY submit_seq DESC LIMIT ?");

  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  Query q(*db, sql);
  q.Int(before);
  for (int st : states) q.Int(st);
  if (!filter.tenant.empty()) q.Text(filter.tenant);
  if (!filter.kind.empty()) q.Text(filter.kind);
  q.Int(page_size + 1);  // One more row tells whether a next page exists.
  ListPage page;
  for (;;) {
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    if (static_cast<int>(page.jobs.size()) == page_size) {
      page.next_page_token = EncodePageToken(page.jobs.back().submit_seq);
      break;
    }
    absl::StatusOr<StoredJob> job = RowToJob(*db, q.ColBlob(0), q.ColInt(1));
    if (!job.ok()) return job.status();
    page.jobs.push_back(*std::move(job));
  }
  return page;
}

absl::StatusOr<std::vector<StoredJob>> JobStore::LoadActive() {
  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  Query q(*db,
          "SELECT job, submit_seq FROM jobs WHERE state NOT IN (?1, ?2, ?3) ORDER BY submit_seq");
  q.Int(v1::JOB_STATE_SUCCEEDED).Int(v1::JOB_STATE_FAILED).Int(v1::JOB_STATE_CANCELLED);
  std::vector<StoredJob> jobs;
  for (;;) {
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    absl::StatusOr<StoredJob> job = RowToJob(*db, q.ColBlob(0), q.ColInt(1));
    if (!job.ok()) return job.status();
    jobs.push_back(*std::move(job));
  }
  return jobs;
}

absl::StatusOr<std::map<v1::JobState, int64_t>> JobStore::CountByState(const std::string& kind) {
  absl::StatusOr<SqliteDb*> db = TakeReader();
  if (!db.ok()) return db.status();
  auto give_back = absl::MakeCleanup([this, d = *db] { GiveBack(d); });
  Query q(*db, kind.empty() ? "SELECT state, COUNT(*) FROM jobs GROUP BY state"
                            : "SELECT state, COUNT(*) FROM jobs WHERE kind = ? GROUP BY state");
  if (!kind.empty()) q.Text(kind);
  std::map<v1::JobState, int64_t> counts;
  for (;;) {
    absl::StatusOr<bool> row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    counts[static_cast<v1::JobState>(q.ColInt(0))] = q.ColInt(1);
  }
  return counts;
}

}  // namespace server
}  // namespace dattn
