// Measurements for docs/performance.md on a real GPU:
//   bench lookup   — registry lookup (cuhook_lookup) of device pointers and of host pointers (a
//                    miss) vs cuPointerGetAttributes, 1, 8 and 16 threads
//   bench pairs rt|drv THREADS — 4 KiB cudaMallocAsync+cudaFreeAsync (rt) or
//                    cuMemAllocAsync+cuMemFreeAsync (drv) pairs, each thread on its own stream,
//                    best of 20 blocks per thread (run plain with NO_CUHOOK=1, and hooked)
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
static char host[1 << 20];

struct job {
    int use_driver;
    long iters;
    double ns;
    long found;
};

enum { PTRS = 4096 };

static void *lookup_thread(void *arg) {
    struct job *j = (struct job *)arg;
    cuCtxSetCurrent(ctx);
    // The pointers are drawn before the clock starts, so the loop times the lookup and not the
    // divisions that pick a pointer (they cost as much as the lookup itself).
    static __thread char *ptrs[PTRS];
    unsigned x = 12345u + (unsigned)(uintptr_t)arg;
    for (int i = 0; i < PTRS; i++) {
        x = x * 1664525u + 1013904223u;
        int k = x % BUFFERS;
        ptrs[i] = j->use_driver == 2 ? host + (x >> 8) % sizeof host
                                     : (char *)bufs[k] + (x >> 8) % sizes[k];
    }
    long found = 0;
    double t0 = now();
    for (long i = 0; i < j->iters; i++) {
        char *p = ptrs[i % PTRS];
        if (j->use_driver == 2) {
            // Host memory: the answer a communication library gets most often.
            cuhook_mem_info_t info;
            found += cuhook.lookup(p, 1, &info) != 0;
        } else if (j->use_driver) {
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
    for (int use_driver = 0; use_driver < 3; use_driver++) {
        for (int threads = 1; threads <= 16; threads = threads == 1 ? 8 : threads * 2) {
            pthread_t t[16];
            struct job jobs[16];
            for (int k = 0; k < threads; k++) {
                jobs[k].use_driver = use_driver;
                jobs[k].iters = use_driver == 1 ? 200000 : 2000000;
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
            printf("lookup %-24s threads=%2d ns_per_lookup=%.1f found=%ld/%ld\n", use_driver == 1 ? "cuPointerGetAttributes" : use_driver ? "cuhook_lookup(host)" : "cuhook_lookup", threads,
                   sum / threads, found, total);
        }
    }
}

struct pair_job {
    int driver;     // cuMemAllocAsync+cuMemFreeAsync instead of the runtime pair
    long blocks, per_block;
    double best_ns; // best block, ns per pair
};

static void *pair_thread(void *arg) {
    struct pair_job *j = (struct pair_job *)arg;
    cuCtxSetCurrent(ctx);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    void *p;
    CUdeviceptr d;
    for (int i = 0; i < 10000; i++) {  // warm the pool
        cudaMallocAsync(&p, 4096, s);
        cudaFreeAsync(p, s);
    }
    cudaStreamSynchronize(s);
    j->best_ns = 1e30;
    for (long b = 0; b < j->blocks; b++) {
        double t0 = now();
        if (j->driver) {
            for (long i = 0; i < j->per_block; i++) {
                cuMemAllocAsync(&d, 4096, (CUstream)s);
                cuMemFreeAsync(d, (CUstream)s);
            }
        } else {
            for (long i = 0; i < j->per_block; i++) {
                cudaMallocAsync(&p, 4096, s);
                cudaFreeAsync(p, s);
            }
        }
        double ns = (now() - t0) * 1e9 / j->per_block;
        if (ns < j->best_ns) j->best_ns = ns;
    }
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return NULL;
}

// bench pairs rt|drv THREADS: each thread allocates on its own stream; prints the mean over
// threads of each thread's best block (ns per pair).
static void pairs(int driver, int threads) {
    cuCtxGetCurrent(&ctx);
    pthread_t t[64];
    struct pair_job jobs[64];
    for (int k = 0; k < threads; k++) {
        jobs[k].driver = driver;
        jobs[k].blocks = 20;
        jobs[k].per_block = threads > 1 ? 5000 : 20000;  // 16 threads share the driver's locks
        pthread_create(&t[k], NULL, pair_thread, &jobs[k]);
    }
    double sum = 0;
    for (int k = 0; k < threads; k++) {
        pthread_join(t[k], NULL);
        sum += jobs[k].best_ns;
    }
    const char *mode = getenv("NO_CUHOOK") ? "plain" : "hooked";
    printf("pairs api=%s threads=%d mode=%s ns_per_pair=%.1f\n",
           driver ? "cuMemAllocAsync+cuMemFreeAsync" : "cudaMallocAsync+cudaFreeAsync", threads, mode,
           sum / threads);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// bench toggle ROUNDS: the driver pair through this program's own GOT slot, in ONE process on
// one thread, alternating blocks with the hooks uninstalled (plain) and installed (hooked), so
// both modes share the core, the clock and the driver's state. Prints the median block of each
// mode, the spread (min-max) and the difference.
static void toggle(int rounds) {
    cuhook_load();
    cudaFree(0);
    CUstream s;
    cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    CUdeviceptr d;
    const long per_block = 20000;
    static double plain[256], hooked[256];
    if (rounds > 256) rounds = 256;
    for (int i = 0; i < 20000; i++) {
        cuMemAllocAsync(&d, 4096, s);
        cuMemFreeAsync(d, s);
    }
    // A library loaded with dlopen need not have installed itself: start installed.
    if (cuhook.cuda_install()) {
        printf("toggle: install failed\n");
        return;
    }
    int installed = 1;
    for (int r = 0; r < rounds; r++) {
        for (int mode = 0; mode < 2; mode++) {
            int on = (r + mode) % 2;  // alternate which mode goes first
            int rc = on == installed ? 0 : on ? cuhook.cuda_install() : cuhook.cuda_uninstall();
            installed = on;
            if (rc) {
                printf("toggle: %s failed: %d\n", on ? "install" : "uninstall", rc);
                return;
            }
            double t0 = now();
            for (long i = 0; i < per_block; i++) {
                cuMemAllocAsync(&d, 4096, s);
                cuMemFreeAsync(d, s);
            }
            double ns = (now() - t0) * 1e9 / per_block;
            (on ? hooked : plain)[r] = ns;
        }
    }
    cuStreamSynchronize(s);
    qsort(plain, rounds, sizeof(double), cmp_double);
    qsort(hooked, rounds, sizeof(double), cmp_double);
    double mp = plain[rounds / 2], mh = hooked[rounds / 2];
    printf("toggle cuMemAllocAsync+cuMemFreeAsync rounds=%d plain %.1f [%.1f-%.1f] hooked %.1f "
           "[%.1f-%.1f] +%.1f ns x%.3f\n",
           rounds, mp, plain[0], plain[rounds - 1], mh, hooked[0], hooked[rounds - 1], mh - mp, mh / mp);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 2 && !strcmp(argv[1], "toggle")) {
        toggle(atoi(argv[2]));
        return 0;
    }
    // NO_CUHOOK=1: plain. Otherwise cuhook is either preloaded (LD_PRELOAD, its constructor
    // installed it with the default configuration) or loaded and installed here.
    if (!getenv("NO_CUHOOK")) {
        cuhook_load();
        if (cuhook.cuda_install() != 0) {
            printf("install failed\n");
            return 1;
        }
    }
    cudaFree(0);
    if (argc > 1 && !strcmp(argv[1], "lookup")) lookups();
    if (argc > 3 && !strcmp(argv[1], "pairs")) pairs(!strcmp(argv[2], "drv"), atoi(argv[3]));
    return 0;
}
