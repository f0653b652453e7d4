// The Levenshtein distance between two strings: how the "did you mean" hints of option
// names and RINGTRAIN_* settings pick the nearest known name.
#pragma once

#include <cstddef>
#include <string>

namespace ringtrain {

// Insertions, deletions and substitutions turning a into b (one row of the table, O(|b|)).
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace ringtrain
