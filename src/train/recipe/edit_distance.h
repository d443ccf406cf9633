// Levenshtein distance, for "did you mean" suggestions on unknown ops, recipe keys and choices.
#pragma once

#include <cstddef>
#include <string>

namespace seqlab {

// The fewest single-character insertions, deletions and substitutions turning a into b.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace seqlab
