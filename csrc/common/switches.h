// The environment switches the kernels read: tuning and debugging overrides, never needed for
// correct results (docs/switches.md lists every one, the build's and the loader's too). Every
// POINTOPS_* variable read from C++ or CUDA goes through these functions.
#pragma once

#include <c10/util/Optional.h>

#include <cstdlib>

namespace pointops {

// The number in environment variable `name` when it is set and positive (or 0, where allow_zero),
// else fallback.
inline double switch_number(const char* name, double fallback, bool allow_zero) {
  const char* text = std::getenv(name);
  if (text == nullptr || text[0] == '\0') return fallback;
  const double value = std::atof(text);
  return value > 0 || (allow_zero && value == 0) ? value : fallback;
}

// Environment variable `name` as a forced choice: unset or empty, none; else whether its first
// character is not '0'.
inline c10::optional<bool> switch_flag(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || text[0] == '\0') return c10::nullopt;
  return text[0] != '0';
}

}  // namespace pointops
