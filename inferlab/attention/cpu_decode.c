/* Paged decode attention on the CPU: one query per sequence against its K/V, read in place
   through the slots its block table names (PagedAttention, Kwon et al. 2023), in one C call.

   The torch path (paged_decode in paged.py) gathers every context token's K and V into new
   tensors, then runs two batched matmuls and a softmax: seven kernels and two copies of the
   context per layer. At a decode step's sizes (9 query heads, a few hundred tokens) the work is
   tens of microseconds and the dispatch is most of the time. Here each (sequence, K/V head) pair
   reads its slots once: the G query heads that share the K/V head (GQA) score every key, a
   softmax in float (max subtracted first), and the weighted sum of the values.

   q [B, Hq, D] and out [B, Hq, D] contiguous; k, v: one layer's cache as [slots, Hkv, D];
   slots [B, S] (int64): the cache slot of each context position, S the longest context;
   context_lens [B] (int64): sequence b reads positions [lo_b, context_lens[b]), where
   lo_b = context_lens[b] - window when a sliding window (window > 0) bites, else 0. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_GROUP 64  /* query heads per K/V head */
#define LANES 8       /* independent partial sums: the compiler keeps them in one vector register */

static inline float dot(const float *a, const float *b, int D) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= D; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += acc[j];
    for (; i < D; i++) s += a[i] * b[i];
    return s;
}

void inferlab_paged_decode(const float *q, const float *k, const float *v, const int64_t *slots,
                           const int64_t *context_lens, int B, int Hq, int Hkv, int D, int S, int window,
                           float scale, float *out, int nthreads) {
    const int G = Hq / Hkv;
    #pragma omp parallel for collapse(2) num_threads(nthreads) schedule(static) if (B * Hkv > 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hkv; h++) {
            const int64_t ctx = context_lens[b];
            const int64_t lo = window > 0 && ctx > window ? ctx - window : 0;
            const int64_t n = ctx - lo;
            float *scores = malloc(sizeof(float) * (size_t)(G * n > 0 ? G * n : 1));
            const float *qb = q + ((int64_t)b * Hq + (int64_t)h * G) * D;
            float *ob = out + ((int64_t)b * Hq + (int64_t)h * G) * D;
            float mx[MAX_GROUP], sum[MAX_GROUP];
            for (int g = 0; g < G; g++) mx[g] = -INFINITY, sum[g] = 0.0f;
            for (int64_t p = 0; p < n; p++) {  /* scores: every query head of the group per key */
                const float *kp = k + (slots[(int64_t)b * S + lo + p] * Hkv + h) * D;
                for (int g = 0; g < G; g++) {
                    const float sc = dot(qb + (int64_t)g * D, kp, D) * scale;
                    scores[g * n + p] = sc;
                    if (sc > mx[g]) mx[g] = sc;
                }
            }
            for (int g = 0; g < G; g++) {
                for (int64_t p = 0; p < n; p++) {
                    const float e = expf(scores[g * n + p] - mx[g]);
                    scores[g * n + p] = e;
                    sum[g] += e;
                }
                for (int i = 0; i < D; i++) ob[(int64_t)g * D + i] = 0.0f;
            }
            for (int64_t p = 0; p < n; p++) {  /* the weighted values, each value row read once */
                const float *vp = v + (slots[(int64_t)b * S + lo + p] * Hkv + h) * D;
                for (int g = 0; g < G; g++) {
                    const float w = scores[g * n + p] / sum[g];
                    float *og = ob + (int64_t)g * D;
                    for (int i = 0; i < D; i++) og[i] += w * vp[i];
                }
            }
            free(scores);
        }
    }
}
