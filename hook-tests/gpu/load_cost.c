// What reading loaded device code costs: loads every fatbin container of a shared object's
// `.nv_fatbin` section with cuLibraryLoadData (as the runtime does for each registered fatbin),
// timing the loads, then unloads them. Run plain and with libcuhook.so preloaded, alternated
// (measure.sh's `loads`); prints one line: containers, bytes, load time.
// Usage: load_cost FILE [MAX_CONTAINERS]
#include <cuda.h>
#include <elf.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    long max = argc > 2 ? atol(argv[2]) : 1L << 30;
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) return 2;
    const uint8_t *f = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)f;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(f + eh->e_shoff);
    const char *names = (const char *)(f + sh[eh->e_shstrndx].sh_offset);
    const uint8_t *sec = NULL;
    size_t len = 0;
    for (int i = 0; i < eh->e_shnum; i++)
        if (!strcmp(names + sh[i].sh_name, ".nv_fatbin")) sec = f + sh[i].sh_offset, len = sh[i].sh_size;
    if (!sec) { printf("no .nv_fatbin\n"); return 2; }
    cuInit(0);
    CUdevice dev;
    CUcontext ctx;
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    static CUlibrary libs[100000];
    long n = 0, failed = 0;
    size_t bytes = 0;
    double spent = 0;
    for (size_t at = 0; at + 16 <= len && n < max;) {
        uint32_t magic;
        uint64_t size;
        memcpy(&magic, sec + at, 4);
        if (magic != 0xBA55ED50u) { at += 8; continue; }
        memcpy(&size, sec + at + 8, 8);
        // A private copy, 8-byte aligned, as a registered fatbin is.
        uint8_t *copy = aligned_alloc(8, (16 + size + 7) & ~(size_t)7);
        memcpy(copy, sec + at, 16 + size);
        double t = now();
        CUresult r = cuLibraryLoadData(&libs[n], copy, NULL, NULL, 0, NULL, NULL, 0);
        spent += now() - t;
        if (r == CUDA_SUCCESS) n++; else failed++;
        bytes += 16 + size;
        at += 16 + size;
    }
    for (long i = 0; i < n; i++) cuLibraryUnload(libs[i]);
    printf("loads %ld failed %ld bytes %zu load_ms %.2f per_load_us %.1f\n", n, failed, bytes, spent * 1e3,
           n ? spent * 1e6 / n : 0.0);
    return 0;
}
