// Diagnostic (issue 10): delay each cuMemAllocAsync / cuMemFreeAsync by SPIN TSC cycles of busy
// work before the real call — no cuhook at all — to see how the driver's many-thread time per
// pair responds to work done between its calls. Build: gcc -O2 -shared -fPIC -o spin_shim.so
// spin_shim.c -ldl; run: SPIN=450 NO_CUHOOK=1 LD_PRELOAD=./spin_shim.so bench pairs drv 16
// (docs/performance-log.md, "What the 16-thread overhead is").
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <x86intrin.h>
typedef int (*alloc_t)(unsigned long long *, size_t, void *);
typedef int (*free_t)(unsigned long long, void *);
static uint64_t spin_cycles(void) { static uint64_t s = (uint64_t)-1; if (s == (uint64_t)-1) { const char *e = getenv("SPIN"); s = e ? strtoull(e, 0, 0) : 0; } return s; }
static void spin(void) { uint64_t n = spin_cycles(), t = __rdtsc(); while (__rdtsc() - t < n) _mm_pause(); }
int cuMemAllocAsync(unsigned long long *p, size_t n, void *s) { static alloc_t r; if (!r) r = (alloc_t)dlsym(RTLD_NEXT, "cuMemAllocAsync"); spin(); return r(p, n, s); }
int cuMemFreeAsync(unsigned long long p, void *s) { static free_t r; if (!r) r = (free_t)dlsym(RTLD_NEXT, "cuMemFreeAsync"); spin(); return r(p, s); }
