/* The unquantized format's decode loop: y [M, N] = x [M, K] @ w [N, K]^T in float32, for the few
   rows of a decode step, reading each weight once for all M rows (a prompt's many rows too: a row's
   result never depends on the rows beside it, and at 512 rows this still beat the library GEMM).

   A decode step's time is the time to read the weights. A library GEMM is built for large M: at
   M = 1 it runs a GEMV, and at M = 2..16 it often packs the weights into panels first, which reads
   them twice; so a second row can cost nearly as much as the first. This loop walks the weights
   once: a tile of 4 weight rows stays in registers while it meets each activation row (up to 6 at
   a time on AVX-512, held in 24 of its 32 registers, so a verify of 5 rows is one pass; 4 on NEON,
   2 on AVX2), and more activation rows re-read the tile from L1, not memory.
   x is small (a few KB) and stays in cache. That makes the marginal row nearly free on a
   memory-bound model, which is what speculative verification and batching need.

   Three builds of the same loop, chosen at run time by the CPU: AVX-512 (16 floats per register),
   AVX2 + FMA (8; tiles of 4 x 2 so the accumulators fit its 16 registers), and NEON on aarch64 (4).
   inferlab/quant/f32.py compiles this file with the system C compiler, and falls back to torch's
   F.linear wherever a build is missing or a shape does not fit (K a multiple of the vector width,
   N a multiple of 4). */
#include <stddef.h>
#include <stdint.h>

#define TILE_N 4  /* weight rows per tile */
#define AHEAD 16  /* the first pass over a tile asks for the weights this many rows ahead: with the
                     hardware prefetcher alone, more rows per tile left the loop waiting on memory */

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,fma")))
#define AVX2 __attribute__((target("avx2,fma")))

int inferlab_f32_isa(void) {  /* 2: AVX-512, 1: AVX2 + FMA, 0: neither */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
}

AVX512 static inline __attribute__((always_inline)) void tile512(const float *x, int K, const float *w, int N,
                                                                 float *y, int n0, int m0, const int MR) {
    __m512 acc[6][TILE_N];
    for (int j = 0; j < MR; j++)
        for (int r = 0; r < TILE_N; r++) acc[j][r] = _mm512_setzero_ps();
    const float *wt = w + (size_t)n0 * K;
    for (int k = 0; k < K; k += 16) {
        __m512 wv[TILE_N];
        for (int r = 0; r < TILE_N; r++) {
            wv[r] = _mm512_loadu_ps(wt + (size_t)r * K + k);
            if (m0 == 0) _mm_prefetch((const char *)(wt + (size_t)(r + AHEAD) * K + k), _MM_HINT_T0);
        }
        for (int j = 0; j < MR; j++) {
            const __m512 xv = _mm512_loadu_ps(x + (size_t)(m0 + j) * K + k);
            for (int r = 0; r < TILE_N; r++) acc[j][r] = _mm512_fmadd_ps(wv[r], xv, acc[j][r]);
        }
    }
    for (int j = 0; j < MR; j++)
        for (int r = 0; r < TILE_N; r++) y[(size_t)(m0 + j) * N + n0 + r] = _mm512_reduce_add_ps(acc[j][r]);
}

AVX512 int inferlab_f32_gemv_avx512(const float *x, int M, int K, const float *w, int N, float *y, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n0 = 0; n0 < N; n0 += TILE_N) {
        int m0 = 0;
        for (; m0 + 6 <= M; m0 += 6) tile512(x, K, w, N, y, n0, m0, 6);
        switch (M - m0) {  /* constant row counts, so each tile's loops unroll */
            case 5: tile512(x, K, w, N, y, n0, m0, 5); break;
            case 4: tile512(x, K, w, N, y, n0, m0, 4); break;
            case 3: tile512(x, K, w, N, y, n0, m0, 3); break;
            case 2: tile512(x, K, w, N, y, n0, m0, 2); break;
            case 1: tile512(x, K, w, N, y, n0, m0, 1); break;
        }
    }
    return 0;
}

AVX2 static inline float hsum256(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

AVX2 static inline __attribute__((always_inline)) void tile256(const float *x, int K, const float *w, int N,
                                                               float *y, int n0, int m0, const int MR) {
    __m256 acc[2][TILE_N];
    for (int j = 0; j < MR; j++)
        for (int r = 0; r < TILE_N; r++) acc[j][r] = _mm256_setzero_ps();
    const float *wt = w + (size_t)n0 * K;
    for (int k = 0; k < K; k += 8) {
        __m256 wv[TILE_N];
        for (int r = 0; r < TILE_N; r++) {
            wv[r] = _mm256_loadu_ps(wt + (size_t)r * K + k);
            if (m0 == 0 && (k & 15) == 0) _mm_prefetch((const char *)(wt + (size_t)(r + AHEAD) * K + k), _MM_HINT_T0);
        }
        for (int j = 0; j < MR; j++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)(m0 + j) * K + k);
            for (int r = 0; r < TILE_N; r++) acc[j][r] = _mm256_fmadd_ps(wv[r], xv, acc[j][r]);
        }
    }
    for (int j = 0; j < MR; j++)
        for (int r = 0; r < TILE_N; r++) y[(size_t)(m0 + j) * N + n0 + r] = hsum256(acc[j][r]);
}

AVX2 int inferlab_f32_gemv_avx2(const float *x, int M, int K, const float *w, int N, float *y, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n0 = 0; n0 < N; n0 += TILE_N) {
        int m0 = 0;
        for (; m0 + 2 <= M; m0 += 2) tile256(x, K, w, N, y, n0, m0, 2);
        if (m0 < M) tile256(x, K, w, N, y, n0, m0, 1);
    }
    return 0;
}
#endif

#if defined(__aarch64__)
#include <arm_neon.h>

int inferlab_f32_isa(void) { return 3; }  /* NEON is part of every aarch64 CPU */

static inline __attribute__((always_inline)) void tile_neon(const float *x, int K, const float *w, int N,
                                                            float *y, int n0, int m0, const int MR) {
    float32x4_t acc[4][TILE_N];
    for (int j = 0; j < MR; j++)
        for (int r = 0; r < TILE_N; r++) acc[j][r] = vdupq_n_f32(0.f);
    const float *wt = w + (size_t)n0 * K;
    for (int k = 0; k < K; k += 4) {
        float32x4_t wv[TILE_N];
        for (int r = 0; r < TILE_N; r++) {
            wv[r] = vld1q_f32(wt + (size_t)r * K + k);
            if (m0 == 0 && (k & 15) == 0) __builtin_prefetch(wt + (size_t)(r + AHEAD) * K + k);
        }
        for (int j = 0; j < MR; j++) {
            const float32x4_t xv = vld1q_f32(x + (size_t)(m0 + j) * K + k);
            for (int r = 0; r < TILE_N; r++) acc[j][r] = vfmaq_f32(acc[j][r], wv[r], xv);
        }
    }
    for (int j = 0; j < MR; j++)
        for (int r = 0; r < TILE_N; r++) y[(size_t)(m0 + j) * N + n0 + r] = vaddvq_f32(acc[j][r]);
}

int inferlab_f32_gemv_neon(const float *x, int M, int K, const float *w, int N, float *y, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n0 = 0; n0 < N; n0 += TILE_N) {
        int m0 = 0;
        for (; m0 + 4 <= M; m0 += 4) tile_neon(x, K, w, N, y, n0, m0, 4);
        switch (M - m0) {
            case 3: tile_neon(x, K, w, N, y, n0, m0, 3); break;
            case 2: tile_neon(x, K, w, N, y, n0, m0, 2); break;
            case 1: tile_neon(x, K, w, N, y, n0, m0, 1); break;
        }
    }
    return 0;
}
#endif
