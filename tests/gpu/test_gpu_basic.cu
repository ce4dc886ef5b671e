// test_gpu_basic.cu - DEVICE and PINNED pools on a real GPU, and
// stream-ordered allocation on a stream under graph capture.
//
//   1. DEVICE pool: create, alloc, a kernel writes a block, the host reads
//      it back; alloc_async/free_async on a stream; free, trim, stats,
//      check, destroy.
//   2. PINNED pool: the host writes a block, a kernel reads it (and writes
//      a second one that the host then reads without a copy); a 6 MiB
//      block's device pointer at inner offsets is its own address, and
//      cudaMemset and cudaMemcpy take it whole.
//   3. Capture: magpool_alloc_async on a stream being captured
//      (cudaStreamCaptureModeThreadLocal) either fails with
//      MAGPOOL_ECAPTURE or succeeds; either way nothing crashes, the
//      capture ends cleanly (magpool made no call that invalidates it), the
//      graph instantiates and runs, and the pool still works afterwards.
//      Done on a fresh stream and on one the pool has already used.
//   4. Passed streams: a large block freed on a stream that has finished
//      its work goes back at once when the stream's park is retired (no
//      callback: pending_bytes is 0 right after magpool_stream_release);
//      on a stream still running a kernel it is pending.  Meanwhile
//      another thread captures a stream in global mode: the stream queries
//      behind this must not invalidate that capture.  With an error of
//      the program's pending in the runtime's last-error slot the stream
//      is still asked (through the driver) and the error is still there.
//   5. capture_check = 0: frees of runs and of small blocks on s work
//      while s is in use; once the program has released s, every async
//      call on s during its capture answers MAGPOOL_ECAPTURE (the blocks
//      stay allocated), the capture ends cleanly, and s works after it.
//   6. Extent blocks (src/extent.c) on a capped DEVICE pool: three 576 KiB
//      blocks share one chunk, 576 KiB usable each; a kernel fills each
//      whole and the host reads all three back (an overlap would break a
//      neighbour's pattern); cudaMemset over one whole block leaves the
//      other two as they were; fifteen 136 KiB blocks (34 granules of 4
//      KiB) share one chunk and each reads back its own kernel fill; an
//      async block on a stream, freed there, serves the stream's next
//      request of the same granules.
//
// Exit status: 0 pass, 1 fail, 77 no usable GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>
#include <magpool.h>

#define GPU_TEST "gpu_basic"
#include "gpu_check.h"

#include <unistd.h>

#include <atomic>
#include <thread>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

__global__ void k_fill(uint32_t *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = seed ^ (uint32_t)(i * 2654435761u);
}

// Counts words of p that differ from the k_fill pattern.
__global__ void k_count_bad(const uint32_t *p, size_t n, uint32_t seed,
                            unsigned long long *bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    if (p[i] != (seed ^ (uint32_t)(i * 2654435761u))) b++;
  if (b) atomicAdd(bad, b);
}

// Spins for about `ns` nanoseconds of GPU time.
__global__ void k_spin(long long ns) {
  long long t0 = clock64();
  while (clock64() - t0 < ns * 2) {  // >= 1 cycle per ns at the H200's clocks
  }
}

__global__ void k_nop(int *x) {
  if (x != nullptr) *x += 1;
}

size_t host_count_bad(const uint32_t *p, size_t n, uint32_t seed) {
  size_t b = 0;
  for (size_t i = 0; i < n; i++)
    if (p[i] != (seed ^ (uint32_t)(i * 2654435761u))) b++;
  return b;
}

// capture_check: the config field (1, its default, but in
// test_capture_unchecked).
magpool_t *make_pool(magpool_mem_kind_t kind, size_t size, int capture_check = 1) {
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.kind = kind;
  cfg.pool_size = size;
  cfg.device = 0;
  cfg.capture_check = capture_check;
  magpool_t *pool = nullptr;
  int rc = magpool_create(&cfg, &pool);
  REQUIRE(rc == 0 && pool != nullptr, "magpool_create(kind %d): %s", (int)kind,
          magpool_strerror(rc));
  return pool;
}

void expect_empty(magpool_t *pool, size_t size, const char *what) {
  EXPECT(magpool_trim(pool) == 0, "%s: trim", what);
  magpool_stats_t st;
  EXPECT(magpool_get_stats(pool, &st) == 0, "%s: stats", what);
  EXPECT(st.used_bytes == 0, "%s: used_bytes %zu", what, st.used_bytes);
  EXPECT(st.pending_bytes == 0, "%s: pending_bytes %zu", what, st.pending_bytes);
  EXPECT(st.cached_bytes == 0, "%s: cached_bytes %zu", what, st.cached_bytes);
  EXPECT(magpool_check(pool) == 0, "%s: magpool_check", what);
  void *all = magpool_alloc(pool, size);
  EXPECT(all != nullptr, "%s: whole pool not one block after trim: %s", what,
         magpool_strerror(magpool_last_error()));
  if (all != nullptr) EXPECT(magpool_free(pool, all) == 0, "%s: free whole pool", what);
}

void test_device_pool() {
  const size_t PS = 64u << 20, N = (1u << 20) / 4;
  magpool_t *pool = make_pool(MAGPOOL_MEM_DEVICE, PS);
  uint32_t *d = (uint32_t *)magpool_alloc(pool, N * 4);
  REQUIRE(d != nullptr, "device alloc: %s", magpool_strerror(magpool_last_error()));
  cudaPointerAttributes attr;
  CK(cudaPointerGetAttributes(&attr, d));
  EXPECT(attr.type == cudaMemoryTypeDevice, "DEVICE pool block is memory type %d",
         (int)attr.type);
  k_fill<<<256, 256>>>(d, N, 0x1234u);
  CK(cudaGetLastError());
  std::vector<uint32_t> h(N);
  CK(cudaMemcpy(h.data(), d, N * 4, cudaMemcpyDeviceToHost));
  EXPECT(host_count_bad(h.data(), N, 0x1234u) == 0, "device block read back wrong");

  // Stream-ordered round trip on a stream, with a device-side check.
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned long long *bad = (unsigned long long *)magpool_alloc(pool, sizeof *bad);
  REQUIRE(bad != nullptr, "counter alloc");
  CK(cudaMemset(bad, 0, sizeof *bad));
  for (int i = 0; i < 200; i++) {
    size_t n = 64 + (size_t)i * 97;
    uint32_t *p = (uint32_t *)magpool_alloc_async(pool, n * 4, (magpool_stream_t)s);
    REQUIRE(p != nullptr, "alloc_async %d: %s", i, magpool_strerror(magpool_last_error()));
    k_fill<<<8, 128, 0, s>>>(p, n, 77u + i);
    k_count_bad<<<8, 128, 0, s>>>(p, n, 77u + i, bad);
    EXPECT(magpool_free_async(pool, p, (magpool_stream_t)s) == 0, "free_async %d", i);
  }
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s));
  unsigned long long nbad = 1;
  CK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
  EXPECT(nbad == 0, "%llu bad words in stream-ordered blocks", nbad);
  EXPECT(magpool_free(pool, bad) == 0, "free counter");
  EXPECT(magpool_free(pool, d) == 0, "free device block");
  EXPECT(magpool_free(pool, d) == MAGPOOL_EINVAL, "double free not detected");
  EXPECT(magpool_stream_release(pool, (magpool_stream_t)s) == 0, "release");
  CK(cudaStreamSynchronize(s));
  expect_empty(pool, PS, "DEVICE pool");
  CK(cudaStreamDestroy(s));
  EXPECT(magpool_destroy(pool) == 0, "destroy DEVICE pool");
  std::printf("gpu_basic: DEVICE pool ok\n");
}

void test_pinned_pool() {
  const size_t PS = 16u << 20, N = 4096;
  magpool_t *pool = make_pool(MAGPOOL_MEM_PINNED, PS);
  uint32_t *h = (uint32_t *)magpool_alloc(pool, N * 4);
  uint32_t *h2 = (uint32_t *)magpool_alloc(pool, N * 4);
  unsigned long long *bad = (unsigned long long *)magpool_alloc(pool, sizeof *bad);
  REQUIRE(h && h2 && bad, "pinned alloc: %s", magpool_strerror(magpool_last_error()));
  cudaPointerAttributes attr;
  CK(cudaPointerGetAttributes(&attr, h));
  EXPECT(attr.type == cudaMemoryTypeHost, "PINNED pool block is memory type %d",
         (int)attr.type);
  // Host-writable ...
  for (size_t i = 0; i < N; i++) h[i] = 0xBEEFu ^ (uint32_t)(i * 2654435761u);
  *bad = 0;
  // ... device-readable (and device-writable, host-readable).
  uint32_t *dh = nullptr, *dh2 = nullptr;
  unsigned long long *dbad = nullptr;
  CK(cudaHostGetDevicePointer((void **)&dh, h, 0));
  CK(cudaHostGetDevicePointer((void **)&dh2, h2, 0));
  CK(cudaHostGetDevicePointer((void **)&dbad, bad, 0));
  k_count_bad<<<4, 128>>>(dh, N, 0xBEEFu, dbad);
  k_fill<<<4, 128>>>(dh2, N, 0xF00Du);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  EXPECT(*bad == 0, "device read %llu wrong words from a pinned block", *bad);
  EXPECT(host_count_bad(h2, N, 0xF00Du) == 0, "host read wrong words written by the device");
  // A block over several 2 MiB pieces: what a pool of host memory mapped
  // per chunk broke (docs/design.md, "PINNED: whole regions").  Its device
  // pointer at any offset is the same address; cudaMemset and cudaMemcpy
  // take it whole.
  const size_t BIG = 6u << 20;
  unsigned char *big = (unsigned char *)magpool_alloc(pool, BIG);
  REQUIRE(big != nullptr, "pinned 6 MiB: %s", magpool_strerror(magpool_last_error()));
  for (size_t off : {(size_t)0, (size_t)4096 + 8, ((size_t)2 << 20) + 64, BIG - 8}) {
    void *dp = nullptr;
    CK(cudaHostGetDevicePointer(&dp, big + off, 0));
    EXPECT(dp == big + off, "device pointer of a pinned block at +%zu is %p, not %p", off, dp,
           (void *)(big + off));
  }
  std::memset(big, 0, BIG);
  CK(cudaMemset(big, 0xab, BIG));
  CK(cudaDeviceSynchronize());
  size_t nb = 0;
  for (size_t i = 0; i < BIG; i++) nb += big[i] != 0xab;
  EXPECT(nb == 0, "cudaMemset over a 6 MiB pinned block: %zu bytes differ", nb);
  uint32_t *dbuf = nullptr;
  CK(cudaMalloc(&dbuf, BIG));
  k_fill<<<64, 256>>>(dbuf, BIG / 4, 0xCAFEu);
  CK(cudaGetLastError());
  CK(cudaMemcpy(big, dbuf, BIG, cudaMemcpyDeviceToHost));
  EXPECT(host_count_bad((const uint32_t *)big, BIG / 4, 0xCAFEu) == 0,
         "cudaMemcpy into a 6 MiB pinned block read back wrong");
  CK(cudaFree(dbuf));
  EXPECT(magpool_free(pool, big) == 0, "free 6 MiB");
  EXPECT(magpool_free(pool, h) == 0, "free");
  EXPECT(magpool_free(pool, h2) == 0, "free");
  EXPECT(magpool_free(pool, bad) == 0, "free");
  expect_empty(pool, PS, "PINNED pool");
  EXPECT(magpool_destroy(pool) == 0, "destroy PINNED pool");
  std::printf("gpu_basic: PINNED pool ok\n");
}

// One capture round on s.  warm: the pool used s just before the capture
// (s has a stream cache, and this thread's one-entry memo points at it).
void capture_round(magpool_t *pool, cudaStream_t s, bool warm, const char *name) {
  int *dummy = (int *)magpool_alloc(pool, sizeof(int));
  REQUIRE(dummy != nullptr, "alloc");
  CK(cudaMemset(dummy, 0, sizeof(int)));
  CK(cudaDeviceSynchronize());
  if (warm) {
    for (int i = 0; i < 16; i++) {
      void *w = magpool_alloc_async(pool, 1024, (magpool_stream_t)s);
      REQUIRE(w != nullptr, "warm-up alloc");
      EXPECT(magpool_free_async(pool, w, (magpool_stream_t)s) == 0, "warm-up free");
    }
    CK(cudaStreamSynchronize(s));
  }

  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  k_nop<<<1, 1, 0, s>>>(dummy);  // a real node in the graph
  cudaError_t le = cudaGetLastError();
  void *p = magpool_alloc_async(pool, 1024, (magpool_stream_t)s);
  int err = p == nullptr ? magpool_last_error() : 0;
  int frc = 0;
  if (p != nullptr) {
    // What a user does with a block allocated in a graph: use it in the
    // graph, and free it in the graph.
    k_fill<<<1, 128, 0, s>>>((uint32_t *)p, 256, 0xCAFEu);
    frc = magpool_free_async(pool, p, (magpool_stream_t)s);
  }
  cudaGraph_t graph = nullptr;
  cudaError_t ec = cudaStreamEndCapture(s, &graph);
  (void)cudaGetLastError();
  std::printf("gpu_basic: capture on %s stream: alloc_async %s (%s)%s%s; end capture: %s\n",
              name, p != nullptr ? "succeeded" : "failed",
              p != nullptr ? "-" : magpool_strerror(err),
              p != nullptr ? ", free_async: " : "",
              p != nullptr ? (frc == 0 ? "0" : magpool_strerror(frc)) : "",
              cudaGetErrorString(ec));
  EXPECT(le == cudaSuccess, "launch in capture: %s", cudaGetErrorString(le));
  EXPECT(p != nullptr || err == MAGPOOL_ECAPTURE,
         "alloc_async under capture failed with %s, not MAGPOOL_ECAPTURE",
         magpool_strerror(err));
  EXPECT(frc == 0 || frc == MAGPOOL_ECAPTURE, "free_async under capture: %s",
         magpool_strerror(frc));
  EXPECT(ec == cudaSuccess,
         "magpool invalidated the user's capture: cudaStreamEndCapture: %s",
         cudaGetErrorString(ec));
  if (ec == cudaSuccess && graph != nullptr) {
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    // A block allocated on s after the capture, live while the graph runs
    // on s: the graph's writes to p must not land in it.  If the capture
    // "freed" p at capture time, p is in s's cache now and q may be p.
    unsigned long long *gbad = (unsigned long long *)magpool_alloc(pool, sizeof *gbad);
    REQUIRE(gbad != nullptr, "alloc");
    CK(cudaMemset(gbad, 0, sizeof *gbad));
    CK(cudaDeviceSynchronize());
    uint32_t *q = (uint32_t *)magpool_alloc_async(pool, 1024, (magpool_stream_t)s);
    REQUIRE(q != nullptr, "alloc_async after capture");
    k_fill<<<1, 128, 0, s>>>(q, 256, 0x600Du);
    CK(cudaGraphLaunch(exec, s));
    k_count_bad<<<1, 128, 0, s>>>(q, 256, 0x600Du, gbad);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    int v = 0;
    CK(cudaMemcpy(&v, dummy, sizeof v, cudaMemcpyDeviceToHost));
    EXPECT(v == 1, "the captured graph did not run its kernel (dummy = %d)", v);
    unsigned long long nb = 0;
    CK(cudaMemcpy(&nb, gbad, sizeof nb, cudaMemcpyDeviceToHost));
    EXPECT(nb == 0,
           "%s stream: a block allocated after the capture (%p) was overwritten by the "
           "graph's use of the block it allocated during capture (%p): %llu bad words",
           name, (void *)q, p, nb);
    EXPECT(magpool_free_async(pool, q, (magpool_stream_t)s) == 0, "free q");
    CK(cudaStreamSynchronize(s));
    EXPECT(magpool_free(pool, gbad) == 0, "free");
    CK(cudaGraphExecDestroy(exec));
  }
  if (graph != nullptr) CK(cudaGraphDestroy(graph));
  // A block the capture refused to free stays allocated: free it now.
  if (p != nullptr && frc == MAGPOOL_ECAPTURE)
    EXPECT(magpool_free_async(pool, p, (magpool_stream_t)s) == 0, "free after capture");
  CK(cudaStreamSynchronize(s));
  EXPECT(magpool_free(pool, dummy) == 0, "free dummy");

  // The pool still works on s.
  unsigned long long *bad = (unsigned long long *)magpool_alloc(pool, sizeof *bad);
  REQUIRE(bad != nullptr, "alloc");
  CK(cudaMemset(bad, 0, sizeof *bad));
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < 64; i++) {
    uint32_t *q = (uint32_t *)magpool_alloc_async(pool, 4096, (magpool_stream_t)s);
    REQUIRE(q != nullptr, "alloc_async after capture: %s",
            magpool_strerror(magpool_last_error()));
    k_fill<<<4, 128, 0, s>>>(q, 1024, 9u + i);
    k_count_bad<<<4, 128, 0, s>>>(q, 1024, 9u + i, bad);
    EXPECT(magpool_free_async(pool, q, (magpool_stream_t)s) == 0, "free_async after capture");
  }
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s));
  unsigned long long nbad = 1;
  CK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
  EXPECT(nbad == 0, "%llu bad words after capture", nbad);
  EXPECT(magpool_free(pool, bad) == 0, "free");
}

void test_capture() {
  const size_t PS = 64u << 20;
  magpool_t *pool = make_pool(MAGPOOL_MEM_DEVICE, PS);
  cudaStream_t fresh, warm;
  CK(cudaStreamCreateWithFlags(&fresh, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&warm, cudaStreamNonBlocking));
  capture_round(pool, fresh, false, "a fresh");
  capture_round(pool, warm, true, "a used");
  EXPECT(magpool_stream_release(pool, (magpool_stream_t)fresh) == 0, "release");
  EXPECT(magpool_stream_release(pool, (magpool_stream_t)warm) == 0, "release");
  CK(cudaDeviceSynchronize());
  expect_empty(pool, PS, "capture pool");
  CK(cudaStreamDestroy(fresh));
  CK(cudaStreamDestroy(warm));
  EXPECT(magpool_destroy(pool) == 0, "destroy");
  std::printf("gpu_basic: capture done\n");
}

// capture_check = 0: the program releases s before it captures on it.  A
// free of a run on s no longer asks the driver (alloc_async.c): the
// release must still make every call on s during the capture fail.
void test_capture_unchecked() {
  const size_t PS = 64u << 20, RUN = 4u << 20;
  magpool_t *pool = make_pool(MAGPOOL_MEM_DEVICE, PS, 0);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  magpool_stream_t ms = (magpool_stream_t)s;
  int *dummy = (int *)magpool_alloc(pool, sizeof(int));
  REQUIRE(dummy != nullptr, "alloc");
  CK(cudaMemset(dummy, 0, sizeof(int)));
  void *big = nullptr, *small = nullptr;
  for (int i = 0; i < 8; i++) {
    if (big != nullptr) EXPECT(magpool_free_async(pool, big, ms) == 0, "free_async run");
    if (small != nullptr) EXPECT(magpool_free_async(pool, small, ms) == 0, "free_async small");
    big = magpool_alloc_async(pool, RUN, ms);
    small = magpool_alloc_async(pool, 1024, ms);
    REQUIRE(big != nullptr && small != nullptr, "alloc_async: %s",
            magpool_strerror(magpool_last_error()));
    k_fill<<<4, 128, 0, s>>>((uint32_t *)big, RUN / 4, 7u + i);
  }
  CK(cudaGetLastError());
  EXPECT(magpool_stream_release(pool, ms) == 0, "release before the capture");
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  k_nop<<<1, 1, 0, s>>>(dummy);
  cudaError_t le = cudaGetLastError();
  int frun = magpool_free_async(pool, big, ms);
  int fsmall = magpool_free_async(pool, small, ms);
  void *p = magpool_alloc_async(pool, RUN, ms);
  int aerr = p == nullptr ? magpool_last_error() : 0;
  cudaGraph_t graph = nullptr;
  cudaError_t ec = cudaStreamEndCapture(s, &graph);
  (void)cudaGetLastError();
  std::printf("gpu_basic: capture_check=0, released stream under capture: free run %s, "
              "free small %s, alloc %s; end capture: %s\n",
              magpool_strerror(frun), magpool_strerror(fsmall),
              p != nullptr ? "succeeded" : magpool_strerror(aerr), cudaGetErrorString(ec));
  EXPECT(le == cudaSuccess, "launch in capture: %s", cudaGetErrorString(le));
  EXPECT(frun == MAGPOOL_ECAPTURE, "free_async of a run under capture: %s",
         magpool_strerror(frun));
  EXPECT(fsmall == MAGPOOL_ECAPTURE, "free_async of a small block under capture: %s",
         magpool_strerror(fsmall));
  EXPECT(p == nullptr && aerr == MAGPOOL_ECAPTURE, "alloc_async under capture: %s",
         p != nullptr ? "succeeded" : magpool_strerror(aerr));
  EXPECT(ec == cudaSuccess, "magpool invalidated the capture: cudaStreamEndCapture: %s",
         cudaGetErrorString(ec));
  if (graph != nullptr) CK(cudaGraphDestroy(graph));
  if (p != nullptr) EXPECT(magpool_free(pool, p) == 0, "free");
  // The refused frees left their blocks allocated; s works again.
  if (frun != 0) EXPECT(magpool_free_async(pool, big, ms) == 0, "free_async run after capture");
  if (fsmall != 0)
    EXPECT(magpool_free_async(pool, small, ms) == 0, "free_async small after capture");
  CK(cudaStreamSynchronize(s));
  EXPECT(magpool_stream_release(pool, ms) == 0, "release");
  EXPECT(magpool_free(pool, dummy) == 0, "free dummy");
  CK(cudaDeviceSynchronize());
  expect_empty(pool, PS, "capture_check=0 pool");
  CK(cudaStreamDestroy(s));
  EXPECT(magpool_destroy(pool) == 0, "destroy");
  std::printf("gpu_basic: capture_check=0 done\n");
}

// A retire on stream s: free one large block (parked), then release the
// stream (the park is retired).  Returns pending_bytes right after.
size_t retire_one(magpool_t *pool, cudaStream_t s, size_t bytes, bool busy, const char *what) {
  void *p = magpool_alloc_async(pool, bytes, (magpool_stream_t)s);
  REQUIRE(p != nullptr, "%s: alloc_async: %s", what, magpool_strerror(magpool_last_error()));
  if (busy) k_spin<<<1, 1, 0, s>>>(200LL * 1000 * 1000);  // 200 ms or more
  EXPECT(magpool_free_async(pool, p, (magpool_stream_t)s) == 0, "%s: free_async", what);
  EXPECT(magpool_stream_release(pool, (magpool_stream_t)s) == 0, "%s: release", what);
  magpool_stats_t st;
  EXPECT(magpool_get_stats(pool, &st) == 0, "%s: stats", what);
  return st.pending_bytes;
}

// The test's own wait while another thread captures in global mode: in
// relaxed mode, so that it cannot be what invalidates that capture.
void sync_relaxed(cudaStream_t s) {
  cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  CK(cudaThreadExchangeStreamCaptureMode(&m));
  CK(cudaStreamSynchronize(s));
  CK(cudaThreadExchangeStreamCaptureMode(&m));
}

void test_idle() {
  const size_t PS = 256u << 20, BIG = 32u << 20;
  magpool_t *pool = make_pool(MAGPOOL_MEM_DEVICE, PS);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // Another thread captures cs in global mode for the whole of part 1.
  std::atomic<int> phase{0};
  cudaError_t end_rc = cudaErrorUnknown, begin_rc = cudaErrorUnknown;
  cudaGraph_t graph = nullptr;
  cudaStream_t cs;
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  std::thread cap([&] {
    cudaSetDevice(0);
    begin_rc = cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal);
    k_nop<<<1, 1, 0, cs>>>(nullptr);
    phase.store(1);
    while (phase.load() != 2) usleep(100);
    end_rc = cudaStreamEndCapture(cs, &graph);
  });
  while (phase.load() != 1) usleep(100);

  // 1. Idle stream: no batch, nothing pending, 20 times over.
  int idle_pending = 0;
  for (int i = 0; i < 20; i++) {
    sync_relaxed(s);
    if (retire_one(pool, s, BIG, false, "idle stream") != 0) idle_pending++;
  }
  EXPECT(idle_pending == 0, "%d of 20 retires on an idle stream left bytes pending",
         idle_pending);
  // The legacy stream, meanwhile: it must work and must not break the capture.
  for (int i = 0; i < 20; i++) (void)retire_one(pool, nullptr, BIG, false, "legacy stream");
  // 2. Busy stream: pending until the kernel is done.
  size_t busy_pending = retire_one(pool, s, BIG, true, "busy stream");
  EXPECT(busy_pending >= BIG, "a retire behind a running kernel was not pending (%zu bytes)",
         busy_pending);
  phase.store(2);
  cap.join();
  EXPECT(begin_rc == cudaSuccess, "begin capture: %s", cudaGetErrorString(begin_rc));
  EXPECT(end_rc == cudaSuccess, "the queries invalidated another thread's capture: %s",
         cudaGetErrorString(end_rc));
  if (graph != nullptr) {
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, graph, 0));
    CK(cudaGraphLaunch(ge, cs));
    CK(cudaStreamSynchronize(cs));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(graph));
  }
  CK(cudaStreamSynchronize(s));
  magpool_stats_t st;
  EXPECT(magpool_get_stats(pool, &st) == 0, "stats");
  EXPECT(st.pending_bytes == 0, "pending after the busy stream finished: %zu", st.pending_bytes);

  // 3. The legacy stream, idle, with no capture anywhere: no batch either.
  CK(cudaDeviceSynchronize());
  idle_pending = 0;
  for (int i = 0; i < 20; i++) {
    CK(cudaStreamSynchronize(nullptr));
    if (retire_one(pool, nullptr, BIG, false, "idle legacy stream") != 0) idle_pending++;
  }
  EXPECT(idle_pending == 0, "%d of 20 retires on the idle legacy stream left bytes pending",
         idle_pending);
  CK(cudaGetLastError());
  // 4. An error of the program's pending in the runtime's last-error slot
  // (a bad device ordinal: not sticky): the question goes to the driver,
  // which leaves the slot alone, so the stream is still asked (nothing
  // pending) and the program still reads its own error afterwards.
  EXPECT(cudaSetDevice(1 << 20) != cudaSuccess, "cudaSetDevice(1 << 20) succeeded");
  cudaError_t mine = cudaPeekAtLastError();
  EXPECT(mine != cudaSuccess, "no error pending: the test needs one");
  idle_pending = 0;
  for (int i = 0; i < 20; i++)
    if (retire_one(pool, s, BIG, false, "idle stream, error pending") != 0) idle_pending++;
  EXPECT(idle_pending == 0,
         "%d of 20 retires on an idle stream left bytes pending while the program had an error",
         idle_pending);
  EXPECT(cudaGetLastError() == mine, "the program's pending error was lost or replaced");
  CK(cudaSetDevice(0));
  CK(cudaDeviceSynchronize());
  expect_empty(pool, PS, "idle pool");
  CK(cudaStreamDestroy(s));
  CK(cudaStreamDestroy(cs));
  EXPECT(magpool_destroy(pool) == 0, "destroy");
  std::printf("gpu_basic: passed streams done\n");
}

// k blocks of b bytes into q, each of usable size b and in q[0]'s chunk,
// each filled by a kernel from seed + i.
void alloc_filled(magpool_t *pool, uint32_t **q, int k, size_t b, uint32_t seed) {
  for (int i = 0; i < k; i++) {
    q[i] = (uint32_t *)magpool_alloc(pool, b);
    REQUIRE(q[i] != nullptr, "%zu B block %d: %s", b, i, magpool_strerror(magpool_last_error()));
    EXPECT(magpool_usable_size(pool, q[i]) == b, "%zu B block %d: usable %zu", b, i,
           magpool_usable_size(pool, q[i]));
    EXPECT((uintptr_t)q[i] >> 21 == (uintptr_t)q[0] >> 21, "%zu B block %d not in block 0's chunk",
           b, i);
    k_fill<<<64, 256>>>(q[i], b / 4, seed + i);
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}

void test_capped_extents() {
  const size_t B = 576u << 10, N = B / 4;
  magpool_config_t cfg;
  magpool_config_init(&cfg);
  cfg.kind = MAGPOOL_MEM_DEVICE;
  cfg.pool_size = 8u << 20;
  cfg.allow_growth = 1;
  cfg.max_pool_size = 64u << 20;
  magpool_t *pool = nullptr;
  int rc = magpool_create(&cfg, &pool);
  REQUIRE(rc == 0 && pool != nullptr, "capped DEVICE pool: %s", magpool_strerror(rc));
  uint32_t *p[3];
  alloc_filled(pool, p, 3, B, 0x500u);
  std::vector<uint32_t> h(N);
  for (int i = 0; i < 3; i++) {
    CK(cudaMemcpy(h.data(), p[i], B, cudaMemcpyDeviceToHost));
    EXPECT(host_count_bad(h.data(), N, 0x500u + i) == 0, "extent block %d read back wrong", i);
  }
  CK(cudaMemset(p[1], 0xab, B));
  CK(cudaMemcpy(h.data(), p[1], B, cudaMemcpyDeviceToHost));
  size_t off = 0;
  for (size_t i = 0; i < N; i++) off += h[i] != 0xababababu;
  EXPECT(off == 0, "cudaMemset over extent block 1: %zu words differ", off);
  for (int i = 0; i < 3; i += 2) {
    CK(cudaMemcpy(h.data(), p[i], B, cudaMemcpyDeviceToHost));
    EXPECT(host_count_bad(h.data(), N, 0x500u + i) == 0, "block %d changed by block 1's memset", i);
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *a = magpool_alloc_async(pool, B, (magpool_stream_t)s);
  REQUIRE(a != nullptr, "async extent block: %s", magpool_strerror(magpool_last_error()));
  k_fill<<<64, 256, 0, s>>>((uint32_t *)a, N, 0x77u);
  EXPECT(magpool_free_async(pool, a, (magpool_stream_t)s) == 0, "free_async extent block");
  void *b = magpool_alloc_async(pool, B - 1000, (magpool_stream_t)s);
  EXPECT(b == a, "the stream's next request of 144 granules got %p, not its freed %p", b, a);
  if (b != nullptr) EXPECT(magpool_free_async(pool, b, (magpool_stream_t)s) == 0, "free_async b");
  CK(cudaGetLastError());
  for (int i = 0; i < 3; i++) EXPECT(magpool_free(pool, p[i]) == 0, "free extent block %d", i);
  EXPECT(magpool_stream_release(pool, (magpool_stream_t)s) == 0, "release");
  CK(cudaStreamSynchronize(s));
  CK(cudaStreamDestroy(s));
  // The 576 KiB blocks this thread's extent cache kept go back first: the
  // fifteen below need a chunk of their own.
  EXPECT(magpool_trim(pool) == 0, "trim before the 136 KiB blocks");
  const size_t M = 136u << 10, MN = M / 4;
  uint32_t *q[15];
  alloc_filled(pool, q, 15, M, 0x900u);
  for (int i = 0; i < 15; i++) {
    CK(cudaMemcpy(h.data(), q[i], M, cudaMemcpyDeviceToHost));
    EXPECT(host_count_bad(h.data(), MN, 0x900u + i) == 0, "136 KiB block %d read back wrong", i);
    EXPECT(magpool_free(pool, q[i]) == 0, "free 136 KiB block %d", i);
  }
  EXPECT(magpool_trim(pool) == 0, "trim");
  magpool_stats_t st;
  EXPECT(magpool_get_stats(pool, &st) == 0 && st.used_bytes == 0 && st.pending_bytes == 0,
         "capped pool not empty: used %zu pending %zu", st.used_bytes, st.pending_bytes);
  EXPECT(magpool_check(pool) == 0, "capped pool: magpool_check");
  EXPECT(magpool_destroy(pool) == 0, "destroy capped pool");
  std::printf("gpu_basic: extent blocks ok\n");
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::printf("gpu_basic: SKIP (no CUDA device: %s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  CK(cudaSetDevice(0));
  test_device_pool();
  test_pinned_pool();
  test_capture();
  test_capture_unchecked();
  test_idle();
  test_capped_extents();
  std::printf("gpu_basic: %s (%d failures)\n", g_fail ? "FAIL" : "PASS", g_fail);
  return g_fail ? 1 : 0;
}
