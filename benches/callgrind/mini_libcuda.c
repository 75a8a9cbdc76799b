/*
 * mini_libcuda.c: the cheapest driver that still behaves like one for the
 * calls the pair benchmark makes. Built as libcuda.so.1 for callgrind only
 * (the full fake driver in fixtures/cuda takes a mutex and keeps tables, so
 * its own cost would hide what cuhook adds).
 *
 * Device memory is a bump range of fake addresses; freed blocks go on a
 * LIFO list per size class of one, so an alloc after a free hands the same
 * address back, as a stream-ordered pool does.
 */
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef int CUdevice;

#define EXPORT __attribute__((visibility("default")))

enum { MAX_FREE = 64 };
static CUdeviceptr g_next = (CUdeviceptr)1 << 40;
static CUdeviceptr g_free[MAX_FREE];
static int g_nfree;
static char g_ctx;

EXPORT CUresult cuInit(unsigned flags) { (void)flags; return 0; }

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    *pctx = &g_ctx;
    return 0;
}

EXPORT CUresult cuStreamGetCtx(CUstream stream, CUcontext *pctx)
{
    (void)stream;
    *pctx = &g_ctx;
    return 0;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    *dev = 0;
    return 0;
}

/* Present so that cuhook takes this object as the driver; never called. */
EXPORT CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p)
{
    (void)n; (void)attrs; (void)data; (void)p;
    return 1;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream)
{
    (void)stream;
    if (g_nfree > 0) {
        *dptr = g_free[--g_nfree];
        return 0;
    }
    *dptr = g_next;
    g_next += (size + 511) & ~(size_t)511;
    return 0;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    (void)stream;
    if (g_nfree < MAX_FREE)
        g_free[g_nfree++] = dptr;
    return 0;
}
