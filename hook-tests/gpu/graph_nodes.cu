// Graph memory nodes added explicitly (not captured), checked against the driver: through the
// driver's cuGraphAddMemAllocNode / cuGraphAddMemFreeNode, the generic cuGraphAddNode, and the
// static runtime's cudaGraphAddMemAllocNode / cudaGraphAddMemFreeNode (which reach the driver
// through cuGetProcAddress). An allocation node's address is registered (GRAPH, not
// STREAM_ORDERED, on the node's device) when the node is made; a free node takes it out; the
// allocation the graph keeps is the driver's once the graph has run, and leaves the registry
// when it is freed outside the graph.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "cuhook_api.h"
}
#include "driver_check.h"

// The registry's entry for p: its size when it starts at p, is flagged GRAPH and not
// STREAM_ORDERED and is on device 0, else 0.
static char found[256];
static size_t node_size(CUdeviceptr p, const char **api) {
    cuhook_mem_info_t info;
    memset(&info, 0, sizeof info);
    snprintf(found, sizeof found, "nothing at %#llx", (unsigned long long)p);
    if (api) *api = found;
    if (cuhook.lookup((const void *)(uintptr_t)p, 1, &info) != 0) return 0;
    snprintf(found, sizeof found, "at %#llx: [%p +%zu) flags %#x device %d type %d api %s", (unsigned long long)p,
             info.address, info.size, info.flags, info.device, info.mem_type, info.api);
    bool ok = (uintptr_t)info.address == p && (info.flags & CUHOOK_FLAG_GRAPH) &&
              !(info.flags & CUHOOK_FLAG_STREAM_ORDERED) && info.device == 0 && info.mem_type == CUHOOK_MEM_TYPE_CUDA;
    return ok ? info.size : 0;
}

int main() {
    CUcontext ctx = start_installed("nodes_install");
    // The static runtime fetches its driver pointers at its first call: after install, so that
    // they are mapped to the hooks.
    cudaSetDevice(0);

    CUgraph g = NULL;
    cuGraphCreate(&g, 0);
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;

    // Driver: an allocation node, a memset on it, a free node.
    const size_t a_size = 2 << 20;
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps = props;
    ap.bytesize = a_size;
    CUgraphNode a_node, set_node, free_node;
    CUresult rc = cuGraphAddMemAllocNode(&a_node, g, NULL, 0, &ap);
    const char *api = "";
    size_t got = node_size(ap.dptr, &api);
    CHECK("nodes_driver_alloc_registered", rc == CUDA_SUCCESS && ap.dptr && got == a_size,
          "rc=%d dptr=%#llx registered %zu (want %zu) api %s", rc, (unsigned long long)ap.dptr, got, a_size, api);
    CUDA_MEMSET_NODE_PARAMS ms;
    memset(&ms, 0, sizeof ms);
    ms.dst = ap.dptr;
    ms.elementSize = 1;
    ms.width = a_size;
    ms.height = 1;
    ms.value = 7;
    cuGraphAddMemsetNode(&set_node, g, &a_node, 1, &ms, ctx);
    rc = cuGraphAddMemFreeNode(&free_node, g, &set_node, 1, ap.dptr);
    CHECK("nodes_driver_free_unregistered", rc == CUDA_SUCCESS && node_size(ap.dptr, NULL) == 0, "rc=%d registered %zu", rc,
          node_size(ap.dptr, NULL));

    // Generic entry points, both ABIs, looked up by version as a library would (the header may
    // name either one cuGraphAddNode): an allocation the graph keeps, and one it frees.
    typedef CUresult (*add_node_v1_t)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);
    typedef CUresult (*add_node_v2_t)(CUgraphNode *, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t,
                                      CUgraphNodeParams *);
    void *f1 = NULL, *f2 = NULL;
    cudaDriverEntryPointQueryResult q1, q2;
    cudaGetDriverEntryPointByVersion("cuGraphAddNode", &f1, 12020, cudaEnableDefault, &q1);
    cudaGetDriverEntryPointByVersion("cuGraphAddNode", &f2, 12030, cudaEnableDefault, &q2);
    const size_t k_size = 1 << 20;
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    np.alloc.poolProps = props;
    np.alloc.bytesize = k_size;
    CUgraphNode k_node;
    rc = f1 ? ((add_node_v1_t)f1)(&k_node, g, NULL, 0, &np) : CUDA_ERROR_NOT_FOUND;
    CUdeviceptr kept = np.alloc.dptr;
    got = node_size(kept, &api);
    CHECK("nodes_generic_alloc_registered", rc == CUDA_SUCCESS && kept && got == k_size, "rc=%d registered %zu (want %zu) api %s",
          rc, got, k_size, api);
    const size_t t_size = 256 << 10;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    np.alloc.poolProps = props;
    np.alloc.bytesize = t_size;
    CUgraphNode t_node, t_free;
    rc = f2 ? ((add_node_v2_t)f2)(&t_node, g, NULL, NULL, 0, &np) : CUDA_ERROR_NOT_FOUND;
    CUdeviceptr temp = np.alloc.dptr;
    got = node_size(temp, &api);
    CHECK("nodes_generic_v2_alloc_registered", rc == CUDA_SUCCESS && temp && got == t_size,
          "rc=%d registered %zu (want %zu) api %s", rc, got, t_size, api);
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    np.free.dptr = temp;
    rc = f2 ? ((add_node_v2_t)f2)(&t_free, g, &t_node, NULL, 1, &np) : CUDA_ERROR_NOT_FOUND;
    CHECK("nodes_generic_v2_free_unregistered", rc == CUDA_SUCCESS && node_size(temp, NULL) == 0, "rc=%d registered %zu", rc,
          node_size(temp, NULL));

    // Static runtime: allocation and free nodes, through its driver pointers.
    const size_t r_size = 512 << 10;
    cudaMemAllocNodeParams rp;
    memset(&rp, 0, sizeof rp);
    rp.poolProps.allocType = cudaMemAllocationTypePinned;
    rp.poolProps.location.type = cudaMemLocationTypeDevice;
    rp.poolProps.location.id = 0;
    rp.bytesize = r_size;
    cudaGraphNode_t r_node, r_free;
    cudaError_t e = cudaGraphAddMemAllocNode(&r_node, g, NULL, 0, &rp);
    got = node_size((CUdeviceptr)(uintptr_t)rp.dptr, &api);
    CHECK("nodes_runtime_alloc_registered", e == cudaSuccess && rp.dptr && got == r_size, "err=%d registered %zu (want %zu) api %s",
          (int)e, got, r_size, api);
    e = cudaGraphAddMemFreeNode(&r_free, g, &r_node, 1, rp.dptr);
    CHECK("nodes_runtime_free_unregistered", e == cudaSuccess && node_size((CUdeviceptr)(uintptr_t)rp.dptr, NULL) == 0,
          "err=%d registered %zu", (int)e, node_size((CUdeviceptr)(uintptr_t)rp.dptr, NULL));

    // A refused allocation node registers nothing, whatever its output holds (a stale address
    // here, on a device that does not exist).
    const CUdeviceptr stale = (CUdeviceptr)0x7e0000000000ull;
    CUDA_MEM_ALLOC_NODE_PARAMS bad = ap;
    bad.poolProps.location.id = 99;
    bad.dptr = stale;
    CUgraphNode bad_node;
    rc = cuGraphAddMemAllocNode(&bad_node, g, NULL, 0, &bad);
    cuhook_mem_info_t probe;
    int registered = cuhook.lookup((const void *)(uintptr_t)stale, 1, &probe) == 0 ||
                     (bad.dptr != stale && bad.dptr && cuhook.lookup((const void *)(uintptr_t)bad.dptr, 1, &probe) == 0);
    CHECK("nodes_refused_silent", rc != CUDA_SUCCESS && !registered, "rc=%d dptr=%#llx registered=%d", rc,
          (unsigned long long)bad.dptr, registered);
    // A free node of memory no allocation node made: refused by the driver, so the range (its
    // free announced before the call) is registered again and stays the driver's.
    CUdeviceptr plain = 0;
    cuMemAlloc(&plain, 65536);
    CUgraphNode plain_free;
    rc = cuGraphAddMemFreeNode(&plain_free, g, NULL, 0, plain);
    int kept_plain = cuhook.lookup((const void *)(uintptr_t)plain, 1, &probe) == 0 && probe.size == 65536;
    CHECK("nodes_free_of_plain_memory_refused", rc != CUDA_SUCCESS && kept_plain && driver_size(plain) == 65536,
          "rc=%d registered=%d driver %zu", rc, kept_plain, driver_size(plain));
    cuMemFree(plain);

    // Run it: the kept allocation is the driver's; the freed ones are not.
    CUstream s;
    cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    CUgraphExec ex = NULL;
    rc = cuGraphInstantiate(&ex, g, 0);
    int ran = rc == CUDA_SUCCESS && cuGraphLaunch(ex, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS;
    CHECK("nodes_launched",
          ran && driver_size(kept) == k_size && node_size(kept, NULL) == k_size && driver_size(ap.dptr) == 0 &&
              driver_size(temp) == 0,
          "ran=%d kept: driver %zu registry %zu; freed in graph: driver %zu %zu", ran, driver_size(kept), node_size(kept, NULL),
          driver_size(ap.dptr), driver_size(temp));
    cuGraphExecDestroy(ex);
    cuGraphDestroy(g);
    rc = cuMemFreeAsync(kept, s);
    cuStreamSynchronize(s);
    cuhook_mem_info_t info;
    int still = cuhook.lookup((const void *)(uintptr_t)kept, 1, &info) == 0;
    CHECK("nodes_freed_outside", rc == CUDA_SUCCESS && driver_size(kept) == 0 && !still, "rc=%d driver %zu registered %d", rc,
          driver_size(kept), still);
    cuStreamDestroy(s);
    printf("graph_nodes: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
