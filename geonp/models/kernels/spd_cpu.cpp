// Many small symmetric positive definite systems K x = r on the CPU (the local kriging head's
// K x K neighbour covariances, thousands per window), eight systems at a time: each of a
// vector's eight lanes holds one system, so the Cholesky factor and the substitutions run as
// plain scalar algorithms on eight-float vectors, whatever the size. A batched LAPACK call
// factors one system after another, each too small to fill the vector units, and opens an
// OpenMP team for every one. geonp/models/kriging_linalg.py calls these and keeps torch's
// routines where the kernel cannot be built.
//
// Layout inside a group: the lower triangle packed by rows, entry (i, j <= i) at
// i (i + 1) / 2 + j, each entry a vector of the eight systems' values. Shapes: S systems, n
// unknowns, m right-hand sides.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "flush_denormals.h"

namespace {

constexpr int64_t LANES = 8;
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));  // GCC/Clang vector type

inline int64_t tri(int64_t i, int64_t j) { return i * (i + 1) / 2 + j; }

// sum_k a[k] b[k] over k < len, in four partial sums so that the FMAs do not wait on each other.
inline vec dot(const vec* a, const vec* b, int64_t len) {
  vec s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t k = 0;
  for (; k + 4 <= len; k += 4) {
    s0 += a[k] * b[k]; s1 += a[k + 1] * b[k + 1];
    s2 += a[k + 2] * b[k + 2]; s3 += a[k + 3] * b[k + 3];
  }
  for (; k < len; ++k) s0 += a[k] * b[k];
  return (s0 + s1) + (s2 + s3);
}

// One group's packed lower triangles from ``count`` matrices [n][n] at ``src`` (lanes past
// ``count`` get the identity, so they never fail).
void load_lower(const float* src, int64_t n, int64_t count, vec* a) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      vec v;
      for (int64_t l = 0; l < LANES; ++l) v[l] = l < count ? src[(l * n + i) * n + j] : (i == j ? 1.f : 0.f);
      a[tri(i, j)] = v;
    }
}

// In place: the packed lower triangle ``a`` becomes its Cholesky factor (Cholesky-Crout, row by
// row), ``inv`` the reciprocals of its diagonal. A lane whose matrix is not positive definite
// (a pivot <= 0 or NaN) gets info[l] = the 1-based row, as LAPACK's, and goes on with a unit
// pivot so the other lanes finish; its factor is then meaningless.
void factor(vec* a, vec* inv, int64_t n, int32_t* info) {
  for (int64_t i = 0; i < n; ++i) {
    vec* li = a + tri(i, 0);
    for (int64_t j = 0; j < i; ++j) li[j] = (li[j] - dot(li, a + tri(j, 0), j)) * inv[j];
    vec d = li[i] - dot(li, li, i);
    for (int64_t l = 0; l < LANES; ++l) {
      if (!(d[l] > 0.f)) {
        if (info[l] == 0) info[l] = static_cast<int32_t>(i + 1);
        d[l] = 1.f;
      }
      d[l] = std::sqrt(d[l]);
    }
    li[i] = d;
    inv[i] = 1.f / d;
  }
}

// x = K^-1 r for one group from its factor: r [m][n] vectors in ``y``, solved in place
// (L y = r by rows of L, then L^T x = y subtracting each solved unknown from the rows above).
void substitute(const vec* a, const vec* inv, int64_t n, int64_t m, vec* y) {
  for (int64_t c = 0; c < m; ++c) {
    vec* yc = y + c * n;
    for (int64_t i = 0; i < n; ++i) yc[i] = (yc[i] - dot(a + tri(i, 0), yc, i)) * inv[i];
    for (int64_t i = n - 1; i >= 0; --i) {
      const vec xi = yc[i] * inv[i];
      yc[i] = xi;
      const vec* li = a + tri(i, 0);
      for (int64_t k = 0; k < i; ++k) yc[k] -= li[k] * xi;
    }
  }
}

void load_rhs(const float* r, int64_t n, int64_t m, int64_t count, vec* y) {
  for (int64_t c = 0; c < m; ++c)
    for (int64_t i = 0; i < n; ++i) {
      vec v;
      for (int64_t l = 0; l < LANES; ++l) v[l] = l < count ? r[(l * n + i) * m + c] : 0.f;
      y[c * n + i] = v;
    }
}

void store_solution(const vec* y, int64_t n, int64_t m, int64_t count, float* x) {
  for (int64_t l = 0; l < count; ++l)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < m; ++c) x[(l * n + i) * m + c] = y[c * n + i][l];
}

void check(const torch::Tensor& t, int64_t dims, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.dim() == dims,
              "spd_cpu: ", what, " must be a contiguous float32 CPU tensor of ", dims, " dimensions");
}

}  // namespace

// K [S, n, n] (only its lower triangle is read), r [S, n, m] -> (x [S, n, m], info [S] int32:
// 0, or the row where K was found not positive definite; that system's x is meaningless), and
// when ``keep_factor`` the factors as the kernel holds them, packed [ceil(S / 8), n (n + 1) / 2,
// 8] (a group's lower triangles, lane-interleaved), for factor_substitute: the backward pass's
// solve with the same matrices then neither repacks nor refactors them.
std::vector<torch::Tensor> factor_solve(torch::Tensor k, torch::Tensor r, bool keep_factor) {
  check(k, 3, "K");
  check(r, 3, "r");
  const int64_t s = k.size(0), n = k.size(1), m = r.size(2), size = n * (n + 1) / 2;
  TORCH_CHECK(k.size(2) == n && r.size(0) == s && r.size(1) == n, "spd_cpu: K [S, n, n] and r [S, n, m] disagree");
  const int64_t groups = (s + LANES - 1) / LANES;
  auto x = torch::empty_like(r);
  auto info = torch::zeros({s}, k.options().dtype(torch::kInt32));
  auto packed = torch::empty({keep_factor ? groups : 0, size, LANES}, k.options());
  const float *K = k.data_ptr<float>(), *R = r.data_ptr<float>();
  float* X = x.data_ptr<float>();
  vec* P = keep_factor ? reinterpret_cast<vec*>(packed.data_ptr<float>()) : nullptr;
  int32_t* INFO = info.data_ptr<int32_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    const FlushDenormals flush;  // denormals cost a microcode assist each: flush_denormals.h
    std::vector<vec> own(P ? 0 : size), inv(n), y(n * m);
    for (int64_t g = begin; g < end; ++g) {
      const int64_t s0 = g * LANES, count = std::min(LANES, s - s0);
      vec* a = P ? P + g * size : own.data();
      int32_t lane_info[LANES] = {};
      load_lower(K + s0 * n * n, n, count, a);
      factor(a, inv.data(), n, lane_info);
      load_rhs(R + s0 * n * m, n, m, count, y.data());
      substitute(a, inv.data(), n, m, y.data());
      store_solution(y.data(), n, m, count, X + s0 * n * m);
      for (int64_t l = 0; l < count; ++l) INFO[s0 + l] = lane_info[l];
    }
  });
  return {x, info, packed};
}

// x = K^-1 r from the packed factors factor_solve kept ([ceil(S / 8), n (n + 1) / 2, 8]) and
// r [S, n, m] -> x [S, n, m].
torch::Tensor factor_substitute(torch::Tensor packed, torch::Tensor r) {
  check(packed, 3, "the packed factors");
  check(r, 3, "r");
  const int64_t s = r.size(0), n = r.size(1), m = r.size(2), size = n * (n + 1) / 2;
  const int64_t groups = (s + LANES - 1) / LANES;
  TORCH_CHECK(packed.size(0) == groups && packed.size(1) == size && packed.size(2) == LANES,
              "spd_cpu: the packed factors do not match r [S, n, m]");
  TORCH_CHECK(reinterpret_cast<std::uintptr_t>(packed.data_ptr<float>()) % alignof(vec) == 0,
              "spd_cpu: the packed factors must be factor_solve's own tensor (aligned to its vectors)");
  auto x = torch::empty_like(r);
  const vec* P = reinterpret_cast<const vec*>(packed.data_ptr<float>());
  const float* R = r.data_ptr<float>();
  float* X = x.data_ptr<float>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    const FlushDenormals flush;  // denormals cost a microcode assist each: flush_denormals.h
    std::vector<vec> inv(n), y(n * m);
    for (int64_t g = begin; g < end; ++g) {
      const int64_t s0 = g * LANES, count = std::min(LANES, s - s0);
      const vec* a = P + g * size;
      for (int64_t i = 0; i < n; ++i) inv[i] = 1.f / a[tri(i, i)];
      load_rhs(R + s0 * n * m, n, m, count, y.data());
      substitute(a, inv.data(), n, m, y.data());
      store_solution(y.data(), n, m, count, X + s0 * n * m);
    }
  });
  return x;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("factor_solve", &factor_solve, "Cholesky factor and solve of many small SPD systems (CPU, float32)");
  m.def("factor_substitute", &factor_substitute, "solve of many small SPD systems from their packed factors (CPU, float32)");
}
