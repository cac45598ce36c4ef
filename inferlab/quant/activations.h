/* The activation quantizer shared by the decode loops of vnni.c (AVX-512 VNNI) and avx2.c (AVX2):
   both multiply integer codes, so the few activation rows of a decode step are quantized first. */
#ifndef INFERLAB_ACTIVATIONS_H
#define INFERLAB_ACTIVATIONS_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

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
static void quantize_activations(const float *x, int M, int K, int group, int levels, int split, int shift,
                                 void *codes, float *xs, int32_t *xsum) {
    const int G = K / group;
    const size_t half = (size_t)K / 2, odd = (size_t)M * half;
    for (int m = 0; m < M; m++)
        for (int g = 0; g < G; g++) {
            const float *xg = x + (size_t)m * K + (size_t)g * group;
            float amax = 0.f;
            for (int i = 0; i < group; i++) amax = fmaxf(amax, fabsf(xg[i]));
            const float inv = amax > 0.f ? (float)levels / amax : 0.f;
            int32_t sum = 0;
            for (int i = 0; i < group; i++) {
                const size_t k = (size_t)g * group + i;
                const size_t at = split ? (k & 1) * odd + (size_t)m * half + k / 2 : (size_t)m * K + k;
                const int q = (int)nearbyintf(xg[i] * inv);
                sum += q;
                if (levels > 127) ((int16_t *)codes)[at] = (int16_t)q;
                else ((uint8_t *)codes)[at] = (uint8_t)(q + shift);
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

#endif
