/* test_kinds.c - DEVICE and PINNED pools, which need a GPU: on a machine
 * without one, creation fails cleanly.
 */
#define _POSIX_C_SOURCE 200809L /* access() */

#include <magpool.h>

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

static bool nvidia_device_node(void) {
  return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0;
}

static void try_gpu_kind(magpool_mem_kind_t kind, const char *name) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.kind = kind;
  cfg.pool_size = 16 * MiB;
  magpool_t *sentinel = (magpool_t *)(uintptr_t)0x5A5A;
  magpool_t *pool = sentinel;
  int rc = magpool_create(&cfg, &pool);
  if (!nvidia_device_node()) {
    /* No driver: the contract says ENODEV ("or in a build without CUDA");
     * ENOTSUP is accepted as the other honest answer. */
    cr_assert(rc == MAGPOOL_ENODEV || rc == MAGPOOL_ENOTSUP,
              "%s pool on a machine without a GPU: create = %d (%s)", name,
              rc, magpool_strerror(rc));
    cr_assert_eq(pool, sentinel, "%s: *out changed on failure", name);
    return;
  }
  /* A machine with an NVIDIA driver: the pool may work (CUDA build) or not
   * (build without CUDA). */
  if (rc != 0) {
    cr_assert(rc == MAGPOOL_ENODEV || rc == MAGPOOL_ENOTSUP ||
                  rc == MAGPOOL_ECUDA,
              "%s: create = %d", name, rc);
    cr_assert_eq(pool, sentinel);
    return;
  }
  void *p = magpool_alloc(pool, 1 * MiB);
  cr_assert_not_null(p, "%s: alloc failed: %s", name,
                     magpool_strerror(magpool_last_error()));
  if (kind == MAGPOOL_MEM_PINNED)
    memset(p, 1, 1 * MiB); /* pinned memory is host memory */
  cr_assert_eq(magpool_free(pool, p), 0);
  mpt_assert_all_free(pool);
  /* The whole pool as one block.  DEVICE and PINNED regions are aligned
   * as cudaMalloc / cudaHostAlloc align them: the header promises 256 B. */
  void *all = magpool_alloc(pool, 16 * MiB);
  cr_assert_not_null(all, "%s: the whole 16 MiB pool is not one block",
                     name);
  cr_assert(mpt_is_aligned(all, 256),
            "%s: 16 MiB block at %p not aligned to 256 B", name, all);
  cr_assert_eq(magpool_free(pool, all), 0);
  mpt_assert_all_free(pool);
  mpt_pool_done(pool);
}

Test(kinds, device_pool_without_gpu) { try_gpu_kind(MAGPOOL_MEM_DEVICE, "DEVICE"); }
Test(kinds, pinned_pool_without_gpu) { try_gpu_kind(MAGPOOL_MEM_PINNED, "PINNED"); }

Test(kinds, bad_device_ordinal) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.kind = MAGPOOL_MEM_DEVICE;
  cfg.device = 4096;
  cfg.pool_size = 1 * MiB;
  magpool_t *sentinel = (magpool_t *)(uintptr_t)0x5A5A;
  magpool_t *pool = sentinel;
  int rc = magpool_create(&cfg, &pool);
  cr_assert_neq(rc, 0, "a pool on device 4096 was created");
  cr_assert_lt(rc, 0);
  cr_assert_eq(pool, sentinel);
}
