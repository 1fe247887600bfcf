#include "api/attend_tensors.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace api {
namespace {

using ::testing::HasSubstr;

// A forward call's region: q, k, v, out one after the other, each `bytes` long.
v1::SharedMemoryRegion Region(int64_t bytes, bool backward) {
  v1::SharedMemoryRegion r;
  r.set_name("/dattn-test.0_A-z");
  std::vector<v1::AttendTensor> order = {v1::ATTEND_TENSOR_Q, v1::ATTEND_TENSOR_K,
                                         v1::ATTEND_TENSOR_V, v1::ATTEND_TENSOR_OUT};
  if (backward) {
    order.insert(order.end(), {v1::ATTEND_TENSOR_DOUT, v1::ATTEND_TENSOR_DQ, v1::ATTEND_TENSOR_DK,
                               v1::ATTEND_TENSOR_DV});
  }
  for (size_t i = 0; i < order.size(); ++i) {
    v1::SharedMemoryTensor* t = r.add_tensors();
    t->set_tensor(order[i]);
    t->set_offset(i * static_cast<uint64_t>(bytes));
  }
  r.set_byte_size(order.size() * static_cast<uint64_t>(bytes));
  return r;
}

std::string Error(const v1::SharedMemoryRegion& r, int64_t bytes, bool backward) {
  absl::StatusOr<SharedMemoryLayout> layout = CheckSharedMemory(r, bytes, backward, "start.sm");
  if (layout.ok()) {
    ADD_FAILURE() << "accepted";
    return "";
  }
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(layout.status().message());
}

TEST(AttendTensorsTest, NamesEveryTensor) {
  EXPECT_STREQ(AttendTensorName(v1::ATTEND_TENSOR_Q), "q");
  EXPECT_STREQ(AttendTensorName(v1::ATTEND_TENSOR_DOUT), "dout");
  EXPECT_STREQ(AttendTensorName(v1::ATTEND_TENSOR_DV), "dv");
  EXPECT_STREQ(AttendTensorName(v1::ATTEND_TENSOR_UNSPECIFIED), "unspecified");
}

TEST(AttendTensorsTest, LaysOutAValidRegion) {
  for (bool backward : {false, true}) {
    absl::StatusOr<SharedMemoryLayout> layout =
        CheckSharedMemory(Region(1000, backward), 1000, backward, "start.sm");
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->name, "/dattn-test.0_A-z");
    EXPECT_EQ(layout->byte_size, backward ? 8000 : 4000);
    EXPECT_EQ(layout->offset[v1::ATTEND_TENSOR_Q], 0);
    EXPECT_EQ(layout->offset[v1::ATTEND_TENSOR_OUT], 3000);
    EXPECT_EQ(layout->offset[v1::ATTEND_TENSOR_DV], backward ? 7000 : -1);
    EXPECT_EQ(layout->offset[v1::ATTEND_TENSOR_UNSPECIFIED], -1);
  }
}

TEST(AttendTensorsTest, OnlyDattnNamesOpen) {
  for (const char* bad : {"dattn-x", "/dattn-", "/other", "/dattn-a/b", "/dattn-..", "/dattn-a b",
                          "/dattn-\xc3\xa9"}) {
    v1::SharedMemoryRegion r = Region(10, false);
    r.set_name(bad);
    EXPECT_THAT(Error(r, 10, false), HasSubstr("start.sm.name")) << bad;
  }
  v1::SharedMemoryRegion r = Region(10, false);
  r.set_name("/dattn-" + std::string(201, 'a'));
  EXPECT_THAT(Error(r, 10, false), HasSubstr("1 .. 200 characters"));
  r.set_name("/dattn-" + std::string(200, 'a'));
  EXPECT_TRUE(CheckSharedMemory(r, 10, false, "p").ok());
}

TEST(AttendTensorsTest, RefusesBadRegionsNamingTheValue) {
  v1::SharedMemoryRegion r = Region(100, false);
  r.set_byte_size(0);
  EXPECT_THAT(Error(r, 100, false), HasSubstr("start.sm.byte_size: must be 1 .."));
  r.set_byte_size((uint64_t{1} << 40) + 1);
  EXPECT_THAT(Error(r, 100, false), HasSubstr("got 1099511627777"));

  r = Region(100, false);
  r.set_byte_size(399);  // out ends at 400.
  EXPECT_THAT(Error(r, 100, false),
              HasSubstr("start.sm.tensors[3].offset: out at offset 300 with its 100 bytes ends "
                        "past byte_size 399"));
  r = Region(100, false);
  r.mutable_tensors(2)->set_offset(~uint64_t{0});  // No wrap-around.
  EXPECT_THAT(Error(r, 100, false), HasSubstr("tensors[2].offset: v at offset"));

  r = Region(100, false);
  r.mutable_tensors(1)->set_offset(50);  // k overlaps q.
  EXPECT_THAT(Error(r, 100, false), HasSubstr("q at 0 and k at 50 overlap (each is 100 bytes)"));

  r = Region(100, false);
  r.mutable_tensors(1)->set_tensor(v1::ATTEND_TENSOR_Q);
  EXPECT_THAT(Error(r, 100, false), HasSubstr("tensors[1].tensor: q is placed twice"));

  r = Region(100, false);
  r.mutable_tensors()->RemoveLast();
  EXPECT_THAT(Error(r, 100, false), HasSubstr("start.sm.tensors: no place for out"));

  // Gradients in a forward call, a forward call's region for a backward one, unknown tensors.
  EXPECT_THAT(Error(Region(100, true), 100, false), HasSubstr("dout is not a tensor of this call"));
  EXPECT_THAT(Error(Region(100, false), 100, true), HasSubstr("no place for dout, dq, dk, dv"));
  r = Region(100, false);
  r.mutable_tensors(0)->set_tensor(static_cast<v1::AttendTensor>(42));
  EXPECT_THAT(Error(r, 100, false), HasSubstr("tensors[0].tensor: 42 is not a tensor"));
  r.mutable_tensors(0)->set_tensor(v1::ATTEND_TENSOR_UNSPECIFIED);
  EXPECT_THAT(Error(r, 100, false), HasSubstr("unspecified is not a tensor"));
}

}  // namespace
}  // namespace api
}  // namespace dattn
