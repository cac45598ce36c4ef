/* Runs one quantized decode loop of a build (inferlab/quant/neon.c cross-compiled for aarch64, run
   under qemu-user) on what stdin holds, and writes y [M, N] as float32 to stdout:
   int32 kind (0 int8, 1 int4, 2 q8_0, 3 q4_0, 4 q4_1, 5 q4_k, 6 nf4), M, K, N, group (INT4's group
   size, NF4's block size),
   then float32 x [M, K], then the weight's buffers in the loop's argument order, each as an int32
   byte count and its bytes. tests/kernels/test_cross_builds.py checks the output against the x86
   loops on the same inputs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int inferlab_int8_gemv(const float *, int, int, const int8_t *, const uint16_t *, int, float *, int);
int inferlab_int4_gemv(const float *, int, int, const uint8_t *, const uint16_t *, const uint8_t *, int, int, float *, int);
typedef int (*blocks_fn)(const float *, int, int, const uint8_t *, int, float *, int);
int inferlab_q8_0_gemv(const float *, int, int, const uint8_t *, int, float *, int);
int inferlab_q4_0_gemv(const float *, int, int, const uint8_t *, int, float *, int);
int inferlab_q4_1_gemv(const float *, int, int, const uint8_t *, int, float *, int);
int inferlab_q4_k_gemv(const float *, int, int, const uint8_t *, int, float *, int);
int inferlab_nf4_gemv(const float *, int, int, const uint8_t *, const float *, const uint8_t *, int, int, float *, int);

static void *read_buffer(void) {
    int32_t n;
    if (fread(&n, sizeof n, 1, stdin) != 1) return NULL;
    void *p = malloc(n ? n : 1);
    if (p && fread(p, 1, n, stdin) != (size_t)n) { free(p); return NULL; }
    return p;
}

int main(void) {
    int32_t h[5];
    if (fread(h, sizeof(int32_t), 5, stdin) != 5) return 2;
    const int kind = h[0], M = h[1], K = h[2], N = h[3], group = h[4];
    float *x = malloc(sizeof(float) * M * K), *y = malloc(sizeof(float) * M * N);
    if (!x || !y || fread(x, sizeof(float), (size_t)M * K, stdin) != (size_t)M * K) return 3;
    const int three = kind == 1 || kind == 6, two = kind == 0 || three;  /* how many buffers the loop takes */
    void *a = read_buffer(), *b = two ? read_buffer() : NULL, *c = three ? read_buffer() : NULL;
    if (!a || (two && !b) || (three && !c)) return 4;
    static const blocks_fn blocks[] = {inferlab_q8_0_gemv, inferlab_q4_0_gemv, inferlab_q4_1_gemv, inferlab_q4_k_gemv};
    int rc;
    if (kind == 0) rc = inferlab_int8_gemv(x, M, K, a, b, N, y, 1);
    else if (kind == 1) rc = inferlab_int4_gemv(x, M, K, a, b, c, N, group, y, 1);
    else if (kind <= 5) rc = blocks[kind - 2](x, M, K, a, N, y, 1);
    else if (kind == 6) rc = inferlab_nf4_gemv(x, M, K, a, b, c, N, group, y, 1);
    else return 6;
    if (rc) return 5;
    fwrite(y, sizeof(float), (size_t)M * N, stdout);
    return 0;
}
