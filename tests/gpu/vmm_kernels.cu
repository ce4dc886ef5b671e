// vmm_kernels.cu - two kernels for test_gpu_vmm.c (a C program, which
// cannot launch kernels itself): they touch memory through its address on
// the device, which is what a PINNED region must allow.
#include <cuda_runtime.h>

#include <cstddef>

namespace {

__global__ void k_fill(unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = v;
}

__global__ void k_count(const unsigned char *p, size_t n, unsigned char v,
                        unsigned long long *bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    b += p[i] != v;
  if (b) atomicAdd(bad, b);
}

}  // namespace

// Writes v over [p, p + n) from the device and waits.  A CUDA error code.
extern "C" int vmm_kernel_fill(void *p, size_t n, unsigned char v) {
  k_fill<<<256, 256>>>(static_cast<unsigned char *>(p), n, v);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return (int)e;
}

// Counts, on the device, the bytes of [p, p + n) that are not v, into *bad.
extern "C" int vmm_kernel_count(const void *p, size_t n, unsigned char v,
                                unsigned long long *bad) {
  unsigned long long *d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof *d);
  if (e != cudaSuccess) return (int)e;
  e = cudaMemset(d, 0, sizeof *d);
  if (e == cudaSuccess) {
    k_count<<<256, 256>>>(static_cast<const unsigned char *>(p), n, v, d);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(bad, d, sizeof *d, cudaMemcpyDeviceToHost);
  cudaError_t f = cudaFree(d);
  return (int)(e != cudaSuccess ? e : f);
}
