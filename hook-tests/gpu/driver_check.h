// Shared by the graph checks (graph.cu, graph_nodes.cu): the driver's own view of an address,
// and the start every check program makes. Include after cuda.h and cuhook_api.h.
#ifndef DRIVER_CHECK_H
#define DRIVER_CHECK_H

// The driver's size of the allocation at p, or 0 when it has none.
static size_t driver_size(CUdeviceptr p) {
    CUdeviceptr base = 0;
    size_t size = 0;
    return cuMemGetAddressRange(&base, &size, p) == CUDA_SUCCESS ? size : 0;
}

// Line-buffered output, device 0's primary context current, cuhook loaded and its CUDA hooks
// installed (checked as `install_check`). Returns the context.
static CUcontext start_installed(const char *install_check) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuInit(0);
    CUdevice d;
    cuDeviceGet(&d, 0);
    CUcontext ctx;
    cuDevicePrimaryCtxRetain(&ctx, d);
    cuCtxSetCurrent(ctx);
    cuhook_load();
    CHECK(install_check, cuhook.cuda_install() == 0, "-");
    return ctx;
}
#endif
