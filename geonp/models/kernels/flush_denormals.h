// Denormal floats flushed to zero inside the kernels' loops, as a guard object: each thread of an
// at::parallel_for sets its own control register on entry and puts it back on exit, so nothing
// outside the kernels (PyTorch's own operations, the caller's threads) changes.
//
// Why: a float below 2^-126 (1.2e-38) is denormal, and on x86 every operation that reads or
// writes one takes a microcode assist, tens to hundreds of times the cost of a normal one. The
// kernels that exponentiate make them as a matter of course: exp_nonpositive gives ~1e-38 for
// pairs far apart, and the softmax weights, the products with them and the gradients through
// them are smaller still. On the demo's captured fine-tuning calls (2 threads) they made the
// fused TE kernel's backward twice as slow (4.33-4.39 s against 2.07-2.13 s flushed). Flushed,
// such values count as zero: a term of 1e-38 beside the others is already below their rounding,
// so results move by nothing that matters (the tests hold the kernels to their PyTorch references
// as before). The neighbour search exponentiates nothing and must match PyTorch's distances
// exactly: no guard there.
#pragma once

#if defined(__SSE__) || defined(__x86_64__) || defined(_M_X64)
#include <pmmintrin.h>  // _mm_getcsr, _mm_setcsr and the FTZ and DAZ bits

namespace {

class FlushDenormals {
 public:
  // MXCSR: FTZ (bit 15) flushes denormal results to zero, DAZ (bit 6) reads denormal inputs as zero.
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | _MM_FLUSH_ZERO_ON | _MM_DENORMALS_ZERO_ON); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned int saved_;
};

}  // namespace
#else
namespace {
struct FlushDenormals {
  FlushDenormals() {}  // other CPUs: left as they are (a constructor, so no unused-variable warning)
};
}  // namespace
#endif
