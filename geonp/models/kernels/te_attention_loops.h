// The inner loops of the fused TE attention kernel (te_attention_cpu.cpp, which includes this
// file once): a layer of the pair MLPs on one tile of keys, the q.k dot products, the value sum,
// row reductions and the weight-gradient sums of the backward pass (the exp is fast_exp.h's). Where the
// compiler targets AVX2 and FMA the four hottest are written in intrinsics (see the kernel's
// header comment); the plain loops serve every other CPU.
#pragma once

#include <torch/extension.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "fast_exp.h"

namespace {

constexpr int64_t KT = 16;  // keys per tile
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// out[i][t] = act(bias[i] + add[i][t] + sum_j w[i][j] in[j][t]) for one tile of KT keys, four
// output rows at a time so that each loaded input row feeds four accumulators held in
// registers. Tiles are rows of KT floats with the given row strides; bias and add may be null.
// With AVX2 and FMA the sums are written with intrinsics: left to itself the compiler kept
// half the accumulators on the stack and stored the outputs one float at a time.
#if defined(__AVX2__) && defined(__FMA__) && defined(GEONP_AVX512)
// On a CPU with AVX-512 (cpu_build.py defines GEONP_AVX512 there) the two hottest loops also have
// 16-float versions, compiled for AVX-512 by a target attribute while the rest of the kernel keeps
// its AVX2 code. On the Intel Xeon measured (2 cores) the kernel's forward passes took 2.3-2.6 ms
// against 2.7-2.9 ms, and the demo's te-pt-tnp fill 21.4-24.9 s against 23.7-24.5 s (inside the
// spread of such runs); other CPUs with AVX-512 (one 512-bit FMA unit, or Zen 4's two halves) are
// not measured. Each sum takes its terms in the AVX2 version's order: the same floats, bit for bit
// (tests compare the two builds).
#define GEONP_512 __attribute__((target("avx512f")))
#endif

#if defined(__AVX2__) && defined(__FMA__)
static_assert(KT == 16, "tile_layer's AVX2 path holds a tile in two 8-float registers");
inline __m256 tile_start(const float* bias, const float* add, int64_t row, int64_t add_stride, int half) {
  __m256 acc = bias ? _mm256_set1_ps(bias[row]) : _mm256_setzero_ps();
  return add ? _mm256_add_ps(acc, _mm256_loadu_ps(add + row * add_stride + 8 * half)) : acc;
}
inline void tile_store(float* out, __m256 acc, bool relu) {
  _mm256_storeu_ps(out, relu ? _mm256_max_ps(acc, _mm256_setzero_ps()) : acc);
}
#ifdef GEONP_512
// tile_layer with a tile in one 16-float register, eight output rows per loaded input row.
GEONP_512 inline __m512 tile_start16(const float* bias, const float* add, int64_t row, int64_t add_stride) {
  const __m512 acc = bias ? _mm512_set1_ps(bias[row]) : _mm512_setzero_ps();
  return add ? _mm512_add_ps(acc, _mm512_loadu_ps(add + row * add_stride)) : acc;
}
GEONP_512 inline void tile_store16(float* out, __m512 acc, bool relu) {
  _mm512_storeu_ps(out, relu ? _mm512_max_ps(acc, _mm512_setzero_ps()) : acc);
}
GEONP_512 void tile_layer(const float* w, const float* bias, const float* in, int64_t in_stride, const float* add,
                          int64_t add_stride, float* out, int64_t out_stride, int64_t rows, int64_t cols, bool relu) {
  int64_t i = 0;
  for (; i + 8 <= rows; i += 8) {
    __m512 acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = tile_start16(bias, add, i + r, add_stride);
    const float* wi = w + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const __m512 x = _mm512_loadu_ps(in + j * in_stride);
      for (int r = 0; r < 8; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(wi[r * cols + j]), x, acc[r]);
    }
    for (int r = 0; r < 8; ++r) tile_store16(out + (i + r) * out_stride, acc[r], relu);
  }
  for (; i < rows; ++i) {
    __m512 acc = tile_start16(bias, add, i, add_stride);
    for (int64_t j = 0; j < cols; ++j)
      acc = _mm512_fmadd_ps(_mm512_set1_ps(w[i * cols + j]), _mm512_loadu_ps(in + j * in_stride), acc);
    tile_store16(out + i * out_stride, acc, relu);
  }
}
#else
void tile_layer(const float* w, const float* bias, const float* in, int64_t in_stride, const float* add,
                int64_t add_stride, float* out, int64_t out_stride, int64_t rows, int64_t cols, bool relu) {
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    __m256 a0 = tile_start(bias, add, i, add_stride, 0), b0 = tile_start(bias, add, i, add_stride, 1);
    __m256 a1 = tile_start(bias, add, i + 1, add_stride, 0), b1 = tile_start(bias, add, i + 1, add_stride, 1);
    __m256 a2 = tile_start(bias, add, i + 2, add_stride, 0), b2 = tile_start(bias, add, i + 2, add_stride, 1);
    __m256 a3 = tile_start(bias, add, i + 3, add_stride, 0), b3 = tile_start(bias, add, i + 3, add_stride, 1);
    const float *w0 = w + i * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
    for (int64_t j = 0; j < cols; ++j) {
      const __m256 x0 = _mm256_loadu_ps(in + j * in_stride), x1 = _mm256_loadu_ps(in + j * in_stride + 8);
      __m256 c = _mm256_broadcast_ss(w0 + j);
      a0 = _mm256_fmadd_ps(c, x0, a0); b0 = _mm256_fmadd_ps(c, x1, b0);
      c = _mm256_broadcast_ss(w1 + j);
      a1 = _mm256_fmadd_ps(c, x0, a1); b1 = _mm256_fmadd_ps(c, x1, b1);
      c = _mm256_broadcast_ss(w2 + j);
      a2 = _mm256_fmadd_ps(c, x0, a2); b2 = _mm256_fmadd_ps(c, x1, b2);
      c = _mm256_broadcast_ss(w3 + j);
      a3 = _mm256_fmadd_ps(c, x0, a3); b3 = _mm256_fmadd_ps(c, x1, b3);
    }
    float* o = out + i * out_stride;
    tile_store(o, a0, relu); tile_store(o + 8, b0, relu); o += out_stride;
    tile_store(o, a1, relu); tile_store(o + 8, b1, relu); o += out_stride;
    tile_store(o, a2, relu); tile_store(o + 8, b2, relu); o += out_stride;
    tile_store(o, a3, relu); tile_store(o + 8, b3, relu);
  }
  for (; i < rows; ++i) {
    __m256 a = tile_start(bias, add, i, add_stride, 0), b = tile_start(bias, add, i, add_stride, 1);
    for (int64_t j = 0; j < cols; ++j) {
      const __m256 c = _mm256_broadcast_ss(w + i * cols + j);
      a = _mm256_fmadd_ps(c, _mm256_loadu_ps(in + j * in_stride), a);
      b = _mm256_fmadd_ps(c, _mm256_loadu_ps(in + j * in_stride + 8), b);
    }
    tile_store(out + i * out_stride, a, relu);
    tile_store(out + i * out_stride + 8, b, relu);
  }
}
#endif  // GEONP_512
#else
void tile_layer(const float* w, const float* bias, const float* in, int64_t in_stride, const float* add,
                int64_t add_stride, float* out, int64_t out_stride, int64_t rows, int64_t cols, bool relu) {
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    float acc[4][KT];
    for (int r = 0; r < 4; ++r)
      for (int64_t t = 0; t < KT; ++t)
        acc[r][t] = (bias ? bias[i + r] : 0.f) + (add ? add[(i + r) * add_stride + t] : 0.f);
    for (int64_t j = 0; j < cols; ++j) {
      const float* x = in + j * in_stride;
      const float w0 = w[(i + 0) * cols + j], w1 = w[(i + 1) * cols + j];
      const float w2 = w[(i + 2) * cols + j], w3 = w[(i + 3) * cols + j];
      for (int64_t t = 0; t < KT; ++t) {
        acc[0][t] += w0 * x[t]; acc[1][t] += w1 * x[t];
        acc[2][t] += w2 * x[t]; acc[3][t] += w3 * x[t];
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int64_t t = 0; t < KT; ++t) out[(i + r) * out_stride + t] = relu ? std::max(acc[r][t], 0.f) : acc[r][t];
  }
  for (; i < rows; ++i) {
    float acc[KT];
    for (int64_t t = 0; t < KT; ++t) acc[t] = (bias ? bias[i] : 0.f) + (add ? add[i * add_stride + t] : 0.f);
    for (int64_t j = 0; j < cols; ++j) {
      const float wv = w[i * cols + j];
      const float* x = in + j * in_stride;
      for (int64_t t = 0; t < KT; ++t) acc[t] += wv * x[t];
    }
    for (int64_t t = 0; t < KT; ++t) out[i * out_stride + t] = relu ? std::max(acc[t], 0.f) : acc[t];
  }
}

#endif

// out[t] = sum_e q[e] k[e][t] for one tile of KT keys (k rows of stride k_stride): the
// scaled dot products of one query with a tile of keys, for one head.
void tile_dots(const float* __restrict q, const float* __restrict k, int64_t k_stride, int64_t dh,
               float* __restrict out) {
#if defined(__AVX2__) && defined(__FMA__)
  // Two sums per half tile, even and odd e: one chain of dh dependent FMAs would wait on each.
  __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
  int64_t e = 0;
  for (; e + 2 <= dh; e += 2) {
    const __m256 q0 = _mm256_set1_ps(q[e]), q1 = _mm256_set1_ps(q[e + 1]);
    const float *k0 = k + e * k_stride, *k1 = k0 + k_stride;
    lo0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k0), lo0); hi0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k0 + 8), hi0);
    lo1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(k1), lo1); hi1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(k1 + 8), hi1);
  }
  if (e < dh) {
    const __m256 q0 = _mm256_set1_ps(q[e]);
    lo0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k + e * k_stride), lo0);
    hi0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k + e * k_stride + 8), hi0);
  }
  _mm256_storeu_ps(out, _mm256_add_ps(lo0, lo1));
  _mm256_storeu_ps(out + 8, _mm256_add_ps(hi0, hi1));
#else
  float acc[KT] = {};
  for (int64_t e = 0; e < dh; ++e) {
    const float qe = q[e];
    const float* __restrict ke = k + e * k_stride;
    for (int64_t t = 0; t < KT; ++t) acc[t] += qe * ke[t];
  }
  for (int64_t t = 0; t < KT; ++t) out[t] = acc[t];
#endif
}

// out[e] = sum_m w[m] v[m][e] over m < last (v rows of length dh), eight columns at a time with
// the sums in registers (accumulating into out itself would store and reload it for every m).
void weighted_sum(const float* __restrict w, const float* __restrict v, int64_t last, int64_t dh,
                  float* __restrict out) {
  int64_t e0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
  // Sixteen columns at a time, even and odd keys in separate sums (four independent chains).
  for (; e0 + 16 <= dh; e0 += 16) {
    __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
    int64_t m = 0;
    for (; m + 2 <= last; m += 2) {
      const __m256 w0 = _mm256_set1_ps(w[m]), w1 = _mm256_set1_ps(w[m + 1]);
      const float *v0 = v + m * dh + e0, *v1 = v0 + dh;
      lo0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0), lo0); hi0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 8), hi0);
      lo1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1), lo1); hi1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + 8), hi1);
    }
    if (m < last) {
      const __m256 w0 = _mm256_set1_ps(w[m]);
      lo0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v + m * dh + e0), lo0);
      hi0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v + m * dh + e0 + 8), hi0);
    }
    _mm256_storeu_ps(out + e0, _mm256_add_ps(lo0, lo1));
    _mm256_storeu_ps(out + e0 + 8, _mm256_add_ps(hi0, hi1));
  }
#endif
  for (; e0 + 8 <= dh; e0 += 8) {
    float acc[8] = {};
    for (int64_t m = 0; m < last; ++m)
      for (int l = 0; l < 8; ++l) acc[l] += w[m] * v[m * dh + e0 + l];
    for (int l = 0; l < 8; ++l) out[e0 + l] = acc[l];
  }
  for (; e0 < dh; ++e0) {
    float acc = 0.f;
    for (int64_t m = 0; m < last; ++m) acc += w[m] * v[m * dh + e0];
    out[e0] = acc;
  }
}

// The layer y = x W^T on rows of n keys (x [cols][n], y [rows][n], both with stride n):
// tile_layer over the row's tiles, then back through a ReLU whose output was act (if given).
void row_layer(const float* w, const float* x, float* y, const float* act, int64_t rows, int64_t cols, int64_t n,
               int64_t last) {
  for (int64_t m0 = 0; m0 < last; m0 += KT) tile_layer(w, nullptr, x + m0, n, nullptr, 0, y + m0, n, rows, cols, false);
  if (act)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t m = 0; m < last; ++m) y[i * n + m] = act[i * n + m] > 0.f ? y[i * n + m] : 0.f;
}

// max_m x[m] over m < last (a multiple of 8), in eight lanes so that it vectorises.
float row_max(const float* x, int64_t last) {
  float acc[8];
  std::fill(acc, acc + 8, NEG_INF);
  for (int64_t m = 0; m < last; m += 8)
    for (int l = 0; l < 8; ++l) acc[l] = std::max(acc[l], x[m + l]);
  return *std::max_element(acc, acc + 8);
}

// sum_m x[m] y[m] over m < last (a multiple of 8), in eight lanes so that it vectorises.
float row_dot(const float* x, const float* y, int64_t last) {
  float acc[8] = {};
  for (int64_t m = 0; m < last; m += 8)
    for (int l = 0; l < 8; ++l) acc[l] += x[m + l] * y[m + l];
  float s = 0.f;
  for (int l = 0; l < 8; ++l) s += acc[l];
  return s;
}

float row_sum(const float* x, int64_t last) {
  float acc[8] = {};
  for (int64_t m = 0; m < last; m += 8)
    for (int l = 0; l < 8; ++l) acc[l] += x[m + l];
  float s = 0.f;
  for (int l = 0; l < 8; ++l) s += acc[l];
  return s;
}

// g[rows][cols] += a[:, :last] b[:, :last]^T for rows of stride n: a weight gradient summed over
// a query row's keys. Two rows of a by four of b at a time, eight-key partial sums in registers
// (with AVX2, in intrinsics: the compiler's version kept most of them on the stack).
#if defined(__AVX2__) && defined(__FMA__)
inline float lane_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif
#ifdef GEONP_512
// Rows i and i + 1 of a, eight keys each, side by side in one register: each half sums as the
// AVX2 loop's eight lanes do, and is reduced by the same lane_sum.
GEONP_512 inline __m512 two_rows(const float* lo, const float* hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(lo))),
                                             _mm256_castps_pd(_mm256_loadu_ps(hi)), 1));
}
GEONP_512 inline __m512 twice(const float* x) {  // eight floats in both halves
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(reinterpret_cast<const double*>(x))));
}
GEONP_512 inline void add_halves(__m512 s, float* lo, float* hi) {
  *lo += lane_sum(_mm512_castps512_ps256(s));
  *hi += lane_sum(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
}
// g[i..i+4][j..j+4] for rows of a in fours and columns in fours: the AVX-512 part of outer_rows;
// returns the rows done (their columns left over are outer_rows' to sum, in AVX2 code: row_dot
// compiled for AVX-512 took its terms in another order).
GEONP_512 int64_t outer_rows16(const float* a, const float* b, int64_t rows, int64_t cols, int64_t n, int64_t last,
                               float* g) {
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    const float *a0 = a + i * n, *a1 = a0 + n, *a2 = a1 + n, *a3 = a2 + n;
    for (int64_t j = 0; j + 4 <= cols; j += 4) {
      const float *b0 = b + j * n, *b1 = b0 + n, *b2 = b1 + n, *b3 = b2 + n;
      __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0, t2 = s0, t3 = s0;
      for (int64_t m = 0; m < last; m += 8) {
        const __m512 x01 = two_rows(a0 + m, a1 + m), x23 = two_rows(a2 + m, a3 + m);
        __m512 y = twice(b0 + m);
        s0 = _mm512_fmadd_ps(x01, y, s0); t0 = _mm512_fmadd_ps(x23, y, t0);
        y = twice(b1 + m);
        s1 = _mm512_fmadd_ps(x01, y, s1); t1 = _mm512_fmadd_ps(x23, y, t1);
        y = twice(b2 + m);
        s2 = _mm512_fmadd_ps(x01, y, s2); t2 = _mm512_fmadd_ps(x23, y, t2);
        y = twice(b3 + m);
        s3 = _mm512_fmadd_ps(x01, y, s3); t3 = _mm512_fmadd_ps(x23, y, t3);
      }
      float* g0 = g + i * cols + j;
      add_halves(s0, g0, g0 + cols); add_halves(s1, g0 + 1, g0 + cols + 1);
      add_halves(s2, g0 + 2, g0 + cols + 2); add_halves(s3, g0 + 3, g0 + cols + 3);
      g0 += 2 * cols;
      add_halves(t0, g0, g0 + cols); add_halves(t1, g0 + 1, g0 + cols + 1);
      add_halves(t2, g0 + 2, g0 + cols + 2); add_halves(t3, g0 + 3, g0 + cols + 3);
    }
  }
  return i;
}
#endif
void outer_rows(const float* a, const float* b, int64_t rows, int64_t cols, int64_t n, int64_t last, float* g) {
  int64_t i = 0;
#ifdef GEONP_512
  i = outer_rows16(a, b, rows, cols, n, last, g);
  for (int64_t r = 0; r < i; ++r)
    for (int64_t j = cols / 4 * 4; j < cols; ++j) g[r * cols + j] += row_dot(a + r * n, b + j * n, last);
#endif
  for (; i + 2 <= rows; i += 2) {
    int64_t j = 0;
    for (; j + 4 <= cols; j += 4) {
#if defined(__AVX2__) && defined(__FMA__)
      const float *a0 = a + i * n, *a1 = a0 + n, *b0 = b + j * n, *b1 = b0 + n, *b2 = b1 + n, *b3 = b2 + n;
      __m256 s00 = _mm256_setzero_ps(), s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00, s12 = s00, s13 = s00;
      for (int64_t m = 0; m < last; m += 8) {
        const __m256 x0 = _mm256_loadu_ps(a0 + m), x1 = _mm256_loadu_ps(a1 + m);
        __m256 y = _mm256_loadu_ps(b0 + m);
        s00 = _mm256_fmadd_ps(x0, y, s00); s10 = _mm256_fmadd_ps(x1, y, s10);
        y = _mm256_loadu_ps(b1 + m);
        s01 = _mm256_fmadd_ps(x0, y, s01); s11 = _mm256_fmadd_ps(x1, y, s11);
        y = _mm256_loadu_ps(b2 + m);
        s02 = _mm256_fmadd_ps(x0, y, s02); s12 = _mm256_fmadd_ps(x1, y, s12);
        y = _mm256_loadu_ps(b3 + m);
        s03 = _mm256_fmadd_ps(x0, y, s03); s13 = _mm256_fmadd_ps(x1, y, s13);
      }
      float* g0 = g + i * cols + j;
      float* g1 = g0 + cols;
      g0[0] += lane_sum(s00); g0[1] += lane_sum(s01); g0[2] += lane_sum(s02); g0[3] += lane_sum(s03);
      g1[0] += lane_sum(s10); g1[1] += lane_sum(s11); g1[2] += lane_sum(s12); g1[3] += lane_sum(s13);
#else
      float acc[2][4][8] = {};
      for (int64_t m = 0; m < last; m += 8)
        for (int r = 0; r < 2; ++r)
          for (int c = 0; c < 4; ++c)
            for (int l = 0; l < 8; ++l) acc[r][c][l] += a[(i + r) * n + m + l] * b[(j + c) * n + m + l];
      for (int r = 0; r < 2; ++r)
        for (int c = 0; c < 4; ++c)
          for (int l = 0; l < 8; ++l) g[(i + r) * cols + j + c] += acc[r][c][l];
#endif
    }
    for (; j < cols; ++j)
      for (int r = 0; r < 2; ++r) g[(i + r) * cols + j] += row_dot(a + (i + r) * n, b + j * n, last);
  }
  for (; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) g[i * cols + j] += row_dot(a + i * n, b + j * n, last);
}

// Contiguous [cols, rows] copy of a [rows, cols] matrix: the transposed layers of the backward.
std::vector<float> transposed(const float* w, int64_t rows, int64_t cols) {
  std::vector<float> out(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[j * rows + i] = w[i * cols + j];
  return out;
}

}  // namespace
