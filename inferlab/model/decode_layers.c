/* Every decoder layer of a decode step in one C call: the loop llama.cpp's graph runs, with the
   project's own pieces.

   A decode step on a small model is mostly not arithmetic. SmolLM2 has 30 layers, and each runs
   about 15 operations (two RMSNorms, four or seven linears, RoPE, the cache write, attention, the
   SiLU gate, two residual adds). From Python each operation is a module call, a few checks and an
   allocation: ~100 us a layer, 3 ms a token, as long as reading the weights of a Q4_1 model takes.
   Here the same operations run back to back in C: RMSNorm and RoPE from glue.c, the paged decode
   attention from cpu_decode.c (both included below, so the arithmetic is the same as the per-op
   path's), and each linear's own loop (f32.c, vnni.c, avx2.c or neon.c) called through a function
   pointer that inferlab/model/decode_layers.py takes from the loaded library.

   The rows are the new tokens of the ragged batch, M of them (decodes and short verifies). Row r
   attends to the first row_len[r] positions of its sequence, read through its row of `slots`
   (the slot of each position, from the block table): a decode row sees its whole context, the
   i-th of a verify's q rows over c tokens sees c - q + i + 1 positions (causal). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "glue.c"
#include "../attention/cpu_decode.c"

/* The four shapes of a linear loop's arguments between (x, M, K) and (y, nthreads). */
enum { SIG_P_I = 0,     /* f32 (weight, N), llama.cpp blocks (qweight, N) */
       SIG_PP_I = 1,    /* int8 (qweight, scales, N) */
       SIG_PPP_II = 2,  /* int4 (qweight, scales, zeros, N, group), nf4 (qweight, absmax, table, N, blocksize) */
       SIG_P_II = 3     /* int4 and nf4 in tiles (tiles, N, group or blocksize) */ };

typedef int (*loop_p_i)(const float *, int, int, const void *, int, float *, int);
typedef int (*loop_pp_i)(const float *, int, int, const void *, const void *, int, float *, int);
typedef int (*loop_ppp_ii)(const float *, int, int, const void *, const void *, const void *, int, int, float *, int);
typedef int (*loop_p_ii)(const float *, int, int, const void *, int, int, float *, int);

typedef struct {
    void *fn;            /* the loop */
    const void *p[3];    /* its pointer arguments */
    const float *bias;   /* [N] or NULL */
    int sig, n_out, extra;  /* extra: the int after N (group or block size) */
} Linear;

typedef struct {
    const float *ln1, *ln2;       /* the two RMSNorm weights */
    Linear qkv[3];                /* one packed q|k|v projection, or q, k, v */
    Linear o;
    Linear gate_up[2];            /* one packed gate|up projection, or gate, up */
    Linear down;
    float *k_cache, *v_cache;     /* this layer's cache as [slots, Hkv, D] */
    int n_qkv, n_gate_up;
} Layer;

typedef struct {
    int M, hidden, hq, hkv, head_dim, ffn, S, window, nthreads;
    float eps, scale;
    const float *cos, *sin;       /* [M, D] */
    const int64_t *slot_mapping;  /* [M]: where row r's K/V is written */
    const int64_t *slots;         /* [M, S]: the slot of each position row r may read */
    const int64_t *row_len;       /* [M] */
} Step;

static int run_linear(const Linear *l, const float *x, int M, int K, float *y, int nthreads) {
    int err;
    if (l->sig == SIG_P_I)
        err = ((loop_p_i)l->fn)(x, M, K, l->p[0], l->n_out, y, nthreads);
    else if (l->sig == SIG_PP_I)
        err = ((loop_pp_i)l->fn)(x, M, K, l->p[0], l->p[1], l->n_out, y, nthreads);
    else if (l->sig == SIG_PPP_II)
        err = ((loop_ppp_ii)l->fn)(x, M, K, l->p[0], l->p[1], l->p[2], l->n_out, l->extra, y, nthreads);
    else
        err = ((loop_p_ii)l->fn)(x, M, K, l->p[0], l->n_out, l->extra, y, nthreads);
    if (!err && l->bias)
        for (int r = 0; r < M; r++)
            for (int n = 0; n < l->n_out; n++) y[(int64_t)r * l->n_out + n] += l->bias[n];
    return err;
}

/* Runs `n` linears of one input; out[i] and stride[i]: where part i's row r starts is
   out[i] + r * stride[i] (one buffer holding every part's columns when packed). */
static int run_parts(const Linear *parts, int n, const float *x, int M, int K, float *buf, int nthreads,
                     float **out, int64_t *stride) {
    if (n == 1) {  /* packed: the parts are column ranges of one output */
        if (run_linear(&parts[0], x, M, K, buf, nthreads)) return 1;
        for (int i = 0; i < 3; i++) stride[i] = parts[0].n_out;
        return 0;
    }
    for (int i = 0; i < n; i++) {
        out[i] = buf;
        stride[i] = parts[i].n_out;
        if (run_linear(&parts[i], x, M, K, buf, nthreads)) return 1;
        buf += (int64_t)M * parts[i].n_out;
    }
    return 0;
}

/* Each linear of ls in turn over x [M, K[i]], into y: the layers' products alone, with nothing
   between the calls, as a decode step runs them (what `inferlab bench rows` times). 0, or 1 where a
   loop could not allocate its buffers. */
int inferlab_run_linears(const Linear *ls, const int *K, int n, const float *x, int M, float *y, int nthreads) {
    for (int i = 0; i < n; i++)
        if (run_linear(&ls[i], x, M, K[i], y, nthreads)) return 1;
    return 0;
}

/* x [M, hidden] is updated in place by every layer in turn; 0, or 1 where a loop could not
   allocate its buffers (x is then partly updated: the caller raises). */
int inferlab_decode_layers(float *x, const Layer *layers, int n_layers, const Step *s) {
    const int M = s->M, H = s->hidden, D = s->head_dim, F = s->ffn;
    const int nq = s->hq * D, nkv = s->hkv * D;
    const int64_t per_row = 3 * (int64_t)nq + 2 * nkv + 3 * F + 2 * H;  /* h, qkv, q, att, gate|up, act, y */
    float *work = malloc(sizeof(float) * (size_t)(M * per_row));
    if (!work) return 1;
    float *h = work, *qkv = h + (int64_t)M * H, *q = qkv + (int64_t)M * (nq + 2 * nkv);
    float *att = q + (int64_t)M * nq, *gu = att + (int64_t)M * nq, *act = gu + (int64_t)M * 2 * F;
    float *y = act + (int64_t)M * F;
    int err = 0;
    for (int l = 0; l < n_layers && !err; l++) {
        const Layer *L = &layers[l];
        float *part[3];
        int64_t stride[3];
        /* attention: norm, q/k/v, RoPE on q and k, the cache write, attention, o, residual */
        inferlab_rms_norm(x, L->ln1, h, M, H, s->eps, s->nthreads);
        part[0] = qkv; part[1] = qkv + nq; part[2] = qkv + nq + nkv;
        if ((err = run_parts(L->qkv, L->n_qkv, h, M, H, qkv, s->nthreads, part, stride))) break;
        inferlab_rope(part[0], M, s->hq, D, stride[0], D, s->cos, s->sin);
        inferlab_rope(part[1], M, s->hkv, D, stride[1], D, s->cos, s->sin);
        for (int r = 0; r < M; r++) {
            memcpy(q + (int64_t)r * nq, part[0] + r * stride[0], sizeof(float) * nq);
            memcpy(L->k_cache + s->slot_mapping[r] * nkv, part[1] + r * stride[1], sizeof(float) * nkv);
            memcpy(L->v_cache + s->slot_mapping[r] * nkv, part[2] + r * stride[2], sizeof(float) * nkv);
        }
        if ((err = inferlab_paged_decode(q, L->k_cache, L->v_cache, s->slots, s->row_len, M, s->hq, s->hkv, D,
                                         s->S, s->window, s->scale, att, s->nthreads))) break;
        if ((err = run_linear(&L->o, att, M, nq, y, s->nthreads))) break;
        for (int64_t i = 0; i < (int64_t)M * H; i++) x[i] += y[i];
        /* MLP: norm, gate and up, silu(gate) * up, down, residual */
        inferlab_rms_norm(x, L->ln2, h, M, H, s->eps, s->nthreads);
        part[0] = gu; part[1] = gu + F;
        if ((err = run_parts(L->gate_up, L->n_gate_up, h, M, H, gu, s->nthreads, part, stride))) break;
        inferlab_silu_mul(part[0], stride[0], part[1], stride[1], act, M, F, s->nthreads);
        if ((err = run_linear(&L->down, act, M, F, y, s->nthreads))) break;
        for (int64_t i = 0; i < (int64_t)M * H; i++) x[i] += y[i];
    }
    free(work);
    return err;
}
