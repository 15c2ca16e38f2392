// The kernel-times-vector of GP prediction, exp2(U V^T) a, fused in one pass (CPU; float32
// and float64).
//
// Built and loaded by gpdyn/gp/native.py (g++ -O3 -march=native), called through ctypes.
// The torch path (gpdyn.gp.kernels.exp2_matvec) writes each kernel block to memory with a
// matmul, raises it to exp2 in a second pass and multiplies it into the vector in a third;
// torch's float32 exp2 runs at 2.4-3.5 G/s on the 2-core EPYC, so the exp2 pass costs about
// as much as the matmul and the whole path reaches 40-50 % of sgemm. Here every 16 (float64:
// 8) test points x 8 basis functions are one register tile: the feature inner products
// accumulate in registers, the exp2 is a polynomial on the same registers and the tile is
// summed into the output, so the feature FMAs and the exp2's adds and shifts overlap and
// nothing of size N x M is stored (73-79 % of sgemm for SVDGP at M_alpha = 16384, docs/control.md; 1.3-1.6x the
// torch path).
//
// exp2(s) = 2^n * p(f), n = round(s), f = s - n in [-1/2, 1/2], p the Chebyshev fit of 2^f
// on that interval: degree 5 for float32 (error 8e-8, under float32 rounding), degree 11 for
// float64 (3e-18). s is clamped to [-127, 128] (float32) or [-1023, 1024] (float64), so
// that n's exponent field stays in range: at the bottom it is 0 and the value comes out 0
// (the kernel value is under the smallest normal number); at the top it is all ones and the
// value is inf, as exp2's overflow (from s > 127.5 or 1023.5 on, a little early). NaN
// passes through (f is NaN). Vectors are GCC vector extensions: the compiler maps them to
// the machine's widest SIMD (AVX-512, AVX2, NEON).

#include <stdint.h>
#include <string.h>

// 64-byte vectors: 16 floats or 8 doubles, with the integer type of the same width
template <typename T> struct Simd;
template <> struct Simd<float> {
  typedef float vec __attribute__((vector_size(64)));
  typedef int32_t bits __attribute__((vector_size(64)));
  static constexpr float bottom = -127.f, top = 128.f;
  static constexpr float magic = 12582912.0f;  // 1.5 * 2^23
  static constexpr int32_t bias = 0x4B400000 - 127, shift = 23;
  static inline vec poly(vec f) {
    vec p = f * 1.3390863364671234e-3f + 9.676031918322054e-3f;
    p = p * f + 5.550357114219078e-2f;
    p = p * f + 2.402210748530834e-1f;
    p = p * f + 6.931471880262288e-1f;
    return p * f + 1.0000000754548972f;
  }
};
template <> struct Simd<double> {
  typedef double vec __attribute__((vector_size(64)));
  typedef int64_t bits __attribute__((vector_size(64)));
  static constexpr double bottom = -1023.0, top = 1024.0;
  static constexpr double magic = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr int64_t bias = 0x4338000000000000LL - 1023, shift = 52;
  static inline vec poly(vec f) {
    vec p = f * 4.4558179083360645e-10 + 7.074194297288521e-09;
    p = p * f + 1.0178057087733941e-07;
    p = p * f + 1.3215432535912375e-06;
    p = p * f + 1.5252733841556773e-05;
    p = p * f + 0.00015403530463724353;
    p = p * f + 0.001333355814640647;
    p = p * f + 0.009618129107587256;
    p = p * f + 0.055504108664821625;
    p = p * f + 0.24022650695910158;
    p = p * f + 0.6931471805599453;
    return p * f + 1.0;
  }
};

// basis functions per register tile: TILE accumulators of one vector of test points each
static const int TILE = 8;
// basis functions per partial sum: a sum over thousands of terms in one accumulator rounds
// ~sqrt(M) times worse than a blocked gemm; partial sums of 256 match it
static const long PARTIAL = 256;
// vectors per call with one kernel for all of them
static const long MAX_VECTORS = 64;

template <typename T> struct Kernel {
  typedef Simd<T> S;
  typedef typename S::vec vec;
  typedef typename S::bits bits;
  static const long lanes = 64 / sizeof(T);

  static inline vec load(const T* p) { vec x; memcpy(&x, p, sizeof x); return x; }
  static inline void store(T* p, vec x) { memcpy(p, &x, sizeof x); }

  static inline vec exp2(vec s) {
    s = s < S::bottom ? S::bottom : s;  // exponent field 0: the scale is 0
    s = s > S::top ? S::top : s;        // exponent field all ones: the scale is inf
    vec t = s + S::magic;  // rounds s to an integer, held in the low mantissa bits of t
    vec f = s - (t - S::magic);
    bits b;
    memcpy(&b, &t, sizeof b);
    bits e = (b - S::bias) << S::shift;  // 2^n as floating-point bits
    vec scale;
    memcpy(&scale, &e, sizeof scale);
    return S::poly(f) * scale;
  }

  // exp2 of the lanes x W tile of test points ut[:, 0:lanes] against basis functions v[0:W]
  template <int W>
  static inline void tile_exp2(const T* __restrict__ ut, long R, long Np, const T* __restrict__ v, vec* e) {
    vec acc[W];
    for (int i = 0; i < W; i++) acc[i] = (vec){};
    for (long r = 0; r < R; r++) {
      vec x = load(ut + r * Np);
      for (int i = 0; i < W; i++) acc[i] += v[i * R + r] * x;
    }
    for (int i = 0; i < W; i++) e[i] = exp2(acc[i]);
  }

  template <int W>
  static inline vec tile_one(const T* ut, long R, long Np, const T* v, const T* a, vec total) {
    vec e[W];
    tile_exp2<W>(ut, R, Np, v, e);
    for (int i = 0; i < W; i++) total += e[i] * a[i];
    return total;
  }

  template <int W>
  static inline void tile_many(const T* ut, long R, long Np, const T* v, const T* a, long M, long P, vec* total) {
    vec e[W];
    tile_exp2<W>(ut, R, Np, v, e);
    for (long p = 0; p < P; p++)
      for (int i = 0; i < W; i++) total[p] += e[i] * a[p * M + i];
  }

  static int run(const T* ut, long ut_stride, long R, long Np, const T* v, long v_stride, long M, const T* a, long P,
                 int shared, T* out, long n0, long n1) {
    if (Np % lanes || n0 % lanes || n1 % lanes || P < 1 || (shared && P > MAX_VECTORS)) return 1;
    if (!shared) {  // a kernel per output: each partial sum stays in a register
      for (long p = 0; p < P; p++) {
        const T *up = ut + p * ut_stride, *vp = v + p * v_stride, *ap = a + p * M;
        for (long n = n0; n < n1; n += lanes) {
          vec sum = {};
          for (long m0 = 0; m0 < M; m0 += PARTIAL) {
            long m1 = m0 + PARTIAL < M ? m0 + PARTIAL : M, m = m0;
            vec partial = {};
            for (; m + TILE <= m1; m += TILE) partial = tile_one<TILE>(up + n, R, Np, vp + m * R, ap + m, partial);
            for (; m < m1; m++) partial = tile_one<1>(up + n, R, Np, vp + m * R, ap + m, partial);
            sum += partial;
          }
          store(out + p * Np + n, sum);
        }
      }
      return 0;
    }
    vec part[MAX_VECTORS], total[MAX_VECTORS];
    for (long n = n0; n < n1; n += lanes) {
      for (long p = 0; p < P; p++) total[p] = (vec){};
      for (long m0 = 0; m0 < M; m0 += PARTIAL) {
        long m1 = m0 + PARTIAL < M ? m0 + PARTIAL : M, m = m0;
        for (long p = 0; p < P; p++) part[p] = (vec){};
        for (; m + TILE <= m1; m += TILE) tile_many<TILE>(ut + n, R, Np, v + m * R, a + m, M, P, part);
        for (; m < m1; m++) tile_many<1>(ut + n, R, Np, v + m * R, a + m, M, P, part);
        for (long p = 0; p < P; p++) total[p] += part[p];
      }
      for (long p = 0; p < P; p++) store(out + p * Np + n, total[p]);
    }
    return 0;
  }
};

// Test points [n0, n1) of out[p] = exp2(U_p V_p^T) a[p] for p < P; 0 on success, 1 when the
// arguments break the layout below.
// ut [R, Np]: test-point features, transposed (Np, n0 and n1 multiples of the lanes, 16 or
// 8); v [M, R]: basis features; a [P, M]; out [P, Np]; all contiguous. ut_stride and
// v_stride step from one output's features to the next (0: the same for every output).
// shared = 1: one kernel for every vector (ut and v the same for all outputs, P <= 64): the
// exp2 is computed once and multiplied into all P vectors.
#define GPDYN_EXP2_MATVEC(NAME, T)                                                                                   \
  extern "C" int NAME(const T* ut, long ut_stride, long R, long Np, const T* v, long v_stride, long M, const T* a, \
                      long P, int shared, T* out, long n0, long n1) {                                               \
    return Kernel<T>::run(ut, ut_stride, R, Np, v, v_stride, M, a, P, shared, out, n0, n1);                         \
  }
GPDYN_EXP2_MATVEC(gpdyn_exp2_matvec_f32, float)
GPDYN_EXP2_MATVEC(gpdyn_exp2_matvec_f64, double)
