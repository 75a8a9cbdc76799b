// leaks.cu: leaks device memory from three call sites (issue 37's side-by-side on the real
// driver): 5 x 64 KiB from leak_small, 3 x 1 MiB stream-ordered from leak_async, 1 x 8 MiB
// from leak_big, and 4 allocations from `balanced` that are freed. Built -g -O1 without frame
// pointers. hook-tests/gpu/stacks.sh runs it under compute-sanitizer --leak-check full and under
// `cuhook run --stacks 16` and compares the sites and the wall times.
#include <cstdio>
#include <cuda_runtime.h>

#define NOINLINE __attribute__((noinline))

static void *kept[64];
static int n;

NOINLINE void leak_small() { cudaMalloc(&kept[n++], 64 << 10); /* MARK(small) */ }
NOINLINE void leak_async(cudaStream_t s) { cudaMallocAsync(&kept[n++], 1 << 20, s); /* MARK(async) */ }
NOINLINE void leak_big() { cudaMalloc(&kept[n++], 8 << 20); /* MARK(big) */ }
NOINLINE void balanced() {
    void *p = nullptr;
    cudaMalloc(&p, 1234); /* MARK(balanced) */
    cudaFree(p);
}

int main() {
    cudaStream_t s;
    cudaStreamCreate(&s);
    for (int i = 0; i < 5; i++) leak_small();
    for (int i = 0; i < 3; i++) leak_async(s);
    leak_big();
    for (int i = 0; i < 4; i++) balanced();
    cudaStreamSynchronize(s);
    printf("leaked %d\n", n);
    return 0;
}
