/* What the loader path's kernel queries cost in a big process: N bench libraries are loaded
 * (target/release/bench-libs, made by `cargo bench --bench install`), then, five times, the
 * whole of /proc/self/maps is read once, and one PROCMAP_QUERY ioctl (Linux >= 6.11) is made
 * per object (its PT_DYNAMIC address). docs/performance-log.md (tenth look of the loader section)
 * quotes it.
 *
 *   cc -O2 benches/probes/procmap.c -o /tmp/procmap -ldl
 *   /tmp/procmap 1000 target/release/bench-libs
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <link.h>
/* <linux/fs.h> of Linux 6.11, for older headers. */
struct procmap_query {
    unsigned long long size, query_flags, query_addr, vma_start, vma_end, vma_flags,
        vma_page_size, vma_offset, inode;
    unsigned dev_major, dev_minor, vma_name_size, build_id_size;
    unsigned long long vma_name_addr, build_id_addr;
};
#define PROCMAP_QUERY _IOWR('f', 17, struct procmap_query)
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* The PT_DYNAMIC address of every loaded object. */
static uintptr_t addrs[4096];
static int naddrs;

static int collect(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    for (int k = 0; k < info->dlpi_phnum; k++)
        if (info->dlpi_phdr[k].p_type == PT_DYNAMIC && naddrs < 4096)
            addrs[naddrs++] = info->dlpi_addr + info->dlpi_phdr[k].p_vaddr;
    return 0;
}

static char text[1 << 22];

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s N BENCH_LIBS_DIR\n", argv[0]);
        return 2;
    }
    int n = atoi(argv[1]);
    char path[512];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/libbench_%d.so", argv[2], i);
        if (!dlopen(path, RTLD_NOW | RTLD_LOCAL)) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
    }
    dl_iterate_phdr(collect, NULL);
    for (int round = 0; round < 5; round++) {
        double t0 = now_ms();
        int fd = open("/proc/self/maps", O_RDONLY);
        size_t total = 0;
        ssize_t got;
        while ((got = read(fd, text + total, sizeof text - total)) > 0)
            total += got;
        close(fd);
        double t1 = now_ms();
        int lines = 0;
        for (size_t j = 0; j < total; j++)
            lines += text[j] == '\n';

        fd = open("/proc/self/maps", O_RDONLY);
        double t2 = now_ms();
        for (int j = 0; j < naddrs; j++) {
            struct procmap_query q;
            memset(&q, 0, sizeof q);
            q.size = sizeof q;
            q.query_addr = addrs[j];
            if (ioctl(fd, PROCMAP_QUERY, &q)) {
                perror("PROCMAP_QUERY");
                return 1;
            }
        }
        double t3 = now_ms();
        close(fd);
        printf("maps read %.3f ms (%zu bytes, %d lines); %d queries %.3f ms (%.2f us each)\n",
               t1 - t0, total, lines, naddrs, t3 - t2, (t3 - t2) * 1e3 / naddrs);
    }
    return 0;
}
