// Module and library globals (issue 13, item 1) on the real driver: __device__, __constant__ and
// __managed__ variables reached through cudaGetSymbolAddress (static runtime: it reaches the
// driver through cuGetProcAddress, so cuhook is installed before the runtime starts), and a PTX
// module/library loaded with the driver API. Each global is registered once (a repeated query
// dispatches nothing), flagged GLOBAL with the right memory type, and gone after unload / reset.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "cuhook_api.h"
}

__device__ int d_counter[64];
__constant__ float c_table[16];
__managed__ int m_shared[32];

__global__ void touch() { d_counter[threadIdx.x] = (int)threadIdx.x + m_shared[0] + (int)c_table[1]; }

static int global_allocs, global_frees, purged_frees;
static void on_event(int event, const cuhook_mem_event_t *ev, void *arg) {
    (void)arg;
    if (!(ev->flags & CUHOOK_FLAG_GLOBAL)) return;
    if (event == CUHOOK_EVENT_MEM_TYPE_ALLOC) global_allocs++;
    if (event == CUHOOK_EVENT_MEM_TYPE_FREE) {
        global_frees++;
        if (ev->flags & CUHOOK_FLAG_PURGED) purged_frees++;
    }
}

static void expect_global(const char *name, const void *p, size_t size, int type) {
    cuhook_mem_info_t info;
    int rc = cuhook.lookup(p, size, &info);
    CHECK(name, rc == 0 && (info.flags & CUHOOK_FLAG_GLOBAL) && info.mem_type == type && info.address == p && info.size >= size,
          "rc=%d flags=0x%x type=%d size=%zu api=%s", rc, rc ? 0 : info.flags, rc ? -1 : info.mem_type, rc ? 0 : info.size,
          rc ? "-" : info.api);
}

static void expect_api(const char *name, const void *p, const char *api) {
    cuhook_mem_info_t info;
    int rc = cuhook.lookup(p, 1, &info);
    CHECK(name, rc == 0 && !strcmp(info.api, api), "rc=%d api=%s", rc, rc ? "-" : info.api);
}

static void expect_gone(const char *name, const void *p) {
    cuhook_mem_info_t info;
    int rc = cuhook.lookup(p, 1, &info);
    CHECK(name, rc == CUHOOK_ERR_NOT_FOUND, "rc=%d api=%s", rc, rc ? "-" : info.api);
}

// A module with one device and one managed global, JIT-compiled by the driver.
static const char *ptx =
    ".version 8.0\n.target sm_75\n.address_size 64\n"
    ".visible .global .align 4 .b8 gvar[1024];\n"
    ".visible .global .attribute(.managed) .align 4 .b8 mvar[256];\n";

int main() {
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuhook_load();
    CHECK("install", cuhook.cuda_install() == 0, "-");
    cuhook.set_event_handler(CUHOOK_EVENT_MEM_TYPE_ALLOC | CUHOOK_EVENT_MEM_TYPE_FREE, 0, on_event, NULL);

    // Runtime symbols (the static runtime's cuLibraryGetGlobal / cuModuleGetGlobal_v2).
    void *pd = NULL, *pd2 = NULL, *pc = NULL, *pm = NULL;
    cudaError_t e = cudaGetSymbolAddress(&pd, d_counter);
    CHECK("symbol_device", e == cudaSuccess && pd, "err=%d", e);
    expect_global("symbol_device_registered", pd, sizeof d_counter, CUHOOK_MEM_TYPE_CUDA);
    int before = global_allocs;
    cudaGetSymbolAddress(&pd2, d_counter);
    CHECK("symbol_repeat_silent", pd2 == pd && global_allocs == before, "allocs %d -> %d", before, global_allocs);
    cudaGetSymbolAddress(&pc, c_table);
    expect_global("symbol_constant_registered", pc, sizeof c_table, CUHOOK_MEM_TYPE_CUDA);
    // The runtime learns a __managed__ address at load through no public call: cuhook read the
    // loaded fatbin for the variable's name and registered it at cuLibraryLoadData.
    cudaGetSymbolAddress(&pm, m_shared);
    expect_global("symbol_managed_registered", pm, sizeof m_shared, CUHOOK_MEM_TYPE_CUDA_MANAGED);
    expect_api("symbol_managed_at_load", pm, "cuLibraryLoadData");
    m_shared[0] = 100;
    float table[16] = {0, 5};
    cudaMemcpyToSymbol(c_table, table, sizeof table);
    touch<<<1, 64>>>();
    cudaDeviceSynchronize();
    int host[64];
    cudaMemcpyFromSymbol(host, d_counter, sizeof host);
    CHECK("kernel_result", host[0] == 105 && host[63] == 168, "host[0]=%d host[63]=%d", host[0], host[63]);

    // Driver API: a module and a library.
    CUmodule mod;
    CUresult r = cuModuleLoadData(&mod, ptx);
    CHECK("module_loaded", r == CUDA_SUCCESS, "rc=%d", r);
    CUdeviceptr g = 0, m = 0, g2 = 0;
    size_t gs = 0, ms = 0;
    cuModuleGetGlobal(&g, &gs, mod, "gvar");
    expect_global("module_global_registered", (void *)(uintptr_t)g, 1024, CUHOOK_MEM_TYPE_CUDA);
    before = global_allocs;
    cuModuleGetGlobal(&g2, &gs, mod, "gvar");
    CHECK("module_repeat_silent", g2 == g && global_allocs == before, "allocs %d -> %d", before, global_allocs);
    cuModuleGetGlobal(&m, &ms, mod, "mvar");
    expect_global("module_managed_registered", (void *)(uintptr_t)m, 256, CUHOOK_MEM_TYPE_CUDA_MANAGED);
    expect_api("module_managed_at_load", (void *)(uintptr_t)m, "cuModuleLoadData");
    int frees = purged_frees;
    r = cuModuleUnload(mod);
    CHECK("module_unloaded", r == CUDA_SUCCESS && purged_frees == frees + 2, "rc=%d purged %d -> %d", r, frees, purged_frees);
    expect_gone("module_global_gone", (void *)(uintptr_t)g);
    expect_gone("module_managed_gone", (void *)(uintptr_t)m);

    CUlibrary lib;
    r = cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0);
    CHECK("library_loaded", r == CUDA_SUCCESS, "rc=%d", r);
    cuLibraryGetGlobal(&g, &gs, lib, "gvar");
    expect_global("library_global_registered", (void *)(uintptr_t)g, 1024, CUHOOK_MEM_TYPE_CUDA);
    r = cuLibraryGetManaged(&m, &ms, lib, "mvar");
    CHECK("library_managed_found", r == CUDA_SUCCESS, "rc=%d", r);
    expect_global("library_managed_registered", (void *)(uintptr_t)m, 256, CUHOOK_MEM_TYPE_CUDA_MANAGED);
    expect_api("library_managed_at_load", (void *)(uintptr_t)m, "cuLibraryLoadData");
    r = cuLibraryUnload(lib);
    CHECK("library_unloaded", r == CUDA_SUCCESS, "rc=%d", r);
    expect_gone("library_global_gone", (void *)(uintptr_t)g);
    expect_gone("library_managed_gone", (void *)(uintptr_t)m);

    // Device reset destroys the primary context: the runtime's device symbols leave with it. A
    // library's __managed__ variable does not: the driver keeps its range (and contents), and
    // the runtime hands the same address out again.
    cudaDeviceReset();
    expect_gone("symbol_device_gone_after_reset", pd);
    expect_global("symbol_managed_kept_after_reset", pm, sizeof m_shared, CUHOOK_MEM_TYPE_CUDA_MANAGED);
    before = global_allocs;
    void *pm2 = NULL;
    cudaGetSymbolAddress(&pm2, m_shared);
    CUdeviceptr mbase = 0;
    size_t msize = 0;
    CUresult mr = cuMemGetAddressRange(&mbase, &msize, (CUdeviceptr)(uintptr_t)pm);
    CHECK("symbol_managed_same_after_reset",
          pm2 == pm && m_shared[0] == 100 && mr == CUDA_SUCCESS && msize == sizeof m_shared && global_allocs == before,
          "pm=%p pm2=%p value=%d driver rc=%d size=%zu allocs %d -> %d", pm, pm2, m_shared[0], mr, msize, before,
          global_allocs);
    printf("info global_allocs=%d global_frees=%d\n", global_allocs, global_frees);
    printf("summary failures=%d\n", failures);
    return failures ? 1 : 0;
}
