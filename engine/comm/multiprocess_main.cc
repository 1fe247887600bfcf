// main() of multi-process test binaries: a child run (see multiprocess.h) or the gtest suite.
#include <optional>

#include "engine/comm/multiprocess.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  if (std::optional<int> code = dattn::comm::multiprocess::MaybeRunChild(argc, argv)) return *code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
