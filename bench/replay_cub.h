/* replay_cub.h - the C interface of replay_cub.cu (magpool-replay's `cub`
 * peer).
 *
 * One cub::CachingDeviceAllocator built with its default constructor:
 * bins 8^3 = 512 B ... 8^7 = 2 MiB (growth 8), at most 6 MiB - 1 B cached
 * per device; a request above 2 MiB is cudaMalloc'd exactly and cudaFree'd
 * when freed.  Functions return a cudaError_t value (0 = cudaSuccess).
 * Needs no CUDA header: struct CUstream_st * is cudaStream_t.
 */
#ifndef MAGPOOL_REPLAY_CUB_H
#define MAGPOOL_REPLAY_CUB_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;
typedef struct replay_cub replay_cub;

int replay_cub_create(int device, replay_cub **out);
/* DeviceAllocate on `stream` (NULL: the legacy default stream). */
int replay_cub_alloc(replay_cub *c, void **ptr, size_t bytes, struct CUstream_st *stream);
/* DeviceFree. */
int replay_cub_free(replay_cub *c, void *ptr);
/* Where cub keeps its byte counts for the device: *cached (free blocks it
 * keeps) and *live (blocks handed out, the exact-size ones included).
 * The pointers stay valid until replay_cub_destroy; reading them costs two
 * loads.  Their sum is what cub holds from the device. */
void replay_cub_counters(replay_cub *c, const size_t **cached, const size_t **live);
/* cached + live, read under cub's own lock: what the counters say while
 * other threads call it (--threads). */
size_t replay_cub_held(replay_cub *c);
/* FreeAllCached, then deletes the allocator. */
int replay_cub_destroy(replay_cub *c);

#ifdef __cplusplus
}
#endif

#endif /* MAGPOOL_REPLAY_CUB_H */
