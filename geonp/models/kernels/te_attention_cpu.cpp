// Fused translation-equivariant attention on the CPU, forward and backward. One pass over
// (query, key) pairs evaluates the logit MLP rho, the distance prior, the softmax, the value
// sum and the location-update MLP phi per pair, without ever materialising a
// [B, Nq, Nk, hidden] tensor. Same function as TEAttention's fast path
// (geonp/models/te_attention.py, which has the equations); geonp/models/te_fused.py prepares
// the inputs and wraps both directions in one autograd Function.
//
// Within a query row, keys are taken in tiles of KT (the key axis is padded to a multiple in
// Python) so that the innermost loops run over the keys of a tile, contiguous in memory, and
// vectorise; key-major copies of k, the key location projections and the key locations are
// made once per call in Python. The backward pass recomputes each row's pair activations
// tile by tile instead of storing them (as FlashAttention does), so its memory is that of the
// forward pass.
//
// Shapes: B batch, H heads, Nq queries, Nk keys, Dh head size, Dx location size, J hidden
// width of rho and phi.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

namespace {

constexpr int64_t KT = 16;  // keys per tile
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// out[i][t] = act(bias[i] + add[i][t] + sum_j w[i][j] in[j][t]) for one tile of KT keys, four
// output rows at a time so that each loaded input row feeds four accumulators held in
// registers. Tiles are rows of KT floats with the given row strides; bias and add may be null.
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

// grad[i][t] *= (act[i][t] > 0): back through a ReLU whose output was act.
void relu_back(float* grad, const float* act, int64_t rows) {
  for (int64_t i = 0; i < rows * KT; ++i) grad[i] = act[i] > 0.f ? grad[i] : 0.f;
}

// A weight gradient sum_m a[i][m] b[j][m] over the keys of one query row: the tiles of a and b
// are gathered into rows of Nk and multiplied once per row, so that the sum over keys stays in
// registers instead of a [rows][cols] accumulator being read and written for every tile.
struct Outer {
  int64_t rows, cols, nk;
  std::vector<float> a, b;  // [rows][nk], [cols][nk]
  Outer(int64_t rows, int64_t cols, int64_t nk) : rows(rows), cols(cols), nk(nk), a(rows * nk), b(cols * nk) {}
  void put(int64_t m0, const float* ta, int64_t a_stride, const float* tb, int64_t b_stride) {
    for (int64_t i = 0; i < rows; ++i) std::copy(ta + i * a_stride, ta + i * a_stride + KT, a.data() + i * nk + m0);
    for (int64_t j = 0; j < cols; ++j) std::copy(tb + j * b_stride, tb + j * b_stride + KT, b.data() + j * nk + m0);
  }
  // g[rows][cols] += a[:, :last] b[:, :last]^T, two rows of a by four of b at a time with
  // eight-key partial sums in registers, reduced once per row (last is a multiple of KT).
  void flush(int64_t last, float* g) const {
    int64_t i = 0;
    for (; i + 2 <= rows; i += 2) {
      int64_t j = 0;
      for (; j + 4 <= cols; j += 4) {
        float acc[2][4][8] = {};
        for (int64_t m = 0; m < last; m += 8)
          for (int r = 0; r < 2; ++r)
            for (int c = 0; c < 4; ++c)
              for (int l = 0; l < 8; ++l) acc[r][c][l] += a[(i + r) * nk + m + l] * b[(j + c) * nk + m + l];
        for (int r = 0; r < 2; ++r)
          for (int c = 0; c < 4; ++c)
            for (int l = 0; l < 8; ++l) g[(i + r) * cols + j + c] += acc[r][c][l];
      }
      for (; j < cols; ++j) dot_into(i, j, last, g), dot_into(i + 1, j, last, g);
    }
    for (; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) dot_into(i, j, last, g);
  }
  void dot_into(int64_t i, int64_t j, int64_t last, float* g) const {
    float acc[8] = {};
    for (int64_t m = 0; m < last; m += 8)
      for (int l = 0; l < 8; ++l) acc[l] += a[i * nk + m + l] * b[j * nk + m + l];
    for (int l = 0; l < 8; ++l) g[i * cols + j] += acc[l];
  }
};

// acc[i][t] += a[i][t]: a bias gradient summed over keys later.
void rows_acc(float* acc, const float* a, int64_t a_stride, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t t = 0; t < KT; ++t) acc[i * KT + t] += a[i * a_stride + t];
}

// Contiguous [cols, rows] copy of a [rows, cols] matrix: the transposed layers of the backward.
std::vector<float> transposed(const float* w, int64_t rows, int64_t cols) {
  std::vector<float> out(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[j * rows + i] = w[i * cols + j];
  return out;
}

// The inputs of one call (see te_attention_forward for their layouts).
struct Args {
  int64_t B, H, Nq, Nk, Dh, Dx, J;
  const float *q, *kT, *v, *xq, *xkT, *mask, *pq, *npkT, *wd, *w2, *b2, *w3, *b3, *he;
  const float *v1, *c1, *v2, *c2, *v3;
  float c3;
  bool has_phi;
};

// Per-thread buffers of one query row.
struct Scratch {
  std::vector<float> alpha, dots, h1, h2, prior, w, zeros, dist2;
  Scratch(const Args& a)
      : alpha(a.H * a.Nk), dots(a.H * KT), h1(a.J * KT), h2(a.J * KT), prior(a.H * KT), w(KT),
        zeros(std::max(a.J, a.H), 0.f), dist2(KT) {}
};

// rho on one tile of keys m0..m0+KT for query (b, n): fills s.dist2, s.dots [H][KT],
// s.h1 and s.h2 [J][KT] (post-ReLU) and writes the logits (prior included, mask not) to
// logit: H rows of KT with the given row stride.
void rho_tile(const Args& a, int64_t b, int64_t n, int64_t m0, Scratch& s, float* logit, int64_t logit_stride) {
  const float* xqn = a.xq + (b * a.Nq + n) * a.Dx;
  std::fill(s.dist2.begin(), s.dist2.end(), 0.f);
  for (int64_t d = 0; d < a.Dx; ++d) {
    const float* xk = a.xkT + (b * a.Dx + d) * a.Nk + m0;
    for (int64_t t = 0; t < KT; ++t) { const float e = xqn[d] - xk[t]; s.dist2[t] += e * e; }
  }
  for (int64_t h = 0; h < a.H; ++h) {
    for (int64_t t = 0; t < KT; ++t) s.prior[h * KT + t] = -a.he[h] * s.dist2[t];
    tile_layer(a.q + ((b * a.H + h) * a.Nq + n) * a.Dh, nullptr, a.kT + (b * a.H + h) * a.Dh * a.Nk + m0, a.Nk,
               nullptr, 0, s.dots.data() + h * KT, KT, 1, a.Dh, false);  // q . k
  }
  // W_dots dots + (W_x xq + b1) - W_x xk, ReLU; W2 . + b2, ReLU; W3 . + b3 - prior
  tile_layer(a.wd, a.pq + (b * a.Nq + n) * a.J, s.dots.data(), KT, a.npkT + b * a.J * a.Nk + m0, a.Nk, s.h1.data(),
             KT, a.J, a.H, true);
  tile_layer(a.w2, a.b2, s.h1.data(), KT, nullptr, 0, s.h2.data(), KT, a.J, a.J, true);
  tile_layer(a.w3, a.b3, s.h2.data(), KT, s.prior.data(), KT, logit, logit_stride, a.H, a.J, false);
}

// The attention weights of query row (b, n) into s.alpha [H][Nk] (0 at absent keys); returns
// the end of the keys that matter (padding at the end of a task is skipped whole tiles at a time).
int64_t row_alpha(const Args& a, int64_t b, int64_t n, Scratch& s) {
  const float* mk = a.mask + b * a.Nk;
  int64_t last = a.Nk;
  while (last > 0 && mk[last - 1] == 0.f) --last;
  last = (last + KT - 1) / KT * KT;
  for (int64_t m0 = 0; m0 < last; m0 += KT) {
    rho_tile(a, b, n, m0, s, s.alpha.data() + m0, a.Nk);
    for (int64_t h = 0; h < a.H; ++h)
      for (int64_t t = 0; t < KT; ++t)
        if (mk[m0 + t] == 0.f) s.alpha[h * a.Nk + m0 + t] = NEG_INF;
  }
  for (int64_t h = 0; h < a.H; ++h) {
    float* lh = s.alpha.data() + h * a.Nk;
    float mx = NEG_INF;
    for (int64_t m = 0; m < last; ++m) mx = std::max(mx, lh[m]);
    if (!(mx > NEG_INF)) {  // no key present: no attention
      std::fill(lh, lh + last, 0.f);
      continue;
    }
    float sum = 0.f;
    for (int64_t m = 0; m < last; ++m) { lh[m] = std::exp(lh[m] - mx); sum += lh[m]; }
    const float inv = 1.f / sum;
    for (int64_t m = 0; m < last; ++m) lh[m] *= inv;
  }
  return last;
}

// phi on one tile: s.h1 = ReLU(V1 alpha + c1), s.h2 = ReLU(V2 s.h1 + c2), s.w = v3 . s.h2 + c3
// (phi's last layer summed over heads), times the mask.
void phi_tile(const Args& a, int64_t b, int64_t m0, Scratch& s) {
  tile_layer(a.v1, a.c1, s.alpha.data() + m0, a.Nk, nullptr, 0, s.h1.data(), KT, a.J, a.H, true);
  tile_layer(a.v2, a.c2, s.h1.data(), KT, nullptr, 0, s.h2.data(), KT, a.J, a.J, true);
  tile_layer(a.v3, &a.c3, s.h2.data(), KT, nullptr, 0, s.w.data(), KT, 1, a.J, false);
  const float* mk = a.mask + b * a.Nk + m0;
  for (int64_t t = 0; t < KT; ++t) s.w[t] *= mk[t];
}

float present(const Args& a, int64_t b) {
  float n = 0.f;
  for (int64_t m = 0; m < a.Nk; ++m) n += a.mask[b * a.Nk + m];
  return std::max(n, 1.f);
}

Args make_args(const std::vector<torch::Tensor>& t, bool has_phi) {
  Args a;
  a.B = t[0].size(0); a.H = t[0].size(1); a.Nq = t[0].size(2); a.Dh = t[0].size(3);
  a.Nk = t[1].size(3); a.Dx = t[3].size(2); a.J = t[9].size(0);
  TORCH_CHECK(a.Nk % KT == 0, "te_attention_cpu: keys must be padded to a multiple of ", KT);
  for (const auto& x : t) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "te_attention_cpu: every input must be a contiguous float32 CPU tensor");
  }
  const float** slots[] = {&a.q, &a.kT, &a.v, &a.xq, &a.xkT, &a.mask, &a.pq, &a.npkT, &a.wd, &a.w2, &a.b2,
                           &a.w3, &a.b3, &a.he, &a.v1, &a.c1, &a.v2, &a.c2, &a.v3};
  for (size_t i = 0; i < 19; ++i) *slots[i] = t[i].data_ptr<float>();
  a.c3 = t[19].data_ptr<float>()[0];
  a.has_phi = has_phi;
  return a;
}

}  // namespace

// Inputs, all contiguous float32: q [B,H,Nq,Dh] (already scaled by 1/sqrt(Dh)); kT [B,H,Dh,Nk];
// v [B,H,Nk,Dh]; xq [B,Nq,Dx]; xkT [B,Dx,Nk]; mask [B,Nk] (1 present, 0 absent); pq [B,Nq,J] =
// W_x xq + b1; npkT [B,J,Nk] = -W_x xk; wd [J,H] (rho's first layer on the dot products);
// w2 [J,J]; b2 [J]; w3 [H,J]; b3 [H]; he [H] = 0.5 / ell_h^2 (zeros without the distance
// prior); phi: v1 [J,H], c1 [J], v2 [J,J], c2 [J], v3 [J] (last layer summed over heads), c3 [1].
// Nk must be a multiple of KT (padded keys have mask 0). Returns out [B,H,Nq,Dh] and dx
// [B,Nq,Dx], the Eq. 10 update divided by the number of present keys (zeros without phi).
std::vector<torch::Tensor> te_attention_forward(std::vector<torch::Tensor> inputs, bool has_phi) {
  const Args a = make_args(inputs, has_phi);
  auto out = torch::zeros({a.B, a.H, a.Nq, a.Dh}, inputs[0].options());
  auto dx = torch::zeros({a.B, a.Nq, a.Dx}, inputs[0].options());
  float *OUT = out.data_ptr<float>(), *DX = dx.data_ptr<float>();
  at::parallel_for(0, a.B * a.Nq, 8, [&](int64_t begin, int64_t end) {
    Scratch s(a);
    std::vector<float> swx(a.Dx);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / a.Nq, n = row % a.Nq;
      const int64_t last = row_alpha(a, b, n, s);
      for (int64_t h = 0; h < a.H; ++h) {  // out = alpha v
        const float* ah = s.alpha.data() + h * a.Nk;
        const float* vh = a.v + (b * a.H + h) * a.Nk * a.Dh;
        float* o = OUT + ((b * a.H + h) * a.Nq + n) * a.Dh;
        for (int64_t m = 0; m < last; ++m)
          for (int64_t e = 0; e < a.Dh; ++e) o[e] += ah[m] * vh[m * a.Dh + e];
      }
      if (!a.has_phi) continue;
      // dx = (1/N) sum_m w_m (x_q - x_m) = (x_q sum_m w_m - sum_m w_m x_m) / N
      float sw = 0.f;
      std::fill(swx.begin(), swx.end(), 0.f);
      for (int64_t m0 = 0; m0 < last; m0 += KT) {
        phi_tile(a, b, m0, s);
        for (int64_t t = 0; t < KT; ++t) sw += s.w[t];
        for (int64_t d = 0; d < a.Dx; ++d) {
          const float* xk = a.xkT + (b * a.Dx + d) * a.Nk + m0;
          for (int64_t t = 0; t < KT; ++t) swx[d] += s.w[t] * xk[t];
        }
      }
      const float inv_n = 1.f / present(a, b);
      const float* xqn = a.xq + (b * a.Nq + n) * a.Dx;
      for (int64_t d = 0; d < a.Dx; ++d) DX[(b * a.Nq + n) * a.Dx + d] = (xqn[d] * sw - swx[d]) * inv_n;
    }
  });
  return {out, dx};
}

// Gradients of te_attention_forward with respect to its inputs 0-4 and 6-19 (all but the
// mask), in that order, given those of its outputs (g_out [B,H,Nq,Dh], g_dx [B,Nq,Dx]).
// Batches are split over threads, so the key-side gradients of a batch have one writer; the
// weight gradients are summed per thread and then across threads.
std::vector<torch::Tensor> te_attention_backward(std::vector<torch::Tensor> inputs, bool has_phi,
                                                 torch::Tensor g_out, torch::Tensor g_dx) {
  const Args a = make_args(inputs, has_phi);
  const int64_t H = a.H, J = a.J, Nk = a.Nk, Dh = a.Dh, Dx = a.Dx;
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (i != 5) grads.push_back(torch::zeros_like(inputs[i]));
  float *GQ = grads[0].data_ptr<float>(), *GKT = grads[1].data_ptr<float>(), *GV = grads[2].data_ptr<float>();
  float *GXQ = grads[3].data_ptr<float>(), *GXKT = grads[4].data_ptr<float>(), *GPQ = grads[5].data_ptr<float>();
  float* GNPKT = grads[6].data_ptr<float>();
  g_out = g_out.contiguous();
  g_dx = g_dx.contiguous();
  const float *GO = g_out.data_ptr<float>(), *GDX = g_dx.data_ptr<float>();
  const std::vector<float> wdT = transposed(a.wd, J, H), w2T = transposed(a.w2, J, J), w3T = transposed(a.w3, H, J);
  const std::vector<float> v1T = transposed(a.v1, J, H), v2T = transposed(a.v2, J, J);
  // Weight gradients in input order 8..19, per key of a tile until the end: [rows][cols][KT].
  const int64_t wsize[] = {J * H, J * J, J, H * J, H, H, J * H, J, J * J, J, J, 1};
  const bool by_gemm[] = {true, true, false, true, false, false, true, false, true, false, true, false};
  std::mutex lock;
  at::parallel_for(0, a.B, 1, [&](int64_t begin, int64_t end) {
    Scratch s(a);
    std::vector<std::vector<float>> acc;  // [rows][cols] for the GEMM'd weights, [rows][KT] for the rest
    for (size_t w = 0; w < 12; ++w) acc.emplace_back(wsize[w] * (by_gemm[w] ? 1 : KT), 0.f);
    Outer o_wd(J, H, Nk), o_w2(J, J, Nk), o_w3(H, J, Nk), o_v1(J, H, Nk), o_v2(J, J, Nk), o_v3(1, J, Nk);
    std::vector<float> dalpha(H * Nk), logit(H * KT), dl(H * KT), dh1(J * KT), dh2(J * KT), dw(KT), g_dist2(KT), ddots(H * KT);
    for (int64_t b = begin; b < end; ++b) {
      const float inv_n = 1.f / present(a, b);
      const float* mk = a.mask + b * Nk;
      for (int64_t n = 0; n < a.Nq; ++n) {
        const int64_t last = row_alpha(a, b, n, s);
        const float* xqn = a.xq + (b * a.Nq + n) * Dx;
        float* gxq = GXQ + (b * a.Nq + n) * Dx;
        // d alpha from out = alpha v, and d v.
        for (int64_t h = 0; h < H; ++h) {
          const float* go = GO + ((b * H + h) * a.Nq + n) * Dh;
          const float* vh = a.v + (b * H + h) * Nk * Dh;
          float* gv = GV + (b * H + h) * Nk * Dh;
          for (int64_t m = 0; m < last; ++m) {
            float acc_m = 0.f;
            for (int64_t e = 0; e < Dh; ++e) {
              acc_m += go[e] * vh[m * Dh + e];
              gv[m * Dh + e] += s.alpha[h * Nk + m] * go[e];
            }
            dalpha[h * Nk + m] = acc_m;
          }
        }
        if (a.has_phi) {  // back through dx and phi, tile by tile, into d alpha
          const float* gdx = GDX + (b * a.Nq + n) * Dx;
          for (int64_t m0 = 0; m0 < last; m0 += KT) {
            phi_tile(a, b, m0, s);
            for (int64_t t = 0; t < KT; ++t) dw[t] = 0.f;
            for (int64_t d = 0; d < Dx; ++d) {
              const float g = gdx[d] * inv_n;
              const float* xk = a.xkT + (b * Dx + d) * Nk + m0;
              float* gxk = GXKT + (b * Dx + d) * Nk + m0;
              for (int64_t t = 0; t < KT; ++t) {
                dw[t] += g * (xqn[d] - xk[t]);
                gxq[d] += g * s.w[t];
                gxk[t] -= g * s.w[t];
              }
            }
            for (int64_t t = 0; t < KT; ++t) dw[t] *= mk[m0 + t];
            o_v3.put(m0, dw.data(), KT, s.h2.data(), KT);  // v3
            rows_acc(acc[11].data(), dw.data(), KT, 1);  // c3
            for (int64_t i = 0; i < J; ++i)
              for (int64_t t = 0; t < KT; ++t) dh2[i * KT + t] = s.h2[i * KT + t] > 0.f ? a.v3[i] * dw[t] : 0.f;
            o_v2.put(m0, dh2.data(), KT, s.h1.data(), KT);  // v2
            rows_acc(acc[9].data(), dh2.data(), KT, J);  // c2
            tile_layer(v2T.data(), nullptr, dh2.data(), KT, nullptr, 0, dh1.data(), KT, J, J, false);
            relu_back(dh1.data(), s.h1.data(), J);
            o_v1.put(m0, dh1.data(), KT, s.alpha.data() + m0, Nk);  // v1
            rows_acc(acc[7].data(), dh1.data(), KT, J);  // c1
            tile_layer(v1T.data(), nullptr, dh1.data(), KT, dalpha.data() + m0, Nk, dalpha.data() + m0, Nk, H, J,
                       false);
          }
          o_v1.flush(last, acc[6].data());
          o_v2.flush(last, acc[8].data());
          o_v3.flush(last, acc[10].data());
        }
        // Softmax: d logit = alpha (d alpha - sum_m alpha d alpha), zero at absent keys.
        for (int64_t h = 0; h < H; ++h) {
          float dot = 0.f;
          for (int64_t m = 0; m < last; ++m) dot += s.alpha[h * Nk + m] * dalpha[h * Nk + m];
          for (int64_t m = 0; m < last; ++m) dalpha[h * Nk + m] = s.alpha[h * Nk + m] * (dalpha[h * Nk + m] - dot);
        }
        // Back through rho, recomputing each tile's activations.
        float* gpq = GPQ + (b * a.Nq + n) * J;
        for (int64_t m0 = 0; m0 < last; m0 += KT) {
          rho_tile(a, b, n, m0, s, logit.data(), KT);  // the activations; its logits are not needed
          for (int64_t h = 0; h < H; ++h)
            for (int64_t t = 0; t < KT; ++t) dl[h * KT + t] = dalpha[h * Nk + m0 + t];
          o_w3.put(m0, dl.data(), KT, s.h2.data(), KT);  // w3
          rows_acc(acc[4].data(), dl.data(), KT, H);  // b3
          for (int64_t t = 0; t < KT; ++t) g_dist2[t] = 0.f;
          for (int64_t h = 0; h < H; ++h)
            for (int64_t t = 0; t < KT; ++t) {
              acc[5][h * KT + t] -= dl[h * KT + t] * s.dist2[t];  // he
              g_dist2[t] -= dl[h * KT + t] * a.he[h];
            }
          for (int64_t d = 0; d < Dx; ++d) {
            const float* xk = a.xkT + (b * Dx + d) * Nk + m0;
            float* gxk = GXKT + (b * Dx + d) * Nk + m0;
            for (int64_t t = 0; t < KT; ++t) {
              const float g = 2.f * g_dist2[t] * (xqn[d] - xk[t]);
              gxq[d] += g;
              gxk[t] -= g;
            }
          }
          tile_layer(w3T.data(), nullptr, dl.data(), KT, nullptr, 0, dh2.data(), KT, J, H, false);
          relu_back(dh2.data(), s.h2.data(), J);
          o_w2.put(m0, dh2.data(), KT, s.h1.data(), KT);  // w2
          rows_acc(acc[2].data(), dh2.data(), KT, J);  // b2
          tile_layer(w2T.data(), nullptr, dh2.data(), KT, nullptr, 0, dh1.data(), KT, J, J, false);
          relu_back(dh1.data(), s.h1.data(), J);
          o_wd.put(m0, dh1.data(), KT, s.dots.data(), KT);  // wd
          float* gnpk = GNPKT + b * J * Nk + m0;
          for (int64_t j = 0; j < J; ++j)
            for (int64_t t = 0; t < KT; ++t) {
              gpq[j] += dh1[j * KT + t];
              gnpk[j * Nk + t] += dh1[j * KT + t];
            }
          tile_layer(wdT.data(), nullptr, dh1.data(), KT, nullptr, 0, ddots.data(), KT, H, J, false);
          for (int64_t h = 0; h < H; ++h) {  // dots = q . k
            const float* qh = a.q + ((b * H + h) * a.Nq + n) * Dh;
            float* gq = GQ + ((b * H + h) * a.Nq + n) * Dh;
            const float* kh = a.kT + (b * H + h) * Dh * Nk + m0;
            float* gk = GKT + (b * H + h) * Dh * Nk + m0;
            const float* dd = ddots.data() + h * KT;
            for (int64_t e = 0; e < Dh; ++e)
              for (int64_t t = 0; t < KT; ++t) {
                gq[e] += dd[t] * kh[e * Nk + t];
                gk[e * Nk + t] += dd[t] * qh[e];
              }
          }
        }
        o_wd.flush(last, acc[0].data());
        o_w2.flush(last, acc[1].data());
        o_w3.flush(last, acc[3].data());
      }
    }
    std::lock_guard<std::mutex> guard(lock);
    for (size_t w = 0; w < acc.size(); ++w) {
      float* g = grads[7 + w].data_ptr<float>();
      for (int64_t i = 0; i < wsize[w]; ++i) {
        if (by_gemm[w]) {
          g[i] += acc[w][i];
        } else {
          for (int64_t t = 0; t < KT; ++t) g[i] += acc[w][i * KT + t];
        }
      }
    }
  });
  return grads;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &te_attention_forward, "fused TE attention forward (CPU, float32)");
  m.def("backward", &te_attention_backward, "fused TE attention backward (CPU, float32)");
}
