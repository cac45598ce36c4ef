/* Decode loops for every quantized format on x86 CPUs with AVX-512 VNNI: the kind of loops llama.cpp
   runs for its blocks, here for inferlab's INT8 (per channel), INT4 (group-wise, asymmetric), NF4
   (bitsandbytes' layout) and llama.cpp's own Q8_0, Q4_0, Q4_1 and Q4_K rows.

   A decode step multiplies a few activation rows by each weight matrix; its time is the time to
   read the weights. Dequantizing a weight to floats costs several instructions per weight, which
   on one core is slower than memory. VNNI's vpdpbusd multiplies 64 unsigned bytes by 64 signed
   bytes and adds each group of four products into one of 16 int32 lanes: one instruction for 64
   weights (vpdpwssd: 32 pairs of int16). So the activations are quantized to integers first (int8
   per group or block of 32; int16 per block of 32 for INT8), the integer dot products run on the
   codes as stored, and the scales are applied once per block. NF4's codes index a table of 16
   values, which its loops hold as int8 and look up with vpshufb. inferlab/quant/vnni.py builds this file
   with the system C compiler, loads it with ctypes and checks the CPU; inferlab/quant/fused.py
   holds the torch expressions these replace, and every quantized linear's dequantize-then-matmul
   stays the reference both are tested against.

   Each function returns 0, or -1 when it could not allocate its small activation buffers. */
#ifdef INFERLAB_PORTABLE
#include "vnni_portable.h"  /* the same intrinsics in plain C: a slow build for any CPU (see there) */
#else
#include <immintrin.h>
#endif
#include "loops.h"  /* quantized_activations, free_activations, ROW_CHUNKS, INLINE, q4_k_scale_min */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PREFETCH_ROWS 8  /* ask for the codes of the row this many ahead: the hardware prefetcher alone leaves the loop waiting on memory */
#ifdef INFERLAB_PORTABLE
#define VNNI
#define AVX512F
int inferlab_vnni_supported(void) { return 1; }  /* plain C: runs on every CPU */
#else
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define AVX512F __attribute__((target("avx512f,fma")))

int inferlab_vnni_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
#endif


/* llama.cpp's blocks of 32 (inferlab/quant/ggml.py): each row of qweight is K / 32 blocks of an fp16
   scale d (Q4_1: and an fp16 min m) and 32 codes. The activations are quantized per block of 32 too
   (llama.cpp's Q8_0 for activations), so a block's dot product is one 256-bit vpdpbusd and one
   multiply-add by d * xs. */
VNNI static inline float f16_at(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    return _cvtsh_ss(h);
}

VNNI static inline float hsum256(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* INT8 weights q [N, K] (row n scaled by the fp16 scales[n]), x [M, K] -> y [M, N], K % 32 == 0.
   Here the activations keep 16 bits: one int16 scale per block of 32 (32767 levels, so the result
   is the float product to about 1e-5 of each block's largest activation, where int8 activations
   move greedy tokens), and vpdpwssd multiplies 32 int16 pairs per instruction, the weights widened
   from int8 in a register: as few instructions per weight as the int8 x int8 loop. */
VNNI INLINE void int8_rows(const int16_t *xq, const float *xs, int K, int B, const int8_t *row, float s,
                           float *y, int N, int n, int m0, const int MR) {
    __m512 acc[4];
    for (int j = 0; j < MR; j++) acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < B; b++) {
        if (m0 == 0) _mm_prefetch((const char *)(row + (size_t)PREFETCH_ROWS * K + b * 32), _MM_HINT_T0);
        const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(row + b * 32)));
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            __m512i dot = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(xq + (size_t)m * K + b * 32));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(xs[m * B + b]), acc[j]);
        }
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = _mm512_reduce_add_ps(acc[j]) * s;
}

VNNI int inferlab_int8_gemv(const float *x, int M, int K, const int8_t *qweight, const uint16_t *scales,
                            int N, float *y, int nthreads) {
    const int B = K / 32;
    int16_t *xq; float *xs;
    if (quantized_activations(x, M, K, 32, 32767, 0, 0, (void **)&xq, &xs, NULL)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define INT8_ROWS(R) int8_rows(xq, xs, K, B, qweight + (size_t)n * K, _cvtsh_ss(scales[n]), y, N, n, m0, R)
        ROW_CHUNKS(M, INT8_ROWS);
    }
    free_activations(xq, xs, NULL);
    return 0;
}

/* INT8 in tiles of 16 outputs (as the llama.cpp blocks below; why there): for each block of 32
   columns, 16 registers' worth of [16 outputs x 2 codes] (32 bytes, widened to int16 in a register),
   so one vpdpwssd advances 16 outputs against a broadcast pair of int16 activations; the channel
   scales of the tile multiply its 16 sums at the end. inferlab/quant/int8.py builds the tiles. */
VNNI INLINE void int8_tile_rows(const int16_t *xq, const float *xs, int K, int B, const int8_t *tile,
                                const uint16_t *scales, float *y, int N, int t, int m0, const int MR) {
    __m512 acc[6];
    for (int j = 0; j < MR; j++) acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < B; b++) {
        const int8_t *p = tile + (size_t)b * 512;
        if (m0 == 0) PREFETCH_AHEAD(p, 512);
        __m512i dot0[6], dot1[6];
        for (int j = 0; j < MR; j++) { dot0[j] = _mm512_setzero_si512(); dot1[j] = _mm512_setzero_si512(); }
        for (int i = 0; i < 16; i += 2) {
            const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 32 * i)));
            const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 32 * i + 32)));
            for (int j = 0; j < MR; j++) {
                int32_t x0, x1;  /* columns 2i, 2i + 1 and 2i + 2, 2i + 3 of row m0 + j */
                memcpy(&x0, xq + (size_t)(m0 + j) * K + b * 32 + 2 * i, 4);
                memcpy(&x1, xq + (size_t)(m0 + j) * K + b * 32 + 2 * i + 2, 4);
                dot0[j] = _mm512_dpwssd_epi32(dot0[j], _mm512_set1_epi32(x0), w0);
                dot1[j] = _mm512_dpwssd_epi32(dot1[j], _mm512_set1_epi32(x1), w1);
            }
        }
        for (int j = 0; j < MR; j++)
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(dot0[j], dot1[j])),
                                     _mm512_set1_ps(xs[(size_t)(m0 + j) * B + b]), acc[j]);
    }
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + 16 * t)));
    for (int j = 0; j < MR; j++) _mm512_storeu_ps(y + (size_t)(m0 + j) * N + 16 * t, _mm512_mul_ps(acc[j], s));
}

VNNI int inferlab_int8_tiles_gemv(const float *x, int M, int K, const int8_t *tiles, const uint16_t *scales,
                                  int N, float *y, int nthreads) {
    const int B = K / 32, T = N / 16;
    int16_t *xq; float *xs;
    if (quantized_activations(x, M, K, 32, 32767, 0, 0, (void **)&xq, &xs, NULL)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < T; t++) {
#define INT8_TILE_ROWS(R) int8_tile_rows(xq, xs, K, B, tiles + (size_t)t * 16 * K, scales, y, N, t, m0, R)
        ROW_CHUNKS6(M, INT8_TILE_ROWS);
    }
    free_activations(xq, xs, NULL);
    return 0;
}

/* INT4 weights: qweight [N, K / 2] bytes, byte j = code 2j (low nibble) | code 2j + 1 (high),
   fp16 scales and uint8 zeros [N, K / G], w = (q - z) * s; x [M, K] -> y [M, N]. G % 64 == 0.
   The activations are quantized per group and split into even and odd columns, so 64 bytes of
   codes (128 weights) meet their activations in two vpdpbusd: low nibbles x even, high x odd;
   a group of 64 more (G = 64, 192, ...: a width like 576 takes groups of 64) in two 256-bit ones.
   The zero point leaves the loop: sum_k (q_k - z) xq_k = sum_k q_k xq_k - z sum_k xq_k. */
VNNI INLINE void int4_rows(const int8_t *xe, const int8_t *xo, const float *xs, const int32_t *xsum, int K, int G,
                           int group_size, const uint8_t *row, const uint16_t *scales, const uint8_t *zeros,
                           float *y, int N, int n, int m0, const int MR) {
    const int chunks = group_size / 128, tail = group_size % 128, half = K / 2;
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m256i low256 = _mm256_set1_epi8(0x0F);
    __m512 acc[4];
    float zero_part[4];
    for (int j = 0; j < MR; j++) { acc[j] = _mm512_setzero_ps(); zero_part[j] = 0.f; }
    for (int g = 0; g < G; g++) {
        __m512i dot[4];
        for (int j = 0; j < MR; j++) dot[j] = _mm512_setzero_si512();
        for (int c = 0; c < chunks; c++) {
            const int off = g * (group_size / 2) + c * 64;
            const __m512i v = _mm512_loadu_si512(row + off);
            if (m0 == 0) _mm_prefetch((const char *)(row + (size_t)PREFETCH_ROWS * half + off), _MM_HINT_T0);
            const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            for (int j = 0; j < MR; j++) {
                const size_t at = (size_t)(m0 + j) * half + off;
                dot[j] = _mm512_dpbusd_epi32(dot[j], lo, _mm512_loadu_si512(xe + at));
                dot[j] = _mm512_dpbusd_epi32(dot[j], hi, _mm512_loadu_si512(xo + at));
            }
        }
        if (tail) {  /* the last 64 weights of the group: 32 bytes */
            const int off = g * (group_size / 2) + chunks * 64;
            const __m256i v = _mm256_loadu_si256((const __m256i *)(row + off));
            if (m0 == 0) _mm_prefetch((const char *)(row + (size_t)PREFETCH_ROWS * half + off), _MM_HINT_T0);
            const __m256i lo = _mm256_and_si256(v, low256), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low256);
            for (int j = 0; j < MR; j++) {
                const size_t at = (size_t)(m0 + j) * half + off;
                __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, _mm256_loadu_si256((const __m256i *)(xe + at)));
                d = _mm256_dpbusd_epi32(d, hi, _mm256_loadu_si256((const __m256i *)(xo + at)));
                dot[j] = _mm512_add_epi32(dot[j], _mm512_zextsi256_si512(d));
            }
        }
        const float s = _cvtsh_ss(scales[g]), z = (float)zeros[g];
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const float sx = s * xs[m * G + g];
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[j]), _mm512_set1_ps(sx), acc[j]);
            zero_part[j] += sx * z * (float)xsum[m * G + g];
        }
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = _mm512_reduce_add_ps(acc[j]) - zero_part[j];
}

VNNI int inferlab_int4_gemv(const float *x, int M, int K, const uint8_t *qweight, const uint16_t *scales,
                            const uint8_t *zeros, int N, int group_size, float *y, int nthreads) {
    const int G = K / group_size, half = K / 2;
    int8_t *xe; float *xs; int32_t *xsum;  /* xe: even columns, then (at M * half) odd columns */
    if (quantized_activations(x, M, K, group_size, 127, 1, 0, (void **)&xe, &xs, &xsum)) return -1;
    const int8_t *xo = xe + (size_t)M * half;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define INT4_ROWS(R) int4_rows(xe, xo, xs, xsum, K, G, group_size, qweight + (size_t)n * half, \
                               scales + (size_t)n * G, zeros + (size_t)n * G, y, N, n, m0, R)
        ROW_CHUNKS(M, INT4_ROWS);
    }
    free_activations(xe, xs, xsum);
    return 0;
}

/* INT4 in tiles of 16 outputs: for each group, its blocks of 32 columns as 4 registers of [16 outputs
   x 4 code bytes] (a byte: an even column in its low nibble, the next odd one in its high), then the
   group's 16 fp16 scales and 16 zero points (and 16 bytes of padding): 64 bytes per group where
   the plain rows take 48. Low nibbles meet the even columns' activations, high the odd ones'
   (quantized_activations' split layout), 4 bytes broadcast at a time. inferlab/quant/int4.py
   builds the tiles. */
VNNI INLINE void int4_tile_rows(const int8_t *xe, const int8_t *xo, const float *xs, const int32_t *xsum,
                                const float *act, int K, int G, int group_size, const uint8_t *tile, float *y,
                                int N, int t, int m0, const int MR, const uint8_t *nf4_table) {
    const int blocks = group_size / 32, half = K / 2, group_bytes = blocks * 256 + 64;
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i table = nf4_table ? _mm512_loadu_si512(nf4_table) : low;
    __m512 acc[6], zacc[6];
    for (int j = 0; j < MR; j++) { acc[j] = _mm512_setzero_ps(); zacc[j] = _mm512_setzero_ps(); }
    for (int g = 0; g < G; g++) {
        const uint8_t *p = tile + (size_t)g * group_bytes;
        __m512i dl[6];
        for (int j = 0; j < MR; j++) dl[j] = _mm512_setzero_si512();
        for (int blk = 0; blk < blocks; blk++) {
            const uint8_t *c = p + blk * 256;
            if (m0 == 0) PREFETCH_AHEAD(c, 256);
            __m512i lo[4], hi[4];
            for (int i = 0; i < 4; i++) {
                const __m512i v = _mm512_loadu_si512(c + 64 * i);
                lo[i] = _mm512_and_si512(v, low);
                hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                if (nf4_table) {  /* NF4: each nibble indexes the table (vpshufb: 64 lookups an instruction) */
                    lo[i] = _mm512_shuffle_epi8(table, lo[i]);
                    hi[i] = _mm512_shuffle_epi8(table, hi[i]);
                }
            }
            const size_t col = (size_t)g * (group_size / 2) + blk * 16;  /* this block's first byte in xe/xo */
            for (int j = 0; j < MR; j++) {  /* the block's products in two short chains, added to the row's group sum */
                const int8_t *e = xe + (size_t)(m0 + j) * half + col, *o = xo + (size_t)(m0 + j) * half + col;
                __m512i tl = _mm512_setzero_si512(), th = _mm512_setzero_si512();
                for (int i = 0; i < 4; i++) {
                    int32_t x_e, x_o;
                    memcpy(&x_e, e + 4 * i, 4);
                    memcpy(&x_o, o + 4 * i, 4);
                    tl = _mm512_dpbusd_epi32(tl, lo[i], _mm512_set1_epi32(x_e));
                    th = _mm512_dpbusd_epi32(th, hi[i], _mm512_set1_epi32(x_o));
                }
                dl[j] = _mm512_add_epi32(dl[j], _mm512_add_epi32(tl, th));
            }
        }
        if (nf4_table) {  /* sum_k t_k xq_k = sum_k (t_k + 128) xq_k - 128 sum_k xq_k, exact in int32; then absmax / 127 */
            const __m512 s = _mm512_loadu_ps((const float *)(p + blocks * 256));
            for (int j = 0; j < MR; j++) {
                const __m512i dot = _mm512_sub_epi32(dl[j], _mm512_set1_epi32(128 * xsum[(size_t)(m0 + j) * G + g]));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(xs[(size_t)(m0 + j) * G + g])), acc[j]);
            }
            continue;
        }
        const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + blocks * 256)));
        const __m512 sz = _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + blocks * 256 + 32)))));
        for (int j = 0; j < MR; j++) {  /* sum_k (q - z) s xs xq = s xs (sum_k q xq) - s z xs (sum_k xq) */
            const float *a = act + 2 * ((size_t)(m0 + j) * G + g);  /* xs, xs * sum xq */
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dl[j]), _mm512_mul_ps(s, _mm512_set1_ps(a[0])), acc[j]);
            zacc[j] = _mm512_fmadd_ps(sz, _mm512_set1_ps(a[1]), zacc[j]);
        }
    }
    for (int j = 0; j < MR; j++) _mm512_storeu_ps(y + (size_t)(m0 + j) * N + 16 * t, _mm512_sub_ps(acc[j], zacc[j]));
}

/* INT4's and NF4's tiles (nf4_table NULL for INT4): the activations quantized per group, split into
   even and odd columns, then the tiles split over the threads. */
VNNI static inline __attribute__((always_inline)) int group_tiles_gemv(
        const float *x, int M, int K, const uint8_t *tiles, int N, int group_size, float *y, int nthreads,
        const uint8_t *nf4_table) {
    const int G = K / group_size, T = N / 16, half = K / 2;
    const size_t tile_bytes = (size_t)G * ((group_size / 32) * 256 + 64);
    int8_t *xe; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, group_size, 127, 1, 0, (void **)&xe, &xs, &xsum)) return -1;
    float *act = nf4_table ? NULL : block_constants(xs, xsum, (size_t)M * G);  /* INT4's zero points read them */
    if (!nf4_table && !act) { free_activations(xe, xs, xsum); return -1; }
    const int8_t *xo = xe + (size_t)M * half;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < T; t++) {
#define GROUP_TILE_ROWS(R) int4_tile_rows(xe, xo, xs, xsum, act, K, G, group_size, tiles + (size_t)t * tile_bytes, y, N, t, m0, R, nf4_table)
        ROW_CHUNKS6(M, GROUP_TILE_ROWS);
    }
    free(act);
    free_activations(xe, xs, xsum);
    return 0;
}

VNNI int inferlab_int4_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, int group_size,
                                  float *y, int nthreads) {
    return group_tiles_gemv(x, M, K, tiles, N, group_size, y, nthreads, NULL);
}

/* NF4 in INT4's tiles (inferlab/quant/nf4.py builds them): the buffer starts with the 64-byte code
   table (below), then each tile of 16 outputs holds, for each block, its codes as INT4's groups do
   (low nibble: the even column) and the block's 16 absmax / 127 as float32. */
VNNI int inferlab_nf4_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, int blocksize,
                                 float *y, int nthreads) {
    return group_tiles_gemv(x, M, K, tiles + 64, N, blocksize, y, nthreads, tiles);
}

/* Q8_0: 34-byte blocks (d, 32 int8 codes), w = q * d. sum q (xq + 128) - 128 sum q = sum q xq. */
VNNI INLINE void q8_0_rows(const uint8_t *xu, const float *xs, int K, int B, const uint8_t *row, int row_bytes,
                           float *y, int N, int n, int m0, const int MR) {
    const __m256i ones = _mm256_set1_epi8(1);
    __m256 acc[4];
    for (int j = 0; j < MR; j++) acc[j] = _mm256_setzero_ps();
    for (int b = 0; b < B; b++) {
        const uint8_t *blk = row + b * 34;
        if (m0 == 0) _mm_prefetch((const char *)(blk + (size_t)PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 2));
        const __m256i shift = _mm256_slli_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q), 7);
        const float d = f16_at(blk);
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            __m256i xb = _mm256_loadu_si256((const __m256i *)(xu + (size_t)m * K + b * 32));
            __m256i dot = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), xb, q), shift);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * xs[m * B + b]), acc[j]);
        }
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = hsum256(acc[j]);
}

VNNI int inferlab_q8_0_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    const int B = K / 32, row_bytes = B * 34;
    uint8_t *xu; float *xs;  /* codes + 128: the shift comes back out through the weights' sum */
    if (quantized_activations(x, M, K, 32, 127, 0, 128, (void **)&xu, &xs, NULL)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define Q8_0_ROWS(R) q8_0_rows(xu, xs, K, B, qweight + (size_t)n * row_bytes, row_bytes, y, N, n, m0, R)
        ROW_CHUNKS(M, Q8_0_ROWS);
    }
    free_activations(xu, xs, NULL);
    return 0;
}

/* Q4_0 and Q4_1 share their 16 bytes of nibbles (code i in the low nibble of byte i, code i + 16 in
   its high nibble) after an fp16 d. Q4_0 (18-byte blocks): w = (q - 8) * d. Q4_1 (20 bytes: d, then an
   fp16 min m): w = d * q + m. Either way the constant leaves the integer loop, once per block:
   sum (d q + c) xs xq = d xs sum q xq + c xs sum xq, with c = -8 d or m (llama.cpp's Q8_1
   activation blocks keep xs sum xq as their s for this). */
/* A block's scale d and constant c: w = d * q + c, with c = -8 d (Q4_0) or the stored min m (Q4_1). */
VNNI INLINE void nibble_consts(const uint8_t *blk, const int has_min, float *d_out, float *c_out) {
    const float d = f16_at(blk), c = has_min ? f16_at(blk + 2) : -8.f * d;
    *d_out = d;
    *c_out = c;
}

/* Two blocks (64 weights) per step. Their 32 bytes of nibbles unpack in one 256-bit register into
   [low nibbles of both, high nibbles of both], one lane shuffle lays them out as x lies (block b's
   32 codes, then block b + 1's), and one 512-bit vpdpbusd per row takes all 64. The four fp16
   numbers of the pair (d and m of each block) convert in one instruction and meet the row's
   [xs, xs * sum xq] of both blocks in one multiply: [d0 xs0, c0 xs0 s0, d1 xs1, c1 xs1 s1]; lanes 0
   and 2, spread over the two halves of a 512-bit register, scale the products, and lanes 1 and 3
   add up the constant's share. A block at a time, with the scales, the constant and the fp16
   conversions in scalar code, the loop read Q4_1 at about 30 GB/s on a 2-core EPYC, where Q8_0's
   simpler blocks reach memory speed (68): this one reads it at about 45. An odd last block takes
   a 256-bit step. */
VNNI INLINE void nibble_rows(const uint8_t *xq, const float *act, int K, int B, const uint8_t *row,
                             int row_bytes, float *y, int N, int n, int m0, const int MR, const int has_min) {
    const int block_bytes = has_min ? 20 : 18, codes = has_min ? 4 : 2;
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m512i spread = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    /* [d, c] of each block from its fp16 pair: Q4_1 stores [d, m]; Q4_0 only d, taken twice, c = -8 d */
    const __m128 dc_sign = has_min ? _mm_set1_ps(1.f) : _mm_set_ps(-8.f, 1.f, -8.f, 1.f);
    __m512 acc[4];
    __m128 off[4];
    float tail[4];
    for (int j = 0; j < MR; j++) { acc[j] = _mm512_setzero_ps(); off[j] = _mm_setzero_ps(); tail[j] = 0.f; }
    int b = 0;
    for (; b + 2 <= B; b += 2) {
        const uint8_t *b0 = row + b * block_bytes, *b1 = b0 + block_bytes;
        if (m0 == 0) _mm_prefetch((const char *)(b0 + (size_t)PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
        const __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(b1 + codes)),
                                           _mm_loadu_si128((const __m128i *)(b0 + codes)));
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);  /* lo0 lo1 hi0 hi1 */
        const __m512i q = _mm512_shuffle_i64x2(both, both, 0xD8);                    /* lo0 hi0 lo1 hi1 */
        int32_t h0, h1;
        memcpy(&h0, b0, 4);
        memcpy(&h1, b1, 4);
        __m128i h = _mm_set_epi32(0, 0, h1, h0);                           /* fp16: d0 m0 d1 m1 */
        if (!has_min) h = _mm_shufflelo_epi16(h, _MM_SHUFFLE(2, 2, 0, 0));  /* fp16: d0 d0 d1 d1 */
        const __m128 dc = _mm_mul_ps(_mm_cvtph_ps(h), dc_sign);           /* d0 c0 d1 c1 */
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q,
                                                    _mm512_loadu_si512(xq + (size_t)m * K + b * 32));
            const __m128 p = _mm_mul_ps(dc, _mm_loadu_ps(act + 2 * ((size_t)m * B + b)));
            off[j] = _mm_add_ps(off[j], p);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(p)), acc[j]);
        }
    }
    if (b < B) {
        const uint8_t *blk = row + b * block_bytes;
        const __m128i v = _mm_loadu_si128((const __m128i *)(blk + codes));
        const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), low);  /* values i, then i + 16 */
        float d, c;
        nibble_consts(blk, has_min, &d, &c);
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + (size_t)m * K + b * 32));
            const float *a = act + 2 * ((size_t)m * B + b);
            tail[j] = hsum256(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xb))) * d * a[0] + c * a[1];
        }
    }
    for (int j = 0; j < MR; j++) {
        float o[4];
        _mm_storeu_ps(o, off[j]);
        y[(size_t)(m0 + j) * N + n] = _mm512_reduce_add_ps(acc[j]) + o[1] + o[3] + tail[j];
    }
}


/* Q4_0, Q4_1 (and Q8_0 below) again, with the weights laid out for several rows: tiles of 16 outputs.
   The loops above take one output at a time and reduce its dot product across a register, so every
   (activation row, block of 32) pays a product, a conversion, a lane shuffle and a multiply-add,
   about 4 instructions per row per 32 weights: at 5 rows the arithmetic, not the memory, sets the
   time. llama.cpp's CPU backend repacks Q4_0 for the same reason (its "x8" interleaved blocks). Here
   a tile holds, for each block of 32 columns, the 16 outputs' codes interleaved 4 bytes at a time:
   register i (64 bytes) is bytes 4i..4i+3 of each output's 16 code bytes, so its low nibbles are
   columns 4i..4i+3 of the 16 outputs, its high nibbles columns 16+4i..16+4i+3. One vpdpbusd meets
   them with 4 activation bytes broadcast to every lane: 16 outputs advance at once, and a block is 8
   of these per row, with the outputs' scales (and Q4_1's mins) applied as one vector of 16. Then d
   [16] and (Q4_1) m [16] as fp16: 288 or 320 bytes, the same bytes as 16 blocks of the plain layout.
   inferlab/quant/ggml.py builds the tiles (block_tiles) from the plain rows. */
VNNI INLINE void nibble_tile_rows(const uint8_t *xq, const float *act, int K, int B, const uint8_t *tile,
                                  float *y, int N, int t, int m0, const int MR, const int has_min) {
    const int tile_bytes = has_min ? 320 : 288;
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[6], cacc[6];
    for (int j = 0; j < MR; j++) { acc[j] = _mm512_setzero_ps(); cacc[j] = _mm512_setzero_ps(); }
    for (int b = 0; b < B; b++) {
        const uint8_t *p = tile + (size_t)b * tile_bytes;
        if (m0 == 0) PREFETCH_AHEAD(p, tile_bytes);
        __m512i lo[4], hi[4];
        for (int i = 0; i < 4; i++) {
            const __m512i v = _mm512_loadu_si512(p + 64 * i);
            lo[i] = _mm512_and_si512(v, low);
            hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 256)));
        const __m512 c = has_min ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 288)))
                                 : _mm512_mul_ps(d, _mm512_set1_ps(-8.f));
        for (int j = 0; j < MR; j++) {
            const uint8_t *xb = xq + (size_t)(m0 + j) * K + b * 32;
            __m512i dl = _mm512_setzero_si512(), dh = _mm512_setzero_si512();
            for (int i = 0; i < 4; i++) {
                int32_t x_lo, x_hi;
                memcpy(&x_lo, xb + 4 * i, 4);
                memcpy(&x_hi, xb + 16 + 4 * i, 4);
                dl = _mm512_dpbusd_epi32(dl, lo[i], _mm512_set1_epi32(x_lo));
                dh = _mm512_dpbusd_epi32(dh, hi[i], _mm512_set1_epi32(x_hi));
            }
            const float *a = act + 2 * ((size_t)(m0 + j) * B + b);  /* xs, xs * sum xq */
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(dl, dh)), _mm512_mul_ps(d, _mm512_set1_ps(a[0])), acc[j]);
            cacc[j] = _mm512_fmadd_ps(c, _mm512_set1_ps(a[1]), cacc[j]);
        }
    }
    for (int j = 0; j < MR; j++) _mm512_storeu_ps(y + (size_t)(m0 + j) * N + 16 * t, _mm512_add_ps(acc[j], cacc[j]));
}

/* Q4_0 and Q4_1 (has_min), plain rows (one output at a time) or tiles of 16 outputs (tiled): the
   activations quantized per block of 32 once, then the outputs split over the threads. */
VNNI static inline __attribute__((always_inline)) int nibble_gemv(
        const float *x, int M, int K, const uint8_t *w, int N, float *y, int nthreads, const int has_min, const int tiled) {
    const int B = K / 32, row_bytes = B * (has_min ? 20 : 18);
    uint8_t *xq; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, &xsum)) return -1;
    float *act = block_constants(xs, xsum, (size_t)M * B);
    if (!act) { free_activations(xq, xs, xsum); return -1; }
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int u = 0; u < (tiled ? N / 16 : N); u++) {  /* u: an output, or a tile of 16 (16 rows' bytes) */
#define NIBBLE_TILE_ROWS(R) nibble_tile_rows(xq, act, K, B, w + (size_t)u * 16 * row_bytes, y, N, u, m0, R, has_min)
#define NIBBLE_ROWS(R) nibble_rows(xq, act, K, B, w + (size_t)u * row_bytes, row_bytes, y, N, u, m0, R, has_min)
        if (tiled) ROW_CHUNKS6(M, NIBBLE_TILE_ROWS); else ROW_CHUNKS(M, NIBBLE_ROWS);
    }
    free(act);
    free_activations(xq, xs, xsum);
    return 0;
}

VNNI int inferlab_q4_0_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    return nibble_gemv(x, M, K, qweight, N, y, nthreads, 0, 0);
}

VNNI int inferlab_q4_1_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    return nibble_gemv(x, M, K, qweight, N, y, nthreads, 1, 0);
}

VNNI int inferlab_q4_0_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, float *y, int nthreads) {
    return nibble_gemv(x, M, K, tiles, N, y, nthreads, 0, 1);
}

VNNI int inferlab_q4_1_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, float *y, int nthreads) {
    return nibble_gemv(x, M, K, tiles, N, y, nthreads, 1, 1);
}

/* Q8_0 in the same tiles: per block, 8 registers of 64 bytes (bytes 4i..4i+3 of each of the 16
   outputs' 32 codes), then the 16 fp16 scales: 544 bytes, as 16 plain blocks. The codes are signed,
   so the activations take the unsigned side (codes + 128) and the 128 sum q each output gains comes
   back out: summed once per tile and block (vpdpbusd with ones), shared by every row. */
VNNI INLINE void q8_0_tile_rows(const uint8_t *xu, const float *xs, int K, int B, const uint8_t *tile,
                                float *y, int N, int t, int m0, const int MR) {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512 acc[6];
    for (int j = 0; j < MR; j++) acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < B; b++) {
        const uint8_t *p = tile + (size_t)b * 544;
        if (m0 == 0) PREFETCH_AHEAD(p, 544);
        __m512i w[8], wsum = _mm512_setzero_si512();
        for (int i = 0; i < 8; i++) {
            w[i] = _mm512_loadu_si512(p + 64 * i);
            wsum = _mm512_dpbusd_epi32(wsum, ones, w[i]);
        }
        const __m512i shift = _mm512_slli_epi32(wsum, 7);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 512)));
        for (int j = 0; j < MR; j++) {
            const uint8_t *xb = xu + (size_t)(m0 + j) * K + b * 32;
            __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
            for (int i = 0; i < 8; i += 2) {
                int32_t x0, x1;
                memcpy(&x0, xb + 4 * i, 4);
                memcpy(&x1, xb + 4 * i + 4, 4);
                d0 = _mm512_dpbusd_epi32(d0, _mm512_set1_epi32(x0), w[i]);
                d1 = _mm512_dpbusd_epi32(d1, _mm512_set1_epi32(x1), w[i + 1]);
            }
            const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(d0, d1), shift);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(xs[(size_t)(m0 + j) * B + b])), acc[j]);
        }
    }
    for (int j = 0; j < MR; j++) _mm512_storeu_ps(y + (size_t)(m0 + j) * N + 16 * t, acc[j]);
}

VNNI int inferlab_q8_0_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, float *y, int nthreads) {
    const int B = K / 32, T = N / 16;
    uint8_t *xu; float *xs;
    if (quantized_activations(x, M, K, 32, 127, 0, 128, (void **)&xu, &xs, NULL)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < T; t++) {
#define Q8_0_TILE_ROWS(R) q8_0_tile_rows(xu, xs, K, B, tiles + (size_t)t * B * 544, y, N, t, m0, R)
        ROW_CHUNKS6(M, Q8_0_TILE_ROWS);
    }
    free_activations(xu, xs, NULL);
    return 0;
}

/* Q4_K: 144-byte super-blocks of 256 (d, dmin, 12 bytes of 6-bit sub-block scales and mins, 128
   bytes of codes); sub-block j of 32 has w = d * sc_j * q - dmin * m_j, and 32-byte chunk i holds
   sub-block 2i in its low nibbles and 2i + 1 in its high ones (inferlab/quant/ggml.py). */
VNNI INLINE void q4_k_rows(const uint8_t *xq, const float *xs, const int32_t *xsum, int K, int S, const uint8_t *row,
                           int row_bytes, float *y, int N, int n, int m0, const int MR) {
    const int B = K / 32;
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[4];
    float mins[4];
    for (int r = 0; r < MR; r++) { acc[r] = _mm256_setzero_ps(); mins[r] = 0.f; }
    for (int s = 0; s < S; s++) {
        const uint8_t *sb = row + s * 144, *q6 = sb + 4;
        if (m0 == 0) {
            _mm_prefetch((const char *)(sb + (size_t)PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
            _mm_prefetch((const char *)(sb + 64 + (size_t)PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
            _mm_prefetch((const char *)(sb + 128 + (size_t)PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
        }
        const float d = f16_at(sb), dmin = f16_at(sb + 2);
        for (int i = 0; i < 4; i++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(sb + 16 + 32 * i));
            for (int h = 0; h < 2; h++) {
                const int j = 2 * i + h, blk = s * 8 + j;
                int sc, mn;
                q4_k_scale_min(q6, j, &sc, &mn);
                const __m256i q = h ? _mm256_and_si256(_mm256_srli_epi16(v, 4), low) : _mm256_and_si256(v, low);
                for (int r = 0; r < MR; r++) {
                    const int m = m0 + r;
                    __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + (size_t)m * K + blk * 32));
                    __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xb);
                    const float xsb = xs[m * B + blk];
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * sc * xsb), acc[r]);
                    mins[r] += dmin * mn * xsb * (float)xsum[m * B + blk];
                }
            }
        }
    }
    for (int r = 0; r < MR; r++) y[(size_t)(m0 + r) * N + n] = hsum256(acc[r]) - mins[r];
}

VNNI int inferlab_q4_k_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    const int S = K / 256, row_bytes = S * 144;
    uint8_t *xq; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, &xsum)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define Q4_K_ROWS(R) q4_k_rows(xq, xs, xsum, K, S, qweight + (size_t)n * row_bytes, row_bytes, y, N, n, m0, R)
        ROW_CHUNKS(M, Q4_K_ROWS);
    }
    free_activations(xq, xs, xsum);
    return 0;
}

/* Q4_K in tiles of 16 outputs (as Q4_1's above; why there). Per super-block of 256 columns: its 4
   chunks of 64 columns as 8 registers of [16 outputs x 4 code bytes] (bytes 4r..4r+3 of each output's
   32 chunk bytes: low nibbles sub-block 2i, high 2i + 1, as in the plain rows), then the 16 outputs'
   fp16 d and dmin, and their 6-bit sub-block scales and mins unpacked to a byte each, as
   [8 sub-blocks x 16 outputs]: 2368 bytes where 16 plain super-blocks take 2304. A sub-block's 16
   scales d * sc_j convert once for every row of the chunk; the mins leave the integer loop through
   the activations' sums, as in q4_k_rows. inferlab/quant/ggml.py builds the tiles (block_tiles). */
#define Q4_K_TILE_BYTES 2368
VNNI INLINE void q4_k_tile_rows(const uint8_t *xq, const float *act, int K, int S,
                                const uint8_t *tile, float *y, int N, int t, int m0, const int MR) {
    const int B = K / 32;
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[6], macc[6];
    for (int j = 0; j < MR; j++) { acc[j] = _mm512_setzero_ps(); macc[j] = _mm512_setzero_ps(); }
    for (int s = 0; s < S; s++) {
        const uint8_t *p = tile + (size_t)s * Q4_K_TILE_BYTES, *nums = p + 2048;
        if (m0 == 0) PREFETCH_AHEAD(p, Q4_K_TILE_BYTES);
        for (int i = 0; i < 4; i++) {  /* columns 64i..64i + 63: sub-blocks 2i (low nibbles) and 2i + 1 (high) */
            const uint8_t *c = p + 512 * i;
            /* one register of codes at a time, met by every row: the rows' sums, not the chunk's 16
               registers of codes, stay in registers, so 6 rows fit */
            __m512i dl[6], dh[6];
            for (int j = 0; j < MR; j++) { dl[j] = _mm512_setzero_si512(); dh[j] = _mm512_setzero_si512(); }
            for (int r = 0; r < 8; r++) {
                const __m512i v = _mm512_loadu_si512(c + 64 * r);
                const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                for (int j = 0; j < MR; j++) {
                    const uint8_t *xb = xq + (size_t)(m0 + j) * K + s * 256 + 64 * i;
                    int32_t x_lo, x_hi;
                    memcpy(&x_lo, xb + 4 * r, 4);
                    memcpy(&x_hi, xb + 32 + 4 * r, 4);
                    dl[j] = _mm512_dpbusd_epi32(dl[j], lo, _mm512_set1_epi32(x_lo));
                    dh[j] = _mm512_dpbusd_epi32(dh[j], hi, _mm512_set1_epi32(x_hi));
                }
            }
#define SUB_BYTES(at, j) _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(nums + (at) + 16 * (j)))))
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)nums));
            const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(nums + 32)));
            const __m512 sl = _mm512_mul_ps(d, SUB_BYTES(64, 2 * i)), sh = _mm512_mul_ps(d, SUB_BYTES(64, 2 * i + 1));
            const __m512 ml = _mm512_mul_ps(dmin, SUB_BYTES(192, 2 * i)), mh = _mm512_mul_ps(dmin, SUB_BYTES(192, 2 * i + 1));
            for (int j = 0; j < MR; j++) {
                const float *a = act + 2 * ((size_t)(m0 + j) * B + s * 8 + 2 * i);  /* sub-blocks 2i, 2i + 1: [xs, xs * sum xq] each */
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dl[j]), _mm512_mul_ps(sl, _mm512_set1_ps(a[0])), acc[j]);
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dh[j]), _mm512_mul_ps(sh, _mm512_set1_ps(a[2])), acc[j]);
                macc[j] = _mm512_fmadd_ps(ml, _mm512_set1_ps(a[1]), macc[j]);
                macc[j] = _mm512_fmadd_ps(mh, _mm512_set1_ps(a[3]), macc[j]);
            }
#undef SUB_BYTES
        }
    }
    for (int j = 0; j < MR; j++) _mm512_storeu_ps(y + (size_t)(m0 + j) * N + 16 * t, _mm512_sub_ps(acc[j], macc[j]));
}

VNNI int inferlab_q4_k_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, float *y, int nthreads) {
    const int S = K / 256;
    uint8_t *xq; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, &xsum)) return -1;
    float *act = block_constants(xs, xsum, (size_t)M * (K / 32));
    if (!act) { free_activations(xq, xs, xsum); return -1; }
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < N / 16; t++) {
#define Q4_K_TILE_ROWS(R) q4_k_tile_rows(xq, act, K, S, tiles + (size_t)t * S * Q4_K_TILE_BYTES, y, N, t, m0, R)
        ROW_CHUNKS6(M, Q4_K_TILE_ROWS);
    }
    free(act);
    free_activations(xq, xs, xsum);
    return 0;
}

/* NF4 (bitsandbytes' layout): byte i of the flattened weight holds code 2i in its high nibble and
   2i + 1 in its low one, blocks of `blocksize` values (a multiple of 32 dividing K) share a float
   absmax. The 16 code values become integers, t = round(127 * code) (llama.cpp's IQ4_NL keeps its
   non-linear 4-bit codes the same way), so NF4 runs on vpdpbusd like INT4: vpshufb looks 32 codes up
   at once in `table`, which holds t + 128 (unsigned, for vpdpbusd's unsigned side) once per 128-bit
   lane, 64 bytes; the activations are quantized per block of the weight, split into even and odd
   columns, and the 128 leaves the sum exactly: sum_k t_k xq_k = sum_k (t_k + 128) xq_k - 128 sum_k xq_k.
   A weight's code value moves by at most 1/254 of its block's absmax, against NF4's own steps of
   0.08 to 0.3 of it. inferlab/quant/nf4.py builds the table. */
VNNI INLINE void nf4_rows(const int8_t *xe, const int8_t *xo, const float *xs, int K, int blocksize,
                          const uint8_t *row, const float *absmax, const uint8_t *table_bytes,
                          float *y, int N, int n, int m0, const int MR) {
    const int half = K / 2, blocks = K / blocksize;
    /* here t goes back to signed (xor 128) and meets x as AVX2's sign trick does, |t| on the unsigned
       side and x carrying t's sign: each lane's sum is then its own products', with no 128 sum xq to
       take out of one lane, which float would round in the sum of the lanes */
    const __m256i table = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)table_bytes), _mm256_set1_epi8((char)0x80));
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[4];
    for (int j = 0; j < MR; j++) acc[j] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        __m256i dot[4];
        for (int j = 0; j < MR; j++) dot[j] = _mm256_setzero_si256();
        for (int off = b * blocksize / 2; off < (b + 1) * blocksize / 2; off += 16) {  /* 32 weights a step */
            if (m0 == 0 && off % 64 == 0) _mm_prefetch((const char *)(row + (size_t)PREFETCH_ROWS * half + off), _MM_HINT_T0);
            const __m256i v = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(row + off)));
            const __m256i we = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
            const __m256i wo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, low));
            const __m256i ae = _mm256_abs_epi8(we), ao = _mm256_abs_epi8(wo);
            for (int j = 0; j < MR; j++) {
                const size_t at = (size_t)(m0 + j) * half + off;
                const __m256i e = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(xe + at)));
                const __m256i o = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(xo + at)));
                dot[j] = _mm256_dpbusd_epi32(dot[j], ae, _mm256_sign_epi8(e, we));
                dot[j] = _mm256_dpbusd_epi32(dot[j], ao, _mm256_sign_epi8(o, wo));
            }
        }
        const float s = absmax[b] * (1.f / 127.f);
        for (int j = 0; j < MR; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j]), _mm256_set1_ps(s * xs[(size_t)(m0 + j) * blocks + b]), acc[j]);
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = hsum256(acc[j]);
}

VNNI int inferlab_nf4_gemv(const float *x, int M, int K, const uint8_t *qweight, const float *absmax,
                           const uint8_t *table, int N, int blocksize, float *y, int nthreads) {
    const int half = K / 2, blocks = K / blocksize;
    int8_t *xe; float *xs;
    if (quantized_activations(x, M, K, blocksize, 127, 1, 0, (void **)&xe, &xs, NULL)) return -1;
    const int8_t *xo = xe + (size_t)M * half;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define NF4_ROWS(R) nf4_rows(xe, xo, xs, K, blocksize, qweight + (size_t)n * half, absmax + (size_t)n * blocks, \
                             table, y, N, n, m0, R)
        ROW_CHUNKS(M, NF4_ROWS);
    }
    free_activations(xe, xs, NULL);
    return 0;
}

#ifndef INFERLAB_PORTABLE
/* The CPU's peak rate of 8-bit multiply-adds, for `inferlab bench rows`: `iters` rounds of 12
   independent vpdpbusd chains per thread (enough to hide the instruction's latency), no memory.
   Returns the multiply-adds done; the caller times the call. A loop over quantized weights can do
   no better than this rate, so k rows' multiply-adds over it is the least k rows can cost. */
static volatile long peak_sink;
VNNI long inferlab_peak_int8_macs(long iters, int nthreads) {
    long sink = 0;
    int threads = 0;  /* the threads the region got: each did iters rounds */
    #pragma omp parallel num_threads(nthreads) reduction(+:sink, threads)
    {
        threads += 1;
        __m512i a[12], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
        for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
        for (long it = 0; it < iters; it++) {
            for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
            __asm__ volatile("" : "+v"(w), "+v"(x));  /* the inputs may change: no folding the chains */
        }
        __m512i s = a[0];
        for (int i = 1; i < 12; i++) s = _mm512_add_epi32(s, a[i]);
        sink += _mm512_reduce_add_epi32(s);
    }
    peak_sink = sink;  /* kept: the chains' sums must be used */
    return iters * 12L * 64L * threads;
}
#endif
