#include "server/job_state.h"

#include <set>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace server {
namespace {

using ::testing::HasSubstr;

constexpr v1::JobState kQ = v1::JOB_STATE_QUEUED;
constexpr v1::JobState kP = v1::JOB_STATE_PLACED;
constexpr v1::JobState kR = v1::JOB_STATE_RUNNING;
constexpr v1::JobState kS = v1::JOB_STATE_SUCCEEDED;
constexpr v1::JobState kF = v1::JOB_STATE_FAILED;
constexpr v1::JobState kC = v1::JOB_STATE_CANCELLED;

// The whole machine written out independently of the implementation's switch: every pair not listed
// (among known states) must be refused with FAILED_PRECONDITION.
const std::set<std::pair<v1::JobState, v1::JobState>>& AllowedPairs() {
  static const auto* pairs = new std::set<std::pair<v1::JobState, v1::JobState>>{
      {kQ, kQ}, {kQ, kP}, {kQ, kC}, {kQ, kF},            //
      {kP, kP}, {kP, kR}, {kP, kQ}, {kP, kC}, {kP, kF},  //
      {kR, kR}, {kR, kS}, {kR, kF}, {kR, kC}, {kR, kQ},  //
  };
  return *pairs;
}

TEST(JobStateTest, EveryPairOfKnownStates) {
  const v1::JobState known[] = {kQ, kP, kR, kS, kF, kC};
  int allowed = 0;
  for (v1::JobState from : known) {
    for (v1::JobState to : known) {
      SCOPED_TRACE(std::string(StateName(from)) + " -> " + std::string(StateName(to)));
      absl::Status s = CheckTransition(from, to);
      if (AllowedPairs().count({from, to})) {
        EXPECT_TRUE(s.ok()) << s;
        ++allowed;
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        EXPECT_THAT(s.message(),
                    HasSubstr(std::string(StateName(from)) + " -> " + std::string(StateName(to))));
      }
    }
  }
  EXPECT_EQ(allowed, 14);
}

TEST(JobStateTest, TerminalStatesAreFinalAndSaySo) {
  for (v1::JobState from : {kS, kF, kC}) {
    EXPECT_TRUE(IsTerminal(from));
    absl::Status s = CheckTransition(from, kQ);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("is terminal"));
  }
  for (v1::JobState s : {kQ, kP, kR, v1::JOB_STATE_UNSPECIFIED}) EXPECT_FALSE(IsTerminal(s));
  EXPECT_FALSE(IsTerminal(static_cast<v1::JobState>(42)));
}

TEST(JobStateTest, UnspecifiedAndOutOfRangeAreInvalidArguments) {
  const v1::JobState bad[] = {v1::JOB_STATE_UNSPECIFIED, static_cast<v1::JobState>(42),
                              static_cast<v1::JobState>(-1)};
  const v1::JobState all[] = {kQ, kP, kR, kS, kF, kC, v1::JOB_STATE_UNSPECIFIED};
  for (v1::JobState b : bad) {
    for (v1::JobState other : all) {
      EXPECT_EQ(CheckTransition(b, other).code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(CheckTransition(other, b).code(), absl::StatusCode::kInvalidArgument);
    }
  }
  EXPECT_THAT(CheckTransition(kQ, static_cast<v1::JobState>(42)).message(), HasSubstr("(42)"));
}

TEST(JobStateTest, Names) {
  EXPECT_EQ(StateName(kQ), "queued");
  EXPECT_EQ(StateName(kP), "placed");
  EXPECT_EQ(StateName(kR), "running");
  EXPECT_EQ(StateName(kS), "succeeded");
  EXPECT_EQ(StateName(kF), "failed");
  EXPECT_EQ(StateName(kC), "cancelled");
  EXPECT_EQ(StateName(v1::JOB_STATE_UNSPECIFIED), "unspecified");
  EXPECT_EQ(StateName(static_cast<v1::JobState>(42)), "unknown");
}

}  // namespace
}  // namespace server
}  // namespace dattn
