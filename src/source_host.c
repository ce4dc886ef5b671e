/* source_host.c - the host memory source: anonymous mmap.  Layer 1. */
#include "internal.h"

#include <sys/mman.h>
#include <unistd.h>

/* Reserve: anonymous, NORESERVE mapping; pages are backed on first touch
 * and given back by decommit (MADV_DONTNEED), which is what a later issue's
 * chunk mapping will call. */
/* Regions are aligned to their size rounded up to a power of two, so that
 * every block is aligned to its own size: the tree places
 * a block of 2^k bytes at an offset that is a multiple of 2^k.  Over-
 * reserving address space with NORESERVE costs no memory; the unaligned
 * head and tail are unmapped at once. */
static int host_reserve(void *ctx, size_t size, void **base) {
  (void)ctx;
  size_t align = (size_t)1 << mp_log2_ceil(size);
  if (align < 4096) align = 4096;
  size_t span = size + align - 4096;
  char *p = mmap(NULL, span, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return MAGPOOL_ENOMEM;
  char *a = (char *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
  if (a > p) munmap(p, (size_t)(a - p));
  char *end = p + span, *aend = a + ((size + 4095) & ~(size_t)4095);
  if (end > aend) munmap(aend, (size_t)(end - aend));
  *base = a;
  return 0;
}

static int host_release(void *ctx, void *base, size_t size) {
  (void)ctx;
  return munmap(base, (size + 4095) & ~(size_t)4095) == 0 ? 0 : MAGPOOL_EINVAL;
}

static int host_decommit(void *ctx, void *addr, size_t size) {
  (void)ctx;
  return madvise(addr, size, MADV_DONTNEED) == 0 ? 0 : MAGPOOL_EINVAL;
}

/* Chunk mapping: the range is reserved PROT_NONE (no memory, no
 * commit charge); map makes a run readable and writable (pages are then
 * backed on first touch), unmap gives the pages back (MADV_DONTNEED) and
 * makes the run inaccessible again, so a stray access after a free faults
 * instead of silently re-backing the page.  `keep` has no meaning here:
 * the kernel keeps the memory. */
static size_t host_granularity(void *ctx) {
  (void)ctx;
  long pg = sysconf(_SC_PAGESIZE);
  return pg > 0 ? (size_t)pg : 4096;
}

static int host_va_reserve(void *ctx, size_t size, size_t chunk, void **base) {
  (void)ctx;
  (void)chunk;
  size_t span = size * 2;
  if (span < size) return MAGPOOL_ENOMEM;
  char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return MAGPOOL_ENOMEM;
  char *a = (char *)(((uintptr_t)p + size - 1) & ~(uintptr_t)(size - 1));
  if (a > p) munmap(p, (size_t)(a - p));
  if (p + span > a + size) munmap(a + size, (size_t)(p + span - (a + size)));
  *base = a;
  return 0;
}

static int host_va_release(void *ctx, void *base, size_t size) {
  (void)ctx;
  return munmap(base, size) == 0 ? 0 : MAGPOOL_EINVAL;
}

static int host_map(void *ctx, void *addr, size_t bytes) {
  (void)ctx;
  return mprotect(addr, bytes, PROT_READ | PROT_WRITE) == 0 ? 0 : MAGPOOL_ENOMEM;
}

static int host_unmap(void *ctx, void *addr, size_t bytes, int keep) {
  (void)ctx;
  (void)keep;
  if (madvise(addr, bytes, MADV_DONTNEED) != 0) return MAGPOOL_EINVAL;
  return mprotect(addr, bytes, PROT_NONE) == 0 ? 0 : MAGPOOL_EINVAL;
}

static size_t host_capacity(void *ctx) {
  (void)ctx;
  long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
  return pages > 0 && pg > 0 ? (size_t)pages * (size_t)pg : 0;
}

const mp_source_ops mp_source_host = {
  .name = "host",
  .reserve = host_reserve,
  .release = host_release,
  .commit = NULL, /* anonymous memory is backed on touch */
  .decommit = host_decommit,
  .open = NULL,
  .close = NULL,
  .granularity = host_granularity,
  .va_reserve = host_va_reserve,
  .va_release = host_va_release,
  .map = host_map,
  /* Nothing to gain on the host, but the chunk map then groups host
   * pools as device pools, so the tests of this machine see the same
   * placement and footprint. */
  .map_group = host_map,
  .unmap = host_unmap,
  .capacity = host_capacity,
};
