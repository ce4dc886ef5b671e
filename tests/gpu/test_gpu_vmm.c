/* test_gpu_vmm.c - the chunk-mapping ops of the DEVICE memory source
 * (granularity, va_reserve, va_release, map, unmap) on a real GPU, through
 * the source tables of src/internal.h.
 *
 * A 1 GiB range of 2 MiB chunks, aligned to its size; a run of 3 chunks
 * mapped, written and read back (cudaMemset and a copy); the middle chunk
 * unmapped and kept, a chunk mapped
 * elsewhere with the kept memory (no create: the source's counters say
 * so), written and read; a group of 4 kept and mapped elsewhere (no
 * create), a kept group a one-chunk map leaves alone freed by drop_kept;
 * unmap without keep frees; an unmap of three mappings whose third
 * driver call fails (MP_HOOK_VMM_UNMAP) leaves all three mapped with their
 * bytes and the counters as they were; bad input (unaligned,
 * outside the range, already mapped, not mapped, zero, a run over the
 * end) answers MAGPOOL_EINVAL and changes no counter; va_release with
 * chunks still mapped and kept frees them all (the device's free memory
 * comes back to within 2 MiB).  A run larger than the device's free
 * memory must fail with MAGPOOL_ENOMEM and leave nothing mapped; that step
 * maps the whole GPU for a moment, so it runs only when the device has at
 * most 16 GiB free or MAGPOOL_GPU_TEST_OOM=1 is set (skipped otherwise,
 * and with MAGPOOL_GPU_TEST_SMALL).
 *
 * The PINNED source has no chunk ops (whole regions from cudaHostAlloc:
 * docs/design.md, "PINNED: whole regions", says why); its region is
 * written and read from both sides at the same address (a kernel writes
 * and the host reads in place, the host writes and a kernel counts,
 * vmm_kernels.cu).
 *
 * Exit status: 0 pass, 1 fail, 77 no usable GPU (ctest SKIP_RETURN_CODE). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/internal.h"

#define GPU_TEST "gpu_vmm"
#include "gpu_check.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static size_t dev_free(void) {
  size_t f = 0, t = 0;
  CK(cudaMemGetInfo(&f, &t));
  return f;
}

static int same_counts(const mp_chunk_counts *a, const mp_chunk_counts *b) {
  return a->creates == b->creates && a->releases == b->releases && a->reuses == b->reuses &&
         a->mapped == b->mapped && a->kept == b->kept;
}

static mp_chunk_counts counts(void *ctx) {
  mp_chunk_counts c;
  REQUIRE(mp_source_chunk_counts(ctx, &c) == 0, "counts");
  return c;
}

/* Writes `byte` over [p, p + n) with cudaMemset, copies it back and checks
 * every byte. */
static void check_fill(const char *what, void *p, size_t n, unsigned char byte) {
  unsigned char *h = malloc(n);
  REQUIRE(h != NULL, "malloc");
  CK(cudaMemset(p, byte, n));
  memset(h, ~byte, n);
  CK(cudaMemcpy(h, p, n, cudaMemcpyDefault));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != byte;
  EXPECT(bad == 0, "%s: %zu of %zu bytes differ from 0x%02x", what, bad, n, byte);
  free(h);
}

/* vmm_kernels.cu: kernels that touch memory through its device address. */
int vmm_kernel_fill(void *p, size_t n, unsigned char v);
int vmm_kernel_count(const void *p, size_t n, unsigned char v, unsigned long long *bad);

#define KK(x)                                                                  \
  do {                                                                         \
    int e_ = (x);                                                              \
    REQUIRE(e_ == 0, "%s", cudaGetErrorString((cudaError_t)e_));               \
  } while (0)

/* Pinned memory, from both sides at the same address: a kernel writes, the
 * host reads in place; the host writes, a kernel counts. */
static void check_pinned(const char *what, void *p, size_t n, unsigned char byte) {
  unsigned char *h = p;
  KK(vmm_kernel_fill(p, n, byte));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != byte;
  EXPECT(bad == 0, "%s: host read %zu bad bytes of device writes", what, bad);
  memset(h, (unsigned char)~byte, n);
  unsigned long long dbad = 0;
  KK(vmm_kernel_count(p, n, (unsigned char)~byte, &dbad));
  EXPECT(dbad == 0, "%s: device read %llu bad bytes of host writes", what, dbad);
  memset(h, byte, n);
}

/* Every bad call answers EINVAL and leaves the counters as they were. */
static void check_bad_input(const mp_source_ops *ops, void *ctx, char *base, size_t size,
                            size_t chunk, size_t gran) {
  mp_chunk_counts before = counts(ctx);
  struct { const char *what; void *addr; size_t bytes; } maps[] = {
    { "unaligned", base + chunk / 2, chunk },
    { "at the range's end", base + size, chunk },
    { "below the range", base - chunk, chunk },
    { "already mapped", base + 2 * chunk, chunk },
    { "zero bytes", base + 40 * chunk, 0 },
    { "part of a chunk", base + 40 * chunk, chunk / 2 },
    { "over the range's end", base + size - chunk, 2 * chunk },
    { "half mapped", base + chunk, 2 * chunk },
  };
  for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++) {
    int rc = ops->map(ctx, maps[i].addr, maps[i].bytes);
    EXPECT(rc == MAGPOOL_EINVAL, "%s: map %s: rc %d", ops->name, maps[i].what, rc);
  }
  struct { const char *what; void *addr; size_t bytes; } unmaps[] = {
    { "not mapped", base + 40 * chunk, chunk },
    { "unaligned", base + 2 * chunk + chunk / 2, chunk },
    { "outside", base + size, chunk },
    { "half mapped", base + chunk, 2 * chunk },
  };
  for (size_t i = 0; i < sizeof unmaps / sizeof unmaps[0]; i++) {
    int rc = ops->unmap(ctx, unmaps[i].addr, unmaps[i].bytes, 1);
    EXPECT(rc == MAGPOOL_EINVAL, "%s: unmap %s: rc %d", ops->name, unmaps[i].what, rc);
  }
  void *b2 = NULL;
  EXPECT(ops->va_reserve(ctx, 3 * MiB, chunk, &b2) == MAGPOOL_EINVAL, "size not a power of two");
  EXPECT(ops->va_reserve(ctx, size, 3 * MiB, &b2) == MAGPOOL_EINVAL, "chunk not a power of two");
  EXPECT(ops->va_reserve(ctx, chunk, 2 * chunk, &b2) == MAGPOOL_EINVAL, "chunk over size");
  if (gran > 4096)
    EXPECT(ops->va_reserve(ctx, size, gran / 2, &b2) == MAGPOOL_EINVAL, "chunk under granularity");
  EXPECT(ops->va_release(ctx, base + chunk, size) == MAGPOOL_EINVAL, "release of no range");
  EXPECT(ops->va_release(ctx, base, size / 2) == MAGPOOL_EINVAL, "release of a wrong size");
  mp_chunk_counts after = counts(ctx);
  EXPECT(same_counts(&before, &after), "%s: a bad call changed the counters", ops->name);
}

/* A run larger than the device's free memory fails with ENOMEM, nothing of
 * it stays mapped, and the kept chunk is still kept. */
static void check_oom(const mp_source_ops *ops, void *ctx, size_t chunk) {
  size_t f = dev_free();
  size_t run = (f / chunk + 64) * chunk, size = chunk;
  while (size < run) size <<= 1;
  void *b = NULL;
  int rc = ops->va_reserve(ctx, size, chunk, &b);
  REQUIRE(rc == 0, "oom: va_reserve %zu GiB: rc %d", size / GiB, rc);
  /* One chunk kept: the failed run takes it first and must give it back. */
  REQUIRE(ops->map(ctx, (char *)b + size - chunk, chunk) == 0, "oom: map one");
  REQUIRE(ops->unmap(ctx, (char *)b + size - chunk, chunk, 1) == 0, "oom: keep one");
  mp_chunk_counts before = counts(ctx);
  rc = ops->map(ctx, b, run);
  mp_chunk_counts after = counts(ctx);
  EXPECT(rc == MAGPOOL_ENOMEM, "oom: map of %zu MiB with %zu MiB free: rc %d (cuda %d)",
         run / MiB, f / MiB, rc, magpool_last_cuda_error());
  EXPECT(after.mapped == before.mapped && after.kept == before.kept &&
             after.creates - after.releases == before.creates - before.releases,
         "oom: the failed run left memory behind: mapped %llu kept %llu live %llu (was %llu)",
         (unsigned long long)after.mapped, (unsigned long long)after.kept,
         (unsigned long long)(after.creates - after.releases),
         (unsigned long long)(before.creates - before.releases));
  EXPECT(ops->va_release(ctx, b, size) == 0, "oom: va_release");
  size_t f3 = dev_free();
  EXPECT(f3 + 2 * MiB >= f, "oom: free memory %zu MiB, was %zu MiB", f3 / MiB, f / MiB);
  printf("gpu_vmm: %s: a run of %zu MiB with %zu MiB free: ENOMEM, undone\n", ops->name,
         run / MiB, f / MiB);
}

/* A group of 4 chunks unmapped with keep serves the next group of its
 * size elsewhere (a move in groups: no create, no release); a kept group
 * no map of its size takes stays until drop_kept frees it. */
static void check_groups(const mp_source_ops *ops, void *ctx, char *base, size_t chunk) {
  if (ops->map_group == NULL || ops->drop_kept == NULL) return;
  char *g1 = base + 200 * chunk, *g2 = base + 300 * chunk;
  mp_chunk_counts c0 = counts(ctx), c;
  REQUIRE(ops->map_group(ctx, g1, 4 * chunk) == 0, "%s: map_group", ops->name);
  check_fill("group", g1, 4 * chunk, 0x3c);
  EXPECT(ops->unmap(ctx, g1, 4 * chunk, 1) == 0, "%s: unmap group keep", ops->name);
  c = counts(ctx);
  EXPECT(c.kept == c0.kept + 4 && c.creates == c0.creates + 1 && c.releases == c0.releases,
         "%s: kept group: kept %llu creates %llu", ops->name, (unsigned long long)c.kept,
         (unsigned long long)c.creates);
  REQUIRE(ops->map_group(ctx, g2, 4 * chunk) == 0, "%s: map_group kept", ops->name);
  c = counts(ctx);
  EXPECT(c.creates == c0.creates + 1 && c.reuses == c0.reuses + 4 && c.kept == c0.kept &&
             c.mapped == c0.mapped + 4,
         "%s: the group move created memory: creates %llu reuses %llu kept %llu", ops->name,
         (unsigned long long)c.creates, (unsigned long long)c.reuses, (unsigned long long)c.kept);
  check_fill("moved group", g2, 4 * chunk, 0xc3);
  /* Kept again; a one-chunk map does not take it, drop_kept frees it. */
  EXPECT(ops->unmap(ctx, g2, 4 * chunk, 1) == 0, "%s: unmap group keep again", ops->name);
  REQUIRE(ops->map(ctx, g1, chunk) == 0, "%s: map one beside a kept group", ops->name);
  c = counts(ctx);
  EXPECT(c.creates == c0.creates + 2 && c.kept == c0.kept + 4, "%s: a chunk took the group",
         ops->name);
  ops->drop_kept(ctx);
  c = counts(ctx);
  EXPECT(c.kept == c0.kept && c.releases == c0.releases + 1 && c.mapped == c0.mapped + 1,
         "%s: drop_kept: kept %llu releases %llu", ops->name, (unsigned long long)c.kept,
         (unsigned long long)c.releases);
  EXPECT(ops->unmap(ctx, g1, chunk, 0) == 0, "%s: unmap the chunk", ops->name);
}

/* An unmap over three one-chunk mappings whose third driver call fails
 * (the hook fails it) is all or none: the two unmapped first are mapped
 * back, every byte and counter as before, and the run works and unmaps
 * afterwards. */
static char *fail_at;
static void fail_hook(int point, void *arg) {
  if (point == MP_HOOK_VMM_UNMAP && ((mp_hook_unmap *)arg)->addr == fail_at)
    ((mp_hook_unmap *)arg)->fail = 1;
}
static void check_unmap_all_or_none(const mp_source_ops *ops, void *ctx, char *base,
                                    size_t chunk) {
  char *r3 = base + 400 * chunk;
  REQUIRE(ops->map(ctx, r3, 3 * chunk) == 0, "%s: map a row of 3", ops->name);
  check_fill("row of 3", r3, 3 * chunk, 0x69);
  mp_chunk_counts c0 = counts(ctx), c;
  fail_at = r3 + 2 * chunk;
  mp_hook_set(fail_hook);
  int rc = ops->unmap(ctx, r3, 3 * chunk, 1);
  mp_hook_set(NULL);
  EXPECT(rc == MAGPOOL_ECUDA, "%s: an unmap whose third call fails: rc %d", ops->name, rc);
  c = counts(ctx);
  EXPECT(same_counts(&c, &c0), "%s: a failed unmap changed the counters: mapped %llu kept %llu",
         ops->name, (unsigned long long)c.mapped, (unsigned long long)c.kept);
  unsigned long long bad = 0;
  KK(vmm_kernel_count(r3, 3 * chunk, 0x69, &bad));
  EXPECT(bad == 0, "%s: %llu bytes lost by a failed unmap", ops->name, bad);
  check_fill("row of 3 after a failed unmap", r3, 3 * chunk, 0x96);
  EXPECT(ops->unmap(ctx, r3, 3 * chunk, 0) == 0, "%s: unmap the row", ops->name);
  c = counts(ctx);
  EXPECT(c.mapped == c0.mapped - 3 && c.releases == c0.releases + 3,
         "%s: after the row's unmap: mapped %llu releases %llu", ops->name,
         (unsigned long long)c.mapped, (unsigned long long)c.releases);
}

/* A whole region of 4 MiB: reserved, filled and checked with `check`,
 * released. */
static void check_region(const mp_source_ops *ops, void *ctx,
                         void (*check)(const char *, void *, size_t, unsigned char)) {
  void *whole = NULL;
  int rc = ops->reserve(ctx, 4 * MiB, &whole);
  EXPECT(rc == 0 && whole != NULL, "%s: reserve: rc %d", ops->name, rc);
  if (rc == 0) {
    check("whole region", whole, 4 * MiB, 0x11);
    EXPECT(ops->release(ctx, whole, 4 * MiB) == 0, "%s: release", ops->name);
  }
}

/* Opens the source on device 0: its rc, the context in *ctx. */
static int open_source(const mp_source_ops *ops, void **ctx) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.device = 0;
  *ctx = NULL;
  return ops->open(ctx, &cfg);
}

static int run_source(const mp_source_ops *ops) {
  void *ctx = NULL;
  int rc = open_source(ops, &ctx);
  if (rc == MAGPOOL_ENODEV) return 77;
  REQUIRE(rc == 0, "%s: open: rc %d", ops->name, rc);
  REQUIRE(ops->map != NULL && ops->unmap != NULL && ops->va_reserve != NULL &&
              ops->va_release != NULL && ops->granularity != NULL,
          "%s: chunk ops missing", ops->name);

  size_t gran = ops->granularity(ctx);
  printf("gpu_vmm: %s: granularity %zu KiB\n", ops->name, gran / 1024);
  const size_t size = GiB, chunk = 2 * MiB;
  REQUIRE(gran != 0 && (gran & (gran - 1)) == 0, "%s: granularity %zu", ops->name, gran);
  if (gran > chunk) {
    printf("gpu_vmm: %s: SKIP (granularity over 2 MiB)\n", ops->name);
    ops->close(ctx);
    return 0;
  }

  size_t free0 = dev_free();
  char *base = NULL;
  rc = ops->va_reserve(ctx, size, chunk, (void **)&base);
  REQUIRE(rc == 0, "%s: va_reserve: rc %d (cuda %d)", ops->name, rc, magpool_last_cuda_error());
  EXPECT((uintptr_t)base % size == 0, "%s: base %p not aligned to 1 GiB", ops->name, (void *)base);
  mp_chunk_counts c = counts(ctx);
  EXPECT(c.creates == 0 && c.mapped == 0, "%s: memory behind a fresh range", ops->name);

  /* A run of 3 chunks. */
  char *run = base + 2 * chunk;
  rc = ops->map(ctx, run, 3 * chunk);
  REQUIRE(rc == 0, "%s: map 3: rc %d (cuda %d)", ops->name, rc, magpool_last_cuda_error());
  c = counts(ctx);
  EXPECT(c.creates == 3 && c.mapped == 3 && c.reuses == 0, "%s: after map 3: creates %llu mapped %llu",
         ops->name, (unsigned long long)c.creates, (unsigned long long)c.mapped);
  EXPECT(dev_free() + 6 * MiB <= free0 + 2 * MiB, "%s: 6 MiB mapped, free memory barely moved",
         ops->name);
  check_fill("run of 3", run, 3 * chunk, 0xa5);
  /* Nothing may run on a chunk while it is unmapped (cuMemUnmap does not
   * wait for it: a kernel still writing faults); check_fill has waited. */

  /* The middle chunk unmapped and kept; a chunk mapped elsewhere takes it. */
  rc = ops->unmap(ctx, run + chunk, chunk, 1);
  EXPECT(rc == 0, "%s: unmap keep: rc %d", ops->name, rc);
  c = counts(ctx);
  EXPECT(c.mapped == 2 && c.kept == 1 && c.releases == 0, "%s: after keep: mapped %llu kept %llu",
         ops->name, (unsigned long long)c.mapped, (unsigned long long)c.kept);
  char *far = base + 100 * chunk;
  rc = ops->map(ctx, far, chunk);
  REQUIRE(rc == 0, "%s: map far: rc %d", ops->name, rc);
  c = counts(ctx);
  EXPECT(c.creates == 3 && c.reuses == 1 && c.kept == 0 && c.mapped == 3,
         "%s: the move created memory: creates %llu reuses %llu kept %llu", ops->name,
         (unsigned long long)c.creates, (unsigned long long)c.reuses, (unsigned long long)c.kept);
  check_fill("moved chunk", far, chunk, 0x5a);
  /* The neighbours of the hole kept their bytes. */
  unsigned long long nb = 0;
  KK(vmm_kernel_count(run, chunk, 0xa5, &nb));
  EXPECT(nb == 0, "%s: first chunk lost %llu bytes", ops->name, nb);
  KK(vmm_kernel_count(run + 2 * chunk, chunk, 0xa5, &nb));
  EXPECT(nb == 0, "%s: third chunk lost %llu bytes", ops->name, nb);

  check_bad_input(ops, ctx, base, size, chunk, gran);

  /* Unmap without keep frees. */
  rc = ops->unmap(ctx, far, chunk, 0);
  EXPECT(rc == 0, "%s: unmap free: rc %d", ops->name, rc);
  c = counts(ctx);
  EXPECT(c.releases == 1 && c.mapped == 2 && c.kept == 0, "%s: after unmap free: releases %llu",
         ops->name, (unsigned long long)c.releases);
  /* The hole maps again (a new create), as a run with its neighbour. */
  rc = ops->unmap(ctx, run + 2 * chunk, chunk, 1);
  EXPECT(rc == 0, "%s: unmap keep third: rc %d", ops->name, rc);
  rc = ops->map(ctx, run + chunk, 2 * chunk);
  EXPECT(rc == 0, "%s: map hole + third: rc %d", ops->name, rc);
  c = counts(ctx);
  EXPECT(c.creates == 4 && c.reuses == 2 && c.mapped == 3, "%s: refill: creates %llu reuses %llu",
         ops->name, (unsigned long long)c.creates, (unsigned long long)c.reuses);
  check_fill("refilled run", run, 3 * chunk, 0x77);
  check_groups(ops, ctx, base, chunk);
  check_unmap_all_or_none(ops, ctx, base, chunk);
  /* One more kept, so that va_release finds both mapped and kept memory. */
  EXPECT(ops->unmap(ctx, run, chunk, 1) == 0, "%s: keep first", ops->name);

  rc = ops->va_release(ctx, base, size);
  EXPECT(rc == 0, "%s: va_release: rc %d", ops->name, rc);
  c = counts(ctx);
  EXPECT(c.mapped == 0 && c.kept == 0 && c.creates == c.releases,
         "%s: after va_release: mapped %llu kept %llu creates %llu releases %llu", ops->name,
         (unsigned long long)c.mapped, (unsigned long long)c.kept,
         (unsigned long long)c.creates, (unsigned long long)c.releases);
  EXPECT(ops->va_release(ctx, base, size) == MAGPOOL_EINVAL, "%s: second va_release", ops->name);
  size_t free1 = dev_free();
  EXPECT(free1 + 2 * MiB >= free0, "%s: device free memory %zu MiB, was %zu MiB", ops->name,
         free1 / MiB, free0 / MiB);

  /* Whole regions still work beside the chunk ops. */
  check_region(ops, ctx, check_fill);

  const char *oom = getenv("MAGPOOL_GPU_TEST_OOM");
  const char *small = getenv("MAGPOOL_GPU_TEST_SMALL");
  if ((small == NULL || strcmp(small, "1") != 0) &&
      ((oom != NULL && strcmp(oom, "1") == 0) || dev_free() <= 16 * GiB)) {
    check_oom(ops, ctx, chunk);
  } else {
    printf("gpu_vmm: %s: SKIP the out-of-memory run (%zu GiB free; MAGPOOL_GPU_TEST_OOM=1 "
           "runs it)\n", ops->name, dev_free() / GiB);
  }

  /* close gives back what a range still holds. */
  rc = ops->va_reserve(ctx, size, chunk, (void **)&base);
  EXPECT(rc == 0, "%s: va_reserve again: rc %d", ops->name, rc);
  if (rc == 0) EXPECT(ops->map(ctx, base, 2 * chunk) == 0, "%s: map before close", ops->name);
  ops->close(ctx);
  EXPECT(dev_free() + 2 * MiB >= free0, "%s: close left device memory behind", ops->name);
  return 0;
}

/* The PINNED source: no chunk ops; a whole region works from both sides. */
static void run_pinned(const mp_source_ops *ops) {
  void *ctx = NULL;
  int rc = open_source(ops, &ctx);
  REQUIRE(rc == 0, "%s: open: rc %d", ops->name, rc);
  EXPECT(ops->granularity == NULL && ops->va_reserve == NULL && ops->map == NULL &&
             ops->unmap == NULL,
         "%s: chunk ops present", ops->name);
  check_region(ops, ctx, check_pinned);
  if (ops->close != NULL) ops->close(ctx);
}

int main(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    printf("gpu_vmm: SKIP (no usable GPU: %s)\n", cudaGetErrorString(e));
    return 77;
  }
  if (run_source(&mp_source_device) == 77) {
    printf("gpu_vmm: SKIP (device source: no device)\n");
    return 77;
  }
  run_pinned(&mp_source_pinned);
  if (g_fail) {
    printf("gpu_vmm: %d checks FAILED\n", g_fail);
    return 1;
  }
  printf("gpu_vmm: PASS\n");
  return 0;
}
