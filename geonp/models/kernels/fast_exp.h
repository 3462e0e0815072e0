// A vectorisable exp for the kernels' non-positive arguments (softmax weights in
// te_attention_cpu.cpp, correlations in covariance_cpu.cpp): std::exp is a scalar libm call, which
// keeps the loops around it scalar.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

// exp(x) for x <= 0 to 2e-7 relative (about 2 float rounding steps), in a form the compiler
// vectorises (std::exp is a scalar libm call): exp(x) = 2^n exp(r), |r| <= ln(2) / 2, exp(r) by
// its degree-6 Taylor polynomial. Below -87 (and at -inf) it returns 2^-126 * exp(r) ~ 1e-38:
// callers multiply by their masks, so absent keys get exactly 0 (present pairs far apart ~1e-38).
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.f);
  const float n = std::floor(x * 1.44269504f + 0.5f);
  const float r = x - n * 0.693145752f - n * 1.42860677e-6f;  // ln 2 in two parts, for accuracy
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace
