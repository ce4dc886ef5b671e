// gpu_check.h - the checks of the GPU tests that count their failures
// (test_gpu_basic.cu, test_gpu_gated.cu, test_gpu_vmm.c; C or C++).
// Define GPU_TEST, the name the messages start with, before including it.
//
//   CK(x)            a CUDA runtime call that must succeed, else exit 1
//   EXPECT(c, ...)   c must hold, else a message and one more failure
//   REQUIRE(c, ...)  c must hold, else a message and exit 1 (later steps
//                    would crash without it); evaluates c once
//
// g_fail counts the failures; main returns g_fail ? 1 : 0.
#ifndef MAGPOOL_TESTS_GPU_CHECK_H
#define MAGPOOL_TESTS_GPU_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <unistd.h>

#ifndef GPU_TEST
#error "define GPU_TEST (the test's name) before including gpu_check.h"
#endif

static int g_fail = 0;

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, GPU_TEST ": FAIL %s:%d: %s: %s\n", __FILE__, __LINE__,   \
              #x, cudaGetErrorString(e_));                                     \
      fflush(stdout);                                                          \
      _exit(1);                                                                \
    }                                                                          \
  } while (0)

#define EXPECT(c, ...)                                                         \
  do {                                                                         \
    if (!(c)) {                                                                \
      printf(GPU_TEST ": FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);           \
      printf(__VA_ARGS__);                                                     \
      printf("\n");                                                            \
      g_fail++;                                                                \
    }                                                                          \
  } while (0)

/* EXPECT, then the test ends at once if it failed. */
#define REQUIRE(c, ...)                                                        \
  do {                                                                         \
    int f_ = g_fail;                                                           \
    EXPECT(c, __VA_ARGS__);                                                    \
    if (g_fail != f_) {                                                        \
      fflush(stdout);                                                          \
      _exit(1);                                                                \
    }                                                                          \
  } while (0)

#endif
