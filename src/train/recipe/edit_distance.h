// Levenshtein distance, for "did you mean" suggestions on unknown ops, recipe keys and choices.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace seqlab {

// The fewest single-character insertions, deletions and substitutions turning a into b.
size_t edit_distance(const std::string& a, const std::string& b);

// A near miss: at most two edits, and fewer than `typed` has letters (so "x" suggests nothing); sets
// *distance to the edit distance either way.
bool near_miss(const std::string& typed, const std::string& known, size_t* distance);
// The candidate nearest to `typed` among the near misses (the first on a tie), or "".
std::string nearest(const std::string& typed, const std::vector<std::string>& candidates);

}  // namespace seqlab
