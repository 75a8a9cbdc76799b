/*
 * pairs.c: LIVE allocations that stay live, then LOOPS cuMemAllocAsync +
 * cuMemFreeAsync pairs of 4 KiB. Run under callgrind twice with different
 * LOOPS; the difference of the two instruction counts divided by the
 * difference of LOOPS is the cost of one pair, start-up cancelled.
 *
 *   pairs LIVE LOOPS
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
    cuInit(0);
    CUdeviceptr p;
    for (long i = 0; i < live; i++)
        if (cuMemAllocAsync(&p, 4096, 0))
            return 1;
    unsigned long long sum = 0;
    for (long i = 0; i < loops; i++) {
        if (cuMemAllocAsync(&p, 4096, 0) || cuMemFreeAsync(p, 0))
            return 1;
        sum += p;
    }
    printf("%llu\n", sum & 1);
    return 0;
}
