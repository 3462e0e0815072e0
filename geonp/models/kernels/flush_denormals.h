// Denormal floats flushed to zero inside the kernels' loops, as a guard object: each thread of an
// at::parallel_for sets its own control register on entry and puts it back on exit, so nothing
// outside the kernels (PyTorch's own operations, the caller's threads) changes.
//
// Why: a float below 2^-126 (1.2e-38) is denormal, and on x86 every operation that reads or
// writes one takes a microcode assist, tens to hundreds of times the cost of a normal one. The
// kernels make them as a matter of course: exp_nonpositive gives ~1e-38 for pairs far apart, and
// their softmax weights, the products with them and the gradients through them are smaller
// still. In the fused TE kernel's backward on the demo's fine-tuning calls they made the pass
// about twice as slow. Flushed, such values count as zero: a term of 1e-38 beside the others is
// already below their rounding, so results move by nothing that matters (the tests hold the
// kernels to their PyTorch references as before).
#pragma once

#if defined(__SSE__) || defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>

namespace {

class FlushDenormals {
 public:
  // MXCSR bit 15 flushes denormal results to zero (FTZ), bit 6 reads denormal inputs as zero (DAZ).
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned int saved_;
};

}  // namespace
#else
namespace {
struct FlushDenormals {};  // other CPUs: left as they are
}  // namespace
#endif
