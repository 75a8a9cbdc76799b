/*
 * footprint.c: LIVE allocations kept live, a few warm-up pairs, then one
 * cuMemAllocAsync + cuMemFreeAsync pair between two marker stores, then a
 * copy of /proc/self/maps to MAPS. Run under `valgrind --tool=lackey
 * --trace-mem=yes`: every instruction fetch and data access between the
 * markers is the pair's, and footprint.py counts the distinct 64-byte cache
 * lines they touch (code and data) and says which mapping each lies in.
 *
 *   footprint LIVE MAPS
 */
#include <stdio.h>
#include <stdlib.h>

#include "driver_api.h"

/* The pair lies between a store to footprint_begin and one to footprint_end
 * (footprint.sh finds their addresses with nm). */
volatile long footprint_begin, footprint_end;

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: footprint LIVE MAPS\n");
        return 2;
    }
    long live = atol(argv[1]);
    cuInit(0);
    CUdeviceptr p;
    for (long i = 0; i < live; i++)
        if (cuMemAllocAsync(&p, 4096, 0))
            return 1;
    for (int i = 0; i < 8; i++)
        if (cuMemAllocAsync(&p, 4096, 0) || cuMemFreeAsync(p, 0))
            return 1;
    footprint_begin = 1;
    CUresult rc = cuMemAllocAsync(&p, 4096, 0);
    rc |= cuMemFreeAsync(p, 0);
    footprint_end = 1;
    if (rc)
        return 1;
    FILE *in = fopen("/proc/self/maps", "r"), *out = fopen(argv[2], "w");
    if (!in || !out)
        return 1;
    char line[4096];
    while (fgets(line, sizeof line, in))
        fputs(line, out);
    fclose(in);
    fclose(out);
    return 0;
}
