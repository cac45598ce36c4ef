/* exp_poly: exp(x) in plain arithmetic, for the C loops that take many exponentials at once (the SiLU
   gate in model/glue.c, the softmax of attention/cpu_decode.c). Included by both, and by
   model/decode_layers.c through them. */
#ifndef INFERLAB_EXP_POLY_H
#define INFERLAB_EXP_POLY_H
#include <stdint.h>

/* exp(x) in arithmetic a compiler vectorises (libm's expf is a call per value: 1536 of them a layer
   took longer than the rest of the SiLU gate). Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2 (ln2 split in
   two so that n ln2 is exact), exp(r) by its degree-7 polynomial, times 2^n written into the
   exponent bits. Within about 2 ulp of expf; x is clamped to [-87, 88], where exp stays a normal
   float: silu of a gate beyond those bounds is then x, or within |x| / 1e38 of 0. */
static inline __attribute__((always_inline)) float exp_poly(float x) {
    /* x clamped to [-87, 88] on its bits: compared as floats, a loop stays scalar (GCC keeps the NaN
       rules of fminf and of float compares). As int32, a positive float orders like its bits, and a
       negative one grows towards zero as it grows in magnitude. */
    union { float f; int32_t i; } b;
    b.f = x;
    const int32_t hi = 0x42B00000, lo = (int32_t)0xC2AE0000;  /* 88.0f and -87.0f */
    b.i = b.i >= 0 ? (b.i > hi ? hi : b.i) : (b.i > lo ? lo : b.i);
    x = b.f;
    const int ni = (int)(x * 1.44269504088896341f + 127.5f) - 127;  /* round(x / ln2): positive before the cut */
    const float n = (float)ni;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union { float f; int32_t i; } scale;
    scale.i = (ni + 127) << 23;
    return p * scale.f;
}
#endif
