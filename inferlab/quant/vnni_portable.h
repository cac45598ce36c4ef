/* The AVX-512, AVX2 and VNNI intrinsics vnni.c uses, in plain C: same names, same lane semantics
   (Intel's Intrinsics Guide), a vector being an array of lanes. With -DINFERLAB_PORTABLE, vnni.c
   includes this instead of <immintrin.h> and compiles, unchanged, for any CPU: slow, but the same
   source line for line. inferlab/quant/vnni.py builds it where the real loops cannot run (a CPU
   without VNNI, an ARM machine, ATEN_CPU_CAPABILITY below AVX-512) and the tests compare it with
   torch, so a bug in the loops' arithmetic (a swapped nibble, a lost zero point, a scale read from
   the wrong block) fails on every machine, not only on the ones with VNNI.

   Why an emulation rather than moving the arithmetic into portable C functions the fast build also
   calls: the loops' speed comes from keeping that arithmetic inside the intrinsics (a block's codes
   unpacked in a register, then met by every row), and the planted bugs sit on exactly those lines.
   Emulating the few intrinsics tests those very lines and leaves the fast build as it was.

   Float sums may run in another order than the hardware's (the reduction), so results agree with
   the real build to float rounding, which is what the tests compare against anyway. */
#ifndef INFERLAB_VNNI_PORTABLE_H
#define INFERLAB_VNNI_PORTABLE_H
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef union { int8_t i8[64]; uint8_t u8[64]; int16_t i16[32]; uint16_t u16[32]; int32_t i32[16]; } __m512i;
typedef union { int8_t i8[32]; uint8_t u8[32]; int16_t i16[16]; uint16_t u16[16]; int32_t i32[8]; } __m256i;
typedef union { int8_t i8[16]; uint8_t u8[16]; int16_t i16[8]; uint16_t u16[8]; int32_t i32[4]; } __m128i;
typedef struct { float f[16]; } __m512;
typedef struct { float f[8]; } __m256;
typedef struct { float f[4]; } __m128;

#define PORTABLE static inline
#define _MM_HINT_T0 3
#define _mm_prefetch(p, hint) ((void)(p), (void)(hint))  /* a hint only: nothing to compute */

/* fp16 -> float (vcvtph2ps): sign, 5-bit exponent, 10-bit mantissa; subnormals, inf and NaN kept. */
PORTABLE float _cvtsh_ss(uint16_t h) {
    const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return sign ? -v : v;
}

/* Loads, constants, zeros. */
PORTABLE __m512i _mm512_loadu_si512(const void *p) { __m512i r; memcpy(&r, p, 64); return r; }
PORTABLE __m256i _mm256_loadu_si256(const __m256i *p) { __m256i r; memcpy(&r, p, 32); return r; }
PORTABLE __m128i _mm_loadu_si128(const __m128i *p) { __m128i r; memcpy(&r, p, 16); return r; }
PORTABLE __m512 _mm512_loadu_ps(const float *p) { __m512 r; memcpy(r.f, p, 64); return r; }
PORTABLE __m512i _mm512_setzero_si512(void) { __m512i r; memset(&r, 0, 64); return r; }
PORTABLE __m256i _mm256_setzero_si256(void) { __m256i r; memset(&r, 0, 32); return r; }
PORTABLE __m512 _mm512_setzero_ps(void) { __m512 r; memset(&r, 0, 64); return r; }
PORTABLE __m256 _mm256_setzero_ps(void) { __m256 r; memset(&r, 0, 32); return r; }
PORTABLE __m512i _mm512_set1_epi8(char c) { __m512i r; memset(&r, c, 64); return r; }
PORTABLE __m256i _mm256_set1_epi8(char c) { __m256i r; memset(&r, c, 32); return r; }
PORTABLE __m128i _mm_set1_epi8(char c) { __m128i r; memset(&r, c, 16); return r; }
PORTABLE __m512i _mm512_set1_epi32(int v) { __m512i r; for (int i = 0; i < 16; i++) r.i32[i] = v; return r; }
PORTABLE __m512 _mm512_set1_ps(float v) { __m512 r; for (int i = 0; i < 16; i++) r.f[i] = v; return r; }
PORTABLE __m256 _mm256_set1_ps(float v) { __m256 r; for (int i = 0; i < 8; i++) r.f[i] = v; return r; }

/* Bitwise and shifts (logical, per 16- or 32-bit lane). */
PORTABLE __m512i _mm512_and_si512(__m512i a, __m512i b) { for (int i = 0; i < 16; i++) a.i32[i] &= b.i32[i]; return a; }
PORTABLE __m256i _mm256_and_si256(__m256i a, __m256i b) { for (int i = 0; i < 8; i++) a.i32[i] &= b.i32[i]; return a; }
PORTABLE __m128i _mm_and_si128(__m128i a, __m128i b) { for (int i = 0; i < 4; i++) a.i32[i] &= b.i32[i]; return a; }
PORTABLE __m512i _mm512_srli_epi16(__m512i a, int n) { for (int i = 0; i < 32; i++) a.u16[i] = (uint16_t)(a.u16[i] >> n); return a; }
PORTABLE __m256i _mm256_srli_epi16(__m256i a, int n) { for (int i = 0; i < 16; i++) a.u16[i] = (uint16_t)(a.u16[i] >> n); return a; }
PORTABLE __m128i _mm_srli_epi16(__m128i a, int n) { for (int i = 0; i < 8; i++) a.u16[i] = (uint16_t)(a.u16[i] >> n); return a; }
PORTABLE __m512i _mm512_srli_epi32(__m512i a, int n) { for (int i = 0; i < 16; i++) a.i32[i] = (int32_t)((uint32_t)a.i32[i] >> n); return a; }
PORTABLE __m256i _mm256_slli_epi32(__m256i a, int n) { for (int i = 0; i < 8; i++) a.i32[i] = (int32_t)((uint32_t)a.i32[i] << n); return a; }

/* Integer arithmetic. */
PORTABLE __m512i _mm512_add_epi32(__m512i a, __m512i b) { for (int i = 0; i < 16; i++) a.i32[i] += b.i32[i]; return a; }
PORTABLE __m512i _mm512_sub_epi32(__m512i a, __m512i b) { for (int i = 0; i < 16; i++) a.i32[i] -= b.i32[i]; return a; }
PORTABLE __m512i _mm512_slli_epi32(__m512i a, int n) { for (int i = 0; i < 16; i++) a.i32[i] = (int32_t)((uint32_t)a.i32[i] << n); return a; }
PORTABLE __m256i _mm256_sub_epi32(__m256i a, __m256i b) { for (int i = 0; i < 8; i++) a.i32[i] -= b.i32[i]; return a; }

/* vpdpbusd: each 32-bit lane adds the four products of a's unsigned bytes with b's signed bytes. */
PORTABLE __m512i _mm512_dpbusd_epi32(__m512i src, __m512i a, __m512i b) {
    for (int i = 0; i < 16; i++)
        for (int j = 4 * i; j < 4 * i + 4; j++) src.i32[i] += (int32_t)a.u8[j] * b.i8[j];
    return src;
}
PORTABLE __m256i _mm256_dpbusd_epi32(__m256i src, __m256i a, __m256i b) {
    for (int i = 0; i < 8; i++)
        for (int j = 4 * i; j < 4 * i + 4; j++) src.i32[i] += (int32_t)a.u8[j] * b.i8[j];
    return src;
}
/* vpdpwssd: each 32-bit lane adds the two products of signed 16-bit pairs. */
PORTABLE __m512i _mm512_dpwssd_epi32(__m512i src, __m512i a, __m512i b) {
    for (int i = 0; i < 16; i++) src.i32[i] += (int32_t)a.i16[2 * i] * b.i16[2 * i] + (int32_t)a.i16[2 * i + 1] * b.i16[2 * i + 1];
    return src;
}

/* Widening and moving lanes. */
PORTABLE __m512i _mm512_cvtepi8_epi16(__m256i a) { __m512i r; for (int i = 0; i < 32; i++) r.i16[i] = a.i8[i]; return r; }
PORTABLE __m512i _mm512_cvtepu8_epi32(__m128i a) { __m512i r; for (int i = 0; i < 16; i++) r.i32[i] = a.u8[i]; return r; }
PORTABLE __m512i _mm512_zextsi256_si512(__m256i a) { __m512i r = _mm512_setzero_si512(); memcpy(&r, &a, 32); return r; }
PORTABLE __m256i _mm256_set_m128i(__m128i hi, __m128i lo) { __m256i r; memcpy(r.u8, &lo, 16); memcpy(r.u8 + 16, &hi, 16); return r; }
PORTABLE __m512i _mm512_castsi256_si512(__m256i a) { return _mm512_zextsi256_si512(a); }  /* upper half: undefined there, zero here */
PORTABLE __m512i _mm512_inserti64x4(__m512i a, __m256i b, int hi) { memcpy(a.u8 + 32 * (hi & 1), &b, 32); return a; }
/* lanes of 128 bits: the low two from a, the high two from b, each picked by two bits of imm */
PORTABLE __m512i _mm512_shuffle_i64x2(__m512i a, __m512i b, int imm) {
    __m512i r;
    for (int i = 0; i < 4; i++) memcpy(r.u8 + 16 * i, (i < 2 ? a.u8 : b.u8) + 16 * ((imm >> (2 * i)) & 3), 16);
    return r;
}
PORTABLE __m512i _mm512_set_epi32(int e15, int e14, int e13, int e12, int e11, int e10, int e9, int e8,
                                  int e7, int e6, int e5, int e4, int e3, int e2, int e1, int e0) {
    const int e[16] = {e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15};
    __m512i r;
    memcpy(r.i32, e, 64);
    return r;
}
PORTABLE __m256i _mm256_xor_si256(__m256i a, __m256i b) { for (int i = 0; i < 8; i++) a.i32[i] ^= b.i32[i]; return a; }
PORTABLE __m256i _mm256_abs_epi8(__m256i a) { __m256i r; for (int i = 0; i < 32; i++) r.u8[i] = (uint8_t)(a.i8[i] < 0 ? -a.i8[i] : a.i8[i]); return r; }
/* vpsignb: a's byte negated where b's is negative, zeroed where b's is zero */
PORTABLE __m256i _mm256_sign_epi8(__m256i a, __m256i b) {
    for (int i = 0; i < 32; i++) a.i8[i] = (int8_t)(b.i8[i] < 0 ? -a.i8[i] : b.i8[i] ? a.i8[i] : 0);
    return a;
}
PORTABLE __m256i _mm256_zextsi128_si256(__m128i a) { __m256i r = _mm256_setzero_si256(); memcpy(&r, &a, 16); return r; }
/* vpshufb: each byte of idx picks a byte of table from its own 128-bit lane (idx bits 0-3), or 0 where
   its top bit is set. */
PORTABLE __m512i _mm512_shuffle_epi8(__m512i table, __m512i idx) {
    __m512i r;
    for (int i = 0; i < 64; i++) r.u8[i] = idx.u8[i] & 0x80 ? 0 : table.u8[(i & ~15) | (idx.u8[i] & 15)];
    return r;
}
PORTABLE __m256i _mm256_shuffle_epi8(__m256i table, __m256i idx) {
    __m256i r;
    for (int i = 0; i < 32; i++) r.u8[i] = idx.u8[i] & 0x80 ? 0 : table.u8[(i & ~15) | (idx.u8[i] & 15)];
    return r;
}
PORTABLE __m128i _mm_set_epi32(int e3, int e2, int e1, int e0) { __m128i r; r.i32[0] = e0; r.i32[1] = e1; r.i32[2] = e2; r.i32[3] = e3; return r; }
#define _MM_SHUFFLE(z, y, x, w) (((z) << 6) | ((y) << 4) | ((x) << 2) | (w))
/* the low four 16-bit lanes picked by two bits of imm each; the high four kept */
PORTABLE __m128i _mm_shufflelo_epi16(__m128i a, int imm) {
    __m128i r = a;
    for (int i = 0; i < 4; i++) r.u16[i] = a.u16[(imm >> (2 * i)) & 3];
    return r;
}
PORTABLE __m128 _mm_cvtph_ps(__m128i a) { __m128 r; for (int i = 0; i < 4; i++) r.f[i] = _cvtsh_ss(a.u16[i]); return r; }
PORTABLE __m512 _mm512_cvtph_ps(__m256i a) { __m512 r; for (int i = 0; i < 16; i++) r.f[i] = _cvtsh_ss(a.u16[i]); return r; }
PORTABLE __m128 _mm_set1_ps(float v) { __m128 r; for (int i = 0; i < 4; i++) r.f[i] = v; return r; }
PORTABLE __m128 _mm_set_ps(float e3, float e2, float e1, float e0) { __m128 r = {{e0, e1, e2, e3}}; return r; }
PORTABLE __m128 _mm_setzero_ps(void) { return _mm_set1_ps(0.f); }
PORTABLE __m128 _mm_loadu_ps(const float *p) { __m128 r; memcpy(r.f, p, 16); return r; }
PORTABLE void _mm_storeu_ps(float *p, __m128 a) { memcpy(p, a.f, 16); }
PORTABLE __m128 _mm_mul_ps(__m128 a, __m128 b) { for (int i = 0; i < 4; i++) a.f[i] *= b.f[i]; return a; }
PORTABLE __m512 _mm512_castps128_ps512(__m128 a) { __m512 r; memset(&r, 0, 64); memcpy(r.f, a.f, 16); return r; }
PORTABLE __m512 _mm512_permutexvar_ps(__m512i idx, __m512 a) { __m512 r; for (int i = 0; i < 16; i++) r.f[i] = a.f[idx.i32[i] & 15]; return r; }

/* Float arithmetic: fmadd rounds once, as the instruction does. */
PORTABLE __m512 _mm512_cvtepi32_ps(__m512i a) { __m512 r; for (int i = 0; i < 16; i++) r.f[i] = (float)a.i32[i]; return r; }
PORTABLE __m256 _mm256_cvtepi32_ps(__m256i a) { __m256 r; for (int i = 0; i < 8; i++) r.f[i] = (float)a.i32[i]; return r; }
PORTABLE __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) { for (int i = 0; i < 16; i++) c.f[i] = fmaf(a.f[i], b.f[i], c.f[i]); return c; }
PORTABLE __m512 _mm512_mul_ps(__m512 a, __m512 b) { for (int i = 0; i < 16; i++) a.f[i] *= b.f[i]; return a; }
PORTABLE __m512 _mm512_add_ps(__m512 a, __m512 b) { for (int i = 0; i < 16; i++) a.f[i] += b.f[i]; return a; }
PORTABLE __m512 _mm512_sub_ps(__m512 a, __m512 b) { for (int i = 0; i < 16; i++) a.f[i] -= b.f[i]; return a; }
PORTABLE void _mm512_storeu_ps(float *p, __m512 a) { memcpy(p, a.f, 64); }
PORTABLE __m256 _mm256_fmadd_ps(__m256 a, __m256 b, __m256 c) { for (int i = 0; i < 8; i++) c.f[i] = fmaf(a.f[i], b.f[i], c.f[i]); return c; }
PORTABLE float _mm512_reduce_add_ps(__m512 a) { float s = 0.f; for (int i = 0; i < 16; i++) s += a.f[i]; return s; }

/* The 128-bit steps of a horizontal sum. */
PORTABLE __m128 _mm256_castps256_ps128(__m256 a) { __m128 r; memcpy(r.f, a.f, 16); return r; }
PORTABLE __m128 _mm256_extractf128_ps(__m256 a, int hi) { __m128 r; memcpy(r.f, a.f + 4 * (hi & 1), 16); return r; }
PORTABLE __m128 _mm_add_ps(__m128 a, __m128 b) { for (int i = 0; i < 4; i++) a.f[i] += b.f[i]; return a; }
PORTABLE __m128 _mm_add_ss(__m128 a, __m128 b) { a.f[0] += b.f[0]; return a; }
PORTABLE __m128 _mm_movehl_ps(__m128 a, __m128 b) { a.f[0] = b.f[2]; a.f[1] = b.f[3]; return a; }
PORTABLE __m128 _mm_movehdup_ps(__m128 a) { a.f[0] = a.f[1]; a.f[2] = a.f[3]; return a; }
PORTABLE float _mm_cvtss_f32(__m128 a) { return a.f[0]; }
#endif
