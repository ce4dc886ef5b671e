/* magpool.h - the whole public API of magpool.
 *
 * magpool is a lock-free, concurrent memory allocator for programs in which
 * many host threads allocate on many CUDA streams at once.  It manages one
 * pool of memory (host, CUDA device, or pinned host) as a buddy tree of
 * power-of-two blocks, with per-thread caches in front of it.
 *
 * This header compiles as C (C99 or later) and as C++, and needs no CUDA
 * header: magpool_stream_t is the same type as cudaStream_t.
 *
 * Conventions that hold for every function below unless its contract says
 * otherwise:
 *   - Allocation functions return NULL on failure; magpool_last_error() then
 *     says why.  A successful allocation leaves magpool_last_error()
 *     unchanged.
 *   - Every other function returns 0 on success or a negative MAGPOOL_E*
 *     code, which magpool_strerror() names.
 *   - A call that fails with MAGPOOL_EINVAL has changed nothing.
 *   - Any thread may call any function at any time, concurrently with any
 *     other call on the same pool, except magpool_destroy(), which must not
 *     overlap any other call on that pool.
 */
#ifndef MAGPOOL_H
#define MAGPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  define MAGPOOL_API
#elif defined(MAGPOOL_BUILDING) || defined(__GNUC__)
#  define MAGPOOL_API __attribute__((visibility("default")))
#else
#  define MAGPOOL_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

#define MAGPOOL_VERSION_MAJOR 0
#define MAGPOOL_VERSION_MINOR 3
#define MAGPOOL_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define MAGPOOL_VERSION \
  (MAGPOOL_VERSION_MAJOR * 10000 + MAGPOOL_VERSION_MINOR * 100 + MAGPOOL_VERSION_PATCH)

/* The MAGPOOL_VERSION the library was built with (may differ from the header
 * a program was compiled against when the library is shared). */
MAGPOOL_API int magpool_version(void);

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

#define MAGPOOL_OK         0
#define MAGPOOL_EINVAL   (-1)  /* bad argument: NULL pool, foreign, interior
                                  or already-freed pointer, wrong size ...  */
#define MAGPOOL_ENOMEM   (-2)  /* the request does not fit, even after every
                                  cache was drained and growth was tried     */
#define MAGPOOL_ENOTSUP  (-3)  /* not supported by this build or pool kind  */
#define MAGPOOL_ENODEV   (-4)  /* no CUDA device or driver                  */
#define MAGPOOL_ECUDA    (-5)  /* a CUDA call failed; see
                                  magpool_last_cuda_error()                 */
#define MAGPOOL_ECAPTURE (-6)  /* the stream is being captured into a graph */
#define MAGPOOL_EBUSY    (-7)  /* the object is still in use               */

/* A static, never-NULL English description of code (0 or MAGPOOL_E*). */
MAGPOOL_API const char *magpool_strerror(int code);

/* The reason the calling thread's last failed allocation failed (thread-
 * local).  0 if none of this thread's allocations has failed yet. */
MAGPOOL_API int magpool_last_error(void);

/* The CUDA error code (a cudaError_t value) behind the calling thread's last
 * MAGPOOL_ECUDA, or 0.  Thread-local. */
MAGPOOL_API int magpool_last_cuda_error(void);

/* ------------------------------------------------------------------------ */
/* Types                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct magpool_s magpool_t; /* opaque; the tag is not "magpool", which
                                       * names the C++ namespace of magpool.hpp */

/* Type-compatible with cudaStream_t (both are struct CUstream_st *).  On a
 * MAGPOOL_MEM_HOST pool it is a host stream (magpool_host_stream_create). */
struct CUstream_st;
typedef struct CUstream_st *magpool_stream_t;

/* Where a pool's memory comes from. */
typedef enum magpool_mem_kind {
  MAGPOOL_MEM_HOST = 0,   /* anonymous host memory (mmap); needs no GPU     */
  MAGPOOL_MEM_DEVICE = 1, /* CUDA device memory on magpool_config_t.device  */
  MAGPOOL_MEM_PINNED = 2  /* page-locked host memory (cudaHostAlloc)        */
} magpool_mem_kind_t;

/* Pool configuration.  Always fill it with magpool_config_init() first, then
 * change what you need: fields added in later versions then keep their
 * defaults.  struct_size is how the library knows which fields a program
 * compiled against an older header has. */
typedef struct magpool_config {
  size_t struct_size;        /* sizeof(magpool_config_t); set by init      */
  size_t pool_size;          /* bytes taken at creation; default 256 MiB.
                                Rounded down to a multiple of min_block.
                                Need not be a power of two: the pool holds
                                exactly that many bytes, but on HOST and
                                DEVICE pools when it is not whole chunks
                                (chunk_size): a growing pool rounds it up
                                to whole chunks, unless that would pass
                                max_pool_size; a pool that does not round
                                up rounds it down to whole chunks if that
                                leaves 64 chunks or more (it then holds
                                less than pool_size, by under a chunk).
                                Either way it maps chunks (see
                                chunk_size) however pool_size was
                                written.  Smaller ones keep whole
                                regions, where blocks round up to powers
                                of two.  A chunked pool maps 8 of its
                                chunks for blocks below chunk_size and
                                the rest where larger blocks go first    */
  int allow_growth;          /* nonzero: take more memory from the source
                                when a request does not fit; default 0     */
  size_t max_pool_size;      /* upper bound on all memory taken, growth
                                included; 0 = no limit of magpool's own.
                                A chunked pool with a limit maps its
                                growth a chunk at a time by default
                                (chunk_groups)                           */
  size_t min_block;          /* smallest block, a power of two from 16 to
                                65536; default 64                          */
  magpool_mem_kind_t kind;   /* default MAGPOOL_MEM_HOST                   */
  int device;                /* CUDA device ordinal for DEVICE pools;
                                default 0                                  */
  size_t thread_cache_bytes; /* most bytes one thread's cache may hold for
                                this pool; default 8 MiB, and never more
                                than pool_size / 8 (larger values are
                                lowered at creation); 0 disables the
                                per-thread caches.  While more than 4
                                threads use the pool (those that called
                                it and have not exited), each keeps at
                                most max(4 x this, reserved bytes / 8)
                                divided by their number (rounded down to
                                a power of two), and at least this / 16:
                                64 threads would otherwise cache 64 times
                                this.  Another thread's
                                allocation that does not fit takes what
                                idle threads cache (see magpool_alloc);
                                a trim does not.  Cached blocks keep
                                their chunks mapped: on a chunked pool
                                with many blocks below a chunk, 4 MiB
                                (and stream_cache_bytes 4 MiB) costs
                                less memory for some speed
                                (docs/benchmarks.md, 2026-12-04)          */
  size_t cache_max_block;    /* blocks larger than this bypass the caches;
                                default 1 MiB.  A chunked pool lowers it
                                to chunk_size, and without chunk groups
                                (chunk_groups 0, the default with a
                                max_pool_size) to chunk_size / 256 (8
                                KiB).  On a chunked pool a block below a
                                chunk of a size no cache holds is an
                                extent block (not on one with chunk
                                groups and thread_cache_bytes 0: with
                                no cache of its own there, blocks keep
                                their power of two, which moved far
                                fewer chunks and took less memory): it
                                takes only the granules
                                (chunk_size / 512; 4 KiB by default) its
                                request needs, in a row inside one
                                chunk, not its power of two
                                (magpool_alloc).  So a capped pool holds
                                4,000 live 136 KiB blocks within 1.024 of
                                their bytes where their power of two
                                would take 1.88.  A thread keeps the
                                extent blocks it frees (within its share
                                of thread_cache_bytes, 8 of each size
                                class) for its next request whose
                                granules they hold with at most an
                                eighth to spare; other requests take
                                from the shared tree (about 1,000-2,000
                                instructions an allocation and free,
                                where a cache hit costs tens;
                                docs/benchmarks.md).  A request that
                                would map memory while its thread keeps
                                extent blocks has them back first, so
                                they never make the pool grow.  Where
                                the footprint matters more than the
                                speed of blocks below 1 MiB, 8 KiB (or
                                256 KiB) on an uncapped pool does the
                                same there                              */
  size_t stream_cache_bytes; /* most bytes one thread keeps of the blocks
                                it freed on streams, for reuse on the
                                stream each was freed on, before a batch
                                is retired to the pool behind the stream;
                                default 8 MiB (split among many threads
                                as thread_cache_bytes is), shared
                                equally by the
                                streams the thread has used (a released
                                stream's share goes back to the others
                                when the thread next calls on another
                                stream than its last).  The streams
                                also keep blocks any thread freed on
                                them for every thread's reuse there:
                                this many bytes of small
                                blocks, and up to max(this, pool_size / 8)
                                of blocks larger than cache_max_block,
                                each total shared equally by the streams
                                the pool knows (counted as
                                magpool_usable_size counts them; on
                                chunked pools, blocks of a chunk or more
                                are not kept but fenced, see
                                magpool_alloc_async, and go behind the
                                stream in one batch per max(this,
                                pool_size / 8) bytes);
                                trim, the out-of-memory path and an
                                allocation that would raise the pool's
                                peak return them.  0 retires every async
                                free at once.
                                A retire on a stream that has finished
                                all its work returns the blocks to the
                                pool at once (host streams; CUDA streams
                                through the driver's cuStreamQuery in
                                relaxed capture mode, except
                                cudaStreamPerThread and a stream being
                                captured); so does the free
                                of a block of a chunk or more, or over
                                the stream's share, on such a stream: it
                                is not kept.  A kept block of the
                                request's size class may serve a smaller
                                request on its stream (magpool_usable_size
                                says how much) where the pool would
                                otherwise map or move memory for it     */
  int capture_check;         /* nonzero (default): every async free on a
                                CUDA stream asks whether s is captured
                                (the driver's cuStreamIsCapturing, about
                                20 ns on an H200; cudaStreamIsCapturing
                                if that call fails) and answers
                                MAGPOOL_ECAPTURE during a capture.  0: the
                                program promises to call
                                magpool_stream_release(pool, s) before it
                                begins capturing on s; every async call on
                                s then fails with MAGPOOL_ECAPTURE until
                                the capture ends, with no per-call cost  */
  size_t chunk_size;         /* granule of physical memory on pools whose
                                source maps memory on demand (HOST and
                                DEVICE; PINNED pools keep whole regions:
                                runtime calls such as
                                cudaHostGetDevicePointer and cudaMemset
                                go wrong on host memory mapped per chunk,
                                docs/design.md)
                                and whose pool_size is a multiple of it,
                                or is rounded to one (see pool_size) -
                                "chunked" pools: the pool
                                reserves address space for max_pool_size
                                at creation and
                                maps chunk_size pieces of it as blocks
                                first need them.  A power of two from
                                64 KiB to 1 GiB; default 2 MiB.  DEVICE
                                pools round it up to the device's
                                allocation granularity.  cache_max_block
                                is lowered to it if larger              */
  size_t release_threshold;  /* bytes of empty mapped chunks a pool keeps
                                mapped for reuse, like
                                cudaMemPoolAttrReleaseThreshold; empty
                                chunks above it are unmapped when a block
                                is given back.  Default SIZE_MAX (keep
                                all); magpool_trim unmaps every empty
                                chunk beyond pool_size                  */
  const char *trace_path;    /* non-NULL: record every allocation and free
                                of the pool (sync and async) into this
                                file, in magpool's trace format (README,
                                "Recording and replaying a trace"): per-
                                thread buffers, merged in call order and
                                written at magpool_destroy or at process
                                exit.  "%p" in the path becomes the
                                process id.  A path another pool of the
                                process already records to gets ".N"
                                appended (N: the pool's number).  The
                                string is copied at create.  Default:
                                the MAGPOOL_TRACE environment variable,
                                else NULL                                */
  int chunk_groups;          /* how a chunked pool maps its growth: 1, up
                                to 8 chunks per driver allocation (fewer
                                driver calls: about 5 us a chunk on an
                                H200 against 35), and, on a pool that can
                                grow, the chunks a move maps up to 4 per
                                allocation (a move of a chunk each costs
                                40-55 us on an H200); 0, a chunk each, so
                                that any empty chunk can move where a
                                request needs it (a group with one busy
                                chunk pins the rest: near max_pool_size a
                                request can then fail with memory empty;
                                and where blocks of a chunk or more, of
                                many sizes, come and go on many streams,
                                0 keeps the footprint lower: 1.064-1.079
                                against 1.078-1.121 on synthetic 4-64
                                stream traces, no change on the shipped
                                training and serving traces).  With 0,
                                blocks of a 64th of a chunk to half a
                                chunk also go into the fullest busy
                                chunk that has room for them, not the
                                lowest free address, so that sparse
                                chunks empty and can move (a look at up
                                to 1,024 chunks' counts on each such
                                take from the shared tree; cache hits
                                are unchanged), and the caches keep
                                blocks up to chunk_size / 256 only, so
                                that larger ones below a chunk are
                                extent blocks (cache_max_block), and the
                                pool maps at most one chunk beyond its
                                busy high-water mark + 1.5 % (8 with
                                groups).  With thread_cache_bytes and
                                stream_cache_bytes 0 as well, an
                                uncapped pool is "footprint first":
                                within cudaMalloc's footprint + 2 % on
                                every recorded trace (README).
                                Default -1: 0 with a max_pool_size, else
                                1.  Other values: MAGPOOL_EINVAL at
                                create                                   */
  int cross_stream_reuse;    /* nonzero: an async allocation on stream t
                                that would raise a chunked pool's peak
                                may reuse memory of runs (blocks of a
                                chunk or more) that other streams freed
                                and have not yet passed, by making t wait
                                for the work queued on those streams so
                                far (CUDA streams: an event and
                                cudaStreamWaitEvent; host streams: a
                                task), as cudaMallocAsync's
                                cudaMemPoolReuseAllowInternalDependencies
                                does.  t's later work then runs after
                                theirs, and the pool maps less while
                                streams run behind their host
                                (docs/benchmarks.md).  Default 0: streams
                                stay independent (a program that holds
                                one stream until another finishes, from
                                the host, needs that)                   */
} magpool_config_t;

/* Statistics of one pool, summed over all threads.  Counters are kept per
 * thread and merged when read, so a snapshot taken while other threads run
 * is a consistent sum of per-thread values, each exact, read at slightly
 * different instants. */
typedef struct magpool_stats {
  size_t used_bytes;         /* bytes in live allocations, rounded up to
                                their block size (on chunked pools, an
                                extent block counts its granules, a
                                block of a chunk or more its whole
                                chunks: magpool_usable_size)              */
  size_t requested_bytes;    /* bytes asked for by live allocations        */
  size_t reserved_bytes;     /* memory taken from the source (pool size,
                                growth included); on chunked pools, the
                                bytes of the chunks mapped now            */
  size_t peak_used_bytes;    /* high-water mark of bytes handed out by the
                                tree (live plus cached); >= used_bytes     */
  size_t cached_bytes;       /* free blocks held by thread caches, depots
                                and stream caches, ready for reuse; on
                                chunked pools also runs (blocks of a
                                chunk or more) fenced for their stream's
                                reuse (magpool_alloc_async) whose batch
                                has not yet gone behind the stream, and
                                those a stream that makes every such take
                                freed without a fence                    */
  size_t pending_bytes;      /* blocks freed on streams that have not yet
                                reached the free, as far as the pool
                                knows: retired behind the stream, fenced
                                runs included, until the stream's
                                callback and the next slow path (or
                                magpool_get_stats) see it pass            */
  size_t free_bytes;         /* bytes free in the tree (chunked pools: in
                                the mapped chunks)                         */
  size_t largest_free_block; /* largest block the tree can hand out now,
                                without growth (chunked pools: the largest
                                request that fits in free_bytes, whole
                                chunks; an estimate, the free bytes of
                                partly used chunks are not contiguous)    */
  uint64_t alloc_count;      /* successful allocations, ever               */
  uint64_t free_count;       /* successful frees, ever                     */
  uint64_t live_count;       /* live allocations                           */
  uint64_t grow_count;       /* times the pool grew                        */
  size_t peak_reserved_bytes;/* high-water mark of reserved_bytes since
                                creation or magpool_reset_peaks          */
  uint64_t chunk_maps;       /* chunks mapped, ever (creates and moves)   */
  uint64_t chunk_unmaps;     /* chunks unmapped, ever (moves included)    */
  uint64_t chunk_moves;      /* empty mapped chunks moved to where a block
                                needed memory instead of taking more      */
  size_t pending_at_peak_bytes; /* pending_bytes when reserved_bytes last
                                reached peak_reserved_bytes: memory freed
                                on streams that had not reached the frees
                                at the peak (streams running behind their
                                host hold that much; approximate while
                                several threads grow the pool at once)    */
  uint64_t stream_batches;   /* batches of frees queued behind a stream,
                                ever: each one is a stream callback, a host
                                function in the stream that holds the
                                stream's later work until the host has run
                                it (frees on a stream that had passed them
                                go back at once and queue none)           */
} magpool_stats_t;

/* ------------------------------------------------------------------------ */
/* Pools                                                                    */
/* ------------------------------------------------------------------------ */

/* Fills *cfg with the defaults above, then applies the environment:
 * MAGPOOL_CONF (a magpool_config_parse string) over the built-in
 * defaults, and MAGPOOL_TRACE (a path) as trace_path unless MAGPOOL_CONF
 * named trace_path.  A program's own settings made after this call win
 * over both.  A MAGPOOL_CONF that does not parse is ignored as a whole,
 * with one line on stderr naming the bad key or value (once per
 * process).  No-op if cfg is NULL. */
MAGPOOL_API void magpool_config_init(magpool_config_t *cfg);

/* Applies a "key=value,key=value" string to *cfg: each key is the name of
 * a magpool_config_t field (except struct_size).  Values:
 *   - sizes: a decimal number with an optional binary suffix K, M, G or T
 *     (KiB ... TiB; "k", "KB", "KiB" mean the same), or "max" (SIZE_MAX);
 *   - flags (allow_growth, capture_check): 0, 1, true, false, yes, no,
 *     on, off;
 *   - kind: host, device, pinned, or 0, 1, 2;
 *   - device: a decimal number >= 0;
 *   - trace_path: the text up to the next comma (copied; kept for the
 *     life of the process); an empty value sets NULL.
 * Spaces around keys and values are ignored, and so are empty items
 * ("a=1,,b=2," is fine).  A key may appear more than once: the last
 * wins.  Values are checked for syntax and range of their type only;
 * magpool_create checks the combination.  Fields beyond cfg->struct_size
 * (a program built against an older header) are unknown keys.
 * Returns 0, or MAGPOOL_EINVAL - changing nothing in *cfg - for a NULL
 * argument, an unknown key, an item without '=', or a bad value;
 * magpool_config_error() then names the key or value. */
MAGPOOL_API int magpool_config_parse(magpool_config_t *cfg, const char *conf);

/* A never-NULL English description of why the calling thread's last
 * failing magpool_config_parse failed, e.g. "unknown key 'pool_sise'";
 * "" if none has failed on this thread.  Thread-local storage, valid
 * until the thread's next magpool_config_parse. */
MAGPOOL_API const char *magpool_config_error(void);

/* Creates a pool and stores it in *out.
 * Returns MAGPOOL_EINVAL for a NULL argument, a struct_size too small, a
 * min_block that is not a power of two in [16, 65536], a pool_size smaller
 * than min_block, or a max_pool_size below pool_size; MAGPOOL_ENOMEM if the
 * source cannot give pool_size bytes; MAGPOOL_ENODEV for a DEVICE or PINNED
 * pool on a machine with no GPU or driver, or in a build without CUDA;
 * MAGPOOL_ECUDA if a CUDA call failed; MAGPOOL_EINVAL also when trace_path
 * names a file that cannot be created.  On failure *out is left
 * unchanged. */
MAGPOOL_API int magpool_create(const magpool_config_t *cfg, magpool_t **out);

/* Destroys the pool and gives all its memory back to its source, live
 * allocations included.  Must not overlap any other call on the pool.  For
 * pools used with streams: every stream the pool was used on must have been
 * synchronised (or released with magpool_stream_release) first; destroy then
 * waits for pending stream batches to come back (a host stream that never
 * drains makes it wait forever, asleep).  Other threads' cache
 * records for the pool are orphaned and freed by those threads when they
 * exit; destroy never waits for them, except for a thread that is exiting
 * at that moment.  Returns MAGPOOL_EINVAL for NULL. */
MAGPOOL_API int magpool_destroy(magpool_t *pool);

/* ------------------------------------------------------------------------ */
/* Synchronous allocation                                                   */
/* ------------------------------------------------------------------------ */

/* Allocates size bytes in a block of the next power of two (at least
 * min_block).  The block is aligned to min_block, and to its own size up to
 * the alignment of the region it lies in: on HOST pools a region is aligned
 * to its size rounded up to a power of two; on DEVICE and
 * PINNED pools to what cudaMalloc / cudaHostAlloc give (at least 256 B).
 * Chunked pools (HOST and DEVICE pools whose pool_size is whole chunks or
 * is rounded up to them; see chunk_size): a block under a chunk is as
 * above, but one of a size no cache holds (larger than cache_max_block,
 * or than half of thread_cache_bytes and of stream_cache_bytes) and of two
 * granules or more is an extent block: the request rounded up to whole
 * granules of chunk_size / 512, aligned to a granule, inside one chunk,
 * and that is its usable
 * size (a request that needs its whole power of two gets it, aligned to
 * it); a larger request that no cache serves gets a run of whole chunks,
 * aligned to the chunk, whose usable size is the request rounded up to
 * whole chunks.  On
 * DEVICE pools, free with magpool_free only memory no GPU work still uses
 * (as with any sync free; use magpool_free_async otherwise): an empty chunk
 * may be unmapped at once.  size 0 is valid: it returns a
 * unique block of min_block bytes that must be freed like any other.
 * Returns NULL with MAGPOOL_EINVAL for a NULL pool, and MAGPOOL_ENOMEM when
 * the request does not fit - sizes near SIZE_MAX included.  The pool stays
 * usable after a failure.
 *
 * The out-of-memory promise (every allocation call, sync and async):
 * MAGPOOL_ENOMEM only if the request still does not fit after all of
 *   - every thread's caches for the pool are returned, idle threads'
 *     included (taken over while their threads are outside magpool);
 *   - every depot is drained and every stream cache retired;
 *   - every stream free pending when the call began has completed: the
 *     call waits for those streams, however long their work takes (a
 *     stream whose work never completes makes it wait forever);
 *   - growth has been tried (allow_growth, up to max_pool_size).
 * While other threads keep freeing on streams and taking what comes back,
 * the ladder runs again as long as completions keep coming and the
 * request could fit beside the live allocations (up to 1024 rounds).
 * Memory that other threads hold live is not there.  Memory that is free
 * but in the middle of another thread's merge or split is waited for
 * briefly.
 * Blocks from the synchronous API are ready for host use (HOST and PINNED
 * pools) or for any stream (DEVICE pools) at once. */
MAGPOOL_API void *magpool_alloc(magpool_t *pool, size_t size);

/* Frees ptr, which came from magpool_alloc* on this pool.  ptr NULL is a no-
 * op that returns 0.  Returns MAGPOOL_EINVAL, changing nothing, for a NULL
 * pool or a pointer that is not a live allocation of this pool: foreign,
 * interior, or already freed.  (Double frees are detected when the two
 * frees are ordered by the program; two frees of one pointer that race each
 * other are a data race in the caller.) */
MAGPOOL_API int magpool_free(magpool_t *pool, void *ptr);

/* As magpool_free, but the caller also passes the size it asked for.
 * Returns MAGPOOL_EINVAL, freeing nothing, unless size is exactly the size
 * the allocation was made with. */
MAGPOOL_API int magpool_free_sized(magpool_t *pool, void *ptr, size_t size);

/* The usable size of a live allocation (its block size: whole granules for
 * an extent block, whole chunks for a run; magpool_alloc), or 0 if ptr is
 * not a live allocation of the pool. */
MAGPOOL_API size_t magpool_usable_size(magpool_t *pool, const void *ptr);

/* Returns everything cached to the tree and completes coalescing (on a
 * chunked pool it then unmaps every empty chunk beyond pool_size): the
 * calling thread's cache, every depot, every thread's stream cache
 * (retired behind its stream's work; a cudaStreamPerThread cache is
 * retired by its own thread, at its next call on the pool) and every ready
 * batch of stream frees that has completed.  Caches of threads that have exited were returned when they
 * exited.  The caches of other live threads are not touched by trim: each
 * of those threads returns its whole cache for this pool at its next
 * allocation or free on this pool (it sees the pool's trim epoch move).
 * Stream frees that have not completed stay pending.  When trim returns
 * with no live allocation, no other live thread holding a cache, and
 * nothing pending, the pool is one free block again (per region: a pool
 * that grew has one region per growth step, and a pool whose size is not a
 * power of two is the binary decomposition of its size).  Returns
 * MAGPOOL_EINVAL for NULL. */
MAGPOOL_API int magpool_trim(magpool_t *pool);

/* Fills *out with a snapshot of the pool's statistics, from counters kept
 * per thread and per depot, and the trees' summaries for the largest free
 * block; no bitmap is scanned.  O(threads that used the pool + tree levels
 * + streams in use with the pool).  On a chunked pool it first gives back
 * the stream frees whose streams have passed them (as any allocation's
 * slow path does), so that pending_bytes counts only frees still waiting.
 * MAGPOOL_EINVAL for NULL arguments. */
MAGPOOL_API int magpool_get_stats(magpool_t *pool, magpool_stats_t *out);

/* Restarts the high-water marks: peak_used_bytes and peak_reserved_bytes
 * become the current values (pending_at_peak_bytes the current
 * pending_bytes).  Meant for measuring phases of a program
 * (the replay tool's passes).  MAGPOOL_EINVAL for NULL. */
MAGPOOL_API int magpool_reset_peaks(magpool_t *pool);

/* A cheap query for memory-pressure decisions: *free_bytes receives what
 * the pool could still hand out without growing (free in the tree plus
 * cached), *total_bytes the memory it has reserved.  Either pointer may be
 * NULL.  The same cost as magpool_get_stats.  MAGPOOL_EINVAL for a NULL
 * pool. */
MAGPOOL_API int magpool_mem_info(magpool_t *pool, size_t *free_bytes,
                                 size_t *total_bytes);

/* Checks the pool's internal invariants (tree bitmaps, block headers,
 * accounting) and returns 0 or MAGPOOL_EINVAL if one is broken.  O(pool
 * size); meant for tests and debugging, on a quiescent pool. */
MAGPOOL_API int magpool_check(magpool_t *pool);

/* n rounded up to a multiple of align, which must be a power of two (0 and
 * non-powers return 0).  Returns 0 if the result would overflow size_t. */
MAGPOOL_API size_t magpool_align_up(size_t n, size_t align);

/* ------------------------------------------------------------------------ */
/* Stream-ordered allocation                                                */
/* ------------------------------------------------------------------------ */

/* Allocates size bytes for use on stream s, with the semantics of
 * cudaMallocAsync: the block may be handed out while earlier work on s is
 * still running, so it is only safe to use from work queued on s after this
 * call (or after synchronising s).  Blocks freed on s are reused by
 * allocations on s at once: a thread's own small blocks by that thread,
 * and any block, of any size, by every thread's allocations on s; any
 * other allocation (another stream, the synchronous API) gets them only
 * once s has passed the free.  On chunked pools, a block of a chunk or
 * more freed on s before s has passed it goes back to the pool's free runs
 * at once, marked for s ("fenced"): s's requests of any size may use its
 * chunks, alone or joined with free ones; others only once s has passed
 * the free and the pool has seen it (a completed stream callback, asked
 * for once per max(stream_cache_bytes, pool_size / 8) bytes of such
 * frees - not while s made the pool's last 4096 takes of such blocks,
 * as a training loop's one stream does: no other stream waits for them -
 * and at trim, the out-of-memory path, magpool_stream_release and other
 * streams' peaks; or when a free on s finds s idle).  While s makes the
 * pool's last 4096 takes of such blocks, its frees of them are not even
 * fenced (no callback, no question to s): the first request for such a
 * block from elsewhere, one that would map memory, trim or
 * magpool_stream_release(s) fences them for s then, as above; until then
 * release_threshold leaves that memory mapped.  With
 * cross_stream_reuse set, a request on another stream t that would raise
 * the pool's peak may take them before, after making t wait for s's work
 * queued so far (magpool_config_t).  s may be NULL: the legacy default stream on DEVICE and
 * PINNED pools; "no stream" (same as magpool_alloc) on HOST pools.  Errors as magpool_alloc, plus MAGPOOL_ECUDA if a CUDA call
 * failed, and MAGPOOL_EINVAL for a stream of the wrong kind where that can
 * be told.  Stream capture: the first call for s on a thread (and the first
 * after any magpool_stream_release) fails with MAGPOOL_ECAPTURE while s is
 * being captured; a later call may instead be served from the thread's
 * cache for s without a CUDA call.  Such a block is allocated at capture
 * time and stays allocated until it is freed outside the capture, so a
 * graph may keep using it; it is never handed out twice. */
MAGPOOL_API void *magpool_alloc_async(magpool_t *pool, size_t size,
                                      magpool_stream_t s);

/* Frees ptr in stream order on s, like cudaFreeAsync: the block returns to
 * the pool once all work queued on s before this call has finished.  Later
 * allocations on s may reuse it at once.  ptr may come from any magpool
 * allocation call of this pool.  Errors as magpool_free, plus
 * MAGPOOL_ECAPTURE when s is being captured: a free recorded into a graph
 * would be a no-op at every replay, so the block stays allocated (free it
 * outside the capture once the graph is done with it).  To that end every
 * free on a CUDA stream asks whether s is being captured first (the
 * driver's cuStreamIsCapturing), unless the pool was created with
 * capture_check = 0 (see magpool_config_t). */
MAGPOOL_API int magpool_free_async(magpool_t *pool, void *ptr,
                                   magpool_stream_t s);

/* Call before destroying stream s (or when s will no longer be used with
 * this pool), and before beginning a capture on s: every thread's cache of
 * blocks freed on s is retired behind s's pending work, and the pool
 * forgets s: its entry leaves the stream table (freed once its pending
 * frees complete and every thread has let go of it), and every thread's
 * cache for s closes.  Does not wait for s; it may wait a few
 * microseconds for a thread that is inside an async call on s, or that is
 * retiring its own cache for s.  Must not race async calls on s itself.
 * Returns 0 also when the pool has never seen s.  After it, s's handle may
 * be reused for a new stream, which the pool tells apart by its id.  A
 * thread's cudaStreamPerThread entry is released when the thread exits. */
MAGPOOL_API int magpool_stream_release(magpool_t *pool, magpool_stream_t s);

/* ------------------------------------------------------------------------ */
/* Host streams: in-order executors for machines with no GPU, and tests     */
/* ------------------------------------------------------------------------ */

/* Creates a host stream: a thread that runs launched functions one at a
 * time, in launch order.  MAGPOOL_ENOMEM if it cannot be created. */
MAGPOOL_API int magpool_host_stream_create(magpool_stream_t *out);

/* Queues fn(arg) on s.  Returns at once. */
MAGPOOL_API int magpool_host_stream_launch(magpool_stream_t s,
                                           void (*fn)(void *arg), void *arg);

/* Blocks until every function launched on s before this call has run. */
MAGPOOL_API int magpool_host_stream_sync(magpool_stream_t s);

/* Waits for s's queued work, then frees it.  Call magpool_stream_release on
 * each pool that used s first. */
MAGPOOL_API int magpool_host_stream_destroy(magpool_stream_t s);

/* ------------------------------------------------------------------------ */
/* Scopes: every allocation made through a scope is freed when it ends       */
/* ------------------------------------------------------------------------ */

typedef struct magpool_scope magpool_scope_t;

/* Opens a scope on pool.  A scope belongs to the thread that uses it: it
 * must not be used by two threads at once.  NULL with MAGPOOL_EINVAL or
 * MAGPOOL_ENOMEM on failure. */
MAGPOOL_API magpool_scope_t *magpool_scope_begin(magpool_t *pool);

/* magpool_alloc, with the block recorded in the scope. */
MAGPOOL_API void *magpool_scope_alloc(magpool_scope_t *scope, size_t size);

/* Frees one block of the scope before the scope ends.  Blocks allocated
 * through a scope belong to it: magpool_free and magpool_free_sized refuse
 * them with MAGPOOL_EINVAL, so the scope can never free a block twice.
 * Returns MAGPOOL_EINVAL if ptr is not a live block of this scope; 0 for
 * NULL. */
MAGPOOL_API int magpool_scope_free(magpool_scope_t *scope, void *ptr);

/* Frees every block still held by the scope, then the scope itself.
 * Returns 0, or MAGPOOL_EINVAL for NULL. */
MAGPOOL_API int magpool_scope_end(magpool_scope_t *scope);

/* ------------------------------------------------------------------------ */
/* Allocation tracking and leak checks                                      */
/* ------------------------------------------------------------------------ */

/* Tracking records each live allocation's pointer, size and tag.  It is off
 * by default, costs a mutex per allocation while on, and must be switched on
 * while the pool has no live allocation (else MAGPOOL_EBUSY). */
MAGPOOL_API int magpool_tracking_enable(magpool_t *pool, int on);

/* Sets the calling thread's tag (a static string, or NULL) attached to its
 * tracked allocations from now on.  Thread-local, for all pools. */
MAGPOOL_API void magpool_set_tag(const char *tag);

/* Calls fn(ptr, size, tag, arg) for each tracked live allocation, and
 * returns how many there were (or a negative error).  fn must not call
 * magpool on this pool. */
MAGPOOL_API long magpool_leak_check(magpool_t *pool,
                                    void (*fn)(void *ptr, size_t size,
                                               const char *tag, void *arg),
                                    void *arg);

#ifdef __cplusplus
}
#endif

#endif /* MAGPOOL_H */
