/* What the decode loops of vnni.c (AVX-512 VNNI), avx2.c (AVX2) and neon.c (ARM) share: they
   multiply integer codes, so the few activation rows of a decode step are quantized first, by one
   quantizer; they take the rows in chunks of up to 4 (ROW_CHUNKS; 6 in the AVX-512 tiles); and they read Q4_K's packed
   sub-block scales the same way (q4_k_scale_min); the Q4_0/Q4_1 loops also share their per-block
   activation constants (block_constants). */
#ifndef INFERLAB_LOOPS_H
#define INFERLAB_LOOPS_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The quantizer is inlined into each loop's function, so it is compiled for that function's
   instructions (AVX-512, AVX2) and its group loops vectorise: on its own it was built for the
   baseline x86-64 and took a fifth of a 5-row Q4_1 pass, on one thread while the other waited. */
#define QUANTIZER static inline __attribute__((always_inline))

/* The activation quantizer every loop calls: x [M, K] in groups of `group` columns (32 for the
   llama.cpp blocks and INT8, the weight's group for INT4), each group one scale xs = amax / levels and
   codes q = round(x / xs) in -levels..levels (0 for a group of zeros), half to even as torch rounds.
   - levels 127: int8 codes, stored as bytes plus `shift` (128 makes them unsigned for vpdpbusd's
     unsigned side); 32767: int16 codes for vpdpwssd (`shift` unused).
   - split: even columns first, then (at M * K / 2) the odd ones, where two 4-bit codes share a byte
     and the low nibbles meet the even columns; else row-major, like x.
   - xsum (or NULL where no loop reads it): each group's sum of codes, for the loops that take a
     zero point or a block constant out of the integer sum (sum (q - z) xq = sum q xq - z sum xq).
   codes holds M * K codes of 1 byte (levels 127) or 2; xs and xsum M * (K / group). */
/* v rounded to the nearest integer, half to even, as torch rounds: rintf in the default rounding
   mode, which the compilers turn into one instruction (vrndscaleps, frintx) that vectorises. An
   older form added and subtracted 1.5 * 2^23; inlined into a function built with FMA, the compiler
   fused x * inv + 2^23 into one multiply-add with a single rounding, and a code that lies exactly
   half way moved by one (greedy tokens of notebook 07 changed). rintf(x * inv) rounds the product
   to a float first, as the reference does. */
static inline int round_even(float v) {
    return (int)rintf(v);
}

QUANTIZER void quantize_activations(const float *x, int M, int K, int group, int levels, int split, int shift,
                                 void *codes, float *xs, int32_t *xsum) {
    const int G = K / group;
    const size_t half = (size_t)K / 2, odd = (size_t)M * half;
    for (int m = 0; m < M; m++)
        for (int g = 0; g < G; g++) {
            const float *xg = x + (size_t)m * K + (size_t)g * group;
            uint32_t abs_max = 0;  /* the largest |x| as bits: the order of non-negative floats, in a loop that vectorises */
            for (int i = 0; i < group; i++) {
                uint32_t bits;
                memcpy(&bits, xg + i, 4);
                bits &= 0x7FFFFFFFu;
                abs_max = bits > abs_max ? bits : abs_max;
            }
            float amax;
            memcpy(&amax, &abs_max, 4);
            const float inv = amax > 0.f ? (float)levels / amax : 0.f;
            int32_t sum = 0;
            const size_t k0 = (size_t)g * group;
            if (levels > 127) {
                int16_t *out = (int16_t *)codes + (size_t)m * K + k0;
                for (int i = 0; i < group; i++) {
                    const int q = round_even(xg[i] * inv);
                    out[i] = (int16_t)q;
                    sum += q;
                }
            } else if (!split) {
                uint8_t *out = (uint8_t *)codes + (size_t)m * K + k0;
                for (int i = 0; i < group; i++) {
                    const int q = round_even(xg[i] * inv);
                    out[i] = (uint8_t)(q + shift);
                    sum += q;
                }
            } else {  /* even columns at row m of the first half, odd ones at row m of the second */
                uint8_t *even = (uint8_t *)codes + (size_t)m * half + k0 / 2, *oddc = even + odd;
                for (int i0 = 0; i0 < group; i0 += 64) {  /* 64 at a time through a buffer, so both loops vectorise */
                    int32_t q[64];
                    const int n = group - i0 < 64 ? group - i0 : 64;
                    for (int i = 0; i < n; i++) {
                        q[i] = round_even(xg[i0 + i] * inv);
                        sum += q[i];
                    }
                    for (int i = 0; i < n / 2; i++) {
                        even[i0 / 2 + i] = (uint8_t)(q[2 * i] + shift);
                        oddc[i0 / 2 + i] = (uint8_t)(q[2 * i + 1] + shift);
                    }
                }
            }
            xs[m * G + g] = amax / (float)levels;
            if (xsum) xsum[m * G + g] = sum;
        }
}

/* Buffers for quantize_activations: codes of `code_bytes` each, one scale (and sum, when asked) per
   group. 0, or -1 with nothing left allocated. */
static int activation_buffers(int M, int K, int group, int code_bytes, void **codes, float **xs, int32_t **xsum) {
    const size_t groups = (size_t)M * (K / group);
    *codes = malloc((size_t)M * K * code_bytes);
    *xs = malloc(sizeof(float) * groups);
    if (xsum) *xsum = malloc(sizeof(int32_t) * groups);
    if (*codes && *xs && (!xsum || *xsum)) return 0;
    free(*codes); free(*xs);
    if (xsum) free(*xsum);
    return -1;
}

/* Allocate the buffers and quantize x into them (xsum NULL: no group sums wanted); 0, or -1 with
   nothing left allocated. free_activations gives them back. */
QUANTIZER int quantized_activations(const float *x, int M, int K, int group, int levels, int split, int shift,
                                 void **codes, float **xs, int32_t **xsum) {
    if (activation_buffers(M, K, group, levels > 127 ? 2 : 1, codes, xs, xsum)) return -1;
    quantize_activations(x, M, K, group, levels, split, shift, *codes, *xs, xsum ? *xsum : NULL);
    return 0;
}

/* What the Q4_0 and Q4_1 loops multiply a block's scale d and constant c by: for each group of each
   row, [xs, xs * sum xq] side by side (sum (d q + c) xs xq = d xs sum q xq + c xs sum xq), so a pair
   of blocks reads its four numbers in one load. The INT4 and Q4_K tiles read their zero points' and
   mins' share from it too: computed once per group here, not once per tile in the loop, where each
   product and broadcast took the vector unit from the rows' multiply-adds (5 rows: 5-8% faster).
   NULL when it cannot allocate; free() gives it back. */
static inline float *block_constants(const float *xs, const int32_t *xsum, size_t groups) {
    float *act = malloc(sizeof(float) * 2 * groups);
    if (act)
        for (size_t i = 0; i < groups; i++) { act[2 * i] = xs[i]; act[2 * i + 1] = xs[i] * (float)xsum[i]; }
    return act;
}

static void free_activations(void *codes, float *xs, int32_t *xsum) {
    free(codes); free(xs); free(xsum);
}

/* Rows in chunks of up to 4: each weight block is loaded (and unpacked) once per chunk, then meets
   every row of the chunk, whose sums build in separate accumulators. Loading a block once per row,
   as a loop over rows outside the blocks does, repeats the unpacking and chains every block of a
   row through one accumulator, so a second row cost nearly as much as the first. ROW_CHUNKS calls
   CALL(rows) with a constant, so each chunk's inner loop unrolls. */
#define ROW_CHUNKS(M, CALL) do { \
        int m0 = 0; \
        for (; m0 + 4 <= (M); m0 += 4) CALL(4); \
        switch ((M) - m0) { case 3: CALL(3); break; case 2: CALL(2); break; case 1: CALL(1); break; } \
    } while (0)
/* The same in chunks of up to 6, for the AVX-512 tile loops: 32 registers hold 6 rows' sums beside a
   block's codes, so a speculative verify of k + 1 = 5 rows (or a batch of 5 or 6) is one pass over
   the weights, not a pass of 4 and another of 1 that unpacks every block again. */
#define ROW_CHUNKS6(M, CALL) do { \
        int m0 = 0; \
        for (; m0 + 6 <= (M); m0 += 6) CALL(6); \
        switch ((M) - m0) { case 5: CALL(5); break; case 4: CALL(4); break; case 3: CALL(3); break; \
                            case 2: CALL(2); break; case 1: CALL(1); break; } \
    } while (0)
#define INLINE static inline __attribute__((always_inline))

/* How far ahead of its work a tile loop asks for the codes: a tile of 16 outputs is read once, in
   order, so a prefetch of the bytes TILE_AHEAD on, as each tile's block is used, keeps the memory
   busy while the rows' multiply-adds run. At 5 rows and more the loops are compute-bound (their
   multiply-adds take as long as reading the weights), and a distance of a few tiles (1-2 KB, under
   the memory's latency at that pace) left them waiting on memory between blocks as well. */
#ifndef TILE_AHEAD
#define TILE_AHEAD 8192
#endif
#define PREFETCH_AHEAD(p, bytes) do { \
        for (int i_ = 0; i_ < (bytes); i_ += 64) __builtin_prefetch((const char *)(p) + TILE_AHEAD + i_, 0, 3); \
    } while (0)

/* Q4_K's 12 bytes of 6-bit sub-block scales and mins (q6): sub-blocks 0-3 keep theirs in the low
   6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 put their low 4 bits in bytes 8-11
   and their top 2 bits in the spare top bits of bytes 0-7 (llama.cpp's get_scale_min_k4). */
INLINE void q4_k_scale_min(const uint8_t *q6, int j, int *sc, int *mn) {
    *sc = j < 4 ? q6[j] & 63 : (q6[j + 4] & 15) | ((q6[j - 4] >> 6) << 4);
    *mn = j < 4 ? q6[j + 4] & 63 : (q6[j + 4] >> 4) | ((q6[j] >> 6) << 4);
}

#endif
