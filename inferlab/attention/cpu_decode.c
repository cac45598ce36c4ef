/* Paged decode attention on the CPU: one query per sequence against its K/V, read in place
   through the slots its block table names (PagedAttention, Kwon et al. 2023), in one C call.

   The torch path (paged_decode in paged.py) gathers every context token's K and V into new
   tensors, then runs two batched matmuls and a softmax: seven kernels and two copies of the
   context per layer. At a decode step's sizes (9 query heads, a few hundred tokens) the work is
   tens of microseconds and the dispatch is most of the time. Here each (sequence, query head)
   reads its K/V head's slots in place: it scores every key, takes a softmax in float (max
   subtracted first), and sums the values with those weights.

   q [B, Hq, D] and out [B, Hq, D] contiguous; k, v: one layer's cache as [slots, Hkv, D];
   slots [B, S] (int64): the cache slot of each context position, S the longest context;
   context_lens [B] (int64): sequence b reads positions [lo_b, context_lens[b]), where
   lo_b = context_lens[b] - window when a sliding window (window > 0) bites, else 0. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "../clones.h"  /* CLONES: a build per x86 level; the loops below are plain C the compiler vectorises */
#define LANES 16  /* independent partial sums: one AVX-512 register, two AVX2 ones */

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

/* Each (sequence, query head) is one piece of work, so the two threads of a batch of one share 9
   heads rather than 3 K/V heads (a 2:1 split); the G heads that share a K/V head read its rows
   G times, from cache. Scores live in one buffer per thread, grown as contexts grow. */
CLONES void inferlab_paged_decode(const float *q, const float *k, const float *v, const int64_t *slots,
                                  const int64_t *context_lens, int B, int Hq, int Hkv, int D, int S, int window,
                                  float scale, float *out, int nthreads) {
    const int G = Hq / Hkv;
    #pragma omp parallel num_threads(nthreads) if (B * Hq > 1)
    {
        float *scores = NULL;
        int64_t capacity = 0;
        #pragma omp for schedule(static)
        for (int bh = 0; bh < B * Hq; bh++) {
            const int b = bh / Hq, hq = bh % Hq, h = hq / G;
            const int64_t ctx = context_lens[b];
            const int64_t lo = window > 0 && ctx > window ? ctx - window : 0;
            const int64_t n = ctx - lo;
            float *ob = out + ((int64_t)b * Hq + hq) * D;
            for (int i = 0; i < D; i++) ob[i] = 0.0f;
            if (n > capacity) {
                float *grown = realloc(scores, sizeof(float) * (size_t)n);
                if (!grown) continue;  /* out of memory: this head stays zero */
                scores = grown;
                capacity = n;
            }
            if (n <= 0) continue;
            const float *qb = q + ((int64_t)b * Hq + hq) * D;
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t p = 0; p < n; p++) {  /* scores */
                const float *kp = k + (slots[(int64_t)b * S + lo + p] * Hkv + h) * D;
                const float sc = dot(qb, kp, D) * scale;
                scores[p] = sc;
                if (sc > mx) mx = sc;
            }
            for (int64_t p = 0; p < n; p++) {  /* softmax, max subtracted first */
                const float e = expf(scores[p] - mx);
                scores[p] = e;
                sum += e;
            }
            for (int64_t p = 0; p < n; p++) {  /* the weighted values */
                const float *vp = v + (slots[(int64_t)b * S + lo + p] * Hkv + h) * D;
                const float w = scores[p] / sum;
                for (int i = 0; i < D; i++) ob[i] += w * vp[i];
            }
        }
        free(scores);
    }
}
