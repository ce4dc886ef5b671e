/* cuda_baselines.h - the C interface of cub_baseline.cu.
 *
 * cub::CachingDeviceAllocator is C++ (and header-only), so the bench's C
 * code reaches it through these four functions.  Every function returns a
 * cudaError_t value (0 = cudaSuccess).  The allocator is mutex-based: any
 * thread may call bench_cub_alloc / bench_cub_free on one instance at any
 * time; create and destroy must not overlap other calls.
 *
 * Needs no CUDA header: struct CUstream_st * is cudaStream_t.
 */
#ifndef MAGPOOL_BENCH_CUDA_BASELINES_H
#define MAGPOOL_BENCH_CUDA_BASELINES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;
typedef struct bench_cub bench_cub;

/* One allocator for `device`: cub's default bins (8^3 = 512 B ... 8^7 =
 * 2 MiB, growth 8) and no cap on cached bytes, so that, like
 * cudaMallocAsync with release threshold UINT64_MAX, it keeps what it
 * has.  Larger requests than 2 MiB are cudaMalloc'd exactly by cub. */
int bench_cub_create(int device, bench_cub **out);

/* DeviceAllocate on `stream`: the block may be reused at once on that
 * stream, on other streams once the stream has passed the free. */
int bench_cub_alloc(bench_cub *cub, void **ptr, size_t bytes, struct CUstream_st *stream);

/* DeviceFree. */
int bench_cub_free(bench_cub *cub, void *ptr);

/* FreeAllCached, then deletes the allocator.  cub must be NULL or have no
 * live block. */
int bench_cub_destroy(bench_cub *cub);

#ifdef __cplusplus
}
#endif

#endif /* MAGPOOL_BENCH_CUDA_BASELINES_H */
