// A 2-D tensor written as rows in a test: rows({{0, 1}, {2, 3}}).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace baton::test {

// The rows' values (each row as long as the last), as `dtype`; built in
// double, so that an fp32 tensor holds the values rounded once.
inline at::Tensor rows(std::initializer_list<std::initializer_list<double>> values,
                       at::ScalarType dtype = at::kFloat) {
  std::vector<double> flat;
  int64_t cols = 0;
  for (const auto& r : values) {
    cols = static_cast<int64_t>(r.size());
    flat.insert(flat.end(), r.begin(), r.end());
  }
  return at::tensor(flat, at::kDouble)
      .reshape({static_cast<int64_t>(values.size()), cols})
      .to(dtype);
}

}  // namespace baton::test
