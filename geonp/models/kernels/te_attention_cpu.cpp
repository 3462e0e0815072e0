// Fused translation-equivariant attention on the CPU: one pass over (query, key) pairs that
// evaluates the logit MLP rho, the softmax, the value sum and the location-update MLP phi per
// pair without ever materialising a [B, Nq, Nk, hidden] tensor. Same function as
// TEAttention's fast path (geonp/models/te_attention.py); see that module for the equations.
//
// Work is split over (batch, query) rows with at::parallel_for. Within a row, keys are taken in
// tiles of KT so that the innermost loops run over the keys of a tile, contiguous in memory,
// and vectorise (key-major copies of k, the key location projections and the key locations are
// made once per call in Python).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int64_t KT = 16;  // keys per tile (the key axis is padded to a multiple in Python)

// out[i][t] = act(bias[i] + add[i][t] + sum_j w[i][j] in[j][t]) for one tile of KT keys, four
// output rows at a time so that each loaded input row feeds four accumulators held in
// registers. Tiles are rows of KT floats with the given row strides; ``add`` may be null.
inline void tile_layer(const float* w, const float* bias, const float* in, int64_t in_stride,
                       const float* add, int64_t add_stride, float* out, int64_t out_stride,
                       int64_t rows, int64_t cols, bool relu) {
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    float acc[4][KT];
    for (int r = 0; r < 4; ++r)
      for (int64_t t = 0; t < KT; ++t) acc[r][t] = bias[i + r] + (add ? add[(i + r) * add_stride + t] : 0.f);
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
    for (int64_t t = 0; t < KT; ++t) acc[t] = bias[i] + (add ? add[i * add_stride + t] : 0.f);
    for (int64_t j = 0; j < cols; ++j) {
      const float wv = w[i * cols + j];
      const float* x = in + j * in_stride;
      for (int64_t t = 0; t < KT; ++t) acc[t] += wv * x[t];
    }
    for (int64_t t = 0; t < KT; ++t) out[i * out_stride + t] = relu ? std::max(acc[t], 0.f) : acc[t];
  }
}

}  // namespace

// q [B,H,Nq,Dh] (already scaled by 1/sqrt(Dh)); kT [B,H,Dh,Nk]; v [B,H,Nk,Dh];
// xq [B,Nq,Dx]; xkT [B,Dx,Nk]; mask [B,Nk] (float 0/1); pq [B,Nq,J] = W_x xq + b1;
// neg_pkT [B,J,Nk] = -W_x xk; Nk a multiple of KT (padded keys have mask 0); w_dots [J,H]; w2 [J,J]; b2 [J]; w3 [H,J]; b3 [H]; half_inv_ell2 [H]
// (0.5 / ell_h^2, zeros without the distance prior); phi: v1 [J,H], c1 [J], v2 [J,J], c2 [J],
// v3 [J] (last layer summed over heads), c3 [1]; has_phi selects the location update.
// Returns out [B,H,Nq,Dh] and dx [B,Nq,Dx] (the Eq. 10 update, already divided by the number
// of present keys).
std::vector<torch::Tensor> te_attention_forward(
    torch::Tensor q, torch::Tensor kT, torch::Tensor v, torch::Tensor xq, torch::Tensor xkT,
    torch::Tensor mask, torch::Tensor pq, torch::Tensor neg_pkT, torch::Tensor w_dots, torch::Tensor w2,
    torch::Tensor b2, torch::Tensor w3, torch::Tensor b3, torch::Tensor half_inv_ell2,
    torch::Tensor v1, torch::Tensor c1, torch::Tensor v2, torch::Tensor c2, torch::Tensor v3,
    torch::Tensor c3, bool has_phi) {
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), Dh = q.size(3);
  const int64_t Nk = kT.size(3), Dx = xq.size(2), J = w2.size(0);
  auto out = torch::zeros({B, H, Nq, Dh}, q.options());
  auto dx = torch::zeros({B, Nq, Dx}, q.options());
  const float *Q = q.data_ptr<float>(), *KTp = kT.data_ptr<float>(), *V = v.data_ptr<float>();
  const float *XQ = xq.data_ptr<float>(), *XKT = xkT.data_ptr<float>(), *M = mask.data_ptr<float>();
  const float *PQ = pq.data_ptr<float>(), *NPKT = neg_pkT.data_ptr<float>();
  const float *WD = w_dots.data_ptr<float>(), *W2 = w2.data_ptr<float>(), *B2 = b2.data_ptr<float>();
  const float *W3 = w3.data_ptr<float>(), *B3 = b3.data_ptr<float>(), *HE = half_inv_ell2.data_ptr<float>();
  const float *V1 = v1.data_ptr<float>(), *C1 = c1.data_ptr<float>(), *V2 = v2.data_ptr<float>();
  const float *C2 = c2.data_ptr<float>(), *V3 = v3.data_ptr<float>();
  const float C3 = c3.data_ptr<float>()[0];
  float *OUT = out.data_ptr<float>(), *DX = dx.data_ptr<float>();

  at::parallel_for(0, B * Nq, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> logit(H * Nk), dots(H * KT), h1(J * KT), h2(J * KT), prior(H * KT), w(KT);
    std::vector<float> zeros(std::max(J, H), 0.f), swx(Dx);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / Nq, n = row % Nq;
      const float* mk = M + b * Nk;
      const float* xqn = XQ + (b * Nq + n) * Dx;
      int64_t last = Nk;  // padding sits at the end of a task: skip whole padded tiles
      while (last > 0 && mk[last - 1] == 0.f) --last;
      last = (last + KT - 1) / KT * KT;
      float n_valid = 0.f;
      for (int64_t m = 0; m < last; ++m) n_valid += mk[m];
      // Pass 1: the logits of every key, per head; -inf where absent.
      for (int64_t m0 = 0; m0 < last; m0 += KT) {
        float dist2[KT] = {};
        for (int64_t d = 0; d < Dx; ++d) {
          const float* xk = XKT + (b * Dx + d) * Nk + m0;
          for (int64_t t = 0; t < KT; ++t) { const float e = xqn[d] - xk[t]; dist2[t] += e * e; }
        }
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t t = 0; t < KT; ++t) prior[h * KT + t] = -HE[h] * dist2[t];
          tile_layer(Q + ((b * H + h) * Nq + n) * Dh, zeros.data(), KTp + (b * H + h) * Dh * Nk + m0, Nk,
                     nullptr, 0, dots.data() + h * KT, KT, 1, Dh, false);  // q . k
        }
        // rho: W_dots dots + (W_x xq + b1) - W_x xk, ReLU, W2 . + b2, ReLU, W3 . + b3 - prior
        tile_layer(WD, PQ + (b * Nq + n) * J, dots.data(), KT, NPKT + b * J * Nk + m0, Nk, h1.data(), KT, J, H, true);
        tile_layer(W2, B2, h1.data(), KT, nullptr, 0, h2.data(), KT, J, J, true);
        tile_layer(W3, B3, h2.data(), KT, prior.data(), KT, logit.data() + m0, Nk, H, J, false);
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < KT; ++t)
            if (mk[m0 + t] == 0.f) logit[h * Nk + m0 + t] = -std::numeric_limits<float>::infinity();
      }
      // Softmax over keys per head (alpha overwrites the logits), then the value sum.
      for (int64_t h = 0; h < H; ++h) {
        float* lh = logit.data() + h * Nk;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t m = 0; m < last; ++m) mx = std::max(mx, lh[m]);
        if (!(mx > -std::numeric_limits<float>::infinity())) {  // no key present: alpha = 0
          std::fill(lh, lh + last, 0.f);
          continue;
        }
        float s = 0.f;
        for (int64_t m = 0; m < last; ++m) { lh[m] = std::exp(lh[m] - mx); s += lh[m]; }
        const float inv = 1.f / s;
        const float* vh = V + (b * H + h) * Nk * Dh;
        float* o = OUT + ((b * H + h) * Nq + n) * Dh;
        for (int64_t m = 0; m < last; ++m) {
          lh[m] *= inv;
          const float a = lh[m];
          const float* vm = vh + m * Dh;
          for (int64_t e = 0; e < Dh; ++e) o[e] += a * vm[e];
        }
      }
      if (!has_phi) continue;
      // Pass 2: location update dx = (1/N) sum_m w_m (x_q - x_m), w_m = sum_h phi(alpha_m)[h].
      float sw = 0.f;
      std::fill(swx.begin(), swx.end(), 0.f);
      for (int64_t m0 = 0; m0 < last; m0 += KT) {
        tile_layer(V1, C1, logit.data() + m0, Nk, nullptr, 0, h1.data(), KT, J, H, true);
        tile_layer(V2, C2, h1.data(), KT, nullptr, 0, h2.data(), KT, J, J, true);
        tile_layer(V3, &C3, h2.data(), KT, nullptr, 0, w.data(), KT, 1, J, false);
        for (int64_t t = 0; t < KT; ++t) { w[t] *= mk[m0 + t]; sw += w[t]; }
        for (int64_t d = 0; d < Dx; ++d) {
          const float* xk = XKT + (b * Dx + d) * Nk + m0;
          float acc = 0.f;
          for (int64_t t = 0; t < KT; ++t) acc += w[t] * xk[t];
          swx[d] += acc;
        }
      }
      const float inv_n = 1.f / std::max(n_valid, 1.f);
      float* dxn = DX + (b * Nq + n) * Dx;
      for (int64_t d = 0; d < Dx; ++d) dxn[d] = (xqn[d] * sw - swx[d]) * inv_n;
    }
  });
  return {out, dx};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &te_attention_forward, "fused TE attention forward (CPU, float32)");
}
