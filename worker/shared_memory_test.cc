#include "worker/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace worker {
namespace {

using ::testing::HasSubstr;

// A fresh object of `bytes` bytes holding 0, 1, 2, ... (mod 251); removed when destroyed.
class Object {
 public:
  explicit Object(int64_t bytes) : name_(absl::StrCat("/dattn-shm-test-", getpid())) {
    shm_unlink(name_.c_str());
    fd_ = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd_, 0);
    std::string data(static_cast<size_t>(bytes), '\0');
    for (int64_t i = 0; i < bytes; ++i) data[static_cast<size_t>(i)] = static_cast<char>(i % 251);
    EXPECT_EQ(pwrite(fd_, data.data(), data.size(), 0), bytes);
  }
  ~Object() {
    close(fd_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  void Resize(int64_t bytes) { EXPECT_EQ(ftruncate(fd_, bytes), 0); }
  std::string Bytes(int64_t offset, int64_t length) const {
    std::string s(static_cast<size_t>(length), '\0');
    EXPECT_EQ(pread(fd_, s.data(), s.size(), offset), length);
    return s;
  }

 private:
  std::string name_;
  int fd_ = -1;
};

api::SharedMemoryLayout Layout(const std::string& name, int64_t bytes) {
  api::SharedMemoryLayout layout;
  layout.name = name;
  layout.byte_size = bytes;
  return layout;
}

TEST(SharedMemoryFileTest, ReadsAndWritesTheObject) {
  const int64_t size = 3 * 4096 + 17;
  Object object(size);
  absl::StatusOr<SharedMemoryFile> file = SharedMemoryFile::Open(Layout(object.name(), size));
  ASSERT_TRUE(file.ok()) << file.status();
  std::string got(100, '\0');
  ASSERT_TRUE(file->Read(4000, 100, got.data()).ok());
  EXPECT_EQ(got, object.Bytes(4000, 100));
  EXPECT_EQ(got[0], static_cast<char>(4000 % 251));
  ASSERT_TRUE(file->Write(size - 10, 10, "0123456789").ok());
  EXPECT_EQ(object.Bytes(size - 10, 10), "0123456789");
  EXPECT_TRUE(absl::IsOutOfRange(file->Write(size - 5, 10, "0123456789")));
  // Moved, it still works; the moved-from file is empty.
  SharedMemoryFile moved = *std::move(file);
  ASSERT_TRUE(moved.Write(0, 3, "abc").ok());
  EXPECT_EQ(object.Bytes(0, 3), "abc");
}

TEST(SharedMemoryFileTest, ARegionThatShrinksUnderTheCallIsDataLossNotACrash) {
  const int64_t size = 8 * 4096;
  Object object(size);
  absl::StatusOr<SharedMemoryFile> file = SharedMemoryFile::Open(Layout(object.name(), size));
  ASSERT_TRUE(file.ok()) << file.status();
  object.Resize(4096);
  std::string page(4096, 'x');
  absl::Status write = file->Write(5 * 4096, 4096, page.data());  // SIGBUS, caught.
  EXPECT_TRUE(absl::IsDataLoss(write)) << write;
  EXPECT_THAT(write.message(), HasSubstr("it shrank during the call"));
  absl::Status read = file->Read(2 * 4096, 4096, page.data());
  EXPECT_TRUE(absl::IsDataLoss(read)) << read;
  EXPECT_THAT(read.message(), HasSubstr("ends at byte 8192"));
  // The guard is per copy: a later copy within the object works.
  EXPECT_TRUE(file->Write(0, 4096, page.data()).ok());
  EXPECT_EQ(object.Bytes(0, 4), "xxxx");
}

TEST(SharedMemoryFileTest, MissingOrSmallObjectsAreRefusedNamingThem) {
  Object object(100);
  absl::StatusOr<SharedMemoryFile> missing =
      SharedMemoryFile::Open(Layout("/dattn-shm-test-no-such-object", 100));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("shared memory /dattn-shm-test-no-such-object does not exist on host"));
  absl::StatusOr<SharedMemoryFile> small = SharedMemoryFile::Open(Layout(object.name(), 101));
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(small.status().message(),
              HasSubstr("is 100 bytes; the call places its tensors in 101"));
  absl::StatusOr<SharedMemoryFile> other = SharedMemoryFile::Open(Layout("/dev-shm-other", 10));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace worker
}  // namespace dattn
