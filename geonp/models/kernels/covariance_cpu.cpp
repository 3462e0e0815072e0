// The local kriging head's neighbour covariance matrices on the CPU, forward and backward: each
// target's K x K matrix built in one pass over its entries, and its gradient in another, where
// PyTorch's chain of elementwise steps (distances, correlation, masks, sill, diagonal) streamed
// the [S, K, K] tensor through memory about ten times each way. Same function as
// geonp/models/kriging_linalg.py's NeighbourCovariance (which has the formulas and calls this
// where it is built); its sums are taken in another order and the correlation's exp is
// fast_exp.h's, so values agree with PyTorch's to rounding, not to the bit.
//
// Shapes: S systems (targets), K neighbours, D location size. Inputs, all contiguous float32:
// scaled [S, K, D] (neighbour offsets in lengthscales), sill [S], nugget [S], ok [S, K] (1
// present, 0 absent); ``family`` 0 gaussian, 1 exponential, 2 matern32.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fast_exp.h"
#include "flush_denormals.h"

namespace {

constexpr float JITTER = 1e-4f;      // kriging_linalg.JITTER
constexpr float EPS = 1e-12f;        // kriging_linalg.correlation's epsilon under the square root
constexpr float SQRT3 = 1.7320508f;

// One system's offsets transposed to [D][K], so that a row's loop over neighbours j is contiguous,
// and their squared norms [K].
void transpose(const float* s, int64_t k, int64_t d, float* st, float* norm) {
  for (int64_t j = 0; j < k; ++j) {
    norm[j] = 0.f;
    for (int64_t e = 0; e < d; ++e) {
      st[e * k + j] = s[j * d + e];
      norm[j] += s[j * d + e] * s[j * d + e];
    }
  }
}

// Row i of one system: d2[j] = |s_i - s_j|^2 and corr[j] (masked by ok_i ok_j) for j < K. The
// squared distance is taken as |s_i|^2 + |s_j|^2 - 2 s_i.s_j and clamped at 0, as the PyTorch path
// takes it (``norm`` holds |s_j|^2): the correlations the network was trained with, whose
// rounding near distance 0 the exponential family's square root magnifies (differences taken
// directly put the diagonal's correlation at 1 exactly: entries up to 1.5e-3 off the chain's
// with sills of 0.5-1.5, the exponential family, three offsets per neighbour).
inline void row(const float* st, const float* norm, const float* ok, int64_t i, int64_t k, int64_t d, int family,
                float* d2, float* corr) {
  for (int64_t j = 0; j < k; ++j) d2[j] = 0.f;
  for (int64_t e = 0; e < d; ++e) {
    const float si = st[e * k + i];
    const float* se = st + e * k;
    for (int64_t j = 0; j < k; ++j) d2[j] += si * se[j];
  }
  for (int64_t j = 0; j < k; ++j) d2[j] = std::max(norm[i] + norm[j] - 2.f * d2[j], 0.f);
  const float oi = ok[i];
  for (int64_t j = 0; j < k; ++j) {
    float c;
    if (family == 0) {
      c = exp_nonpositive(-0.5f * d2[j]);
    } else {
      const float r = std::sqrt(d2[j] + EPS);
      c = family == 1 ? exp_nonpositive(-r) : (1.f + SQRT3 * r) * exp_nonpositive(-SQRT3 * r);
    }
    corr[j] = c * oi * ok[j];
  }
}

// sum_j x[j] y[j] in eight lanes, so that it vectorises (a single sum would keep the loop scalar).
inline float lanes_dot(const float* x, const float* y, int64_t n) {
  float acc[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) acc[l] += x[j + l] * y[j + l];
  float total = 0.f;
  for (; j < n; ++j) total += x[j] * y[j];
  for (int l = 0; l < 8; ++l) total += acc[l];
  return total;
}

void check(const torch::Tensor& t, int64_t dims, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.dim() == dims,
              "covariance_cpu: ", name, " must be a contiguous float32 CPU tensor of ", dims, " dimensions");
}

}  // namespace

// k [S, K, K]: sill * corr(|s_i - s_j|^2) between present neighbours, nugget + jitter added on
// their diagonal, 1 on an absent neighbour's diagonal and no tie to it.
torch::Tensor covariance_forward(torch::Tensor scaled, torch::Tensor sill, torch::Tensor nugget, torch::Tensor ok,
                                 int64_t family) {
  check(scaled, 3, "scaled"); check(sill, 1, "sill"); check(nugget, 1, "nugget"); check(ok, 2, "ok");
  const int64_t s = scaled.size(0), k = scaled.size(1), d = scaled.size(2);
  TORCH_CHECK(sill.size(0) == s && nugget.size(0) == s && ok.size(0) == s && ok.size(1) == k,
              "covariance_cpu: sill, nugget [S] and ok [S, K] must match scaled [S, K, D]");
  TORCH_CHECK(family >= 0 && family <= 2, "covariance_cpu: family must be 0, 1 or 2, got ", family);
  auto out = torch::empty({s, k, k}, scaled.options());
  const float *SC = scaled.data_ptr<float>(), *SILL = sill.data_ptr<float>(), *NUG = nugget.data_ptr<float>();
  const float* OK = ok.data_ptr<float>();
  float* OUT = out.data_ptr<float>();
  at::parallel_for(0, s, 16, [&](int64_t begin, int64_t end) {
    const FlushDenormals flush;  // denormals cost a microcode assist each: flush_denormals.h
    std::vector<float> st(d * k), norm(k), d2(k);
    for (int64_t t = begin; t < end; ++t) {
      transpose(SC + t * k * d, k, d, st.data(), norm.data());
      const float* okt = OK + t * k;
      for (int64_t i = 0; i < k; ++i) {
        float* ki = OUT + (t * k + i) * k;
        row(st.data(), norm.data(), okt, i, k, d, static_cast<int>(family), d2.data(), ki);
        for (int64_t j = 0; j < k; ++j) ki[j] *= SILL[t];
        ki[i] += (NUG[t] + JITTER) * okt[i] + (1.f - okt[i]);
      }
    }
  });
  return out;
}

// Gradients (scaled [S, K, D], sill [S], nugget [S]) of covariance_forward given g [S, K, K]:
// d2_ij depends on s_i and s_j alike, so d/ds_a sum_ij g_ij corr(d2_ij) = 2 sum_j (g_aj + g_ja)
// corr'(d2_aj) (s_a - s_j); the diagonal's d2 is 0 whatever s_a and sends nothing.
std::vector<torch::Tensor> covariance_backward(torch::Tensor g, torch::Tensor scaled, torch::Tensor sill,
                                               torch::Tensor ok, int64_t family) {
  check(g, 3, "g"); check(scaled, 3, "scaled"); check(sill, 1, "sill"); check(ok, 2, "ok");
  const int64_t s = scaled.size(0), k = scaled.size(1), d = scaled.size(2);
  TORCH_CHECK(g.size(0) == s && g.size(1) == k && g.size(2) == k && sill.size(0) == s && ok.size(0) == s &&
              ok.size(1) == k, "covariance_cpu: g [S, K, K], sill [S] and ok [S, K] must match scaled [S, K, D]");
  TORCH_CHECK(family >= 0 && family <= 2, "covariance_cpu: family must be 0, 1 or 2, got ", family);
  auto g_scaled = torch::empty_like(scaled);
  auto g_sill = torch::empty_like(sill);
  auto g_nugget = torch::empty_like(sill);
  const float *G = g.data_ptr<float>(), *SC = scaled.data_ptr<float>(), *SILL = sill.data_ptr<float>();
  const float* OK = ok.data_ptr<float>();
  float *GS = g_scaled.data_ptr<float>(), *GSILL = g_sill.data_ptr<float>(), *GNUG = g_nugget.data_ptr<float>();
  at::parallel_for(0, s, 16, [&](int64_t begin, int64_t end) {
    const FlushDenormals flush;  // denormals cost a microcode assist each: flush_denormals.h
    std::vector<float> st(d * k), norm(k), d2(k), corr(k), both(k), ones(k, 1.f);
    for (int64_t t = begin; t < end; ++t) {
      transpose(SC + t * k * d, k, d, st.data(), norm.data());
      const float* okt = OK + t * k;
      const float* gt = G + t * k * k;
      float gs = 0.f, gn = 0.f;
      for (int64_t i = 0; i < k; ++i) {
        row(st.data(), norm.data(), okt, i, k, d, static_cast<int>(family), d2.data(), corr.data());
        const float* gi = gt + i * k;
        gs += lanes_dot(gi, corr.data(), k);
        gn += gi[i] * okt[i];
        // (g_ij + g_ji) corr'(d2_ij) sill: corr' from corr (and d), as _correlation_slope has it.
        for (int64_t j = 0; j < k; ++j) {
          float slope;
          if (family == 0) {
            slope = -0.5f * corr[j];
          } else {
            const float r = std::sqrt(d2[j] + EPS);
            slope = family == 1 ? -0.5f * corr[j] / r : -1.5f * corr[j] / (1.f + SQRT3 * r);
          }
          both[j] = (gi[j] + gt[j * k + i]) * slope * SILL[t];
        }
        both[i] = 0.f;
        // sum_j both_j (s_i - s_j) = s_i sum_j both_j - sum_j both_j s_j
        const float total = lanes_dot(both.data(), ones.data(), k);
        for (int64_t e = 0; e < d; ++e)
          GS[(t * k + i) * d + e] = 2.f * (st[e * k + i] * total - lanes_dot(both.data(), st.data() + e * k, k));
      }
      GSILL[t] = gs;
      GNUG[t] = gn;
    }
  });
  return {g_scaled, g_sill, g_nugget};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &covariance_forward, "the kriging head's neighbour covariances (CPU, float32)");
  m.def("backward", &covariance_backward, "their gradients (CPU, float32)");
}
