/* A registration cache for GPU buffers, as an MPI library or an RDMA transport keeps one.
 *
 * The send path asks cuhook which allocation a buffer belongs to (cuhook_lookup: a registry
 * lookup, no driver call) and registers that whole allocation once; later sends from anywhere
 * in it reuse the registration. cuhook's free event drops the registration *before* the driver
 * releases the memory, so an allocation that later gets the same address is never sent through
 * a stale registration. Each registration also remembers the allocation's `seq`, which changes
 * when an address is reused: a second guard that needs no event at all.
 *
 * Run it, with no GPU, on cuhook's fake driver: `scripts/run-example.sh regcache-c` (it installs
 * cuhook into target/examples-run/prefix and builds this file with pkg-config).
 * On a machine with CUDA, against an installed cuhook (scripts/install-c.sh) and the toolkit's
 * cuda.h (the rpath: where install-c.sh put the library, unless ldconfig knows it):
 *   cc regcache.c $(pkg-config --cflags --libs cuhook) -I/usr/local/cuda/include -lcuda -lpthread \
 *      -Wl,-rpath,$(pkg-config --variable=libdir cuhook) && ./a.out
 * The test suite runs it both ways on the fake driver (hook-tests/examples.rs). */
#include <cuda.h>
#include <cuhook.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#define MAX_REGISTRATIONS 64

struct registration {
    uintptr_t start;
    size_t size;
    uint64_t seq; /* the allocation's identity: a reused address gets a new seq */
    int key;      /* what the NIC would hand back (an ibv_mr's lkey) */
    int valid;
};

static struct registration cache[MAX_REGISTRATIONS];
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned hits, misses, invalidations;
static int next_key = 1;

/* Stand-ins for ibv_reg_mr / ibv_dereg_mr. */
static int nic_register(uintptr_t start, size_t size) {
    (void)start;
    (void)size;
    return next_key++;
}
static void nic_deregister(int key) { (void)key; }

/* cuhook calls this on the freeing thread, before the memory goes back to the driver. It must
 * not call CUDA; it takes only the cache's own lock. */
static void on_free(int event, const cuhook_mem_event_t *ev, void *arg) {
    (void)event;
    (void)arg;
    uintptr_t lo = (uintptr_t)ev->address;
    uintptr_t hi = lo + (ev->size ? ev->size : 1);
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < MAX_REGISTRATIONS; i++) {
        struct registration *r = &cache[i];
        if (r->valid && r->start < hi && lo < r->start + r->size) {
            nic_deregister(r->key);
            r->valid = 0;
            invalidations++;
        }
    }
    pthread_mutex_unlock(&cache_lock);
}

/* The send path: the key of a registration covering [buf, buf+len), registering the whole
 * allocation on first use; -1 when the range is not (entirely) GPU memory (send by copy). */
static int registration_key(const void *buf, size_t len) {
    cuhook_mem_info_t info;
    if (cuhook_lookup(buf, len, &info) != CUHOOK_OK || info.mem_type != CUHOOK_MEM_TYPE_CUDA)
        return -1;
    int key = -1, free_slot = -1;
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < MAX_REGISTRATIONS && key < 0; i++) {
        struct registration *r = &cache[i];
        if (r->valid && r->start == (uintptr_t)info.address && r->seq == info.seq)
            key = r->key;
        else if (!r->valid && free_slot < 0)
            free_slot = i;
    }
    if (key >= 0) {
        hits++;
    } else if (free_slot >= 0) {
        misses++;
        struct registration *r = &cache[free_slot];
        r->start = (uintptr_t)info.address;
        r->size = info.size;
        r->seq = info.seq;
        r->key = key = nic_register(r->start, r->size);
        r->valid = 1;
    }
    pthread_mutex_unlock(&cache_lock);
    return key;
}

static int failures;
static void check(const char *name, int ok) {
    printf("check %s %s\n", name, ok ? "ok" : "FAIL");
    failures += !ok;
}

int main(void) {
    if (cuhook_set_event_handler(CUHOOK_EVENT_MEM_TYPE_FREE, 0, on_free, NULL) != CUHOOK_OK) {
        fprintf(stderr, "regcache: cannot subscribe to cuhook's free events\n");
        return 1;
    }
    CUdevice dev;
    CUcontext ctx;
    cuInit(0);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);

    CUdeviceptr a, b, c;
    cuMemAlloc(&a, 1 << 20);
    cuMemAlloc(&b, 4 << 20);
    int ka = registration_key((void *)a, 4096);
    int ka_inside = registration_key((void *)(a + 65536), 4096);
    int kb = registration_key((void *)b, 1 << 20);
    check("first_send_registers", ka > 0 && kb > 0 && ka != kb);
    check("same_allocation_reuses_registration", ka_inside == ka);

    cuMemFree(a); /* the free event drops a's registration before the memory goes */
    check("free_invalidates_before_release", invalidations == 1);
    cuMemAlloc(&c, 1 << 20); /* the driver may hand a's address out again */
    int kc = registration_key((void *)c, 4096);
    check("new_allocation_gets_new_registration", kc > 0 && kc != ka);
    printf("address reused: %s\n", c == a ? "yes" : "no");

    int on_stack = 0;
    check("host_memory_is_not_registered", registration_key(&on_stack, sizeof on_stack) == -1);
    check("range_past_the_end_is_not_registered",
          registration_key((void *)(b + (4 << 20) - 16), 64) == -1);

    cuMemFree(b);
    cuMemFree(c);
    check("every_registration_dropped", invalidations == 3);
    printf("hits %u misses %u invalidations %u\n", hits, misses, invalidations);
    cuhook_unset_event_handler(CUHOOK_EVENT_MEM_TYPE_FREE, on_free, NULL);
    return failures ? 1 : 0;
}
