/* vmm_calls.c - magpool-vmm-calls: what mapping memory per chunk costs on
 * a GPU, per 2 MiB chunk (docs/design.md, "Memory sources: chunk
 * mapping").
 *
 *   magpool-vmm-calls [--chunks N] [--rounds R] [--device D] [--background B]
 *
 * --background B keeps B more one-chunk mappings (their own reservation,
 * access set) for the whole run: do the calls cost more in a process
 * that holds many mappings, as a pool of a few GiB does?
 *
 * Single driver calls, through the driver's entry points looked up the
 * way src/source_vmm.c looks them up (no libcuda link):
 *   create            cuMemCreate of one chunk
 *   map               cuMemMap of one chunk
 *   access_chunk      cuMemSetAccess (read/write, the device) per chunk
 *   access_run16      one cuMemSetAccess over a run of 16 mapped chunks,
 *                     divided by 16
 *   unmap             cuMemUnmap of one chunk
 *   unmap_run16       one cuMemUnmap over a run of 16 one-chunk mappings,
 *                     divided by 16 (-1: the driver refuses such a range)
 *   alias_map         cuMemMap + cuMemSetAccess of a handle at a second
 *                     address while its first mapping stays
 *   alias_unmap       cuMemUnmap of that second mapping
 *   release           cuMemRelease of one handle
 * and the DEVICE source's ops (mp_source_device):
 *   src_map_new16     map of a run of 16 chunks, all created
 *   src_unmap_keep    unmap with keep, per chunk
 *   src_map_kept16    map of a run of 16 chunks from kept memory
 *   move              unmap with keep of one chunk + map of one chunk
 *                     elsewhere (takes the kept memory, sets access)
 *   src_unmap_free    unmap without keep, per chunk
 * and, per call rather than per chunk, on a non-blocking stream with no
 * work queued (what an async free or a retire asks of its stream):
 *   stream_query      cudaStreamQuery
 *   stream_capturing  cudaStreamIsCapturing (capture_check, every free)
 *   stream_idle       the CUDA stream op `idle` (stream_cuda.c: the
 *                     guards and the query), once per retire
 *   drv_capturing     cuStreamIsCapturing, the driver's own entry point
 *   drv_query         cuStreamQuery, the driver's own entry point
 * and what a stream callback costs a busy stream's later work, per
 * callback: N memsets of 64 MiB queued on the stream (about 20 us of
 * GPU work each, queued faster than they run), timed on the GPU with
 * events, alone and with a callback or an event record after each:
 *   hold_work         GPU time of one memset (the reference)
 *   hold_callback     GPU time a cudaStreamAddCallback adds (a no-op
 *                     callback: the stream waits for the host to run it,
 *                     as it does for each batch of frees magpool retires)
 *   hold_event        GPU time a cudaEventRecord adds
 *   host_callback     host time of one cudaStreamAddCallback call
 *
 * Each row runs R rounds of N chunks (default 64 x 5) and prints the
 * median round:  SUMMARY vmm call=NAME us_per_chunk=X
 * Exit status 0; 77 when there is no GPU, 1 when a call fails. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define CHUNK ((size_t)2 << 20)
#define RUN 16
#define MAX_ROUNDS 64

static struct {
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*addr_free)(CUdeviceptr, size_t);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus *);
  CUresult (*query)(CUstream);
} drv;

static void lookup(const char *name, void **fn) {
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || *fn == NULL) {
    fprintf(stderr, "magpool-vmm-calls: no driver entry point %s\n", name);
    exit(1);
  }
}

#define CU(x)                                                                   \
  do {                                                                          \
    CUresult r_ = (x);                                                          \
    if (r_ != CUDA_SUCCESS) {                                                   \
      fprintf(stderr, "magpool-vmm-calls: %s:%d: %s: CUresult %d\n", __FILE__,  \
              __LINE__, #x, (int)r_);                                           \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)
#define CUDA(x)                                                                 \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      fprintf(stderr, "magpool-vmm-calls: %s:%d: %s: %s\n", __FILE__, __LINE__, \
              #x, cudaGetErrorName(e_));                                        \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)
#define MP(x)                                                                   \
  do {                                                                          \
    int rc_ = (x);                                                              \
    if (rc_ != 0) {                                                             \
      fprintf(stderr, "magpool-vmm-calls: %s:%d: %s: %s (cuda %d)\n", __FILE__, \
              __LINE__, #x, magpool_strerror(rc_), magpool_last_cuda_error());  \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

enum { R_CREATE, R_MAP, R_ACC1, R_ACC16, R_UNMAP, R_RELEASE,
       R_SNEW, R_SKEEP, R_SKEPT, R_MOVE, R_SFREE,
       R_BCREATE, R_BMAP, R_BACC, R_BUNMAP, R_BRELEASE,
       R_QCREATE, R_QMAP, R_QACC, R_QUNMAP, R_QRELEASE, R_SGMAP, R_SGUNMAP,
       R_SQUERY, R_SCAPT, R_SIDLE, R_DCAPT, R_DQUERY, R_UNMAP16, R_AMAP, R_AUNMAP,
       R_HWORK, R_HCB, R_HEV, R_HHOST, NROWS };
static const char *row_name[NROWS] = {
  "create", "map", "access_chunk", "access_run16", "unmap", "release",
  "src_map_new16", "src_unmap_keep", "src_map_kept16", "move", "src_unmap_free",
  "create_handle16", "map_handle16", "access_handle16", "unmap_handle16", "release_handle16",
  "create_handle4", "map_handle4", "access_handle4", "unmap_handle4", "release_handle4",
  "src_map_group", "src_unmap_group", "stream_query", "stream_capturing", "stream_idle",
  "drv_capturing", "drv_query", "unmap_run16", "alias_map", "alias_unmap",
  "hold_work", "hold_callback", "hold_event", "host_callback",
};
static double t[NROWS][MAX_ROUNDS];

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The same bytes as one handle per g chunks (rows row0 .. row0 + 4: create,
 * map, access, unmap, release, per chunk): is a call's cost per handle
 * (then larger handles make mapping cheaper) or per byte? */
static void group_round(int r, int row0, size_t g, CUdeviceptr va, size_t n,
                        CUmemGenericAllocationHandle *h, const CUmemAllocationProp *prop,
                        const CUmemAccessDesc *acc) {
  double u0 = now_us();
  for (size_t i = 0; i < n; i += g) CU(drv.create(&h[i], g * CHUNK, prop, 0));
  double u1 = now_us();
  for (size_t i = 0; i < n; i += g) CU(drv.map(va + i * CHUNK, g * CHUNK, 0, h[i], 0));
  double u2 = now_us();
  for (size_t i = 0; i < n; i += g) CU(drv.access(va + i * CHUNK, g * CHUNK, acc, 1));
  double u3 = now_us();
  for (size_t i = 0; i < n; i += g) CU(drv.unmap(va + i * CHUNK, g * CHUNK));
  double u4 = now_us();
  for (size_t i = 0; i < n; i += g) CU(drv.release(h[i]));
  double u5 = now_us();
  t[row0][r] = (u1 - u0) / n;
  t[row0 + 1][r] = (u2 - u1) / n;
  t[row0 + 2][r] = (u3 - u2) / n;
  t[row0 + 3][r] = (u4 - u3) / n;
  t[row0 + 4][r] = (u5 - u4) / n;
}

/* A one-device pinned allocation's properties and its read/write access. */
static void dev_props(int dev, CUmemAllocationProp *prop, CUmemAccessDesc *acc) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = dev;
  memset(acc, 0, sizeof *acc);
  acc->location = prop->location;
  acc->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* One round of the single driver calls over n chunks at va. */
static void raw_round(int r, int dev, CUdeviceptr va, CUdeviceptr va2, size_t n,
                      CUmemGenericAllocationHandle *h) {
  CUmemAllocationProp prop;
  CUmemAccessDesc acc;
  dev_props(dev, &prop, &acc);
  double t0 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.create(&h[i], CHUNK, &prop, 0));
  double t1 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.map(va + i * CHUNK, CHUNK, 0, h[i], 0));
  double t2 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.access(va + i * CHUNK, CHUNK, &acc, 1));
  double t3 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.unmap(va + i * CHUNK, CHUNK));
  double t4 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.map(va + i * CHUNK, CHUNK, 0, h[i], 0));
  double t5 = now_us();
  for (size_t i = 0; i < n; i += RUN) CU(drv.access(va + i * CHUNK, RUN * CHUNK, &acc, 1));
  double t6 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.unmap(va + i * CHUNK, CHUNK));
  /* One unmap call over RUN one-chunk mappings, where the driver takes it. */
  for (size_t i = 0; i < n; i++) CU(drv.map(va + i * CHUNK, CHUNK, 0, h[i], 0));
  for (size_t i = 0; i < n; i += RUN) CU(drv.access(va + i * CHUNK, RUN * CHUNK, &acc, 1));
  double t9 = now_us(), t10 = -1;
  CUresult ur = drv.unmap(va, RUN * CHUNK);
  if (ur == CUDA_SUCCESS) {
    for (size_t i = RUN; i < n; i += RUN) CU(drv.unmap(va + i * CHUNK, RUN * CHUNK));
    t10 = now_us();
  } else {
    if (r == 0)
      fprintf(stderr, "magpool-vmm-calls: one unmap over %d mappings: CUresult %d\n", RUN, (int)ur);
    for (size_t i = 0; i < n; i++) CU(drv.unmap(va + i * CHUNK, CHUNK));
  }
  /* A second mapping of each handle at va2 while the first stays. */
  for (size_t i = 0; i < n; i++) CU(drv.map(va + i * CHUNK, CHUNK, 0, h[i], 0));
  CU(drv.access(va, n * CHUNK, &acc, 1));
  double t11 = now_us();
  for (size_t i = 0; i < n; i++) {
    CU(drv.map(va2 + i * CHUNK, CHUNK, 0, h[i], 0));
    CU(drv.access(va2 + i * CHUNK, CHUNK, &acc, 1));
  }
  double t12 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.unmap(va2 + i * CHUNK, CHUNK));
  double t13 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.unmap(va + i * CHUNK, CHUNK));
  double t14 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.release(h[i]));
  double t8 = now_us();
  t[R_UNMAP16][r] = t10 < 0 ? -1 : (t10 - t9) / n;
  t[R_AMAP][r] = (t12 - t11) / n;
  t[R_AUNMAP][r] = (t13 - t12) / n;
  group_round(r, R_BCREATE, RUN, va, n, h, &prop, &acc);
  group_round(r, R_QCREATE, 4, va, n, h, &prop, &acc);
  t[R_CREATE][r] = (t1 - t0) / n;
  t[R_MAP][r] = (t2 - t1) / n;
  t[R_ACC1][r] = (t3 - t2) / n;
  t[R_UNMAP][r] = (t4 - t3) / n;
  t[R_ACC16][r] = (t6 - t5) / n;
  t[R_RELEASE][r] = (t8 - t14) / n;
}

/* One round of the source's ops over n chunks: runs at a, moves to b. */
static void src_round(int r, void *ctx, char *a, char *b, size_t n) {
  double t0 = now_us();
  for (size_t i = 0; i < n; i += RUN) MP(mp_source_device.map(ctx, a + i * CHUNK, RUN * CHUNK));
  double t1 = now_us();
  for (size_t i = 0; i < n; i++) MP(mp_source_device.unmap(ctx, a + i * CHUNK, CHUNK, 1));
  double t2 = now_us();
  for (size_t i = 0; i < n; i += RUN) MP(mp_source_device.map(ctx, a + i * CHUNK, RUN * CHUNK));
  double t3 = now_us();
  for (size_t i = 0; i < n; i++) {
    MP(mp_source_device.unmap(ctx, a + i * CHUNK, CHUNK, 1));
    MP(mp_source_device.map(ctx, b + i * CHUNK, CHUNK));
  }
  double t4 = now_us();
  for (size_t i = 0; i < n; i++) MP(mp_source_device.unmap(ctx, b + i * CHUNK, CHUNK, 0));
  double t5 = now_us();
  /* The pool's growth path: groups of MP_CHUNK_GROUP chunks. */
  const size_t G = MP_CHUNK_GROUP;
  for (size_t i = 0; i + G <= n; i += G) MP(mp_source_device.map_group(ctx, a + i * CHUNK, G * CHUNK));
  double t6 = now_us();
  for (size_t i = 0; i + G <= n; i += G) MP(mp_source_device.unmap(ctx, a + i * CHUNK, G * CHUNK, 0));
  double t7 = now_us();
  t[R_SGMAP][r] = (t6 - t5) / n;
  t[R_SGUNMAP][r] = (t7 - t6) / n;
  t[R_SNEW][r] = (t1 - t0) / n;
  t[R_SKEEP][r] = (t2 - t1) / n;
  t[R_SKEPT][r] = (t3 - t2) / n;
  t[R_MOVE][r] = (t4 - t3) / n;
  t[R_SFREE][r] = (t5 - t4) / n;
}

/* One round of the stream calls, n of each, on idle stream s. */
static void stream_round(int r, cudaStream_t s, size_t n) {
  enum cudaStreamCaptureStatus st;
  int idle = 1;
  double t0 = now_us();
  for (size_t i = 0; i < n; i++) CUDA(cudaStreamQuery(s));
  double t1 = now_us();
  for (size_t i = 0; i < n; i++) CUDA(cudaStreamIsCapturing(s, &st));
  double t2 = now_us();
  for (size_t i = 0; i < n; i++) idle &= mp_cuda_stream_ops.idle(NULL, (magpool_stream_t)s);
  double t3 = now_us();
  if (!idle) {
    fprintf(stderr, "magpool-vmm-calls: the stream op says an idle stream is busy\n");
    exit(1);
  }
  CUstreamCaptureStatus ds;
  double t4 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.is_capturing((CUstream)s, &ds));
  double t5 = now_us();
  for (size_t i = 0; i < n; i++) CU(drv.query((CUstream)s));
  double t6 = now_us();
  t[R_DCAPT][r] = (t5 - t4) / n;
  t[R_DQUERY][r] = (t6 - t5) / n;
  t[R_SQUERY][r] = (t1 - t0) / n;
  t[R_SCAPT][r] = (t2 - t1) / n;
  t[R_SIDLE][r] = (t3 - t2) / n;
}

static void CUDART_CB noop_cb(cudaStream_t s, cudaError_t e, void *arg) {
  (void)s;
  (void)e;
  (void)arg;
}

#define HOLD_BYTES ((size_t)64 << 20)

/* One round of the hold rows on s (buf: HOLD_BYTES of device memory):
 * variant 0 queues n memsets, 1 a callback after each, 2 an event record
 * after each; the GPU's time between two events around them. */
static void hold_round(int r, cudaStream_t s, void *buf, size_t n) {
  cudaEvent_t e0, e1, ev;
  CUDA(cudaEventCreate(&e0));
  CUDA(cudaEventCreate(&e1));
  CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  float ms[3];
  double host = 0;
  for (int v = 0; v < 3; v++) {
    CUDA(cudaStreamSynchronize(s));
    CUDA(cudaEventRecord(e0, s));
    for (size_t i = 0; i < n; i++) {
      CUDA(cudaMemsetAsync(buf, (int)(i & 0xff), HOLD_BYTES, s));
      double h0 = now_us();
      if (v == 1) CUDA(cudaStreamAddCallback(s, noop_cb, NULL, 0));
      else if (v == 2) CUDA(cudaEventRecord(ev, s));
      if (v == 1) host += now_us() - h0;
    }
    CUDA(cudaEventRecord(e1, s));
    CUDA(cudaEventSynchronize(e1));
    CUDA(cudaEventElapsedTime(&ms[v], e0, e1));
  }
  CUDA(cudaEventDestroy(e0));
  CUDA(cudaEventDestroy(e1));
  CUDA(cudaEventDestroy(ev));
  t[R_HWORK][r] = ms[0] * 1e3 / n;
  t[R_HCB][r] = (ms[1] - ms[0]) * 1e3 / n;
  t[R_HEV][r] = (ms[2] - ms[0]) * 1e3 / n;
  t[R_HHOST][r] = host / n;
}

int main(int argc, char **argv) {
  size_t n = 64;
  int rounds = 5, dev = 0;
  size_t bg = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--chunks") && i + 1 < argc) n = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) dev = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--background") && i + 1 < argc) bg = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr, "usage: magpool-vmm-calls [--chunks N] [--rounds R] [--device D] "
                      "[--background B]\n");
      return 2;
    }
  }
  n = (n + RUN - 1) / RUN * RUN;
  if (n == 0 || rounds < 1 || rounds > MAX_ROUNDS) {
    fprintf(stderr, "magpool-vmm-calls: --chunks >= 1, --rounds 1..%d\n", MAX_ROUNDS);
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= dev) {
    printf("magpool-vmm-calls: no GPU: NOTRUN\n");
    return 77;
  }
  if (cudaSetDevice(dev) != cudaSuccess || cudaFree(NULL) != cudaSuccess) return 1;
  struct cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return 1;
  lookup("cuMemCreate", (void **)&drv.create);
  lookup("cuMemRelease", (void **)&drv.release);
  lookup("cuMemAddressReserve", (void **)&drv.reserve);
  lookup("cuMemAddressFree", (void **)&drv.addr_free);
  lookup("cuMemMap", (void **)&drv.map);
  lookup("cuMemUnmap", (void **)&drv.unmap);
  lookup("cuMemSetAccess", (void **)&drv.access);
  lookup("cuStreamIsCapturing", (void **)&drv.is_capturing);
  lookup("cuStreamQuery", (void **)&drv.query);

  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.device = dev;
  void *ctx = NULL;
  MP(mp_source_device.open(&ctx, &cfg));
  size_t gran = mp_source_device.granularity(ctx);
  printf("magpool-vmm-calls: %s, device %d, granularity %zu KiB, %zu chunks of 2 MiB x %d "
         "rounds (median round)\n", p.name, dev, gran / 1024, n, rounds);
  if (gran == 0 || gran > CHUNK) {
    printf("magpool-vmm-calls: granularity does not allow 2 MiB chunks: NOTRUN\n");
    return 1;
  }

  CUmemGenericAllocationHandle *h = calloc(n, sizeof *h);
  if (h == NULL) return 1;
  CUdeviceptr va = 0, va2 = 0;
  CU(drv.reserve(&va, n * CHUNK, CHUNK, 0, 0));
  CU(drv.reserve(&va2, n * CHUNK, CHUNK, 0, 0));
  size_t span = CHUNK;
  while (span < 2 * n * CHUNK) span <<= 1;
  char *base = NULL;
  MP(mp_source_device.va_reserve(ctx, span, CHUNK, (void **)&base));

  CUmemGenericAllocationHandle *bh = bg != 0 ? calloc(bg, sizeof *bh) : NULL;
  CUdeviceptr bva = 0;
  if (bg != 0) {
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    dev_props(dev, &prop, &acc);
    if (bh == NULL) return 1;
    CU(drv.reserve(&bva, bg * CHUNK, CHUNK, 0, 0));
    for (size_t i = 0; i < bg; i++) {
      CU(drv.create(&bh[i], CHUNK, &prop, 0));
      CU(drv.map(bva + i * CHUNK, CHUNK, 0, bh[i], 0));
    }
    CU(drv.access(bva, bg * CHUNK, &acc, 1));
    printf("magpool-vmm-calls: %zu more one-chunk mappings held\n", bg);
  }
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *hbuf = NULL;
  CUDA(cudaMalloc(&hbuf, HOLD_BYTES));
  for (int r = 0; r < rounds; r++) {
    raw_round(r, dev, va, va2, n, h);
    src_round(r, ctx, base, base + n * CHUNK, n);
    stream_round(r, s, n);
    hold_round(r, s, hbuf, n);
  }
  CUDA(cudaFree(hbuf));
  CUDA(cudaStreamDestroy(s));
  mp_chunk_counts c;
  MP(mp_source_chunk_counts(ctx, &c));
  MP(mp_source_device.va_release(ctx, base, span));
  CU(drv.addr_free(va, n * CHUNK));
  CU(drv.addr_free(va2, n * CHUNK));
  for (size_t i = 0; i < bg; i++) {
    CU(drv.unmap(bva + i * CHUNK, CHUNK));
    CU(drv.release(bh[i]));
  }
  if (bg != 0) CU(drv.addr_free(bva, bg * CHUNK));
  free(bh);
  mp_source_device.close(ctx);
  free(h);

  for (int k = 0; k < NROWS; k++) {
    qsort(t[k], (size_t)rounds, sizeof t[k][0], cmp_double);
    printf("SUMMARY vmm call=%s us_per_chunk=%.2f\n", row_name[k], t[k][rounds / 2]);
  }
  printf("magpool-vmm-calls: source counters: creates %llu reuses %llu releases %llu\n",
         (unsigned long long)c.creates, (unsigned long long)c.reuses,
         (unsigned long long)c.releases);
  return 0;
}
