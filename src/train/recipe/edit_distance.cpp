#include "train/recipe/edit_distance.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace seqlab {

// One row of the dynamic-programming table at a time: row[j] = distance(a[:i], b[:j]).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

bool near_miss(const std::string& typed, const std::string& known, size_t* distance) {
  *distance = edit_distance(typed, known);
  return *distance <= 2 && *distance < typed.size();
}

std::string nearest(const std::string& typed, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX, d = 0;
  for (const std::string& c : candidates) {
    if (near_miss(typed, c, &d) && d < best_d) best = c, best_d = d;
  }
  return best;
}

}  // namespace seqlab
