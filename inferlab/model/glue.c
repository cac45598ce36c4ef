/* The small operations of a decode step, one C call each: RMSNorm and rotary embeddings.

   On one token, each of these is a few thousand floats of work, and torch spends far longer
   dispatching it: F.rms_norm runs ~6 kernels, the "rotate half" RoPE ~10 (slices, a cat, a neg,
   three multiplies and adds), each with its allocation and ~3-5 us of overhead on a CPU. A
   30-layer model pays that 60 and 30 times a token: milliseconds, next to the ~24 ms its fp32
   weights take to read. llama.cpp's graph runs each as one loop; so do these.

   Both are written as plain loops the compiler vectorises (-O3); they are not where the bytes are.
   inferlab/model/glue.py builds this file and falls back to the torch ops wherever it does not run. */
#include <math.h>
#include <stdint.h>

#include "../clones.h"    /* CLONES: a build per x86 level, for the SiLU loop below */
#include "../exp_poly.h"  /* exp_poly: exp in arithmetic the compiler vectorises */

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for `rows` rows of `dim` floats (contiguous).
   The sum of squares is accumulated in double: one long float sum would drift from torch's
   vectorised (pairwise) one by more than the low bit. It runs in 8 lanes, added in order at the
   end: a fixed order the compiler vectorises (a single running sum is a chain of dependent adds,
   about 0.7 us a row of 576, which a batch of 16 paid 60 times a step). A prompt's many rows are
   shared over `nthreads` threads; each row is computed the same way on any of them. */
CLONES void inferlab_rms_norm(const float *x, const float *w, float *out, int rows, int dim, float eps, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (rows > 32)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (int64_t)r * dim;
        float *yr = out + (int64_t)r * dim;
        double lane[8] = {0.0}, ss = 0.0;
        int i = 0;
        for (; i + 8 <= dim; i += 8)
            for (int j = 0; j < 8; j++) lane[j] += (double)xr[i + j] * xr[i + j];
        for (int j = 0; j < 8; j++) ss += lane[j];
        for (; i < dim; i++) ss += (double)xr[i] * xr[i];
        const float inv = (float)(1.0 / sqrt(ss / dim + eps));
        for (int j = 0; j < dim; j++) yr[j] = (xr[j] * inv) * w[j];
    }
}

/* Rotate, in place, `heads` heads of head_dim D at each of `tokens` tokens by that token's angles
   ("rotate half", HF Llama's layout): channel i and i + D/2 form a pair,
       x_i' = x_i cos_i - x_{i+D/2} sin_i,   x_{i+D/2}' = x_{i+D/2} cos_i + x_i sin_i.
   x[t, h, :] sits at x + t * token_stride + h * head_stride (the D floats contiguous): the q or k
   part of a packed projection's output is rotated where it lies. cos/sin: [tokens, D] rows (their
   halves are equal, as rope_cos_sin builds them); only the first D/2 of each row is read. */
void inferlab_rope(float *x, int tokens, int heads, int D, int64_t token_stride, int64_t head_stride,
                   const float *cos, const float *sin) {
    const int half = D / 2;
    for (int t = 0; t < tokens; t++) {
        const float *c = cos + (int64_t)t * D, *s = sin + (int64_t)t * D;
        for (int h = 0; h < heads; h++) {
            float *a = x + t * token_stride + h * head_stride, *b = a + half;
            for (int i = 0; i < half; i++) {
                const float ai = a[i], bi = b[i];
                a[i] = ai * c[i] - bi * s[i];
                b[i] = bi * c[i] + ai * s[i];
            }
        }
    }
}

/* out[r] = silu(gate[r]) * up[r] = gate / (1 + exp(-gate)) * up, the SwiGLU gate, for `rows` rows of
   `F` floats; row r of gate starts at r * gate_stride, of up at r * up_stride (the two halves of a
   packed gate|up output are rows of one buffer), out is contiguous [rows, F]. A prompt's many rows
   are shared over `nthreads` threads; each value is computed the same way on any of them. */
CLONES void inferlab_silu_mul(const float *gate, int64_t gate_stride, const float *up, int64_t up_stride, float *out,
                              int rows, int F, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (rows > 32)
    for (int r = 0; r < rows; r++) {
        const float *g = gate + r * gate_stride, *u = up + r * up_stride;
        float *a = out + (int64_t)r * F;
        for (int i = 0; i < F; i++) a[i] = g[i] / (1.0f + exp_poly(-g[i])) * u[i];
    }
}

/* out[r] = the position of row r's first maximum among n floats: torch's max(-1).indices, with
   its rules (the first of equal maxima; a row holding a NaN gives its first NaN). A decode step
   picks each greedy token so, over a vocabulary of 49,152 at smollm2: torch's reduction compares one
   float at a time (about 80 us a row on the EPYC measured, 0.66 ms for a batch of 16). Here the
   maximum comes from a vectorised reduction (any order gives the same maximum), then a scan finds
   the first position holding it, 64 floats at a time. Rows are shared over `nthreads` threads. */
CLONES void inferlab_argmax(const float *x, int rows, int64_t n, int64_t *out, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (rows > 1)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (int64_t)r * n;
        float m = -INFINITY;  /* the largest number; a NaN anywhere makes the first NaN the answer */
        int any_nan = 0;
        #pragma omp simd reduction(max:m) reduction(|:any_nan)
        for (int64_t i = 0; i < n; i++) {
            m = xr[i] > m ? xr[i] : m;
            any_nan |= xr[i] != xr[i];
        }
        int64_t at = 0;
        for (int64_t c = 0; c < n; c += 64) {
            const int64_t end = c + 64 < n ? c + 64 : n;
            int hit = 0;
            if (any_nan)
                for (int64_t k = c; k < end; k++) hit |= xr[k] != xr[k];
            else
                for (int64_t k = c; k < end; k++) hit |= xr[k] == m;
            if (hit) {
                for (at = c; any_nan ? xr[at] == xr[at] : xr[at] != m; at++) {}
                break;
            }
        }
        out[r] = at;
    }
}
