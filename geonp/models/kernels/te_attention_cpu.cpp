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
// made once per call in Python. The loops themselves are in te_attention_loops.h. Where the
// compiler targets AVX2 and FMA (cpu_build.py asks for them on CPUs that have them) the four
// hottest (tile_layer, outer_rows, tile_dots, weighted_sum) are written in intrinsics: GCC's own vectorisation of the plain loops kept half
// their sums on the stack and ran the demo's fine-tuning and fill kernels 2.1x slower (12.2 s
// against 5.8 s, fwd + bwd). The plain loops stay for every other CPU. On a CPU with AVX-512,
// tile_layer and outer_rows run 16 floats wide as well, giving the same floats (see the loops' header).
//
// The backward pass recomputes one query row at a time (as FlashAttention does) and keeps only
// that row's activations, [hidden][Nk] per layer, so its memory is that of the forward pass
// plus a few rows per thread.
//
// Shapes: B batch, H heads, Nq queries, Nk keys, Dh head size, Dx location size, J hidden
// width of rho and phi.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "flush_denormals.h"
#include "te_attention_loops.h"

namespace {

// The inputs of one call (see te_attention_forward for their layouts).
struct Args {
  int64_t B, H, Nq, Nk, Dh, Dx, J;
  const float *q, *kT, *v, *xq, *xkT, *mask, *pq, *npkT, *wd, *w2, *b2, *w3, *b3, *he;
  const float *v1, *c1, *v2, *c2, *v3;
  float c3;
  const float* mask_q;  // [B, Nq]: 1 where a query row is wanted (a padded batch's padding is skipped)
  bool has_phi;
};

// Where one layer stack writes its activations for a tile: rows of stride ``stride``, the tile
// at column ``off`` (per-tile buffers: stride KT, off 0; per-row buffers: stride Nk, off m0).
struct Acts {
  float *dots, *h1, *h2, *dist2;  // rho: q.k [H], hidden [J], hidden [J], |x_q - x_k|^2 [1]
  float *g1, *g2, *w;              // phi: hidden [J], hidden [J], summed output [1]
  int64_t stride;
};

// Per-thread buffers: the row's attention weights, one tile's activations and, for the
// backward pass, one row's activations.
struct Scratch {
  std::vector<float> alpha, prior, zeros, tile, row;
  Acts tile_acts, row_acts;
  Scratch(const Args& a, bool rows)
      : alpha(a.H * a.Nk), prior(a.H * KT), zeros(std::max(a.J, a.H), 0.f), tile((a.H + 4 * a.J + 2) * KT),
        row(rows ? (a.H + 4 * a.J + 2) * a.Nk : 0) {
    tile_acts = split(tile.data(), a, KT);
    if (rows) row_acts = split(row.data(), a, a.Nk);
  }
  static Acts split(float* p, const Args& a, int64_t n) {
    Acts s;
    s.stride = n;
    s.dots = p; p += a.H * n;
    s.h1 = p; p += a.J * n;
    s.h2 = p; p += a.J * n;
    s.g1 = p; p += a.J * n;
    s.g2 = p; p += a.J * n;
    s.dist2 = p; p += n;
    s.w = p;
    return s;
  }
};

// rho on one tile of keys m0..m0+KT for query (b, n): its activations into ``acts`` at column
// ``off`` and its logits (prior included, mask not) into H rows of ``logit`` (stride Nk).
void rho_tile(const Args& a, int64_t b, int64_t n, int64_t m0, Scratch& s, const Acts& acts, int64_t off,
              float* logit) {
  const int64_t st = acts.stride;
  const float* xqn = a.xq + (b * a.Nq + n) * a.Dx;
  float* dist2 = acts.dist2 + off;
  for (int64_t t = 0; t < KT; ++t) dist2[t] = 0.f;
  for (int64_t d = 0; d < a.Dx; ++d) {
    const float* xk = a.xkT + (b * a.Dx + d) * a.Nk + m0;
    for (int64_t t = 0; t < KT; ++t) { const float e = xqn[d] - xk[t]; dist2[t] += e * e; }
  }
  for (int64_t h = 0; h < a.H; ++h) {
    for (int64_t t = 0; t < KT; ++t) s.prior[h * KT + t] = -a.he[h] * dist2[t];
    tile_dots(a.q + ((b * a.H + h) * a.Nq + n) * a.Dh, a.kT + (b * a.H + h) * a.Dh * a.Nk + m0, a.Nk, a.Dh,
              acts.dots + h * st + off);
  }
  // W_dots dots + (W_x xq + b1) - W_x xk, ReLU; W2 . + b2, ReLU; W3 . + b3 - prior
  tile_layer(a.wd, a.pq + (b * a.Nq + n) * a.J, acts.dots + off, st, a.npkT + b * a.J * a.Nk + m0, a.Nk,
             acts.h1 + off, st, a.J, a.H, true);
  tile_layer(a.w2, a.b2, acts.h1 + off, st, nullptr, 0, acts.h2 + off, st, a.J, a.J, true);
  tile_layer(a.w3, a.b3, acts.h2 + off, st, s.prior.data(), KT, logit + m0, a.Nk, a.H, a.J, false);
}

// The attention weights of query row (b, n) into s.alpha [H][Nk] (0 at absent keys), rho's
// activations into ``acts`` (per row, or per tile and overwritten: ``per_row`` false); returns the end of the keys
// that matter (padding at the end of a task is skipped whole tiles at a time).
int64_t row_alpha(const Args& a, int64_t b, int64_t n, Scratch& s, const Acts& acts, bool per_row) {
  const float* mk = a.mask + b * a.Nk;
  int64_t last = a.Nk;
  while (last > 0 && mk[last - 1] == 0.f) --last;
  last = (last + KT - 1) / KT * KT;
  for (int64_t m0 = 0; m0 < last; m0 += KT) {
    rho_tile(a, b, n, m0, s, acts, per_row ? m0 : 0, s.alpha.data());
    for (int64_t h = 0; h < a.H; ++h)
      for (int64_t t = 0; t < KT; ++t)
        if (mk[m0 + t] == 0.f) s.alpha[h * a.Nk + m0 + t] = NEG_INF;
  }
  for (int64_t h = 0; h < a.H; ++h) {
    float* lh = s.alpha.data() + h * a.Nk;
    const float mx = row_max(lh, last);
    if (!(mx > NEG_INF)) {  // no key present: no attention
      std::fill(lh, lh + last, 0.f);
      continue;
    }
    for (int64_t m = 0; m < last; ++m) lh[m] = exp_nonpositive(lh[m] - mx) * mk[m];
    const float inv = 1.f / row_sum(lh, last);
    for (int64_t m = 0; m < last; ++m) lh[m] *= inv;
  }
  return last;
}

// phi on one tile: g1 = ReLU(V1 alpha + c1), g2 = ReLU(V2 g1 + c2), w = (v3 . g2 + c3) * mask
// (phi's last layer summed over heads), into ``acts`` at column ``off``.
void phi_tile(const Args& a, int64_t b, int64_t m0, const Scratch& s, const Acts& acts, int64_t off) {
  const int64_t st = acts.stride;
  tile_layer(a.v1, a.c1, s.alpha.data() + m0, a.Nk, nullptr, 0, acts.g1 + off, st, a.J, a.H, true);
  tile_layer(a.v2, a.c2, acts.g1 + off, st, nullptr, 0, acts.g2 + off, st, a.J, a.J, true);
  tile_layer(a.v3, &a.c3, acts.g2 + off, st, nullptr, 0, acts.w + off, st, 1, a.J, false);
  const float* mk = a.mask + b * a.Nk + m0;
  for (int64_t t = 0; t < KT; ++t) acts.w[off + t] *= mk[t];
}

// One query row (row = b * Nq + n) of te_attention_forward: its out [H][Dh] and dx [Dx] (inv_n: 1 /
// the task's present keys; swx: Dx floats of scratch).
void forward_row(const Args& a, int64_t row, float inv_n, Scratch& s, std::vector<float>& swx, float* OUT, float* DX) {
  const Acts& acts = s.tile_acts;
  const int64_t b = row / a.Nq, n = row % a.Nq;
  const int64_t last = row_alpha(a, b, n, s, acts, false);
  for (int64_t h = 0; h < a.H; ++h)  // out = alpha v
    weighted_sum(s.alpha.data() + h * a.Nk, a.v + (b * a.H + h) * a.Nk * a.Dh, last, a.Dh,
                 OUT + ((b * a.H + h) * a.Nq + n) * a.Dh);
  if (!a.has_phi) return;
  // dx = (1/N) sum_m w_m (x_q - x_m) = (x_q sum_m w_m - sum_m w_m x_m) / N
  float sw = 0.f;
  std::fill(swx.begin(), swx.end(), 0.f);
  for (int64_t m0 = 0; m0 < last; m0 += KT) {
    phi_tile(a, b, m0, s, acts, 0);
    for (int64_t t = 0; t < KT; ++t) sw += acts.w[t];
    for (int64_t d = 0; d < a.Dx; ++d) {
      const float* xk = a.xkT + (b * a.Dx + d) * a.Nk + m0;
      for (int64_t t = 0; t < KT; ++t) swx[d] += acts.w[t] * xk[t];
    }
  }
  const float* xqn = a.xq + row * a.Dx;
  for (int64_t d = 0; d < a.Dx; ++d) DX[row * a.Dx + d] = (xqn[d] * sw - swx[d]) * inv_n;
}

float present(const Args& a, int64_t b) {
  float n = 0.f;
  for (int64_t m = 0; m < a.Nk; ++m) n += a.mask[b * a.Nk + m];
  return std::max(n, 1.f);
}

Args make_args(const std::vector<torch::Tensor>& t, bool has_phi) {
  TORCH_CHECK(t.size() == 21, "te_attention_cpu: expected 21 inputs, got ", t.size());
  for (const auto& x : t) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "te_attention_cpu: every input must be a contiguous float32 CPU tensor");
  }
  Args a;
  a.B = t[0].size(0); a.H = t[0].size(1); a.Nq = t[0].size(2); a.Dh = t[0].size(3);
  a.Nk = t[1].size(3); a.Dx = t[3].size(2); a.J = t[9].size(0);
  TORCH_CHECK(a.Nk % KT == 0, "te_attention_cpu: keys must be padded to a multiple of ", KT);
  const float** slots[] = {&a.q, &a.kT, &a.v, &a.xq, &a.xkT, &a.mask, &a.pq, &a.npkT, &a.wd, &a.w2, &a.b2,
                           &a.w3, &a.b3, &a.he, &a.v1, &a.c1, &a.v2, &a.c2, &a.v3};
  for (size_t i = 0; i < 19; ++i) *slots[i] = t[i].data_ptr<float>();
  a.c3 = t[19].data_ptr<float>()[0];
  a.mask_q = t[20].data_ptr<float>();
  a.has_phi = has_phi;
  return a;
}

}  // namespace

// Inputs, all contiguous float32: q [B,H,Nq,Dh] (already scaled by 1/sqrt(Dh)); kT [B,H,Dh,Nk];
// v [B,H,Nk,Dh]; xq [B,Nq,Dx]; xkT [B,Dx,Nk]; mask [B,Nk] (1 present, 0 absent); pq [B,Nq,J] =
// W_x xq + b1; npkT [B,J,Nk] = -W_x xk; wd [J,H] (rho's first layer on the dot products);
// w2 [J,J]; b2 [J]; w3 [H,J]; b3 [H]; he [H] = 0.5 / ell_h^2 (zeros without the distance
// prior); phi: v1 [J,H], c1 [J], v2 [J,J], c2 [J], v3 [J] (last layer summed over heads), c3 [1];
// mask_q [B,Nq] (1 wanted, 0 skipped: a padded batch's padding). Nk must be a multiple of KT
// (padded keys have mask 0). Returns out [B,H,Nq,Dh] and dx [B,Nq,Dx], the Eq. 10 update divided
// by the number of present keys (zeros without phi, and in skipped rows).
std::vector<torch::Tensor> te_attention_forward(std::vector<torch::Tensor> inputs, bool has_phi) {
  const Args a = make_args(inputs, has_phi);
  auto out = torch::zeros({a.B, a.H, a.Nq, a.Dh}, inputs[0].options());
  auto dx = torch::zeros({a.B, a.Nq, a.Dx}, inputs[0].options());
  float *OUT = out.data_ptr<float>(), *DX = dx.data_ptr<float>();
  std::vector<float> inv_n(a.B);  // 1 / present keys per task, once rather than once per row
  for (int64_t b = 0; b < a.B; ++b) inv_n[b] = 1.f / present(a, b);
  // The wanted rows, dealt out in turn (row i to share i % shares): a task's rows cost alike (its
  // keys), tasks do not, so contiguous ranges left one thread waiting on a longer task's rows (the
  // demo's fine-tuning: 4 tasks on 2 threads). Rows are independent: any split gives the same floats.
  std::vector<int64_t> wanted;
  for (int64_t row = 0; row < a.B * a.Nq; ++row)
    if (a.mask_q[row] != 0.f) wanted.push_back(row);
  const int64_t shares = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), wanted.size() / 8));
  at::parallel_for(0, shares, 1, [&](int64_t begin, int64_t end) {
    const FlushDenormals flush;  // denormals cost a microcode assist each: flush_denormals.h
    Scratch s(a, false);
    std::vector<float> swx(a.Dx);
    for (int64_t share = begin; share < end; ++share)
      for (int64_t i = share; i < static_cast<int64_t>(wanted.size()); i += shares)
        forward_row(a, wanted[i], inv_n[wanted[i] / a.Nq], s, swx, OUT, DX);
  });
  return {out, dx};
}

// The backward's batches dealt to threads by their work (wanted rows x present keys), the
// largest first, each to the least loaded thread: contiguous ranges left one of 2 threads with
// 1.17x the even share in the demo's fine-tuning (4 tasks of unequal sizes), this split 1.07x.
std::vector<std::vector<int64_t>> batch_shares(const Args& a) {
  std::vector<std::pair<double, int64_t>> work;  // (cost, batch)
  for (int64_t b = 0; b < a.B; ++b) {
    double rows = 0.;
    for (int64_t n = 0; n < a.Nq; ++n) rows += a.mask_q[b * a.Nq + n] != 0.f;
    if (rows > 0.) work.emplace_back(rows * present(a, b), b);
  }
  std::stable_sort(work.begin(), work.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), work.size()));
  std::vector<std::vector<int64_t>> shares(threads);
  std::vector<double> load(threads, 0.);
  for (const auto& [cost, b] : work) {
    const int64_t t = std::min_element(load.begin(), load.end()) - load.begin();
    shares[t].push_back(b);
    load[t] += cost;
  }
  return shares;
}

// Gradients of te_attention_forward with respect to its inputs 0-4 and 6-19 (all but the two
// masks), in that order, given those of its outputs (g_out [B,H,Nq,Dh], g_dx [B,Nq,Dx]). Skipped
// query rows send no gradient: their outputs reach no valid result, so their gradients are zero.
// Whole batches go to threads, so the key-side gradients of a batch have one writer; each batch
// sums its own weight gradients, and these are added up in batch order at the end: the same
// floats whatever the thread count or the split.
std::vector<torch::Tensor> te_attention_backward(std::vector<torch::Tensor> inputs, bool has_phi,
                                                 torch::Tensor g_out, torch::Tensor g_dx) {
  const Args a = make_args(inputs, has_phi);
  const int64_t H = a.H, J = a.J, Nk = a.Nk, Dh = a.Dh, Dx = a.Dx;
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (i != 5 && i != 20) grads.push_back(torch::zeros_like(inputs[i]));
  float *GQ = grads[0].data_ptr<float>(), *GKT = grads[1].data_ptr<float>(), *GV = grads[2].data_ptr<float>();
  float *GXQ = grads[3].data_ptr<float>(), *GXKT = grads[4].data_ptr<float>(), *GPQ = grads[5].data_ptr<float>();
  float* GNPKT = grads[6].data_ptr<float>();
  g_out = g_out.contiguous();
  g_dx = g_dx.contiguous();
  const float *GO = g_out.data_ptr<float>(), *GDX = g_dx.data_ptr<float>();
  const std::vector<float> wdT = transposed(a.wd, J, H), w2T = transposed(a.w2, J, J), w3T = transposed(a.w3, H, J);
  const std::vector<float> v1T = transposed(a.v1, J, H), v2T = transposed(a.v2, J, J);
  enum { WD, W2, B2, W3, B3, HE, V1, C1, V2, C2, V3, C3 };  // the weight gradients, in input order 8..19
  const int64_t wsize[] = {J * H, J * J, J, H * J, H, H, J * H, J, J * J, J, J, 1};
  std::vector<std::vector<std::vector<float>>> partials(a.B);  // each batch's weight gradients
  const std::vector<std::vector<int64_t>> shares = batch_shares(a);
  at::parallel_for(0, static_cast<int64_t>(shares.size()), 1, [&](int64_t begin, int64_t end) {
    const FlushDenormals flush;  // denormals cost a microcode assist each: flush_denormals.h
    Scratch s(a, true);
    const Acts& r = s.row_acts;
    // One row's gradients: d alpha (then d logit) [H][Nk], two hidden layers [J][Nk], d dots
    // [H][Nk], d w [Nk].
    std::vector<float> dalpha(H * Nk), d2(J * Nk), d1(J * Nk), ddots(H * Nk), dw(Nk);
    for (int64_t share = begin; share < end; ++share)  // one share a thread, as parallel_for splits them
      for (int64_t b : shares[share]) {
        std::vector<std::vector<float>>& acc = partials[b];
        for (int64_t size : wsize) acc.emplace_back(size, 0.f);
        const float inv_n = 1.f / present(a, b);
        const float* mk = a.mask + b * Nk;
        for (int64_t n = 0; n < a.Nq; ++n) {
          if (a.mask_q[b * a.Nq + n] == 0.f) continue;
          const int64_t last = row_alpha(a, b, n, s, r, true);
          const float* xqn = a.xq + (b * a.Nq + n) * Dx;
          float* gxq = GXQ + (b * a.Nq + n) * Dx;
          // out = alpha v: d alpha and d v.
          for (int64_t h = 0; h < H; ++h) {
            // Restrict pointers, the two sums in loops of their own: with one loop over both and
            // pointers that might alias, GCC vectorised neither.
            const float* __restrict go = GO + ((b * H + h) * a.Nq + n) * Dh;
            const float* __restrict vh = a.v + (b * H + h) * Nk * Dh;
            float* __restrict gv = GV + (b * H + h) * Nk * Dh;
            const float* __restrict ah = s.alpha.data() + h * Nk;
            float* __restrict da = dalpha.data() + h * Nk;
            for (int64_t m = 0; m < last; ++m) {
              float dot = 0.f;
              for (int64_t e = 0; e < Dh; ++e) dot += go[e] * vh[m * Dh + e];
              da[m] = dot;
            }
            for (int64_t m = 0; m < last; ++m)
              for (int64_t e = 0; e < Dh; ++e) gv[m * Dh + e] += ah[m] * go[e];
          }
          if (a.has_phi) {  // back through dx and phi into d alpha
            const float* gdx = GDX + (b * a.Nq + n) * Dx;
            for (int64_t m0 = 0; m0 < last; m0 += KT) phi_tile(a, b, m0, s, r, m0);
            std::fill(dw.begin(), dw.begin() + last, 0.f);
            for (int64_t d = 0; d < Dx; ++d) {
              const float g = gdx[d] * inv_n;
              const float* xk = a.xkT + (b * Dx + d) * Nk;
              float* gxk = GXKT + (b * Dx + d) * Nk;
              gxq[d] += g * row_sum(r.w, last);
              for (int64_t m = 0; m < last; ++m) {
                dw[m] += g * (xqn[d] - xk[m]);
                gxk[m] -= g * r.w[m];
              }
            }
            for (int64_t m = 0; m < last; ++m) dw[m] *= mk[m];
            outer_rows(dw.data(), r.g2, 1, J, Nk, last, acc[V3].data());
            acc[C3][0] += row_sum(dw.data(), last);
            for (int64_t i = 0; i < J; ++i) {  // locals: GCC reloaded a.v3 and the rows for every key
              const float v3i = a.v3[i];
              const float* __restrict g2i = r.g2 + i * Nk;
              const float* __restrict dwp = dw.data();
              float* __restrict d2i = d2.data() + i * Nk;
              for (int64_t m = 0; m < last; ++m) d2i[m] = g2i[m] > 0.f ? v3i * dwp[m] : 0.f;
            }
            outer_rows(d2.data(), r.g1, J, J, Nk, last, acc[V2].data());
            for (int64_t i = 0; i < J; ++i) acc[C2][i] += row_sum(d2.data() + i * Nk, last);
            row_layer(v2T.data(), d2.data(), d1.data(), r.g1, J, J, Nk, last);
            outer_rows(d1.data(), s.alpha.data(), J, H, Nk, last, acc[V1].data());
            for (int64_t j = 0; j < J; ++j) acc[C1][j] += row_sum(d1.data() + j * Nk, last);
            for (int64_t m0 = 0; m0 < last; m0 += KT)  // d alpha += V1^T d g1
              tile_layer(v1T.data(), nullptr, d1.data() + m0, Nk, dalpha.data() + m0, Nk, dalpha.data() + m0, Nk, H,
                         J, false);
          }
          // Softmax: d logit = alpha (d alpha - sum_m alpha d alpha), zero at absent keys.
          for (int64_t h = 0; h < H; ++h) {
            float* dl = dalpha.data() + h * Nk;
            const float* ah = s.alpha.data() + h * Nk;
            const float dot = row_dot(ah, dl, last);
            for (int64_t m = 0; m < last; ++m) dl[m] = ah[m] * (dl[m] - dot);
          }
          // Back through rho: its output layer and the distance prior ...
          outer_rows(dalpha.data(), r.h2, H, J, Nk, last, acc[W3].data());
          for (int64_t h = 0; h < H; ++h) {
            acc[B3][h] += row_sum(dalpha.data() + h * Nk, last);
            acc[HE][h] -= row_dot(dalpha.data() + h * Nk, r.dist2, last);
          }
          for (int64_t m = 0; m < last; ++m) {
            float g_dist2 = 0.f;
            for (int64_t h = 0; h < H; ++h) g_dist2 -= dalpha[h * Nk + m] * a.he[h];
            for (int64_t d = 0; d < Dx; ++d) {
              const float g = 2.f * g_dist2 * (xqn[d] - a.xkT[(b * Dx + d) * Nk + m]);
              gxq[d] += g;
              GXKT[(b * Dx + d) * Nk + m] -= g;
            }
          }
          // ... its hidden layers ...
          row_layer(w3T.data(), dalpha.data(), d2.data(), r.h2, J, H, Nk, last);
          outer_rows(d2.data(), r.h1, J, J, Nk, last, acc[W2].data());
          for (int64_t i = 0; i < J; ++i) acc[B2][i] += row_sum(d2.data() + i * Nk, last);
          row_layer(w2T.data(), d2.data(), d1.data(), r.h1, J, J, Nk, last);
          // ... and its first layer: W_dots dots + pq - (W_x xk), with dots = q . k.
          outer_rows(d1.data(), r.dots, J, H, Nk, last, acc[WD].data());
          float* gpq = GPQ + (b * a.Nq + n) * J;
          float* gnpk = GNPKT + b * J * Nk;
          for (int64_t j = 0; j < J; ++j) {
            gpq[j] += row_sum(d1.data() + j * Nk, last);
            for (int64_t m = 0; m < last; ++m) gnpk[j * Nk + m] += d1[j * Nk + m];
          }
          row_layer(wdT.data(), d1.data(), ddots.data(), nullptr, H, J, Nk, last);
          for (int64_t h = 0; h < H; ++h) {
            const float* qh = a.q + ((b * H + h) * a.Nq + n) * Dh;
            float* gq = GQ + ((b * H + h) * a.Nq + n) * Dh;
            const float* kh = a.kT + (b * H + h) * Dh * Nk;
            float* gk = GKT + (b * H + h) * Dh * Nk;
            const float* dd = ddots.data() + h * Nk;
            for (int64_t e = 0; e < Dh; ++e) {
              gq[e] += row_dot(dd, kh + e * Nk, last);
              for (int64_t m = 0; m < last; ++m) gk[e * Nk + m] += dd[m] * qh[e];
            }
          }
        }
      }
  });
  // Summed in batch order, not in the order threads finish: the same inputs give the same
  // gradients bit for bit on any number of threads, so a resumed training run stays exact.
  for (const auto& part : partials)
    for (size_t w = 0; w < part.size(); ++w) {
      float* g = grads[7 + w].data_ptr<float>();
      for (int64_t i = 0; i < wsize[w]; ++i) g[i] += part[w][i];
    }
  return grads;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &te_attention_forward, "fused TE attention forward (CPU, float32)");
  m.def("backward", &te_attention_backward, "fused TE attention backward (CPU, float32)");
}
