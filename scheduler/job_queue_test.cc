#include "scheduler/job_queue.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/test_util.h"

namespace dattn {
namespace scheduler {
namespace {

JobRequest J(const std::string& id, const std::string& tenant, int priority, int64_t seq) {
  JobRequest j = testing::Job(id, 1, 0, seq);
  j.tenant = tenant;
  j.priority = priority;
  return j;
}

std::vector<std::string> Ids(const JobQueue& q) {
  std::vector<std::string> ids;
  for (const JobRequest& j : q.Ordered()) ids.push_back(j.job_id);
  return ids;
}

using Ids_ = std::vector<std::string>;

TEST(JobQueueTest, EnqueueFindAndSize) {
  JobQueue q;
  EXPECT_TRUE(q.empty());
  ASSERT_TRUE(q.Enqueue(J("a", "t", 0, 1)).ok());
  ASSERT_TRUE(q.Enqueue(J("b", "t", 0, 2)).ok());
  EXPECT_EQ(q.size(), 2u);
  ASSERT_NE(q.Find("a"), nullptr);
  EXPECT_EQ(q.Find("a")->submit_seq, 1);
  EXPECT_EQ(q.Find("zzz"), nullptr);
  EXPECT_TRUE(q.Contains("b"));
}

TEST(JobQueueTest, DuplicateIdRejectedAndQueueUnchanged) {
  JobQueue q;
  ASSERT_TRUE(q.Enqueue(J("a", "t", 0, 1)).ok());
  absl::Status s = q.Enqueue(J("a", "other", 5, 9));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s;
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.Find("a")->tenant, "t");
  EXPECT_EQ(Ids(q), Ids_({"a"}));
}

TEST(JobQueueTest, InvalidJobRejected) {
  JobQueue q;
  JobRequest bad = J("a", "t", 0, 1);
  bad.num_ranks = 0;
  EXPECT_EQ(q.Enqueue(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(q.empty());
}

TEST(JobQueueTest, RemoveTakesTheJobOut) {
  JobQueue q;
  ASSERT_TRUE(q.Enqueue(J("a", "t", 0, 1)).ok());
  ASSERT_TRUE(q.Enqueue(J("b", "t", 0, 2)).ok());
  ASSERT_TRUE(q.Enqueue(J("c", "u", 3, 3)).ok());
  ASSERT_TRUE(q.Remove("b").ok());
  EXPECT_EQ(Ids(q), Ids_({"c", "a"}));
  ASSERT_TRUE(q.Remove("c").ok());
  EXPECT_EQ(Ids(q), Ids_({"a"}));
  absl::Status s = q.Remove("c");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("'c'"), std::string::npos);
  // The id is free again once removed.
  EXPECT_TRUE(q.Enqueue(J("c", "u", 0, 4)).ok());
  EXPECT_EQ(Ids(q), Ids_({"a", "c"}));
}

TEST(JobQueueTest, StrictPriorityThenFifoWithinTenant) {
  JobQueue q;
  ASSERT_TRUE(q.Enqueue(J("low1", "t", 0, 1)).ok());
  ASSERT_TRUE(q.Enqueue(J("high2", "t", 5, 4)).ok());
  ASSERT_TRUE(q.Enqueue(J("low0", "t", 0, 0)).ok());  // Enqueued late but submitted first.
  ASSERT_TRUE(q.Enqueue(J("high1", "t", 5, 3)).ok());
  ASSERT_TRUE(q.Enqueue(J("mid", "t", 2, 2)).ok());
  ASSERT_TRUE(q.Enqueue(J("neg", "t", -1, 0)).ok());
  EXPECT_EQ(Ids(q), Ids_({"high1", "high2", "mid", "low0", "low1", "neg"}));
}

TEST(JobQueueTest, SameSubmitSeqOrdersByJobId) {
  JobQueue q;
  ASSERT_TRUE(q.Enqueue(J("b", "t", 0, 7)).ok());
  ASSERT_TRUE(q.Enqueue(J("a", "t", 0, 7)).ok());
  EXPECT_EQ(Ids(q), Ids_({"a", "b"}));
}

TEST(JobQueueTest, TwoFloodingTenantsInterleave) {
  JobQueue q;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(q.Enqueue(J(absl::StrCat("a", i), "A", 0, i)).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(q.Enqueue(J(absl::StrCat("b", i), "B", 0, 10 + i)).ok());
  // Neither served yet: A's head was submitted first, so A takes the first turn.
  EXPECT_EQ(Ids(q), Ids_({"a0", "b0", "a1", "b1", "a2", "b2", "a3"}));
}

TEST(JobQueueTest, LeastRecentlyServedTenantGoesFirst) {
  JobQueue q;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(q.Enqueue(J(absl::StrCat("a", i), "A", 0, i)).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(q.Enqueue(J(absl::StrCat("b", i), "B", 0, 10 + i)).ok());
  absl::StatusOr<JobRequest> first = q.Dispatch("a0");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->job_id, "a0");
  // A was just served; B (never served) takes the next turn.
  EXPECT_EQ(Ids(q), Ids_({"b0", "a1", "b1", "a2", "b2"}));
  ASSERT_TRUE(q.Dispatch("b0").ok());
  EXPECT_EQ(Ids(q), Ids_({"a1", "b1", "a2", "b2"}));
  // A newcomer has never been served and goes ahead of both.
  ASSERT_TRUE(q.Enqueue(J("c0", "C", 0, 99)).ok());
  EXPECT_EQ(Ids(q), Ids_({"c0", "a1", "b1", "a2", "b2"}));
  EXPECT_EQ(q.Dispatch("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(JobQueueTest, RemoveDoesNotCountAsServed) {
  JobQueue q;
  ASSERT_TRUE(q.Enqueue(J("a0", "A", 0, 0)).ok());
  ASSERT_TRUE(q.Enqueue(J("a1", "A", 0, 1)).ok());
  ASSERT_TRUE(q.Enqueue(J("b0", "B", 0, 2)).ok());
  ASSERT_TRUE(q.Remove("a0").ok());
  // Had the cancel counted, B would go first.
  EXPECT_EQ(Ids(q), Ids_({"a1", "b0"}));
}

TEST(JobQueueTest, FairnessIsPerPriorityLevelWithGlobalServiceRecord) {
  JobQueue q;
  ASSERT_TRUE(q.Enqueue(J("a-hi", "A", 9, 0)).ok());
  ASSERT_TRUE(q.Enqueue(J("a-lo", "A", 0, 1)).ok());
  ASSERT_TRUE(q.Enqueue(J("b-lo", "B", 0, 2)).ok());
  EXPECT_EQ(Ids(q), Ids_({"a-hi", "a-lo", "b-lo"}));
  ASSERT_TRUE(q.Dispatch("a-hi").ok());
  EXPECT_EQ(Ids(q), Ids_({"b-lo", "a-lo"}));
}

TEST(JobQueueTest, PositionMatchesOrdered) {
  JobQueue q;
  ASSERT_TRUE(q.Enqueue(J("a0", "A", 0, 0)).ok());
  ASSERT_TRUE(q.Enqueue(J("a1", "A", 0, 1)).ok());
  ASSERT_TRUE(q.Enqueue(J("b0", "B", 0, 2)).ok());
  ASSERT_TRUE(q.Enqueue(J("h", "B", 1, 3)).ok());
  EXPECT_EQ(q.Position("h"), 0u);
  EXPECT_EQ(q.Position("a0"), 1u);
  EXPECT_EQ(q.Position("b0"), 2u);
  EXPECT_EQ(q.Position("a1"), 3u);
  EXPECT_EQ(q.Position("x"), std::nullopt);
}

TEST(JobQueueTest, RequeueWithSameSeqReturnsToItsPlace) {
  JobQueue q;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(q.Enqueue(J(absl::StrCat("a", i), "A", 0, i)).ok());
  absl::StatusOr<JobRequest> job = q.Dispatch("a0");
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(q.Enqueue(*job).ok());
  EXPECT_EQ(Ids(q), Ids_({"a0", "a1", "a2", "a3"}));
}

// Random enqueues, removes and dispatches against a model of the documented order.
TEST(JobQueueRandomTest, OrderMatchesTheContract) {
  std::mt19937_64 rng(20240611);
  for (int iter = 0; iter < 300; ++iter) {
    JobQueue q;
    std::map<std::string, JobRequest> live;
    std::map<std::string, uint64_t> last_served;  // The model's service record.
    uint64_t clock = 0;
    int64_t seq = 0;
    int next_id = 0;
    const int ops = 1 + static_cast<int>(rng() % 60);
    for (int op = 0; op < ops; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 6 || live.empty()) {
        JobRequest j = J(absl::StrCat("j", next_id++), absl::StrCat("t", rng() % 4),
                         static_cast<int>(rng() % 3), seq);
        seq += static_cast<int64_t>(rng() % 2);  // Repeated seqs exercise the id tie-break.
        ASSERT_TRUE(q.Enqueue(j).ok());
        live[j.job_id] = j;
      } else {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        if (kind < 8) {
          ASSERT_TRUE(q.Remove(it->first).ok());
        } else {
          absl::StatusOr<JobRequest> d = q.Dispatch(it->first);
          ASSERT_TRUE(d.ok());
          EXPECT_EQ(d->job_id, it->first);
          last_served[it->second.tenant] = ++clock;
        }
        live.erase(it);
      }
    }
    std::vector<JobRequest> ordered = q.Ordered();
    ASSERT_EQ(ordered.size(), live.size());
    ASSERT_EQ(q.size(), live.size());
    std::set<std::string> seen;
    for (const JobRequest& j : ordered) {
      ASSERT_TRUE(live.count(j.job_id)) << j.job_id;
      ASSERT_TRUE(seen.insert(j.job_id).second) << j.job_id;
    }
    // Walk each priority segment and replay the rotation the contract describes.
    size_t i = 0;
    while (i < ordered.size()) {
      const int prio = ordered[i].priority;
      if (i > 0) {
        ASSERT_LT(prio, ordered[i - 1].priority) << "priorities interleave";
      }
      std::map<std::string, std::vector<const JobRequest*>> fifo;
      for (const auto& [id, j] : live) {
        if (j.priority == prio) fifo[j.tenant].push_back(&j);
      }
      for (auto& [t, v] : fifo) {
        std::sort(v.begin(), v.end(), [](const JobRequest* a, const JobRequest* b) {
          return std::tie(a->submit_seq, a->job_id) < std::tie(b->submit_seq, b->job_id);
        });
      }
      // Turn order by (last served, head seq, name); serving moves a tenant to the back.
      std::vector<std::tuple<uint64_t, int64_t, std::string>> turns;
      for (const auto& [t, v] : fifo) {
        turns.emplace_back(last_served.count(t) ? last_served[t] : 0, v.front()->submit_seq, t);
      }
      std::sort(turns.begin(), turns.end());
      std::vector<std::string> cycle;
      for (const auto& turn : turns) cycle.push_back(std::get<2>(turn));
      std::map<std::string, size_t> taken;
      while (!cycle.empty()) {
        std::vector<std::string> next_cycle;
        for (const std::string& t : cycle) {
          ASSERT_LT(i, ordered.size());
          EXPECT_EQ(ordered[i].job_id, fifo[t][taken[t]]->job_id)
              << "iter " << iter << " pos " << i;
          ++i;
          if (++taken[t] < fifo[t].size()) next_cycle.push_back(t);
        }
        cycle.swap(next_cycle);
      }
    }
    for (const JobRequest& j : ordered) {
      ASSERT_EQ(q.Position(j.job_id).value(), static_cast<size_t>(&j - ordered.data()));
    }
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace dattn

namespace dattn {
namespace scheduler {
namespace {

// Tenant names come from clients: the "last served" record stays bounded however many tenants have
// come and gone, and the order of the tenants still queued is unchanged by the pruning.
TEST(JobQueueTest, LastServedRecordStaysBounded) {
  JobQueue q;
  int64_t seq = 0;
  auto job = [&](const std::string& id, const std::string& tenant) {
    JobRequest r;
    r.job_id = id;
    r.tenant = tenant;
    r.submit_seq = ++seq;
    r.num_ranks = 1;
    r.memory_per_rank_bytes = 1;
    r.dtype = "fp32";
    return r;
  };
  ASSERT_TRUE(q.Enqueue(job("stay-1", "stay")).ok());
  ASSERT_TRUE(q.Enqueue(job("stay-2", "stay")).ok());
  ASSERT_TRUE(q.Dispatch("stay-1").ok());
  for (int i = 0; i < 5000; ++i) {
    const std::string tenant = "t" + std::to_string(i);
    ASSERT_TRUE(q.Enqueue(job("j" + std::to_string(i), tenant)).ok());
    ASSERT_TRUE(q.Dispatch("j" + std::to_string(i)).ok());
  }
  EXPECT_LE(q.remembered_tenants(), 2u * 1u + 64u + 1u);
  // A never-served tenant goes before a served one, pruning or not.
  ASSERT_TRUE(q.Enqueue(job("fresh-1", "fresh")).ok());
  std::vector<JobRequest> order = q.Ordered();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0].job_id, "fresh-1");
  EXPECT_EQ(order[1].job_id, "stay-2");
}

}  // namespace
}  // namespace scheduler
}  // namespace dattn
