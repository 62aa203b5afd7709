/*
 * HIP compatibility: the CUDA runtime names kernels_cuda/ uses, mapped to
 * HIP, so the same .cu sources build with hipcc, or with a C++17 compiler
 * against HIP-CPU (AMD's HIP runtime on the CPU, -Dhip-cpu=enabled). Kernels
 * never assume a warp of 32 (AMD CDNA runs wavefronts of 64, RDNA 32): block
 * reductions go through shared memory and sizes come from blockDim.
 */
#ifndef FG_HIP_COMPAT_H
#define FG_HIP_COMPAT_H

#include <hip/hip_runtime.h>
#ifndef __HIP_CPU_RT__
#include <hip/hip_fp16.h>
#endif

#if defined(__HIP_CPU_RT__) && defined(__GNUC__) && !defined(__clang__)
/* HIP-CPU marks kernels `simd` for GCC, which asks for vector clones of every
 * kernel and warns (with no option to silence it) on struct arguments; the
 * blocks' threads are fibers, so the clones are never used. */
#undef __global__
#define __global__ __attribute__((flatten))
#endif

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorUnknown hipErrorUnknown
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpy2DAsync hipMemcpy2DAsync
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStream_t hipStream_t
#define cudaStreamCreate hipStreamCreate
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaSetDevice hipSetDevice
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaGetDevice hipGetDevice
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaMallocHost hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaMemset hipMemset

#endif /* FG_HIP_COMPAT_H */
