/*
 * lookups.c: LIVE 4 KiB allocations that stay live, then ROUNDS rounds of 256
 * cuhook_lookup calls (the C API of the preloaded libcuhook.so), each a pointer
 * inside one of the live ranges. Run under callgrind twice with different
 * ROUNDS; the difference of the counts divided by 256 × the difference of
 * ROUNDS is the cost of one lookup, start-up cancelled.
 *
 *   lookups LIVE ROUNDS
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../include/cuhook.h"

#include "driver_api.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: lookups LIVE ROUNDS\n");
        return 2;
    }
    long live = atol(argv[1]), rounds = atol(argv[2]);
    /* Looked up at run time, so the program also runs (and finds nothing) without cuhook. */
    int (*lookup)(const void *, size_t, cuhook_mem_info_t *) =
        (int (*)(const void *, size_t, cuhook_mem_info_t *))dlsym(RTLD_DEFAULT, "cuhook_lookup");
    if (!lookup || live < 1) {
        fprintf(stderr, "lookups: needs libcuhook.so preloaded and LIVE >= 1\n");
        return 2;
    }
    cuInit(0);
    CUdeviceptr *p = malloc(live * sizeof *p);
    if (!p)
        return 1;
    for (long i = 0; i < live; i++)
        if (cuMemAllocAsync(&p[i], 4096, 0))
            return 1;
    cuhook_mem_info_t info;
    long found = 0;
    for (long r = 0; r < rounds; r++)
        for (long i = 0; i < 256; i++)
            found += lookup((const void *)(p[(i * 37) % live] + 100), 0, &info) == 0;
    if (found != rounds * 256) {
        fprintf(stderr, "lookups: %ld of %ld found\n", found, rounds * 256);
        return 1;
    }
    return 0;
}
