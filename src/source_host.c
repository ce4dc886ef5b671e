/* source_host.c - the host memory source: anonymous mmap.  Layer 1. */
#include "internal.h"

#include <sys/mman.h>

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

const mp_source_ops mp_source_host = {
  .name = "host",
  .reserve = host_reserve,
  .release = host_release,
  .commit = NULL, /* anonymous memory is backed on touch */
  .decommit = host_decommit,
  .open = NULL,
  .close = NULL,
};
