// Each query's nearest present keys on the CPU, overall or per quadrant: the neighbour search
// of geonp/models/local_attention.py (nearest_neighbours), which has the definitions. One pass
// over the keys per query keeps the k best in a sorted list, so no [queries, keys] distance
// matrix is formed and sorted: PyTorch's version spent a fill's second-largest share of time
// there (topk, sort and masks over the whole matrix, four times with quadrants).
//
// Order: by squared weighted distance, equal distances by key index (keys are scanned in index
// order, so a later key at an equal distance never displaces an earlier one), as the PyTorch
// version's. Built without FMA contraction (cpu_build's flags for this kernel), so each squared
// offset is rounded before it is summed, as PyTorch's square-then-sum does: two keys at mirrored
// offsets then tie exactly, as they do there, and the tie goes to the lower index. Shapes: B
// tasks, Nq queries, Nk keys, Dx location size, K kept per query.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr float INF = std::numeric_limits<float>::infinity();

// The ``size`` best (distance, index) pairs seen so far, best first; ``count`` filled.
struct Best {
  float* dist;
  int64_t* index;
  int64_t size, count = 0;
  void offer(float d, int64_t i) {
    if (size == 0 || (count == size && !(d < dist[size - 1]))) return;  // not better than the worst kept
    int64_t at = count < size ? count++ : size - 1;
    while (at > 0 && d < dist[at - 1]) {  // strict: an earlier key at an equal distance stays ahead
      dist[at] = dist[at - 1];
      index[at] = index[at - 1];
      --at;
    }
    dist[at] = d;
    index[at] = i;
  }
};

// Which quadrant the offset (du, dv) lies in, as local_attention._quadrants: angles [0, 90),
// [90, 180), ... measured from the dv axis; the zero offset in the first.
inline int quadrant(float du, float dv) {
  if ((dv > 0.f && du >= 0.f) || (dv == 0.f && du == 0.f)) return 0;
  if (dv <= 0.f && du > 0.f) return 1;
  if (dv < 0.f && du <= 0.f) return 2;
  return 3;
}

}  // namespace

// xq [B, Nq, Dx], xk [B, Nk, Dx] float32 (already weighted), mask [B, Nk] bool, ``keep`` per
// query (per quadrant when ``du_dim`` >= 0; ``dv_dim`` is then the other quadrant dimension)
// -> (index [B, Nq, K] int64, squared distance [B, Nq, K] float32, inf where fewer keys are
// present; those slots' index is 0), K = keep, or 4 keep by quadrant.
std::vector<torch::Tensor> nearest(torch::Tensor xq, torch::Tensor xk, torch::Tensor mask, int64_t keep,
                                   int64_t du_dim, int64_t dv_dim) {
  TORCH_CHECK(xq.is_contiguous() && xk.is_contiguous() && mask.is_contiguous() &&
              xq.scalar_type() == torch::kFloat32 && xk.scalar_type() == torch::kFloat32 &&
              mask.scalar_type() == torch::kBool, "neighbours_cpu: contiguous float32 locations and a bool mask");
  TORCH_CHECK(xq.dim() == 3 && xk.dim() == 3 && mask.dim() == 2, "neighbours_cpu: xq, xk [B, N, Dx], mask [B, Nk]");
  const int64_t b = xq.size(0), nq = xq.size(1), dx = xq.size(2), nk = xk.size(1);
  TORCH_CHECK(xk.size(0) == b && xk.size(2) == dx && mask.size(0) == b && mask.size(1) == nk && keep >= 0,
              "neighbours_cpu: xq [B, Nq, Dx], xk [B, Nk, Dx] and mask [B, Nk] disagree");
  TORCH_CHECK(du_dim < 0 || (du_dim < dx && dv_dim >= 0 && dv_dim < dx),
              "neighbours_cpu: quadrant dimensions must be locations' dimensions");
  const int64_t parts = du_dim >= 0 ? 4 : 1, width = parts * keep;
  auto index = torch::zeros({b, nq, width}, xq.options().dtype(torch::kInt64));
  auto dist = torch::full({b, nq, width}, INF, xq.options());
  const float *XQ = xq.data_ptr<float>(), *XK = xk.data_ptr<float>();
  const bool* M = mask.data_ptr<bool>();
  int64_t* IDX = index.data_ptr<int64_t>();
  float* D = dist.data_ptr<float>();
  at::parallel_for(0, b * nq, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> diff(dx);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row / nq;
      const float* q = XQ + row * dx;
      Best best[4];
      for (int64_t p = 0; p < parts; ++p) best[p] = Best{D + row * width + p * keep, IDX + row * width + p * keep, keep};
      for (int64_t m = 0; m < nk; ++m) {
        if (!M[t * nk + m]) continue;
        const float* x = XK + (t * nk + m) * dx;
        float d2 = 0.f;
        for (int64_t d = 0; d < dx; ++d) {  // each square rounded, then summed: built with -ffp-contract=off
          diff[d] = x[d] - q[d];
          d2 += diff[d] * diff[d];
        }
        if (!(d2 <= INF)) continue;  // a NaN location: in no quadrant and never kept, as PyTorch's search
        best[parts == 4 ? quadrant(diff[du_dim], diff[dv_dim]) : 0].offer(d2, m);
      }
    }
  });
  return {index, dist};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("nearest", &nearest, "each query's nearest present keys, overall or per quadrant (CPU, float32)");
}
