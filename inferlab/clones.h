/* One build of a function per x86 level (AVX-512, AVX2 + FMA, baseline), picked when the library
   loads, so plain C loops vectorise for the CPU they run on. Included by the small C files that
   native.library builds (model/glue.c, attention/cpu_decode.c, and model/decode_layers.c through them). */
#ifndef INFERLAB_CLONES_H
#define INFERLAB_CLONES_H
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif
#endif
