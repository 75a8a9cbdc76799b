// Graph memory nodes made by stream capture (issue 13, item 4), checked against the driver: an
// allocation freed inside the graph leaves the registry at capture; one the graph keeps is
// registered (flagged GRAPH) from capture on, is memory the driver has once the graph has run
// (once, or relaunched with auto-free-on-launch), outlives the graph and its exec as the driver's
// allocation does, and leaves the registry when it is freed outside the graph.
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "cuhook_api.h"
}
#include "driver_check.h"

// The registry's size for p when it holds p flagged GRAPH, else 0.
static size_t graph_size(CUdeviceptr p) {
    cuhook_mem_info_t info;
    memset(&info, 0, sizeof info);
    if (cuhook.lookup((const void *)(uintptr_t)p, 1, &info) != 0) return 0;
    return (info.flags & CUHOOK_FLAG_GRAPH) ? info.size : 0;
}

static void scenario(const char *tag, unsigned long long flags, int launches) {
    CUstream s;
    cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    CUdeviceptr a = 0, b = 0;
    const size_t a_size = 1 << 20, b_size = 3 << 20;
    cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    cuMemAllocAsync(&a, a_size, s);
    cuMemsetD8Async(a, 1, a_size, s);
    cuMemFreeAsync(a, s);
    cuMemAllocAsync(&b, b_size, s);
    cuMemsetD8Async(b, 2, b_size, s);
    CUgraph g = NULL;
    CUresult rc = cuStreamEndCapture(s, &g);
    char name[96];
    snprintf(name, sizeof name, "%s_capture", tag);
    CHECK(name, rc == CUDA_SUCCESS && a && b && graph_size(a) == 0 && graph_size(b) == b_size,
          "rc=%d freed-in-graph registered=%zu kept registered=%zu (want 0, %zu)", rc, graph_size(a), graph_size(b), b_size);
    CUgraphExec e = NULL;
    rc = cuGraphInstantiate(&e, g, flags);
    int launched = rc == CUDA_SUCCESS;
    for (int i = 0; i < launches && launched; i++)
        launched = cuGraphLaunch(e, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS;
    snprintf(name, sizeof name, "%s_launched", tag);
    CHECK(name, launched && driver_size(b) == b_size && graph_size(b) == b_size && driver_size(a) == 0 && graph_size(a) == 0,
          "launched=%d kept: driver %zu registry %zu; freed in graph: driver %zu registry %zu", launched, driver_size(b),
          graph_size(b), driver_size(a), graph_size(a));
    cuGraphExecDestroy(e);
    cuGraphDestroy(g);
    CUdevice d;
    cuDeviceGet(&d, 0);
    cuDeviceGraphMemTrim(d);
    snprintf(name, sizeof name, "%s_outlives_graph", tag);
    CHECK(name, driver_size(b) == b_size && graph_size(b) == b_size, "after exec and graph destroy and trim: driver %zu registry %zu",
          driver_size(b), graph_size(b));
    rc = cuMemFreeAsync(b, s);
    cuStreamSynchronize(s);
    snprintf(name, sizeof name, "%s_freed_outside", tag);
    CHECK(name, rc == CUDA_SUCCESS && driver_size(b) == 0 && graph_size(b) == 0, "rc=%d driver %zu registry %zu", rc,
          driver_size(b), graph_size(b));
    cuStreamDestroy(s);
}

int main() {
    start_installed("graph_install");
    scenario("graph_once", 0, 1);
    scenario("graph_autofree", CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, 3);
    printf("graph: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
