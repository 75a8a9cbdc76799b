// Loads the libraries named after argv[1] (RTLD_NOW | RTLD_GLOBAL), then libcuhook.so (argv[1]),
// and times one cuhook_install() in thread CPU time (benches/torch/run.sh).
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
int main(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!dlopen(argv[i], RTLD_NOW | RTLD_GLOBAL)) { printf("dlopen %s: %s\n", argv[i], dlerror()); return 1; }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { printf("cuhook: %s\n", dlerror()); return 1; }
    int (*install)(void) = (int (*)(void))dlsym(h, "cuhook_install");
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    int rc = install();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    printf("install rc=%d cpu_ms=%.3f\n", rc, (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
    return 0;
}
