#include "security/tokens.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "api/tenant.h"
#include "gtest/gtest.h"

namespace dattn {
namespace security {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

TEST(TokensTest, HashIsSha256Hex) {
  // FIPS 180-2's test vector.
  EXPECT_EQ(HashToken("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TokensTest, NewTokensAreLongAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<std::string> token = NewToken();
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_EQ(token->rfind("dattn_", 0), 0u);
    EXPECT_GE(token->size(), 6u + 43u);
    EXPECT_TRUE(seen.insert(*token).second);
  }
}

TEST(TokensTest, ParsesLinesCommentsAndRoles) {
  const std::string text = "# tokens\n\n" + HashToken("t1") + " team-a user alice  # laptop\n" +
                           HashToken("t2") + "\tops\tadmin\n";
  absl::StatusOr<std::map<std::string, Principal>> table = ParseTokenFile(text, "f");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 2u);
  const Principal& a = table->at(HashToken("t1"));
  EXPECT_EQ(a.tenant, "team-a");
  EXPECT_EQ(a.role, Role::kUser);
  EXPECT_EQ(a.name, "alice");
  const Principal& b = table->at(HashToken("t2"));
  EXPECT_EQ(b.role, Role::kAdmin);
  EXPECT_EQ(b.name, HashToken("t2").substr(7, 12));  // The default label.
}

TEST(TokensTest, BadLinesNameTheLineAndTheField) {
  const std::string hash = HashToken("t");
  struct Case {
    std::string text;
    std::string want;
  } cases[] = {
      {"dattn_secret team user\n", "line 1: the first field must be sha256:"},
      {"\n" + hash + " team\n", "line 2: expected"},
      {hash + " team superuser\n", "role \"superuser\""},
      {hash + " te/am user\n", "tenant \"te/am\""},
      {hash + " " + std::string(65, 'a') + " user\n", "must be 1..64"},
      {hash + " a user\n" + hash + " b user\n", "line 2: the same token hash appears twice"},
      {"sha256:ABCDEF team user\n", "64 lowercase hex"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::map<std::string, Principal>> table = ParseTokenFile(c.text, "tokens.txt");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(table.status().message().find(c.want), std::string::npos) << table.status();
    EXPECT_NE(table.status().message().find("tokens.txt"), std::string::npos) << table.status();
  }
}

TEST(TokensTest, AuthenticatesKnownTokensOnly) {
  const std::string path = TempPath("auth-tokens");
  Write(path, HashToken("good") + " team-a user\n");
  absl::StatusOr<std::unique_ptr<TokenTable>> table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  absl::StatusOr<Principal> p = (*table)->Authenticate("good");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tenant, "team-a");
  EXPECT_EQ((*table)->Authenticate("bad").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*table)->Authenticate("").status().code(), absl::StatusCode::kUnauthenticated);
  // The hash itself is not a token.
  EXPECT_EQ((*table)->Authenticate(HashToken("good")).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(TokensTest, LoadRefusesMissingEmptyAndMalformedFiles) {
  EXPECT_EQ(TokenTable::Load(TempPath("no-such-file")).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string path = TempPath("empty-tokens");
  Write(path, "# nobody\n");
  absl::StatusOr<std::unique_ptr<TokenTable>> empty = TokenTable::Load(path);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("has no token"), std::string::npos) << empty.status();
}

// Adding and revoking a token takes effect without a restart; a file that became malformed keeps
// the last good table in force and says why.
TEST(TokensTest, ReloadsWhenTheFileChanges) {
  const std::string path = TempPath("reload-tokens");
  Write(path, HashToken("first") + " a user\n");
  absl::StatusOr<std::unique_ptr<TokenTable>> table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_TRUE((*table)->Authenticate("first").ok());

  Write(path, HashToken("second") + " b admin\n");  // "first" revoked, "second" added.
  bool reloaded = false;
  for (int i = 0; i < 50 && !reloaded; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    reloaded = (*table)->Authenticate("second").ok();
  }
  ASSERT_TRUE(reloaded) << "the changed file was not re-read within 5 s";
  EXPECT_EQ((*table)->Authenticate("first").status().code(), absl::StatusCode::kUnauthenticated);

  Write(path, "garbage here\n");
  std::string error;
  for (int i = 0; i < 50 && error.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    (*table)->Authenticate("second").IgnoreError();
    error = (*table)->reload_error();
  }
  EXPECT_NE(error.find("line 1"), std::string::npos) << error;
  EXPECT_TRUE((*table)->Authenticate("second").ok()) << "the last good table must stay";
}

TEST(TokensTest, TenantsFollowTheJobSpecRule) {
  EXPECT_TRUE(api::IsTenantName("team-a.b_c"));
  EXPECT_FALSE(api::IsTenantName(""));
  EXPECT_FALSE(api::IsTenantName("a b"));
  EXPECT_FALSE(api::IsTenantName(std::string(65, 'x')));
}

}  // namespace
}  // namespace security
}  // namespace dattn
