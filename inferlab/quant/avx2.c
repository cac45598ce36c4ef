/* Decode loops for every quantized format on x86 CPUs with AVX2 and no AVX-512 VNNI (most laptops,
   many servers): the loops of vnni.c, row for row and over the same tiles of 16 outputs (at the
   end of this file), with AVX2's integer products in place of VNNI's.

   vnni.c's vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes and adds each four products
   into an int32 lane in one instruction. AVX2 takes two for 32 bytes, as llama.cpp's quants.c does:
   vpmaddubsw multiplies 32 unsigned by 32 signed bytes and adds neighbouring pairs into 16 int16
   lanes, and vpmaddwd by ones adds neighbouring int16 into 8 int32 lanes. vpmaddubsw saturates at
   32767, so each pair must stay below it:
   - 4-bit codes (0..15) against int8 activations (|x| <= 127): 2 * 15 * 127 = 3810, always exact,
     and two such pair sums still fit an int16 (INT4 adds its low and high nibbles before widening);
   - int8 weights against int8 activations (Q8_0): exact only through the sign trick, |w| on the
     unsigned side and x carrying w's sign (vpsignb), at most 2 * 128 * 127 = 32512.
   INT8 keeps int16 activations (see vnni.c): vpmaddwd multiplies them by the widened weights
   directly. NF4 looks its codes up as int8 (vpshufb) and multiplies them by the sign trick.

   Each loop has the same name and arguments as its vnni.c twin, so inferlab/quant/vnni.py loads
   whichever build the CPU runs; the activations are quantized by the same loops.h. Each
   function returns 0, or -1 when it could not allocate its small activation buffers. */
#include <immintrin.h>
#include "loops.h"  /* quantized_activations, free_activations, ROW_CHUNKS, INLINE, q4_k_scale_min */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PREFETCH_ROWS 8  /* as in vnni.c: ask for the codes of the row this many ahead */
#define AVX2 __attribute__((target("avx2,fma,f16c")))

int inferlab_avx2_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

AVX2 static inline float f16_at(const uint8_t *p) {
    return _cvtsh_ss((uint16_t)(p[0] | (p[1] << 8)));
}

AVX2 static inline float hsum256(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* 8 int32 lanes that add up to sum_i u_i s_i over 32 unsigned u and signed s bytes (pairs exact:
   see the top of the file). */
AVX2 INLINE __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* INT8: q [N, K] int8, fp16 scales [N]; x [M, K] -> y [M, N], K % 32 == 0, int16 activations per
   block of 32. 32 weights widen to int16 in two registers and meet each row in two vpmaddwd. */
AVX2 INLINE void int8_rows(const int16_t *xq, const float *xs, int K, int B, const int8_t *row, float s,
                           float *y, int N, int n, int m0, const int MR) {
    __m256 acc[4];
    for (int j = 0; j < MR; j++) acc[j] = _mm256_setzero_ps();
    for (int b = 0; b < B; b++) {
        if (m0 == 0) _mm_prefetch((const char *)(row + (size_t)PREFETCH_ROWS * K + b * 32), _MM_HINT_T0);
        const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(row + b * 32)));
        const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(row + b * 32 + 16)));
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const int16_t *xb = xq + (size_t)m * K + b * 32;
            const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)xb)),
                                                 _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(xb + 16))));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(xs[m * B + b]), acc[j]);
        }
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = hsum256(acc[j]) * s;
}

AVX2 int inferlab_int8_gemv(const float *x, int M, int K, const int8_t *qweight, const uint16_t *scales,
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

/* INT4 (layout of vnni.c's INT4): 32 bytes hold 64 weights, low nibbles the even columns, high the
   odd; activations int8 per group, split even / odd. Both nibbles' pair sums are added in int16
   (at most 4 * 15 * 127) before one widening per row. */
AVX2 INLINE void int4_rows(const int8_t *xe, const int8_t *xo, const float *xs, const int32_t *xsum, int K, int G,
                           int group_size, const uint8_t *row, const uint16_t *scales, const uint8_t *zeros,
                           float *y, int N, int n, int m0, const int MR) {
    const int chunks = group_size / 64, half = K / 2;
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    float zero_part[4];
    for (int j = 0; j < MR; j++) { acc[j] = _mm256_setzero_ps(); zero_part[j] = 0.f; }
    for (int g = 0; g < G; g++) {
        __m256i dot[4];
        for (int j = 0; j < MR; j++) dot[j] = _mm256_setzero_si256();
        for (int c = 0; c < chunks; c++) {
            const int off = g * (group_size / 2) + c * 32;
            const __m256i v = _mm256_loadu_si256((const __m256i *)(row + off));
            if (m0 == 0) _mm_prefetch((const char *)(row + (size_t)PREFETCH_ROWS * half + off), _MM_HINT_T0);
            const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            for (int j = 0; j < MR; j++) {
                const size_t at = (size_t)(m0 + j) * half + off;
                const __m256i pairs = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(xe + at))),
                    _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xo + at))));
                dot[j] = _mm256_add_epi32(dot[j], _mm256_madd_epi16(pairs, ones));
            }
        }
        const float s = _cvtsh_ss(scales[g]), z = (float)zeros[g];
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const float sx = s * xs[m * G + g];
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j]), _mm256_set1_ps(sx), acc[j]);
            zero_part[j] += sx * z * (float)xsum[m * G + g];
        }
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = hsum256(acc[j]) - zero_part[j];
}

AVX2 int inferlab_int4_gemv(const float *x, int M, int K, const uint8_t *qweight, const uint16_t *scales,
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

/* Q8_0: 34-byte blocks (fp16 d, 32 int8 codes), w = q * d; signed activation codes. |q| is taken
   once per block, the sign moves onto each row's activations. */
AVX2 INLINE void q8_0_rows(const int8_t *xq, const float *xs, int K, int B, const uint8_t *row, int row_bytes,
                           float *y, int N, int n, int m0, const int MR) {
    __m256 acc[4];
    for (int j = 0; j < MR; j++) acc[j] = _mm256_setzero_ps();
    for (int b = 0; b < B; b++) {
        const uint8_t *blk = row + b * 34;
        if (m0 == 0) _mm_prefetch((const char *)(blk + (size_t)PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 2));
        const __m256i q_abs = _mm256_sign_epi8(q, q);
        const float d = f16_at(blk);
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + (size_t)m * K + b * 32));
            const __m256i dot = dot_u8s8(q_abs, _mm256_sign_epi8(xb, q));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * xs[m * B + b]), acc[j]);
        }
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = hsum256(acc[j]);
}

AVX2 int inferlab_q8_0_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    const int B = K / 32, row_bytes = B * 34;
    int8_t *xq; float *xs;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, NULL)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define Q8_0_ROWS(R) q8_0_rows(xq, xs, K, B, qweight + (size_t)n * row_bytes, row_bytes, y, N, n, m0, R)
        ROW_CHUNKS(M, Q8_0_ROWS);
    }
    free_activations(xq, xs, NULL);
    return 0;
}

/* Q4_0 (18-byte blocks, w = (q - 8) d) and Q4_1 (20 bytes, w = d q + m): 16 bytes of nibbles after
   the fp16 d (and m), code i low in byte i, code i + 16 high; the constant c = -8 d or m leaves the
   integer loop once per block through the activations' sum (see vnni.c). Blocks go in pairs, as in
   vnni.c: the pair's four fp16 numbers convert in one instruction and meet the row's [xs, xs * sum xq]
   of both blocks in one multiply, [d0 xs0, c0 xs0 s0, d1 xs1, c1 xs1 s1], whose lanes 0 and 2 scale
   the two blocks' products and lanes 1 and 3 add up the constant; an odd last block goes alone. */
AVX2 INLINE __m256i nibble_codes(const uint8_t *blk, int codes, __m128i low) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(blk + codes));
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
}

AVX2 INLINE void nibble_rows(const int8_t *xq, const float *act, int K, int B, const uint8_t *row,
                             int row_bytes, float *y, int N, int n, int m0, const int MR, const int has_min) {
    const int block_bytes = has_min ? 20 : 18, codes = has_min ? 4 : 2;
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128 dc_sign = has_min ? _mm_set1_ps(1.f) : _mm_set_ps(-8.f, 1.f, -8.f, 1.f);
    __m256 acc[4];
    __m128 off[4];
    for (int j = 0; j < MR; j++) { acc[j] = _mm256_setzero_ps(); off[j] = _mm_setzero_ps(); }
    int b = 0;
    for (; b + 2 <= B; b += 2) {
        const uint8_t *b0 = row + b * block_bytes, *b1 = b0 + block_bytes;
        if (m0 == 0) _mm_prefetch((const char *)(b0 + (size_t)PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
        const __m256i q0 = nibble_codes(b0, codes, low), q1 = nibble_codes(b1, codes, low);
        int32_t h0, h1;
        memcpy(&h0, b0, 4);
        memcpy(&h1, b1, 4);
        __m128i h = _mm_set_epi32(0, 0, h1, h0);                           /* fp16: d0 m0 d1 m1 */
        if (!has_min) h = _mm_shufflelo_epi16(h, _MM_SHUFFLE(2, 2, 0, 0));  /* fp16: d0 d0 d1 d1 */
        const __m128 dc = _mm_mul_ps(_mm_cvtph_ps(h), dc_sign);           /* d0 c0 d1 c1 */
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const int8_t *xb = xq + (size_t)m * K + b * 32;
            const __m128 p = _mm_mul_ps(dc, _mm_loadu_ps(act + 2 * ((size_t)m * B + b)));
            off[j] = _mm_add_ps(off[j], p);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(q0, _mm256_loadu_si256((const __m256i *)xb))),
                                     _mm256_broadcastss_ps(p), acc[j]);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(q1, _mm256_loadu_si256((const __m256i *)(xb + 32)))),
                                     _mm256_broadcastss_ps(_mm_movehl_ps(p, p)), acc[j]);
        }
    }
    float tail[4] = {0.f, 0.f, 0.f, 0.f};
    if (b < B) {
        const uint8_t *blk = row + b * block_bytes;
        const __m256i q = nibble_codes(blk, codes, low);
        const float d = f16_at(blk), c = has_min ? f16_at(blk + 2) : -8.f * d;
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + (size_t)m * K + b * 32));
            const float *a = act + 2 * ((size_t)m * B + b);
            tail[j] = hsum256(_mm256_cvtepi32_ps(dot_u8s8(q, xb))) * d * a[0] + c * a[1];
        }
    }
    for (int j = 0; j < MR; j++) {
        float o[4];
        _mm_storeu_ps(o, off[j]);
        y[(size_t)(m0 + j) * N + n] = hsum256(acc[j]) + o[1] + o[3] + tail[j];
    }
}

AVX2 INLINE int nibble_blocks_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y,
                                   int nthreads, const int has_min) {
    const int B = K / 32, row_bytes = B * (has_min ? 20 : 18);
    int8_t *xq; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, &xsum)) return -1;
    float *act = block_constants(xs, xsum, (size_t)M * B);
    if (!act) { free_activations(xq, xs, xsum); return -1; }
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define NIBBLE_ROWS(R) nibble_rows(xq, act, K, B, qweight + (size_t)n * row_bytes, row_bytes, y, N, n, m0, R, has_min)
        ROW_CHUNKS(M, NIBBLE_ROWS);
    }
    free(act);
    free_activations(xq, xs, xsum);
    return 0;
}

AVX2 int inferlab_q4_0_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    return nibble_blocks_gemv(x, M, K, qweight, N, y, nthreads, 0);
}

AVX2 int inferlab_q4_1_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    return nibble_blocks_gemv(x, M, K, qweight, N, y, nthreads, 1);
}

/* Q4_K: 144-byte super-blocks of 256 (d, dmin, 12 bytes of 6-bit sub-block scales and mins, 128
   bytes of codes), sub-block j of 32: w = d sc_j q - dmin m_j; chunk i holds sub-block 2i low and
   2i + 1 high (inferlab/quant/ggml.py). */
AVX2 INLINE void q4_k_rows(const int8_t *xq, const float *xs, const int32_t *xsum, int K, int S, const uint8_t *row,
                           int row_bytes, float *y, int N, int n, int m0, const int MR) {
    const int B = K / 32;
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[4];
    float mins[4];
    for (int r = 0; r < MR; r++) { acc[r] = _mm256_setzero_ps(); mins[r] = 0.f; }
    for (int s = 0; s < S; s++) {
        const uint8_t *sb = row + s * 144, *q6 = sb + 4;
        if (m0 == 0)
            for (int p = 0; p < 144; p += 64) _mm_prefetch((const char *)(sb + p + (size_t)PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
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
                    const __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + (size_t)m * K + blk * 32));
                    const float xsb = xs[m * B + blk];
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(q, xb)), _mm256_set1_ps(d * sc * xsb), acc[r]);
                    mins[r] += dmin * mn * xsb * (float)xsum[m * B + blk];
                }
            }
        }
    }
    for (int r = 0; r < MR; r++) y[(size_t)(m0 + r) * N + n] = hsum256(acc[r]) - mins[r];
}

AVX2 int inferlab_q4_k_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    const int S = K / 256, row_bytes = S * 144;
    int8_t *xq; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, &xsum)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define Q4_K_ROWS(R) q4_k_rows(xq, xs, xsum, K, S, qweight + (size_t)n * row_bytes, row_bytes, y, N, n, m0, R)
        ROW_CHUNKS(M, Q4_K_ROWS);
    }
    free_activations(xq, xs, xsum);
    return 0;
}

/* NF4 (bitsandbytes' layout, see vnni.c): byte i holds code 2i high and 2i + 1 low; the codes index
   vnni.c's table of t + 128, t = round(127 * code). vpmaddubsw's pair sums would overflow with t + 128
   on its unsigned side (2 * 255 * 127), so here t goes back to signed (xor 128) and the sign trick of
   Q8_0 multiplies: |t| unsigned against x carrying t's sign, exact, the same integer sums as vnni.c. */
AVX2 INLINE __m256i signed_dot(__m256i w, __m256i x) {  /* 8 int32 lanes: each the sum of 4 products w x */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

AVX2 INLINE __m256i nf4_signed_table(const uint8_t *table) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)table), _mm256_set1_epi8((char)0x80));
}

AVX2 INLINE void nf4_rows(const int8_t *xe, const int8_t *xo, const float *xs, int K, int blocksize,
                          const uint8_t *row, const float *absmax, const uint8_t *table_bytes,
                          float *y, int N, int n, int m0, const int MR) {
    const int half = K / 2, blocks = K / blocksize;
    const __m256i table = nf4_signed_table(table_bytes), low = _mm256_set1_epi8(0x0F);
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
            for (int j = 0; j < MR; j++) {
                const size_t at = (size_t)(m0 + j) * half + off;
                dot[j] = _mm256_add_epi32(dot[j], signed_dot(we, _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(xe + at)))));
                dot[j] = _mm256_add_epi32(dot[j], signed_dot(wo, _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(xo + at)))));
            }
        }
        const float s = absmax[b] * (1.f / 127.f);
        for (int j = 0; j < MR; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j]), _mm256_set1_ps(s * xs[(size_t)(m0 + j) * blocks + b]), acc[j]);
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = hsum256(acc[j]);
}

AVX2 int inferlab_nf4_gemv(const float *x, int M, int K, const uint8_t *qweight, const float *absmax,
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

/* The loops over tiles of 16 outputs (vnni.c: why, and the layouts, which inferlab/quant/ggml.py,
   int8.py and int4.py build). A tile's 64-byte registers hold 16 outputs x 4 bytes; AVX2's 32-byte
   registers take 8 outputs, so each tile runs as two halves (h = 0, 1) over the same blocks, the
   second reading them again from L1. Every product of one row with a weight byte is formed once
   per half as on AVX-512, but by AVX2's two-step vpmaddubsw + vpmaddwd, so a row here costs about
   twice its instructions there.
   Q4_0/Q4_1 and INT4: a block's 8 products of 4-bit codes with int8 activations (each pair sum at
   most 2 * 15 * 127 = 3810) add up in int16 (at most 30480), then widen once; the unpacked nibbles
   are shared by the chunk's rows. */
AVX2 INLINE __m256i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* 8 outputs' int32 sums over one block: lo[i] / hi[i] meet 4 activation bytes each, broadcast. */
AVX2 INLINE __m256i nibble_tile_dot(const __m256i *lo, const __m256i *hi, const int8_t *xl, const int8_t *xh) {
    __m256i s = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo[i], bcast4(xl + 4 * i)));
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[i], bcast4(xh + 4 * i)));
    }
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

AVX2 INLINE void nibble_unpack(const uint8_t *p, int h, __m256i *lo, __m256i *hi) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < 4; i++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * i + 32 * h));
        lo[i] = _mm256_and_si256(v, low);
        hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
}

AVX2 INLINE void nibble_tile_rows(const int8_t *xq, const float *act, int K, int B, const uint8_t *tile,
                                  float *y, int N, int t, int m0, const int MR, const int has_min) {
    const int tile_bytes = has_min ? 320 : 288;
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        for (int j = 0; j < MR; j++) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < B; b++) {
            const uint8_t *p = tile + (size_t)b * tile_bytes;
            if (m0 == 0 && h == 0) PREFETCH_AHEAD(p, tile_bytes);
            __m256i lo[4], hi[4];
            nibble_unpack(p, h, lo, hi);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 256 + 16 * h)));
            const __m256 c = has_min ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 288 + 16 * h)))
                                     : _mm256_mul_ps(d, _mm256_set1_ps(-8.f));
            for (int j = 0; j < MR; j++) {
                const int8_t *xb = xq + (size_t)(m0 + j) * K + b * 32;
                const float *a = act + 2 * ((size_t)(m0 + j) * B + b);  /* xs, xs * sum xq */
                const __m256i dot = nibble_tile_dot(lo, hi, xb, xb + 16);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(a[0])), acc[j]);
                acc[j] = _mm256_fmadd_ps(c, _mm256_set1_ps(a[1]), acc[j]);
            }
        }
        for (int j = 0; j < MR; j++) _mm256_storeu_ps(y + (size_t)(m0 + j) * N + 16 * t + 8 * h, acc[j]);
    }
}

AVX2 INLINE int nibble_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, float *y,
                                  int nthreads, const int has_min) {
    const int B = K / 32, tile_bytes = B * (has_min ? 320 : 288);
    int8_t *xq; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, &xsum)) return -1;
    float *act = block_constants(xs, xsum, (size_t)M * B);
    if (!act) { free_activations(xq, xs, xsum); return -1; }
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < N / 16; t++) {
#define NIBBLE_TILE_ROWS(R) nibble_tile_rows(xq, act, K, B, tiles + (size_t)t * tile_bytes, y, N, t, m0, R, has_min)
        ROW_CHUNKS(M, NIBBLE_TILE_ROWS);
    }
    free(act);
    free_activations(xq, xs, xsum);
    return 0;
}

AVX2 int inferlab_q4_0_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, float *y, int nthreads) {
    return nibble_tiles_gemv(x, M, K, tiles, N, y, nthreads, 0);
}

AVX2 int inferlab_q4_1_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, float *y, int nthreads) {
    return nibble_tiles_gemv(x, M, K, tiles, N, y, nthreads, 1);
}

/* INT4 tiles: as Q4_0's blocks, low nibbles against the even columns' activations and high against
   the odd ones'; a group's blocks widen one by one into its int32 sums, then its 16 scales and zero
   points apply (sum (q - z) s xs xq = s xs sum q xq - s z xs sum xq).
   NF4 runs in the same tiles (vnni.c's layout: float absmax / 127 where INT4 keeps its scales and
   zero points), its codes looked up as signed t (nf4_table) and multiplied as in nf4_rows. */
AVX2 INLINE __m256i nf4_tile_dot(const __m256i *lo, const __m256i *hi, const int8_t *xl, const int8_t *xh) {
    __m256i s = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        s = _mm256_add_epi32(s, signed_dot(lo[i], bcast4(xl + 4 * i)));
        s = _mm256_add_epi32(s, signed_dot(hi[i], bcast4(xh + 4 * i)));
    }
    return s;
}

AVX2 INLINE void int4_tile_rows(const int8_t *xe, const int8_t *xo, const float *xs, const int32_t *xsum, int K,
                                int G, int group_size, const uint8_t *tile, float *y, int N, int t, int m0,
                                const int MR, const uint8_t *nf4_table) {
    const int blocks = group_size / 32, half = K / 2, group_bytes = blocks * 256 + 64;
    const __m256i table = nf4_table ? nf4_signed_table(nf4_table) : _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        for (int j = 0; j < MR; j++) acc[j] = _mm256_setzero_ps();
        for (int g = 0; g < G; g++) {
            const uint8_t *p = tile + (size_t)g * group_bytes;
            __m256i dot[4];
            for (int j = 0; j < MR; j++) dot[j] = _mm256_setzero_si256();
            for (int blk = 0; blk < blocks; blk++) {
                const uint8_t *c = p + blk * 256;
                if (m0 == 0 && h == 0) PREFETCH_AHEAD(c, 256);
                __m256i lo[4], hi[4];
                nibble_unpack(c, h, lo, hi);
                if (nf4_table)
                    for (int i = 0; i < 4; i++) { lo[i] = _mm256_shuffle_epi8(table, lo[i]); hi[i] = _mm256_shuffle_epi8(table, hi[i]); }
                const size_t col = (size_t)g * (group_size / 2) + blk * 16;  /* this block's first byte in xe/xo */
                for (int j = 0; j < MR; j++) {
                    const int8_t *e = xe + (size_t)(m0 + j) * half + col, *o = xo + (size_t)(m0 + j) * half + col;
                    dot[j] = _mm256_add_epi32(dot[j], nf4_table ? nf4_tile_dot(lo, hi, e, o) : nibble_tile_dot(lo, hi, e, o));
                }
            }
            const uint8_t *trailer = p + blocks * 256;
            if (nf4_table) {
                const __m256 s = _mm256_loadu_ps((const float *)(trailer + 32 * h));
                for (int j = 0; j < MR; j++)
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j]), _mm256_mul_ps(s, _mm256_set1_ps(xs[(size_t)(m0 + j) * G + g])), acc[j]);
                continue;
            }
            const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(trailer + 16 * h)));
            const __m256 z = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(trailer + 32 + 8 * h))));
            const __m256 sz = _mm256_mul_ps(s, z);
            for (int j = 0; j < MR; j++) {
                const float sx = xs[(size_t)(m0 + j) * G + g];
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j]), _mm256_mul_ps(s, _mm256_set1_ps(sx)), acc[j]);
                acc[j] = _mm256_fnmadd_ps(sz, _mm256_set1_ps(sx * (float)xsum[(size_t)(m0 + j) * G + g]), acc[j]);
            }
        }
        for (int j = 0; j < MR; j++) _mm256_storeu_ps(y + (size_t)(m0 + j) * N + 16 * t + 8 * h, acc[j]);
    }
}

/* INT4's and NF4's tiles (nf4_table NULL for INT4), as vnni.c's group_tiles_gemv. */
AVX2 static inline __attribute__((always_inline)) int group_tiles_gemv(
        const float *x, int M, int K, const uint8_t *tiles, int N, int group_size, float *y, int nthreads,
        const uint8_t *nf4_table) {
    const int G = K / group_size, half = K / 2;
    const size_t tile_bytes = (size_t)G * ((group_size / 32) * 256 + 64);
    int8_t *xe; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, group_size, 127, 1, 0, (void **)&xe, &xs, &xsum)) return -1;
    const int8_t *xo = xe + (size_t)M * half;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < N / 16; t++) {
#define GROUP_TILE_ROWS(R) int4_tile_rows(xe, xo, xs, xsum, K, G, group_size, tiles + (size_t)t * tile_bytes, y, N, t, m0, R, nf4_table)
        ROW_CHUNKS(M, GROUP_TILE_ROWS);
    }
    free_activations(xe, xs, xsum);
    return 0;
}

AVX2 int inferlab_int4_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, int group_size,
                                  float *y, int nthreads) {
    return group_tiles_gemv(x, M, K, tiles, N, group_size, y, nthreads, NULL);
}

AVX2 int inferlab_nf4_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, int blocksize,
                                 float *y, int nthreads) {
    return group_tiles_gemv(x, M, K, tiles + 64, N, blocksize, y, nthreads, tiles);
}

/* Q8_0 tiles: per block 8 registers of [16 outputs x 4 codes], then 16 fp16 scales (544 bytes).
   Signed codes against signed activations through the sign trick of q8_0_rows: |q| once per block
   and half, each row's 4 broadcast bytes taking each code's sign; a pair sum reaches 32512, so
   every product widens before the next adds. */
AVX2 INLINE void q8_0_tile_rows(const int8_t *xq, const float *xs, int K, int B, const uint8_t *tile,
                                float *y, int N, int t, int m0, const int MR) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        for (int j = 0; j < MR; j++) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < B; b++) {
            const uint8_t *p = tile + (size_t)b * 544;
            if (m0 == 0 && h == 0) PREFETCH_AHEAD(p, 544);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 512 + 16 * h)));
            __m256i dot[4];
            for (int j = 0; j < MR; j++) dot[j] = _mm256_setzero_si256();
            for (int i = 0; i < 8; i++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(p + 64 * i + 32 * h)), w_abs = _mm256_sign_epi8(w, w);
                for (int j = 0; j < MR; j++) {
                    const __m256i xb = bcast4(xq + (size_t)(m0 + j) * K + b * 32 + 4 * i);
                    dot[j] = _mm256_add_epi32(dot[j], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(xb, w)), ones));
                }
            }
            for (int j = 0; j < MR; j++)
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j]), _mm256_mul_ps(d, _mm256_set1_ps(xs[(size_t)(m0 + j) * B + b])), acc[j]);
        }
        for (int j = 0; j < MR; j++) _mm256_storeu_ps(y + (size_t)(m0 + j) * N + 16 * t + 8 * h, acc[j]);
    }
}

AVX2 int inferlab_q8_0_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, float *y, int nthreads) {
    const int B = K / 32;
    int8_t *xq; float *xs;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, NULL)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < N / 16; t++) {
#define Q8_0_TILE_ROWS(R) q8_0_tile_rows(xq, xs, K, B, tiles + (size_t)t * B * 544, y, N, t, m0, R)
        ROW_CHUNKS(M, Q8_0_TILE_ROWS);
    }
    free_activations(xq, xs, NULL);
    return 0;
}

/* INT8 tiles: per block 16 column pairs of [16 outputs x 2 codes]; a half's 16 bytes widen to
   int16 and meet each row's broadcast pair of int16 activations in one vpmaddwd (as int8_rows). */
AVX2 INLINE void int8_tile_rows(const int16_t *xq, const float *xs, int K, int B, const int8_t *tile,
                                const uint16_t *scales, float *y, int N, int t, int m0, const int MR) {
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        for (int j = 0; j < MR; j++) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < B; b++) {
            const int8_t *p = tile + (size_t)b * 512;
            if (m0 == 0 && h == 0) PREFETCH_AHEAD(p, 512);
            __m256i dot[4];
            for (int j = 0; j < MR; j++) dot[j] = _mm256_setzero_si256();
            for (int i = 0; i < 16; i++) {
                const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 32 * i + 16 * h)));
                for (int j = 0; j < MR; j++)
                    dot[j] = _mm256_add_epi32(dot[j], _mm256_madd_epi16(w, bcast4(xq + (size_t)(m0 + j) * K + b * 32 + 2 * i)));
            }
            for (int j = 0; j < MR; j++)
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j]), _mm256_set1_ps(xs[(size_t)(m0 + j) * B + b]), acc[j]);
        }
        const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + 16 * t + 8 * h)));
        for (int j = 0; j < MR; j++) _mm256_storeu_ps(y + (size_t)(m0 + j) * N + 16 * t + 8 * h, _mm256_mul_ps(acc[j], s));
    }
}

AVX2 int inferlab_int8_tiles_gemv(const float *x, int M, int K, const int8_t *tiles, const uint16_t *scales,
                                  int N, float *y, int nthreads) {
    const int B = K / 32;
    int16_t *xq; float *xs;
    if (quantized_activations(x, M, K, 32, 32767, 0, 0, (void **)&xq, &xs, NULL)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < N / 16; t++) {
#define INT8_TILE_ROWS(R) int8_tile_rows(xq, xs, K, B, tiles + (size_t)t * 16 * K, scales, y, N, t, m0, R)
        ROW_CHUNKS(M, INT8_TILE_ROWS);
    }
    free_activations(xq, xs, NULL);
    return 0;
}

/* Q4_K tiles (vnni.c's layout): a half's 8 registers of a sub-block's codes at a time (low nibbles,
   then high), so they fit AVX2's 16 registers beside the rows' sums; its 8 products add up in int16
   as Q4_1's do. */
#define Q4_K_TILE_BYTES 2368
AVX2 INLINE void q4_k_tile_rows(const int8_t *xq, const float *xs, const int32_t *xsum, int K, int S,
                                const uint8_t *tile, float *y, int N, int t, int m0, const int MR) {
    const int B = K / 32;
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        for (int j = 0; j < MR; j++) acc[j] = _mm256_setzero_ps();
        for (int s = 0; s < S; s++) {
            const uint8_t *p = tile + (size_t)s * Q4_K_TILE_BYTES, *nums = p + 2048;
            if (m0 == 0 && h == 0) PREFETCH_AHEAD(p, Q4_K_TILE_BYTES);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(nums + 16 * h)));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(nums + 32 + 16 * h)));
            for (int sub = 0; sub < 8; sub++) {  /* sub-block 2i + nib: chunk i's low (nib 0) or high nibbles */
                const int i = sub / 2, nib = sub % 2;
                const uint8_t *c = p + 512 * i + 32 * h;
                __m256i q[8];
                for (int r = 0; r < 8; r++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(c + 64 * r));
                    q[r] = _mm256_and_si256(nib ? _mm256_srli_epi16(v, 4) : v, low);
                }
                const __m256 sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(nums + 64 + 16 * sub + 8 * h)))));
                const __m256 mn = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(nums + 192 + 16 * sub + 8 * h)))));
                for (int j = 0; j < MR; j++) {
                    const int8_t *xb = xq + (size_t)(m0 + j) * K + s * 256 + 64 * i + 32 * nib;
                    __m256i acc16 = _mm256_setzero_si256();
                    for (int r = 0; r < 8; r++) acc16 = _mm256_add_epi16(acc16, _mm256_maddubs_epi16(q[r], bcast4(xb + 4 * r)));
                    const size_t g = (size_t)(m0 + j) * B + s * 8 + sub;
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(acc16, ones)), _mm256_mul_ps(sc, _mm256_set1_ps(xs[g])), acc[j]);
                    acc[j] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(xs[g] * (float)xsum[g]), acc[j]);
                }
            }
        }
        for (int j = 0; j < MR; j++) _mm256_storeu_ps(y + (size_t)(m0 + j) * N + 16 * t + 8 * h, acc[j]);
    }
}

AVX2 int inferlab_q4_k_tiles_gemv(const float *x, int M, int K, const uint8_t *tiles, int N, float *y, int nthreads) {
    const int S = K / 256;
    int8_t *xq; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, &xsum)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < N / 16; t++) {
#define Q4_K_TILE_ROWS(R) q4_k_tile_rows(xq, xs, xsum, K, S, tiles + (size_t)t * S * Q4_K_TILE_BYTES, y, N, t, m0, R)
        ROW_CHUNKS(M, Q4_K_TILE_ROWS);
    }
    free_activations(xq, xs, xsum);
    return 0;
}

/* The CPU's peak rate of 8-bit multiply-adds, for `inferlab bench rows` (vnni.c has the AVX-512
   one): `iters` rounds of 12 independent vpmaddubsw + vpaddw chains per thread, no memory; 32
   multiply-adds a pair, the cheapest form the loops above take them in. Returns the multiply-adds
   done; the caller times the call. */
static volatile long peak_sink;
AVX2 long inferlab_peak_int8_macs(long iters, int nthreads) {
    long sink = 0;
    int threads = 0;  /* the threads the region got: each did iters rounds */
    #pragma omp parallel num_threads(nthreads) reduction(+:sink, threads)
    {
        threads += 1;
        __m256i a[12], w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
        for (int i = 0; i < 12; i++) a[i] = _mm256_set1_epi16((short)i);
        for (long it = 0; it < iters; it++) {
            for (int i = 0; i < 12; i++) a[i] = _mm256_add_epi16(a[i], _mm256_maddubs_epi16(w, x));
            __asm__ volatile("" : "+x"(w), "+x"(x));  /* the inputs may change: no folding the chains */
        }
        __m256i s = a[0];
        for (int i = 1; i < 12; i++) s = _mm256_add_epi16(s, a[i]);
        sink += _mm256_extract_epi16(s, 0);
    }
    peak_sink = sink;  /* kept: the chains' sums must be used */
    return iters * 12L * 32L * threads;
}
