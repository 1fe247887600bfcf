// The median of a list of measurements (step times): the middle value, or the mean of the two
// middle values of an even count; 0 for an empty list. Takes its argument by value (it reorders
// it). Pure; O(n log n).
#ifndef DATTN_BASE_MEDIAN_H_
#define DATTN_BASE_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace dattn {

inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace dattn

#endif  // DATTN_BASE_MEDIAN_H_
