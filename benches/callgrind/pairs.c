/*
 * pairs.c: LIVE allocations that stay live, then LOOPS cuMemAllocAsync +
 * cuMemFreeAsync pairs of 4 KiB. Run under callgrind twice with different
 * LOOPS; the difference of the two instruction counts divided by the
 * difference of LOOPS is the cost of one pair, start-up cancelled.
 *
 *   pairs LIVE LOOPS        (PAIRS_STREAM=0x...: on that stream handle, not the
 *                            default stream; the mini driver takes any)
 */
#include <stdio.h>
#include <stdlib.h>

#include "driver_api.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: pairs LIVE LOOPS\n");
        return 2;
    }
    long live = atol(argv[1]), loops = atol(argv[2]);
    const char *named = getenv("PAIRS_STREAM");
    CUstream s = named ? (CUstream)strtoull(named, NULL, 0) : 0;
    cuInit(0);
    CUdeviceptr p;
    for (long i = 0; i < live; i++)
        if (cuMemAllocAsync(&p, 4096, s))
            return 1;
    unsigned long long sum = 0;
    for (long i = 0; i < loops; i++) {
        if (cuMemAllocAsync(&p, 4096, s) || cuMemFreeAsync(p, s))
            return 1;
        sum += p;
    }
    printf("%llu\n", sum & 1);
    return 0;
}
