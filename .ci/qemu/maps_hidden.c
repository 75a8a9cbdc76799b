// qemu-user 7.2 builds /proc/self/maps from the host's mappings and leaves a host mapping out
// whole when one of its pages is not, at that moment, a guest page with the first page's
// protection. The host merges anonymous mappings of one protection, so a test's pages can vanish
// from the text while another thread unmaps a neighbour. Here four threads map and unmap beside
// the main thread, which maps three pages (read-write, read-only, read-write) and looks for each
// in the text. With `1` as first argument the pages get an inaccessible page on each side (what
// cuhook_fixtures::FencedPages does).
//
//   aarch64-linux-gnu-gcc -O2 -pthread maps_hidden.c -o maps_hidden
//   qemu-aarch64-static -L /usr/aarch64-linux-gnu ./maps_hidden 0 10000   # some rounds miss pages
//   qemu-aarch64-static -L /usr/aarch64-linux-gnu ./maps_hidden 1 10000   # none
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile int stop;

static void *neighbours(void *unused) {
    (void)unused;
    size_t len = 4 * 65536;
    while (!stop) {
        char *m = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        m[0] = 1;
        munmap(m, len);
    }
    return 0;
}

static int listed(unsigned long address) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        found = sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= address && address < hi;
    }
    fclose(f);
    return found;
}

int main(int argc, char **argv) {
    int fenced = argc > 1 && atoi(argv[1]);
    int rounds = argc > 2 ? atoi(argv[2]) : 2000;
    long page = sysconf(_SC_PAGESIZE);
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, neighbours, 0);
    int missing = 0;
    for (int r = 0; r < rounds; r++) {
        int n = fenced ? 5 : 3;
        char *m = mmap(0, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        char *pages = fenced ? m + page : m;
        if (fenced) {
            mprotect(m, page, PROT_NONE);
            mprotect(m + 4 * page, page, PROT_NONE);
        }
        mprotect(pages + page, page, PROT_READ);
        for (int i = 0; i < 3; i++) {
            if (!listed((unsigned long)(pages + i * page + 8))) {
                missing++;
                break;
            }
        }
        munmap(m, n * page);
    }
    stop = 1;
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    printf("fenced=%d page=%ld: %d of %d rounds had a page missing from the maps text\n", fenced,
           page, missing, rounds);
    return 0;
}
