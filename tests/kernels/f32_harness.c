/* Runs inferlab/quant/f32.c's loop on what stdin holds (int32 M, K, N, then float32 x [M, K] and
   w [N, K]) and writes y [M, N] as float32 to stdout: a cross-compiled build (aarch64, under
   qemu-user) is checked against torch by tests/kernels/test_cross_builds.py. */
#include <stdio.h>
#include <stdlib.h>

int inferlab_f32_isa(void);
#if defined(__aarch64__)
int inferlab_f32_gemv_neon(const float *, int, int, const float *, int, float *, int);
#define GEMV inferlab_f32_gemv_neon
#else
int inferlab_f32_gemv_avx2(const float *, int, int, const float *, int, float *, int);
#define GEMV inferlab_f32_gemv_avx2
#endif

int main(void) {
    int dims[3];
    if (fread(dims, sizeof(int), 3, stdin) != 3) return 2;
    const int M = dims[0], K = dims[1], N = dims[2];
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K), *y = malloc(sizeof(float) * M * N);
    if (!x || !w || !y) return 3;
    if (fread(x, sizeof(float), (size_t)M * K, stdin) != (size_t)M * K) return 4;
    if (fread(w, sizeof(float), (size_t)N * K, stdin) != (size_t)N * K) return 4;
    if (GEMV(x, M, K, w, N, y, 1)) return 5;
    fwrite(y, sizeof(float), (size_t)M * N, stdout);
    return 0;
}
