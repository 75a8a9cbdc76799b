/*
 * driver_api.h: the few driver API declarations the callgrind and footprint
 * programs call (mini_libcuda.c defines them), without a CUDA installation.
 */
#ifndef CUHOOK_BENCH_DRIVER_API_H
#define CUHOOK_BENCH_DRIVER_API_H

#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
CUresult cuInit(unsigned flags);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);

#endif
