// Measurements for docs/performance.md on a real GPU:
//   bench lookup   — registry lookup (cuhook_lookup) vs cuPointerGetAttributes, 1 and 16 threads
//   bench pairs    — cudaMallocAsync + cudaFreeAsync pairs per second (run with and without
//                    cuhook: NO_CUHOOK=1 skips loading it)
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "cuhook_api.h"
}

static double now() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

enum { BUFFERS = 1000 };
static void *bufs[BUFFERS];
static size_t sizes[BUFFERS];
static CUcontext ctx;

struct job {
    int use_driver;
    long iters;
    double ns;
    long found;
};

static void *lookup_thread(void *arg) {
    struct job *j = (struct job *)arg;
    cuCtxSetCurrent(ctx);
    unsigned x = 12345u + (unsigned)(uintptr_t)arg;
    long found = 0;
    double t0 = now();
    for (long i = 0; i < j->iters; i++) {
        x = x * 1664525u + 1013904223u;
        int k = x % BUFFERS;
        char *p = (char *)bufs[k] + (x >> 8) % sizes[k];
        if (j->use_driver) {
            CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_CONTEXT};
            unsigned mt = 0;
            int dev = -1;
            CUcontext c = 0;
            void *data[3] = {&mt, &dev, &c};
            found += cuPointerGetAttributes(3, attrs, data, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS && mt == CU_MEMORYTYPE_DEVICE;
        } else {
            cuhook_mem_info_t info;
            found += cuhook.lookup(p, 1, &info) == 0;
        }
    }
    j->ns = (now() - t0) * 1e9 / j->iters;
    j->found = found;
    return NULL;
}

static void lookups() {
    cuCtxGetCurrent(&ctx);
    for (int i = 0; i < BUFFERS; i++) {
        sizes[i] = 4096 + (size_t)(i % 37) * 65536;
        cudaMalloc(&bufs[i], sizes[i]);
    }
    for (int use_driver = 0; use_driver < 2; use_driver++) {
        for (int threads = 1; threads <= 16; threads *= 16) {
            pthread_t t[16];
            struct job jobs[16];
            for (int k = 0; k < threads; k++) {
                jobs[k].use_driver = use_driver;
                jobs[k].iters = use_driver ? 200000 : 2000000;
                pthread_create(&t[k], NULL, lookup_thread, &jobs[k]);
            }
            double sum = 0;
            long found = 0;
            for (int k = 0; k < threads; k++) {
                pthread_join(t[k], NULL);
                sum += jobs[k].ns;
                found += jobs[k].found;
            }
            long total = jobs[0].iters * threads;
            printf("lookup %-24s threads=%2d ns_per_lookup=%.1f found=%ld/%ld\n", use_driver ? "cuPointerGetAttributes" : "cuhook_lookup", threads,
                   sum / threads, found, total);
        }
    }
}

static void pairs() {
    cudaStream_t s;
    cudaStreamCreate(&s);
    void *p;
    for (int i = 0; i < 10000; i++) {  // warm the pool
        cudaMallocAsync(&p, 4096, s);
        cudaFreeAsync(p, s);
    }
    cudaStreamSynchronize(s);
    const long n = 300000;
    double t0 = now();
    for (long i = 0; i < n; i++) {
        cudaMallocAsync(&p, 4096, s);
        cudaFreeAsync(p, s);
    }
    cudaStreamSynchronize(s);
    printf("pairs cudaMallocAsync+cudaFreeAsync ns_per_pair=%.1f hooked=%d\n", (now() - t0) * 1e9 / n, getenv("NO_CUHOOK") ? 0 : 1);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!getenv("NO_CUHOOK")) {
        cuhook_load();
        if (cuhook.cuda_install() != 0) {
            printf("install failed\n");
            return 1;
        }
    }
    cudaFree(0);
    if (argc > 1 && !strcmp(argv[1], "lookup")) lookups();
    if (argc > 1 && !strcmp(argv[1], "pairs")) pairs();
    return 0;
}
