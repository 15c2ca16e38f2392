// The kernel-times-vector of GP prediction, exp2(U V^T) a, fused in one pass (float32, CPU).
//
// Built and loaded by gpdyn/gp/native.py (g++ -O3 -march=native), called through ctypes.
// The torch path (gpdyn.gp.kernels.exp2_matvec) writes each kernel block to memory with a
// matmul, raises it to exp2 in a second pass and multiplies it into the vector in a third;
// torch's exp2 runs at ~2.4 G/s on the 2-core EPYC, so the exp2 pass costs as much as the
// matmul and the whole path reaches ~40-55 % of sgemm. Here every 16 test points x 8 basis
// functions are one register tile: the feature inner products accumulate in registers,
// the exp2 is a polynomial on the same registers and the tile is summed into the output,
// so the feature FMAs and the exp2's adds and shifts overlap and nothing of size N x M is
// stored (~80 % of sgemm, gpdyn bench mpc).
//
// exp2(s) = 2^n * p(f), n = round(s), f = s - n in [-1/2, 1/2], p the degree-5 Chebyshev fit
// of 2^f on that interval (max error 1.3e-7, float32 rounding). s is clamped to [-127, 127]:
// below, the kernel value is under 2^-127 and comes out 0 (float32's smallest normal is
// 2^-126); above would be a kernel value over 1.7e38, which no GP amplitude gives. NaN
// passes through (f is NaN). Vectors are GCC vector extensions: the compiler maps them to
// the machine's widest SIMD (AVX-512, AVX2, NEON).

#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
static const long LANES = 16;
// basis functions per register tile: 8 accumulators of 16 lanes
static const int TILE = 8;
// basis functions per partial sum: a float32 sum over thousands of terms in one
// accumulator rounds ~sqrt(M) times worse than a blocked gemm; partial sums of 256 match it
static const long PARTIAL = 256;

static inline vf load(const float* p) { vf x; memcpy(&x, p, sizeof x); return x; }
static inline void store(float* p, vf x) { memcpy(p, &x, sizeof x); }

static inline vf exp2_poly(vf s) {
  s = s < -127.f ? -127.f : s;
  s = s > 127.f ? 127.f : s;
  // s + 1.5 * 2^23 rounds s to an integer, held in the low mantissa bits of t
  const float magic = 12582912.0f;
  vf t = s + magic;
  vf f = s - (t - magic);
  vf p = f * 1.340043731033802e-3f + 9.676042012870312e-3f;
  p = p * f + 5.550327152013779e-2f;
  p = p * f + 2.402210682630539e-1f;
  p = p * f + 6.931471824645996e-1f;
  p = p * f + 1.0000001192092896f;
  vi bits;
  memcpy(&bits, &t, sizeof bits);
  vi exponent = (bits - (0x4B400000 - 127)) << 23;  // 2^n as float bits
  vf scale;
  memcpy(&scale, &exponent, sizeof scale);
  return p * scale;
}

// exp2 of the 16 x T tile of test points ut[:, 0:16] against basis functions v[0:T]
template <int T>
static inline void tile_exp2(const float* __restrict__ ut, long R, long Np, const float* __restrict__ v, vf* e) {
  vf acc[T];
  for (int i = 0; i < T; i++) acc[i] = (vf){};
  for (long r = 0; r < R; r++) {
    vf x = load(ut + r * Np);
    for (int i = 0; i < T; i++) acc[i] += v[i * R + r] * x;
  }
  for (int i = 0; i < T; i++) e[i] = exp2_poly(acc[i]);
}

template <int T>
static inline vf tile_one(const float* ut, long R, long Np, const float* v, const float* a, vf total) {
  vf e[T];
  tile_exp2<T>(ut, R, Np, v, e);
  for (int i = 0; i < T; i++) total += e[i] * a[i];
  return total;
}

template <int T>
static inline void tile_many(const float* ut, long R, long Np, const float* v, const float* a, long M, long P, vf* total) {
  vf e[T];
  tile_exp2<T>(ut, R, Np, v, e);
  for (long p = 0; p < P; p++)
    for (int i = 0; i < T; i++) total[p] += e[i] * a[p * M + i];
}

// Test points [n0, n1) of out[p] = exp2(U_p V_p^T) a[p] for p < P.
// ut [R, Np]: test-point features, transposed (Np, n0, n1 multiples of 16); v [M, R]: basis
// features; a [P, M]; out [P, Np]; all contiguous. ut_stride and v_stride step from one
// output's features to the next (0: the same for every output).
// shared = 1: one kernel for every vector (ut and v the same for all outputs, P <= 64):
// the exp2 is computed once and multiplied into all P vectors.
extern "C" int gpdyn_exp2_matvec(const float* ut, long ut_stride, long R, long Np, const float* v, long v_stride,
                                 long M, const float* a, long P, int shared, float* out, long n0, long n1) {
  if (Np % LANES || n0 % LANES || n1 % LANES || P < 1 || (shared && P > 64)) return 1;
  vf part[64], total[64];
  if (!shared) {  // a kernel per output: each partial sum stays in a register
    for (long p = 0; p < P; p++) {
      const float *up = ut + p * ut_stride, *vp = v + p * v_stride, *ap = a + p * M;
      for (long n = n0; n < n1; n += LANES) {
        vf sum = {};
        for (long m0 = 0; m0 < M; m0 += PARTIAL) {
          long m1 = m0 + PARTIAL < M ? m0 + PARTIAL : M, m = m0;
          vf partial = {};
          for (; m + TILE <= m1; m += TILE) partial = tile_one<TILE>(up + n, R, Np, vp + m * R, ap + m, partial);
          for (; m < m1; m++) partial = tile_one<1>(up + n, R, Np, vp + m * R, ap + m, partial);
          sum += partial;
        }
        store(out + p * Np + n, sum);
      }
    }
    return 0;
  }
  for (long n = n0; n < n1; n += LANES) {
    for (long p = 0; p < P; p++) total[p] = (vf){};
    for (long m0 = 0; m0 < M; m0 += PARTIAL) {
      long m1 = m0 + PARTIAL < M ? m0 + PARTIAL : M, m = m0;
      for (long p = 0; p < P; p++) part[p] = (vf){};
      for (; m + TILE <= m1; m += TILE) tile_many<TILE>(ut + n, R, Np, v + m * R, a + m, M, P, part);
      for (; m < m1; m++) tile_many<1>(ut + n, R, Np, v + m * R, a + m, M, P, part);
      for (long p = 0; p < P; p++) total[p] += part[p];
    }
    for (long p = 0; p < P; p++) store(out + p * Np + n, total[p]);
  }
  return 0;
}
