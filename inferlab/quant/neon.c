/* Decode loops for the integer quantized formats on ARM (aarch64: every Apple-silicon Mac, phones,
   Graviton): the loops of vnni.c and avx2.c, row for row, with NEON's integer products.

   sdot (vdotq_s32, ARMv8.2's dot-product extension, __ARM_FEATURE_DOTPROD) multiplies 16 signed
   bytes by 16 signed bytes and adds each four products into one of 4 int32 lanes, as vpdpbusd does
   on x86 but signed on both sides: so Q8_0's codes need no shift and no sign trick, and 4-bit codes
   (0..15) are signed bytes already. Without the extension (older cores) the same sums come from
   smull (8 int16 products) and sadalp (pairs added into int32 lanes), exact for |codes| <= 127.
   INT8 keeps int16 activations (see vnni.c): smlal multiplies them by the widened weights into
   int32. NF4 looks its codes up as int8 (tbl) and runs on sdot like INT4.

   Same names and arguments as the x86 loops; inferlab/quant/vnni.py builds this file on aarch64
   (with +dotprod where /proc/cpuinfo lists asimddp) and tests/kernels/test_cross_builds.py checks
   both builds under qemu-user against the x86 loops on the same inputs. Each function returns 0,
   or -1 when it could not allocate its small activation buffers. */
#include <arm_neon.h>
#include "loops.h"  /* quantized_activations, free_activations, ROW_CHUNKS, INLINE, q4_k_scale_min */
#include <stdint.h>
#include <stdlib.h>


#if defined(__ARM_FEATURE_DOTPROD)
int inferlab_neon_dotprod(void) { return 1; }
INLINE int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }
#else
int inferlab_neon_dotprod(void) { return 0; }
INLINE int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}
#endif

static inline float f16_at(const uint8_t *p) {
    __fp16 h;
    uint16_t bits = (uint16_t)(p[0] | (p[1] << 8));
    __builtin_memcpy(&h, &bits, 2);
    return (float)h;
}

/* INT8: int8 weights widened to int16 meet the int16 activations of each block of 32. */
INLINE void int8_rows(const int16_t *xq, const float *xs, int K, int B, const int8_t *row, float s,
                      float *y, int N, int n, int m0, const int MR) {
    float32x4_t acc[4];
    for (int j = 0; j < MR; j++) acc[j] = vdupq_n_f32(0.f);
    for (int b = 0; b < B; b++) {
        const int8x16_t w0 = vld1q_s8(row + b * 32), w1 = vld1q_s8(row + b * 32 + 16);
        const int16x8_t w[4] = {vmovl_s8(vget_low_s8(w0)), vmovl_high_s8(w0), vmovl_s8(vget_low_s8(w1)), vmovl_high_s8(w1)};
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const int16_t *xb = xq + (size_t)m * K + b * 32;
            int32x4_t dot = vdupq_n_s32(0);
            for (int i = 0; i < 4; i++) {
                const int16x8_t xv = vld1q_s16(xb + 8 * i);
                dot = vmlal_s16(dot, vget_low_s16(w[i]), vget_low_s16(xv));
                dot = vmlal_high_s16(dot, w[i], xv);
            }
            acc[j] = vfmaq_n_f32(acc[j], vcvtq_f32_s32(dot), xs[m * B + b]);
        }
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = vaddvq_f32(acc[j]) * s;
}

int inferlab_int8_gemv(const float *x, int M, int K, const int8_t *qweight, const uint16_t *scales,
                       int N, float *y, int nthreads) {
    const int B = K / 32;
    int16_t *xq; float *xs;
    if (quantized_activations(x, M, K, 32, 32767, 0, 0, (void **)&xq, &xs, NULL)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define INT8_ROWS(R) int8_rows(xq, xs, K, B, qweight + (size_t)n * K, f16_at((const uint8_t *)(scales + n)), y, N, n, m0, R)
        ROW_CHUNKS(M, INT8_ROWS);
    }
    free_activations(xq, xs, NULL);
    return 0;
}

/* INT4 (vnni.c's layout): 16 bytes are 32 weights, low nibbles the even columns, high the odd. */
INLINE void int4_rows(const int8_t *xe, const int8_t *xo, const float *xs, const int32_t *xsum, int K, int G,
                      int group_size, const uint8_t *row, const uint16_t *scales, const uint8_t *zeros,
                      float *y, int N, int n, int m0, const int MR) {
    const int chunks = group_size / 32, half = K / 2;
    const uint8x16_t low = vdupq_n_u8(0x0F);
    float32x4_t acc[4];
    float zero_part[4];
    for (int j = 0; j < MR; j++) { acc[j] = vdupq_n_f32(0.f); zero_part[j] = 0.f; }
    for (int g = 0; g < G; g++) {
        int32x4_t dot[4];
        for (int j = 0; j < MR; j++) dot[j] = vdupq_n_s32(0);
        for (int c = 0; c < chunks; c++) {
            const int off = g * (group_size / 2) + c * 16;
            const uint8x16_t v = vld1q_u8(row + off);
            const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, low)), hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
            for (int j = 0; j < MR; j++) {
                const size_t at = (size_t)(m0 + j) * half + off;
                dot[j] = dot_s8(dot_s8(dot[j], lo, vld1q_s8(xe + at)), hi, vld1q_s8(xo + at));
            }
        }
        const float s = f16_at((const uint8_t *)(scales + g)), z = (float)zeros[g];
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const float sx = s * xs[m * G + g];
            acc[j] = vfmaq_n_f32(acc[j], vcvtq_f32_s32(dot[j]), sx);
            zero_part[j] += sx * z * (float)xsum[m * G + g];
        }
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = vaddvq_f32(acc[j]) - zero_part[j];
}

int inferlab_int4_gemv(const float *x, int M, int K, const uint8_t *qweight, const uint16_t *scales,
                       const uint8_t *zeros, int N, int group_size, float *y, int nthreads) {
    const int G = K / group_size, half = K / 2;
    int8_t *xe; float *xs; int32_t *xsum;
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

/* NF4 (bitsandbytes' layout: code 2i in byte i's high nibble, 2i + 1 in its low one): vnni.c's table
   of t + 128, t = round(127 * code), back to signed t (minus 128), looked up 16 codes at a time
   (tbl), and multiplied by sdot, signed on both sides: the same integer sums as the x86 loops. */
INLINE void nf4_rows(const int8_t *xe, const int8_t *xo, const float *xs, int K, int blocksize,
                     const uint8_t *row, const float *absmax, int8x16_t table, float *y, int N, int n, int m0,
                     const int MR) {
    const int half = K / 2, blocks = K / blocksize;
    const uint8x16_t low = vdupq_n_u8(0x0F);
    float32x4_t acc[4];
    for (int j = 0; j < MR; j++) acc[j] = vdupq_n_f32(0.f);
    for (int b = 0; b < blocks; b++) {
        int32x4_t dot[4];
        for (int j = 0; j < MR; j++) dot[j] = vdupq_n_s32(0);
        for (int off = b * blocksize / 2; off < (b + 1) * blocksize / 2; off += 16) {
            const uint8x16_t v = vld1q_u8(row + off);
            const int8x16_t we = vqtbl1q_s8(table, vshrq_n_u8(v, 4)), wo = vqtbl1q_s8(table, vandq_u8(v, low));
            for (int j = 0; j < MR; j++) {
                const size_t at = (size_t)(m0 + j) * half + off;
                dot[j] = dot_s8(dot_s8(dot[j], we, vld1q_s8(xe + at)), wo, vld1q_s8(xo + at));
            }
        }
        const float s = absmax[b] * (1.f / 127.f);
        for (int j = 0; j < MR; j++)
            acc[j] = vfmaq_n_f32(acc[j], vcvtq_f32_s32(dot[j]), s * xs[(size_t)(m0 + j) * blocks + b]);
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = vaddvq_f32(acc[j]);
}

int inferlab_nf4_gemv(const float *x, int M, int K, const uint8_t *qweight, const float *absmax,
                      const uint8_t *table_bytes, int N, int blocksize, float *y, int nthreads) {
    const int half = K / 2, blocks = K / blocksize;
    int8_t *xe; float *xs;
    if (quantized_activations(x, M, K, blocksize, 127, 1, 0, (void **)&xe, &xs, NULL)) return -1;
    const int8_t *xo = xe + (size_t)M * half;
    const int8x16_t table = vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(table_bytes), vdupq_n_u8(128)));
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define NF4_ROWS(R) nf4_rows(xe, xo, xs, K, blocksize, qweight + (size_t)n * half, absmax + (size_t)n * blocks, \
                             table, y, N, n, m0, R)
        ROW_CHUNKS(M, NF4_ROWS);
    }
    free_activations(xe, xs, NULL);
    return 0;
}

/* llama.cpp's blocks of 32, one loop: Q8_0 (34 bytes: d, 32 int8 codes), Q4_0 (18: d, nibbles,
   w = (q - 8) d) and Q4_1 (20: d, m, nibbles, w = d q + m); nibble i low in byte i, i + 16 high.
   The block constant c leaves the integer sum once per block (see vnni.c). */
INLINE void block_rows(const int8_t *xq, const float *xs, const int32_t *xsum, int K, int B, const uint8_t *row,
                       float *y, int N, int n, int m0, const int MR, const int kind) {
    const int block_bytes = kind == 8 ? 34 : kind == 1 ? 20 : 18, codes = kind == 1 ? 4 : 2;
    const uint8x16_t low = vdupq_n_u8(0x0F);
    float32x4_t acc[4];
    float offset[4];
    for (int j = 0; j < MR; j++) { acc[j] = vdupq_n_f32(0.f); offset[j] = 0.f; }
    for (int b = 0; b < B; b++) {
        const uint8_t *blk = row + b * block_bytes;
        int8x16_t q0, q1;
        if (kind == 8) {
            q0 = vld1q_s8((const int8_t *)blk + 2);
            q1 = vld1q_s8((const int8_t *)blk + 18);
        } else {
            const uint8x16_t v = vld1q_u8(blk + codes);
            q0 = vreinterpretq_s8_u8(vandq_u8(v, low));
            q1 = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        }
        const float d = f16_at(blk), c = kind == 1 ? f16_at(blk + 2) : kind == 0 ? -8.f * d : 0.f;
        for (int j = 0; j < MR; j++) {
            const int m = m0 + j;
            const int8_t *xb = xq + (size_t)m * K + b * 32;
            const int32x4_t dot = dot_s8(dot_s8(vdupq_n_s32(0), q0, vld1q_s8(xb)), q1, vld1q_s8(xb + 16));
            const float xsb = xs[m * B + b];
            acc[j] = vfmaq_n_f32(acc[j], vcvtq_f32_s32(dot), d * xsb);
            if (kind != 8) offset[j] += c * xsb * (float)xsum[m * B + b];
        }
    }
    for (int j = 0; j < MR; j++) y[(size_t)(m0 + j) * N + n] = vaddvq_f32(acc[j]) + offset[j];
}

INLINE int blocks_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads,
                       const int kind) {
    const int B = K / 32, row_bytes = B * (kind == 8 ? 34 : kind == 1 ? 20 : 18);
    int8_t *xq; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, &xsum)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define BLOCK_ROWS(R) block_rows(xq, xs, xsum, K, B, qweight + (size_t)n * row_bytes, y, N, n, m0, R, kind)
        ROW_CHUNKS(M, BLOCK_ROWS);
    }
    free_activations(xq, xs, xsum);
    return 0;
}

int inferlab_q8_0_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    return blocks_gemv(x, M, K, qweight, N, y, nthreads, 8);
}

int inferlab_q4_0_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    return blocks_gemv(x, M, K, qweight, N, y, nthreads, 0);
}

int inferlab_q4_1_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    return blocks_gemv(x, M, K, qweight, N, y, nthreads, 1);
}

/* Q4_K (see avx2.c): sub-block j of 32 in super-block s, w = d sc_j q - dmin m_j. */
INLINE void q4_k_rows(const int8_t *xq, const float *xs, const int32_t *xsum, int K, int S, const uint8_t *row,
                      float *y, int N, int n, int m0, const int MR) {
    const int B = K / 32;
    const uint8x16_t low = vdupq_n_u8(0x0F);
    float32x4_t acc[4];
    float mins[4];
    for (int r = 0; r < MR; r++) { acc[r] = vdupq_n_f32(0.f); mins[r] = 0.f; }
    for (int s = 0; s < S; s++) {
        const uint8_t *sb = row + s * 144, *q6 = sb + 4;
        const float d = f16_at(sb), dmin = f16_at(sb + 2);
        for (int i = 0; i < 4; i++) {
            const uint8x16_t v0 = vld1q_u8(sb + 16 + 32 * i), v1 = vld1q_u8(sb + 32 + 32 * i);
            for (int h = 0; h < 2; h++) {
                const int j = 2 * i + h, blk = s * 8 + j;
                int sc, mn;
                q4_k_scale_min(q6, j, &sc, &mn);
                const int8x16_t q0 = vreinterpretq_s8_u8(h ? vshrq_n_u8(v0, 4) : vandq_u8(v0, low));
                const int8x16_t q1 = vreinterpretq_s8_u8(h ? vshrq_n_u8(v1, 4) : vandq_u8(v1, low));
                for (int r = 0; r < MR; r++) {
                    const int m = m0 + r;
                    const int8_t *xb = xq + (size_t)m * K + blk * 32;
                    const int32x4_t dot = dot_s8(dot_s8(vdupq_n_s32(0), q0, vld1q_s8(xb)), q1, vld1q_s8(xb + 16));
                    const float xsb = xs[m * B + blk];
                    acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(dot), d * sc * xsb);
                    mins[r] += dmin * mn * xsb * (float)xsum[m * B + blk];
                }
            }
        }
    }
    for (int r = 0; r < MR; r++) y[(size_t)(m0 + r) * N + n] = vaddvq_f32(acc[r]) - mins[r];
}

int inferlab_q4_k_gemv(const float *x, int M, int K, const uint8_t *qweight, int N, float *y, int nthreads) {
    const int S = K / 256, row_bytes = S * 144;
    int8_t *xq; float *xs; int32_t *xsum;
    if (quantized_activations(x, M, K, 32, 127, 0, 0, (void **)&xq, &xs, &xsum)) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; n++) {
#define Q4_K_ROWS(R) q4_k_rows(xq, xs, xsum, K, S, qweight + (size_t)n * row_bytes, y, N, n, m0, R)
        ROW_CHUNKS(M, Q4_K_ROWS);
    }
    free_activations(xq, xs, xsum);
    return 0;
}
