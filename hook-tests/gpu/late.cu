// Late install: memory made before cuhook_install() (device, stream-ordered pool, explicit pool,
// VMM, managed, pinned host) must be classified correctly by cuhook_classify from a thread with
// no current context; allocations on every visible device carry the right device ordinal.
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "cuhook_api.h"
}

struct item {
    const char *name;
    void *ptr;
    int want_type;
    unsigned want_flags;
    int want_device;
};
static struct item items[16];
static int n_items;

static void add(const char *name, void *p, int type, unsigned flags, int device) {
    items[n_items++] = {name, p, type, flags, device};
}

static void *classify_all(void *arg) {
    (void)arg;
    CUcontext cur = (CUcontext)1;
    cuCtxGetCurrent(&cur);
    CHECK("thread_has_no_context", cur == NULL, "-");
    for (int i = 0; i < n_items; i++) {
        cuhook_mem_info_t info;
        int rc = cuhook.classify(items[i].ptr, &info);
        int ok = rc == 0 && info.mem_type == items[i].want_type && (info.flags & items[i].want_flags) == items[i].want_flags &&
                 (items[i].want_device < 0 || info.device == items[i].want_device);
        char name[64];
        snprintf(name, sizeof name, "classify_%s", items[i].name);
        CHECK(name, ok, "rc=%d type=%d flags=0x%x device=%d", rc, info.mem_type, info.flags, info.device);
    }
    cuCtxGetCurrent(&cur);
    CHECK("primary_context_now_current", cur != NULL, "-");
    return NULL;
}

static int events_device[8], n_events;
static void on_event(int event, const cuhook_mem_event_t *ev, void *arg) {
    (void)arg;
    if (event == CUHOOK_EVENT_MEM_TYPE_ALLOC && n_events < 8) events_device[n_events++] = ev->device;
}

int main() {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int ndev = 0;
    cudaGetDeviceCount(&ndev);
    cudaSetDevice(0);
    void *p;
    cudaMalloc(&p, 1 << 20);
    add("device", p, CUHOOK_MEM_TYPE_CUDA, 0, 0);
    cudaMallocAsync(&p, 1 << 20, 0);
    cudaStreamSynchronize(0);
    add("default_pool", p, CUHOOK_MEM_TYPE_CUDA, CUHOOK_FLAG_POOL, 0);
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool;
    cudaMemPoolCreate(&pool, &props);
    cudaMallocFromPoolAsync(&p, 1 << 20, pool, 0);
    cudaStreamSynchronize(0);
    add("explicit_pool", p, CUHOOK_MEM_TYPE_CUDA, CUHOOK_FLAG_POOL, 0);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    cuMemAddressReserve(&va, gran, 0, 0, 0);
    cuMemCreate(&h, gran, &prop, 0);
    cuMemMap(va, gran, 0, h, 0);
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    cuMemSetAccess(va, gran, &acc, 1);
    add("vmm", (void *)(uintptr_t)va, CUHOOK_MEM_TYPE_CUDA, CUHOOK_FLAG_VMM, 0);
    cudaMallocManaged(&p, 1 << 20, cudaMemAttachGlobal);
    add("managed", p, CUHOOK_MEM_TYPE_CUDA_MANAGED, 0, -1);
    cudaMallocHost(&p, 1 << 16);
    add("pinned_host", p, CUHOOK_MEM_TYPE_HOST, 0, -1);
    static char plain[4096];
    add("pageable_host", plain, CUHOOK_MEM_TYPE_HOST, 0, -1);
    if (ndev > 1) {
        cudaSetDevice(1);
        cudaMalloc(&p, 1 << 20);
        add("device1", p, CUHOOK_MEM_TYPE_CUDA, 0, 1);
        cudaMallocAsync(&p, 1 << 20, 0);
        cudaStreamSynchronize(0);
        add("device1_pool", p, CUHOOK_MEM_TYPE_CUDA, CUHOOK_FLAG_POOL, 1);
        cudaSetDevice(0);
    }

    cuhook_load();
    CHECK("install_late", cuhook.cuda_install() == 0, "-");
    pthread_t t;
    pthread_create(&t, NULL, classify_all, NULL);
    pthread_join(t, NULL);

    // After install: events carry the device of each allocation. (The static runtime resolved
    // its driver pointers before the late install, so it stays unhooked — the documented limit;
    // the driver API through this program's own slots is hooked.)
    cuhook.set_event_handler(CUHOOK_EVENT_MEM_TYPE_ALLOC, 0, on_event, NULL);
    for (int d = 0; d < ndev && d < 2; d++) {
        cudaSetDevice(d);
        CUdeviceptr dp;
        cuMemAlloc(&dp, 4096);
        cuMemAllocAsync(&dp, 4096, 0);
        cudaStreamSynchronize(0);
    }
    int ok = n_events == 2 * (ndev < 2 ? ndev : 2);
    for (int i = 0; i < n_events; i++) ok &= events_device[i] == i / 2;
    CHECK("event_device_ordinals", ok, "devices=%d events=%d first=%d last=%d", ndev, n_events, events_device[0], n_events ? events_device[n_events - 1] : -1);
    printf("info visible_devices=%d\n", ndev);
    printf("summary failures=%d\n", failures);
    return failures ? 1 : 0;
}
