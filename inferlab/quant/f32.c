/* The unquantized format's decode loop: y [M, N] = x [M, K] @ w [N, K]^T in float32, for the few
   rows of a decode step, reading each weight once for all M rows (a prompt's many rows too: a row's
   result never depends on the rows beside it, and at 512 rows this still beat the library GEMM).

   A decode step's time is the time to read the weights. A library GEMM is built for large M: at
   M = 1 it runs a GEMV, and at M = 2..16 it often packs the weights into panels first, which reads
   them twice; so a second row can cost nearly as much as the first. This loop walks the weights
   once. x is small (a few KB) and stays in cache. That makes the marginal row nearly free on a
   memory-bound model, which is what speculative verification and batching need.

   Two shapes of the walk:
   - A tile of 4 weight rows stays in registers while it meets each activation row (up to 6 at a
     time where AVX-512 gives 32 registers, 2 with AVX2's 16, 4 on NEON), and more activation rows
     re-read the tile from L1, not memory. Few loads per product: the faster walk where the weights
     sit in the CPU's cache (a small model) and for many rows (a prompt, a large batch). Its first
     pass asks for the weights AHEAD rows ahead, into L2: asked into L1 (16 rows of 576-1536 floats
     is more than L1 holds), smollm2's layer products took 24-26 ms at 9 rows and 31-35 at 17 on
     a 32 KB-L1 EPYC; into L2, 16-18 and 24-27 (2 threads, `inferlab bench rows`, runs alternated).
   - On x86, for up to STREAM_MAX rows of a weight of STREAM_BYTES or more (beyond a core's L2, so
     it comes from memory), each thread reads its weight rows one after the other, a single
     sequential stream, asking for the weights 16 KB ahead of where it reads, into L2 (not L1),
     and meets every activation row with each vector it loads. More loads per product, but the
     core keeps one stream flowing while it computes. Where the prefetch went into L1, 4 KB ahead,
     an EPYC with a 32 KB L1 gave 5 rows 1.27-1.58x one row over three runs: the requests L1 can
     keep in flight cap how far ahead it looks, and 5 rows' multiply-adds per vector left the
     stream waiting. Into L2, 16 KB ahead: 1.00-1.03x, one row unchanged (13.3-14.1 ms against
     13.6-14.2, runs alternated). Against the tiles (prefetching into L2) on the same machine, the
     stream was as fast or faster up to 5 rows (one row 12-16 ms against 14-17) and slower from 6
     (8 rows 21-22 ms against 17-18): so it takes up to 5.
   Both walks add a row's products in the same order (one 8-float accumulator along K, then its
   lanes), so a row's result is the same bits whatever rows run beside it and whichever walk ran
   it: a sequence's logits do not depend on its batch or on the verify it sits in. The x86 builds
   use 8-float (256-bit) vectors even with AVX-512: on the AMD cores measured, 16-float registers
   bought nothing (they run as two halves) and their stream walk was slower (5 rows 1.11-1.15x,
   one 16-float load a cycle against two of 8 floats); AVX-512 lends its 32 registers to the tiles.

   Three builds, chosen at run time by the CPU: AVX-512 (AVX-512VL for the 32 registers), AVX2 +
   FMA, and NEON on aarch64 (tiles only). inferlab/quant/f32.py compiles this file with the system C
   compiler, and falls back to torch's F.linear wherever a build is missing or a shape does not fit
   (K a multiple of the vector width, N a multiple of 4). */
#include <stddef.h>
#include <stdint.h>

#define TILE_N 4  /* weight rows per tile */
#define STREAM_MAX 5  /* the stream walk takes up to this many rows (x86) ... */
#define STREAM_BYTES (1 << 20)  /* ... of a weight this large: beyond a core's L2, so from memory */
#define STREAM_AHEAD 4096  /* floats (16 KB) ahead on that stream, asked for into L2 as it reads */
#define AHEAD 16  /* the first pass over a tile asks for the weights this many rows ahead, into L2: with
                     the hardware prefetcher alone, more rows per tile left the loop waiting on memory */

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512vl,fma")))
#define AVX2 __attribute__((target("avx2,fma")))

int inferlab_f32_isa(void) {  /* 2: AVX-512 (with its 32 registers for 8-float vectors), 1: AVX2 + FMA, 0: neither */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return 2;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
}

AVX2 static inline float hsum256(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* One weight row n against MR activation rows: the stream walk. */
AVX2 static inline __attribute__((always_inline)) void row256(const float *x, int K, const float *w, int N,
                                                              float *y, int n, const int MR) {
    __m256 acc[STREAM_MAX];
    for (int j = 0; j < MR; j++) acc[j] = _mm256_setzero_ps();
    const float *wr = w + (size_t)n * K;
    for (int k = 0; k < K; k += 8) {
        const __m256 wv = _mm256_loadu_ps(wr + k);
        if ((k & 15) == 0) _mm_prefetch((const char *)(wr + k + STREAM_AHEAD), _MM_HINT_T1);  /* a line a time, into L2 */
        for (int j = 0; j < MR; j++) acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (size_t)j * K + k), acc[j]);
    }
    for (int j = 0; j < MR; j++) y[(size_t)j * N + n] = hsum256(acc[j]);
}

static int streams(int M, int K, int N) { return M <= STREAM_MAX && (size_t)K * N * sizeof(float) >= STREAM_BYTES; }

AVX2 static int stream(const float *x, int M, int K, const float *w, int N, float *y, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
        switch (M) {  /* constant row counts, so each row's loops unroll */
            case 5: row256(x, K, w, N, y, n, 5); break;
            case 4: row256(x, K, w, N, y, n, 4); break;
            case 3: row256(x, K, w, N, y, n, 3); break;
            case 2: row256(x, K, w, N, y, n, 2); break;
            case 1: row256(x, K, w, N, y, n, 1); break;
        }
    }
    return 0;
}

/* A tile of TILE_N weight rows against MR activation rows (from row m0): the same sums as row256's. */
#define TILE(NAME, TARGET, MAX_MR)                                                                        \
TARGET static inline __attribute__((always_inline)) void NAME(const float *x, int K, const float *w,      \
                                                              int N, float *y, int n0, int m0, const int MR) { \
    __m256 acc[MAX_MR][TILE_N];                                                                           \
    for (int j = 0; j < MR; j++)                                                                          \
        for (int r = 0; r < TILE_N; r++) acc[j][r] = _mm256_setzero_ps();                                 \
    const float *wt = w + (size_t)n0 * K;                                                                 \
    for (int k = 0; k < K; k += 8) {                                                                      \
        __m256 wv[TILE_N];                                                                                \
        for (int r = 0; r < TILE_N; r++) {                                                                \
            wv[r] = _mm256_loadu_ps(wt + (size_t)r * K + k);                                              \
            if (m0 == 0 && (k & 15) == 0) _mm_prefetch((const char *)(wt + (size_t)(r + AHEAD) * K + k), _MM_HINT_T1); \
        }                                                                                                 \
        for (int j = 0; j < MR; j++) {                                                                    \
            const __m256 xv = _mm256_loadu_ps(x + (size_t)(m0 + j) * K + k);                             \
            for (int r = 0; r < TILE_N; r++) acc[j][r] = _mm256_fmadd_ps(wv[r], xv, acc[j][r]);           \
        }                                                                                                 \
    }                                                                                                     \
    for (int j = 0; j < MR; j++)                                                                          \
        for (int r = 0; r < TILE_N; r++) y[(size_t)(m0 + j) * N + n0 + r] = hsum256(acc[j][r]);          \
}
TILE(tile6, AVX512, 6)  /* 24 accumulators + 4 weight vectors + x: AVX-512's 32 registers */
TILE(tile2, AVX2, 2)    /* 8 + 4 + 1 of AVX2's 16 */

AVX512 int inferlab_f32_gemv_avx512(const float *x, int M, int K, const float *w, int N, float *y, int nthreads) {
    if (streams(M, K, N)) return stream(x, M, K, w, N, y, nthreads);
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n0 = 0; n0 < N; n0 += TILE_N) {
        int m0 = 0;
        for (; m0 + 6 <= M; m0 += 6) tile6(x, K, w, N, y, n0, m0, 6);
        switch (M - m0) {  /* constant row counts, so each tile's loops unroll */
            case 5: tile6(x, K, w, N, y, n0, m0, 5); break;
            case 4: tile6(x, K, w, N, y, n0, m0, 4); break;
            case 3: tile6(x, K, w, N, y, n0, m0, 3); break;
            case 2: tile6(x, K, w, N, y, n0, m0, 2); break;
            case 1: tile6(x, K, w, N, y, n0, m0, 1); break;
        }
    }
    return 0;
}

AVX2 int inferlab_f32_gemv_avx2(const float *x, int M, int K, const float *w, int N, float *y, int nthreads) {
    if (streams(M, K, N)) return stream(x, M, K, w, N, y, nthreads);
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n0 = 0; n0 < N; n0 += TILE_N) {
        int m0 = 0;
        for (; m0 + 2 <= M; m0 += 2) tile2(x, K, w, N, y, n0, m0, 2);
        if (m0 < M) tile2(x, K, w, N, y, n0, m0, 1);
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
