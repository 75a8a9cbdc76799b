// The real-GPU workload: every allocation kind through the runtime and the driver, printed as
// "call ..." lines after the "event ..." lines cuhook dispatched during each call (the same
// format as the CPU coverage fixtures). Built by run.sh with nvcc in several link modes.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "cuhook_api.h"
}

static void on_event(int event, const cuhook_mem_event_t *ev, void *arg) {
    (void)arg;
    printf("event %s api=%s addr=0x%llx size=%zu type=%d flags=0x%x device=%d\n",
           event == CUHOOK_EVENT_MEM_TYPE_ALLOC ? "alloc" : "free", ev->api,
           (unsigned long long)(uintptr_t)ev->address, ev->size, ev->mem_type, ev->flags, ev->device);
}

static void call(const char *sym, int rc, const char *kind, unsigned long long addr, size_t size) {
    printf("call %s rc=%d kind=%s addr=0x%llx size=%zu\n", sym, rc, kind, addr, size);
}
#define P(x) ((unsigned long long)(uintptr_t)(x))

int main() {
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuhook_load();
    int rc = cuhook.set_event_handler(CUHOOK_EVENT_MEM_TYPE_ALLOC | CUHOOK_EVENT_MEM_TYPE_FREE, 0, on_event, NULL);
    if (rc != 0) {
        printf("check subscribe FAIL rc=%d\n", rc);
        return 1;
    }
    printf("subscribed\n");
    cudaSetDevice(0);
    cudaFree(0); // create the primary context
    cudaStream_t s;
    cudaStreamCreate(&s);
    void *p = NULL, *p2 = NULL;
    size_t pitch = 0;

    rc = cudaMalloc(&p, 1 << 20);
    call("cudaMalloc", rc, "alloc", P(p), 1 << 20);
    rc = cudaFree(p);
    call("cudaFree", rc, "free", P(p), 1 << 20);
    rc = cudaMallocPitch(&p, &pitch, 1000, 10);
    call("cudaMallocPitch", rc, "alloc", P(p), pitch * 10);
    rc = cudaFree(p);
    call("cudaFree", rc, "free", P(p), pitch * 10);
    rc = cudaMallocManaged(&p, 65536, cudaMemAttachGlobal);
    call("cudaMallocManaged", rc, "alloc", P(p), 65536);
    rc = cudaFree(p);
    call("cudaFree", rc, "free", P(p), 65536);
    rc = cudaFree(NULL);
    call("cudaFree", rc, rc == cudaSuccess ? "none" : "wrong-error", 0, 0);

    // Stream-ordered, on the default stream and on a created stream; reuse of a freed address.
    rc = cudaMallocAsync(&p, 8192, 0);
    call("cudaMallocAsync", rc, "alloc", P(p), 8192);
    rc = cudaFreeAsync(p, 0);
    call("cudaFreeAsync", rc, "free", P(p), 8192);
    rc = cudaMallocAsync(&p, 8192, s);
    call("cudaMallocAsync", rc, "alloc", P(p), 8192);
    rc = cudaFreeAsync(p, s);
    call("cudaFreeAsync", rc, "free", P(p), 8192);
    rc = cudaMallocAsync(&p2, 8192, s);
    call("cudaMallocAsync", rc, "alloc", P(p2), 8192);
    printf("info pool_reuse same_address=%d\n", p2 == p);
    cuhook_mem_info_t info;
    int found = cuhook.lookup(p2, 8192, &info);
    printf("check registry_after_reuse %s\n", found == 0 && info.address == p2 && info.size == 8192 ? "ok" : "FAIL");
    // Allocate on one stream, free on another.
    cudaStream_t s2;
    cudaStreamCreate(&s2);
    cudaStreamSynchronize(s);
    rc = cudaFreeAsync(p2, s2);
    call("cudaFreeAsync", rc, "free", P(p2), 8192);
    // cudaFree of a stream-ordered pointer.
    rc = cudaMallocAsync(&p, 4096, s);
    call("cudaMallocAsync", rc, "alloc", P(p), 4096);
    cudaStreamSynchronize(s);
    rc = cudaFree(p);
    call("cudaFree", rc, "free", P(p), 4096);

    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool;
    cudaMemPoolCreate(&pool, &props);
    rc = cudaMallocFromPoolAsync(&p, 12288, pool, s);
    call("cudaMallocFromPoolAsync", rc, "alloc", P(p), 12288);
    rc = cudaFreeAsync(p, s);
    call("cudaFreeAsync", rc, "free", P(p), 12288);
    cudaStreamSynchronize(s);

    rc = cudaMallocHost(&p, 4096);
    call("cudaMallocHost", rc, "alloc", P(p), 4096);
    rc = cudaFreeHost(p);
    call("cudaFreeHost", rc, "free", P(p), 4096);
    rc = cudaHostAlloc(&p, 8192, cudaHostAllocPortable);
    call("cudaHostAlloc", rc, "alloc", P(p), 8192);
    rc = cudaFreeHost(p);
    call("cudaFreeHost", rc, "free", P(p), 8192);
    static char buf[4 * 4096] __attribute__((aligned(4096)));
    rc = cudaHostRegister(buf, sizeof buf, cudaHostRegisterDefault);
    call("cudaHostRegister", rc, "alloc", P(buf), sizeof buf);
    rc = cudaHostUnregister(buf);
    call("cudaHostUnregister", rc, "free", P(buf), sizeof buf);

    rc = cudaMalloc(&p, (size_t)1 << 50);
    call("cudaMalloc", rc, rc == cudaErrorMemoryAllocation ? "none" : "wrong-error", 0, 0);
    cudaGetLastError();

    // The driver API directly.
    CUdeviceptr d = 0;
    rc = cuMemAlloc(&d, 1 << 16);
    call("cuMemAlloc_v2", rc, "alloc", d, 1 << 16);
    rc = cuMemFree(d);
    call("cuMemFree_v2", rc, "free", d, 1 << 16);
    rc = cuMemAllocAsync(&d, 1 << 16, (CUstream)s);
    call("cuMemAllocAsync", rc, "alloc", d, 1 << 16);
    rc = cuMemFreeAsync(d, (CUstream)s);
    call("cuMemFreeAsync", rc, "free", d, 1 << 16);
    rc = cuMemAllocFromPoolAsync(&d, 1 << 16, (CUmemoryPool)pool, (CUstream)s);
    call("cuMemAllocFromPoolAsync", rc, "alloc", d, 1 << 16);
    rc = cuMemFreeAsync(d, (CUstream)s);
    call("cuMemFreeAsync", rc, "free", d, 1 << 16);
    cuStreamSynchronize((CUstream)s);

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va = 0;
    cuMemAddressReserve(&va, gran, 0, 0, 0);
    cuMemCreate(&h, gran, &prop, 0);
    rc = cuMemMap(va, gran, 0, h, 0);
    call("cuMemMap", rc, "alloc", va, gran);
    rc = cuMemUnmap(va, gran);
    call("cuMemUnmap", rc, "free", va, gran);
    cuMemRelease(h);
    cuMemAddressFree(va, gran);

    rc = cudaMalloc(&p, 24576);
    printf("setup cudaDeviceReset owned=0x%llx\n", P(p));
    rc = cudaDeviceReset();
    call("cudaDeviceReset", rc, "purge", P(p), 24576);
    return 0;
}
