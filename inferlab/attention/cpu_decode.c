/* Paged decode attention on the CPU: each query row against its sequence's K/V, read in place
   through the slots its block table names (PagedAttention, Kwon et al. 2023), in one C call.

   The torch path (paged_decode in paged.py) gathers every context token's K and V into new
   tensors, then runs two batched matmuls and a softmax: seven kernels and two copies of the
   context per layer. Here the work is split the way the bytes lie:
   - one piece of work is a query row with all its heads, against every K/V head of its slots: a
     slot's K (or V) heads lie together, so a chunk of slots is read as whole runs of memory, and
     each key and value row once for the G query heads that share it (GQA). Split by K/V head
     instead, each piece read a third of every slot and the cache came from memory at a fifth of
     its speed;
   - a piece walks its keys in chunks of CHUNK with an online softmax (Milakov & Gimelshein 2018,
     as FlashAttention does): the chunk's scores, their exponentials (exp_poly, vectorised), then
     the weighted values, with the running sum and output rescaled when the running max grows.
     K and V are each read once, and nothing the size of the context is written;
   - the rows of one sequence (a speculative verify's k + 1 rows, each seeing one position more)
     share a piece: each chunk of keys is read once and met by all of them while it sits in L1,
     as FlashInfer's kernels do for a query block; a row's arithmetic is the same as alone;
   - each row's context is cut into parts of PART keys that threads take apart, and the parts'
     (max, sum, output) are merged afterwards, as Flash-Decoding does (Dao et al. 2023): the same
     softmax, summed in another order. The cut depends on the row's own context alone, never on
     how many rows share the call or on the thread count (vLLM's PagedAttention v2 cuts at a fixed
     partition size too): a row's output is then the same bits whether it decodes alone, beside 15
     other sequences, or as the first row of a speculative verify, so speculation and batching
     leave a greedy output unchanged ("batch invariance"; He et al., Thinking Machines 2025).

   q [B, Hq, D] and out [B, Hq, D] contiguous; k, v: one layer's cache as [slots, Hkv, D];
   slots [B, S] (int64): the cache slot of each context position, S the longest context;
   context_lens [B] (int64): row b reads positions [lo_b, context_lens[b]), where
   lo_b = context_lens[b] - window when a sliding window (window > 0) bites, else 0.
   Returns 0, or -1 when it could not allocate its buffer of partial results (out is not written). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../clones.h"    /* CLONES: a build per x86 level; the loops below are plain C the compiler vectorises */
#include "../exp_poly.h"  /* exp_poly: exp the compiler vectorises */
#define CHUNK 32     /* keys scored together before their values are summed */
#define PART (2 * CHUNK)  /* keys per part of a row's context (a part's fixed cost is its merge) */
#define MAX_GROUP 32  /* rows of one sequence that share a piece */
#define MAX_D 256    /* the widest head this loop takes; D a multiple of 16 (the Python side checks) */
#define INLINE static inline __attribute__((always_inline))  /* into each CLONES build, or it stays baseline x86 */

/* 16 floats as one value (GCC and Clang vector extensions): one AVX-512 register, two AVX2 ones, four
   SSE or NEON ones, whichever the build targets. The loops are written on these rather than left to
   the auto-vectoriser, which vectorised the value sum across keys with gathers. */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));  /* an unaligned load or store */
#define LOAD(p) (*(const v16u *)(p))

/* The lane sums of 16 vectors at once (r[c] = sum of p[c]'s lanes): four rounds, each adding the two
   halves of pairs of vectors interleaved, 15 shuffle pairs where one vector at a time takes 4 shuffles
   and 4 adds each. */
INLINE void lane_sums16(const v16 *p, v16 *out) {
#define HALVES(a, b, ...) (__builtin_shufflevector(a, b, __VA_ARGS__))
    v16 q[8], r[4], t[2];
    for (int i = 0; i < 8; i++)  /* [p0 8 partial sums | p1 8] */
        q[i] = HALVES(p[2 * i], p[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
             + HALVES(p[2 * i], p[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)  /* [4 | 4 | 4 | 4] */
        r[i] = HALVES(q[2 * i], q[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
             + HALVES(q[2 * i], q[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)  /* [2 | 2 | ... ] */
        t[i] = HALVES(r[2 * i], r[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29)
             + HALVES(r[2 * i], r[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    *out = HALVES(t[0], t[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
         + HALVES(t[0], t[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#undef HALVES
}

/* One piece: R rows' Hq query heads each (rows of D = 16 NV floats) against the keys at slots[p0..p1[r]),
   all Hkv K/V heads of each slot (its Hkv * D floats lie together, so a chunk of slots is read as
   whole runs of memory). Query head j reads K/V head j / G. The rows are one sequence's (a verify's
   k + 1 rows, each seeing one position more than the last) or a single row: each chunk of keys is
   read once and met by every row that sees it, while it is in L1, and each row walks the same chunks
   in the same order as it would alone (its bits do not depend on the rows beside it). Row r's
   queries are qs[r], its keys end at p1[r]; it leaves its query heads' running max in m[], sum of
   exponentials in l[] and unnormalised output in acc [Hq, D] (m, l, acc = states[r], + Hq, + 2 Hq):
   the softmax of this part alone, for merging. With NV a constant, a query or output row stays in
   registers. */
INLINE void attend(const float *const *qs, int R, int Hq, int Hkv, const float *k, const float *v, const int64_t *slots,
                   int64_t p0, const int64_t *p1, const int NV, float scale, float *const *states) {
    const int D = 16 * NV, G = Hq / Hkv;
    const int64_t row = (int64_t)Hkv * D;  /* floats per slot */
    const float *kslot[CHUNK], *vslot[CHUNK];
    v16 s[CHUNK / 16], part[16];
    int64_t end = p0;
    for (int r = 0; r < R; r++) {
        float *m = states[r], *l = m + Hq, *acc = m + 2 * Hq;
        for (int j = 0; j < Hq; j++) { m[j] = -INFINITY; l[j] = 0.0f; }
        memset(acc, 0, sizeof(float) * (size_t)Hq * D);
        end = p1[r] > end ? p1[r] : end;
    }
    for (int64_t c0 = p0; c0 < end; c0 += CHUNK) {
        const int most = end - c0 < CHUNK ? (int)(end - c0) : CHUNK;
        for (int c = 0; c < most; c++) {
            kslot[c] = k + slots[c0 + c] * row;
            vslot[c] = v + slots[c0 + c] * row;
        }
        /* ask for the next chunk's slots now: each layer's cache comes from memory once a step, and
           one chunk's own misses are too few to keep the memory busy */
        const int ahead = end - c0 - CHUNK < CHUNK ? (int)(end - c0 - CHUNK) : CHUNK;
        for (int c = 0; c < ahead; c++) {
            const int64_t at = slots[c0 + CHUNK + c] * row;
            for (int64_t i = 0; i < row; i += 16) {
                __builtin_prefetch(k + at + i, 0, 2);  /* into L2: a chunk of slots outgrows L1 */
                __builtin_prefetch(v + at + i, 0, 2);
            }
        }
        for (int r = 0; r < R; r++) {
            if (c0 >= p1[r]) continue;
            const int n = p1[r] - c0 < CHUNK ? (int)(p1[r] - c0) : CHUNK;
            const float *qr = qs[r];
            float *m = states[r], *l = m + Hq, *acc = m + 2 * Hq;
            for (int j = 0; j < Hq; j++) {
                const int off = j / G * D;  /* this query head's K/V head within a slot */
                v16 qv[MAX_D / 16], o[MAX_D / 16];
                for (int i = 0; i < NV; i++) qv[i] = LOAD(qr + (size_t)j * D + 16 * i);
                float sc[CHUNK];
                for (int c16 = 0; c16 < n; c16 += 16) {  /* scores, 16 keys at a time (L1 after the first head) */
                    for (int c = 0; c < 16; c++) {
                        v16 d = {0};
                        if (c16 + c < n)
                            for (int i = 0; i < NV; i++) d += qv[i] * LOAD(kslot[c16 + c] + off + 16 * i);
                        part[c] = d;
                    }
                    lane_sums16(part, &s[c16 / 16]);
                    s[c16 / 16] *= scale;
                }
                memcpy(sc, s, sizeof(float) * (size_t)n);
                /* online softmax: the new max; the old sum and output rescaled by e^(old max - new max) */
                float mx = m[j];
                for (int c = 0; c < n; c++) mx = sc[c] > mx ? sc[c] : mx;
                const float alpha = m[j] == -INFINITY ? 0.0f : exp_poly(m[j] - mx);
                float sum = 0.0f;
                for (int c = 0; c < n; c++) {
                    sc[c] = exp_poly(sc[c] - mx);
                    sum += sc[c];
                }
                l[j] = l[j] * alpha + sum;
                m[j] = mx;
                float *a = acc + (size_t)j * D;  /* values: the output row in registers over the chunk */
                for (int i = 0; i < NV; i++) o[i] = LOAD(a + 16 * i) * alpha;
                for (int c = 0; c < n; c++)
                    for (int i = 0; i < NV; i++) o[i] += sc[c] * LOAD(vslot[c] + off + 16 * i);
                for (int i = 0; i < NV; i++) *(v16u *)(a + 16 * i) = o[i];
            }
        }
    }
}

/* attend with NV as a constant for the common head widths (32, 64, 128), so its loops unroll. */
INLINE void attend_any(const float *const *qs, int R, int Hq, int Hkv, const float *k, const float *v,
                       const int64_t *slots, int64_t p0, const int64_t *p1, int D, float scale, float *const *states) {
    switch (D) {
    case 32: attend(qs, R, Hq, Hkv, k, v, slots, p0, p1, 2, scale, states); break;
    case 64: attend(qs, R, Hq, Hkv, k, v, slots, p0, p1, 4, scale, states); break;
    case 128: attend(qs, R, Hq, Hkv, k, v, slots, p0, p1, 8, scale, states); break;
    default: attend(qs, R, Hq, Hkv, k, v, slots, p0, p1, D / 16, scale, states);
    }
}

/* The first position a row of context length ctx reads: the last `window` positions under a sliding
   window (Mistral), else all of them. */
INLINE int64_t first_seen(int64_t ctx, int window) { return window > 0 && ctx > window ? ctx - window : 0; }

CLONES int inferlab_paged_decode(const float *q, const float *k, const float *v, const int64_t *slots,
                                  const int64_t *context_lens, int B, int Hq, int Hkv, int D, int S, int window,
                                  float scale, float *out, int nthreads) {
    /* Parts of each row: its own context in pieces of PART keys (an empty one is one part); row b's
       partial results are entries first[b] .. first[b + 1] - 1. */
    int64_t *first = malloc(sizeof(int64_t) * (3 * (size_t)B + 3));
    if (!first) return -1;
    int64_t *group = first + B + 1, *gfirst = group + B + 1;  /* groups: their first rows, their first pieces */
    first[0] = 0;
    for (int b = 0; b < B; b++) {
        const int64_t ctx = context_lens[b], lo = first_seen(ctx, window);
        const int64_t n = ctx > lo ? ctx - lo : 0;
        first[b + 1] = first[b] + (n > PART ? (n + PART - 1) / PART : 1);
    }
    /* Rows of one sequence: row b + 1 joins row b's group when it starts at the same position, sees
       at least as many, and the ones row b sees lie in the same slots (a verify's rows, whose K/V are
       then read once per piece for all of them); at most MAX_GROUP rows. A group reads the slots of
       its last, longest row. */
    int G = 0;
    for (int b = 0; b < B; b++) {
        const int joins = b > 0 && b - group[G - 1] < MAX_GROUP && context_lens[b] >= context_lens[b - 1]
            && first_seen(context_lens[b], window) == first_seen(context_lens[b - 1], window)
            && memcmp(slots + (int64_t)b * S, slots + (int64_t)(b - 1) * S, sizeof(int64_t) * (size_t)context_lens[b - 1]) == 0;
        if (!joins) group[G++] = b;
    }
    group[G] = B;
    gfirst[0] = 0;
    for (int g = 0; g < G; g++) gfirst[g + 1] = gfirst[g] + first[group[g + 1]] - first[group[g + 1] - 1];
    const int64_t pieces = gfirst[G];  /* a group's pieces: the parts of its longest (last) row */
    const size_t part_floats = (size_t)Hq * (D + 2);  /* m, l and acc of one part's heads */
    float *partial = malloc(sizeof(float) * (size_t)first[B] * part_floats);
    if (!partial) { free(first); return -1; }
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) if (pieces > 1)
    for (int64_t w = 0; w < pieces; w++) {
        int g = 0;
        while (gfirst[g + 1] <= w) g++;
        const int64_t part = w - gfirst[g];
        const float *qs[MAX_GROUP];
        float *states[MAX_GROUP];
        int64_t p1[MAX_GROUP], p0 = 0;
        int R = 0;
        for (int b = (int)group[g]; b < group[g + 1]; b++) {  /* the group's rows that have this part */
            if (part >= first[b + 1] - first[b]) continue;
            const int64_t ctx = context_lens[b];
            p0 = first_seen(ctx, window) + part * PART;
            p1[R] = p0 + PART < ctx ? p0 + PART : (ctx > p0 ? ctx : p0);
            qs[R] = q + (int64_t)b * Hq * D;
            states[R++] = partial + (size_t)(first[b] + part) * part_floats;
        }
        const int64_t *row_slots = slots + (int64_t)(group[g + 1] - 1) * S;
        attend_any(qs, R, Hq, Hkv, k, v, row_slots, p0, p1, D, scale, states);
    }
    /* Merge each row's parts: out = sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) l_p, M the largest
       m_p (one part: acc / l). A row that saw no key gets zeros. */
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Hq; j++) {
            float M = -INFINITY, L = 0.0f;
            const int64_t parts = first[b + 1] - first[b];
            for (int64_t p = 0; p < parts; p++) {
                const float mp = partial[(size_t)(first[b] + p) * part_floats + j];
                M = mp > M ? mp : M;
            }
            float *o = out + ((int64_t)b * Hq + j) * D;
            for (int i = 0; i < D; i++) o[i] = 0.0f;
            if (M == -INFINITY) continue;
            for (int64_t p = 0; p < parts; p++) {
                const float *base = partial + (size_t)(first[b] + p) * part_floats;
                if (base[j] == -INFINITY) continue;
                const float f = parts == 1 ? 1.0f : expf(base[j] - M);
                L += f * base[Hq + j];
                const float *a = base + 2 * Hq + (size_t)j * D;
                for (int i = 0; i < D; i++) o[i] += f * a[i];
            }
            for (int i = 0; i < D; i++) o[i] /= L;
        }
    free(partial);
    free(first);
    return 0;
}
