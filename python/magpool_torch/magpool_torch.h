/* magpool_torch.h - the C interface of libmagpool_torch.so, magpool behind
 * PyTorch's CUDAPluggableAllocator (shim.c says how it works).  The
 * Python module magpool_torch drives it through ctypes; a C++ program
 * that embeds PyTorch may call it directly.
 */
#ifndef MAGPOOL_TORCH_H
#define MAGPOOL_TORCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MAGPOOL_TORCH_API __attribute__((visibility("default")))

struct CUstream_st; /* cudaStream_t is struct CUstream_st * */

/* Statistics of one device (magpool_torch_get_stats).  Byte counters of
 * allocations count the sizes PyTorch asked for. */
typedef struct magpool_torch_stats {
  uint64_t allocated_current; /* bytes in live allocations          */
  uint64_t allocated_peak;    /* high-water mark of it              */
  uint64_t reserved_current;  /* the pool's reserved_bytes          */
  uint64_t reserved_peak;     /* the pool's peak_reserved_bytes     */
  uint64_t num_alloc_retries; /* allocations retried after a trim   */
  uint64_t num_ooms;          /* allocations that failed            */
  uint64_t alloc_count;       /* successful allocations             */
  uint64_t free_count;        /* successful frees                   */
  uint64_t live_count;        /* live allocations                   */
  uint64_t pool_created;      /* 1 once the device has a pool       */
  uint64_t grow_count;        /* the pool's grow_count              */
  uint64_t alloc_ns;          /* time spent in magpool_torch_alloc, */
  uint64_t free_ns;           /* in magpool_torch_free, allocations */
  uint64_t slow_allocs;       /* over 100 us, the longest: counted  */
  uint64_t max_alloc_ns;      /* while timing is on, else 0         */
  uint64_t chunk_maps;        /* the pool's chunk_maps, chunk_unmaps */
  uint64_t chunk_unmaps;      /* and chunk_moves (magpool_stats_t):  */
  uint64_t chunk_moves;       /* driver calls of tens of us each     */
  uint64_t pending_at_peak;   /* the pool's pending_at_peak_bytes    */
  uint64_t cached_current;    /* the pool's cached_bytes, free_bytes */
  uint64_t free_current;      /* and pending_bytes now               */
  uint64_t pending_current;
  uint64_t stream_batches;    /* the pool's stream_batches           */
} magpool_torch_stats;

/* The CUDAPluggableAllocator alloc entry point: size bytes on device,
 * in stream order on stream (NULL: the legacy default stream).  Creates
 * the device's pool on first use.  On failure calls the out-of-memory
 * handler (which should throw), else returns NULL. */
MAGPOOL_TORCH_API void *magpool_torch_alloc(ssize_t size, int device, struct CUstream_st *stream);

/* As magpool_torch_alloc, but a failure returns NULL without calling
 * the handler; magpool_torch_last_failure() then says what failed. */
MAGPOOL_TORCH_API void *magpool_torch_alloc_nothrow(ssize_t size, int device,
                                                    struct CUstream_st *stream);

/* The calling thread's last failed allocation, in words ("N bytes on
 * cuda:D: reason"); "" if none.  Thread-local, never NULL. */
MAGPOOL_TORCH_API const char *magpool_torch_last_failure(void);

/* The free entry point: ptr, with the size, device and stream of its
 * allocation; freed in that stream's order.  A pointer that is not a live
 * allocation is reported once on stderr and otherwise ignored. */
MAGPOOL_TORCH_API void magpool_torch_free(void *ptr, ssize_t size, int device,
                                          struct CUstream_st *stream);

/* Sets the "key=value,..." configuration (magpool_config_parse) applied
 * to pools created from now on, over allow_growth=1 and MAGPOOL_CONF;
 * NULL or "" for none.  Returns 0, or MAGPOOL_EINVAL keeping the previous
 * one if it does not parse (magpool_config_error() says why), or
 * MAGPOOL_ENOMEM. */
MAGPOOL_TORCH_API int magpool_torch_configure(const char *conf);

/* Turns the timing of the entry points on (on != 0) or off: the
 * alloc_ns, free_ns, slow_allocs and max_alloc_ns statistics, at two
 * clock reads a call.  Off by default; MAGPOOL_TORCH_TIMING set to a
 * value other than "0" turns it on unless this was called first. */
MAGPOOL_TORCH_API void magpool_torch_set_timing(int on);

/* Sets the function called when an allocation fails (it should not
 * return: magpool_torch's throws c10::OutOfMemoryError).  NULL: none. */
MAGPOOL_TORCH_API void magpool_torch_set_oom_handler(void (*fn)(size_t size, int device,
                                                                const char *detail));

/* Fills *out for device.  MAGPOOL_EINVAL for a device outside [0, 64) or
 * NULL out. */
MAGPOOL_TORCH_API int magpool_torch_get_stats(int device, magpool_torch_stats *out);

/* magpool_trim on the pool of device, or on every pool for -1.
 * Returns 0. */
MAGPOOL_TORCH_API int magpool_torch_empty_cache(int device);

/* Restarts allocated_peak and the pool's peaks, of device or of every
 * device for -1.  Returns 0. */
MAGPOOL_TORCH_API int magpool_torch_reset_peak(int device);

#ifdef __cplusplus
}
#endif

#endif /* MAGPOOL_TORCH_H */
