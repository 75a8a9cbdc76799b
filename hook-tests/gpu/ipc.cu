// Imported memory (issue 13, item 3) across two processes on one GPU. Run without arguments it
// is the exporter (no cuhook): it allocates a device buffer (legacy IPC handle) and a block of an
// exportable pool (pool pointer), fills both, then runs itself as the importer (fork + exec,
// the pool's file descriptor inherited) and waits. The importer installs cuhook, opens / imports
// both: each imported range must be registered (IMPORTED, device memory, the exporter's size)
// while open, carry the exporter's data, and be gone after close / free.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern "C" {
#include "cuhook_api.h"
}

static const size_t kLegacy = 4 << 20, kPooled = 2 << 20;

static void hex(const void *p, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", ((const unsigned char *)p)[i]);
}
static void unhex(const char *s, void *p, size_t n) {
    for (size_t i = 0; i < n; i++) sscanf(s + 2 * i, "%2hhx", (unsigned char *)p + i);
}

static int imported_allocs, imported_frees;
static void on_event(int event, const cuhook_mem_event_t *ev, void *arg) {
    (void)arg;
    if (event == CUHOOK_EVENT_MEM_TYPE_ALLOC && (ev->flags & CUHOOK_FLAG_IMPORTED)) imported_allocs++;
    if (event == CUHOOK_EVENT_MEM_TYPE_FREE && (ev->flags & CUHOOK_FLAG_IMPORTED)) imported_frees++;
}

static void expect_imported(const char *name, void *p, size_t size, unsigned extra) {
    cuhook_mem_info_t info;
    int rc = cuhook.lookup(p, size, &info);
    CHECK(name, rc == 0 && (info.flags & (CUHOOK_FLAG_IMPORTED | extra)) == (CUHOOK_FLAG_IMPORTED | extra) &&
                    info.mem_type == CUHOOK_MEM_TYPE_CUDA && info.address == p && info.size == size && info.device == 0,
          "rc=%d flags=0x%x type=%d size=%zu device=%d api=%s", rc, rc ? 0 : info.flags, rc ? -1 : info.mem_type,
          rc ? 0 : info.size, rc ? -1 : info.device, rc ? "-" : info.api);
}

static void expect_data(const char *name, void *p, unsigned char want) {
    unsigned char got[64];
    cudaMemcpy(got, p, sizeof got, cudaMemcpyDeviceToHost);
    int ok = 1;
    for (size_t i = 0; i < sizeof got; i++) ok &= got[i] == want;
    CHECK(name, ok, "first=0x%02x want=0x%02x", got[0], want);
}

static int importer(const char *legacy_hex, const char *export_hex, int pool_fd) {
    cuhook_load();
    CHECK("install", cuhook.cuda_install() == 0, "-");
    cuhook.set_event_handler(CUHOOK_EVENT_MEM_TYPE_ALLOC | CUHOOK_EVENT_MEM_TYPE_FREE, 0, on_event, NULL);
    cudaSetDevice(0);
    cudaIpcMemHandle_t h;
    unhex(legacy_hex, &h, sizeof h);
    void *p = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    CHECK("ipc_opened", e == cudaSuccess && p, "err=%d", e);
    expect_imported("ipc_registered_while_open", p, kLegacy, 0);
    expect_data("ipc_data", p, 0x5a);
    e = cudaIpcCloseMemHandle(p);
    cuhook_mem_info_t info;
    CHECK("ipc_gone_after_close", e == cudaSuccess && cuhook.lookup(p, 1, &info) == CUHOOK_ERR_NOT_FOUND, "err=%d", e);

    cudaMemPool_t pool;
    e = cudaMemPoolImportFromShareableHandle(&pool, (void *)(intptr_t)pool_fd, cudaMemHandleTypePosixFileDescriptor, 0);
    CHECK("pool_imported", e == cudaSuccess, "err=%d", e);
    // Access to an imported pool's memory is granted explicitly (an error for the pool's own
    // device on some drivers: ignored, the data check below tells).
    cudaMemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = 0;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    cudaMemPoolSetAccess(pool, &access, 1);
    cudaGetLastError();
    cudaMemPoolPtrExportData exp;
    unhex(export_hex, &exp, sizeof exp);
    void *q = NULL;
    e = cudaMemPoolImportPointer(&q, pool, &exp);
    CHECK("pool_pointer_imported", e == cudaSuccess && q, "err=%d", e);
    expect_imported("pool_pointer_registered", q, kPooled, CUHOOK_FLAG_POOL);
    expect_data("pool_pointer_data", q, 0xa5);
    e = cudaFree(q);
    CHECK("pool_pointer_gone_after_free", e == cudaSuccess && cuhook.lookup(q, 1, &info) == CUHOOK_ERR_NOT_FOUND, "err=%d", e);
    CHECK("imported_events_balanced", imported_allocs == 2 && imported_frees == 2, "allocs=%d frees=%d", imported_allocs,
          imported_frees);
    cudaMemPoolDestroy(pool);
    printf("summary failures=%d\n", failures);
    return failures ? 1 : 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 5 && !strcmp(argv[1], "import")) return importer(argv[2], argv[3], atoi(argv[4]));
    cudaSetDevice(0);
    void *p = NULL;
    cudaMalloc(&p, kLegacy);
    cudaMemset(p, 0x5a, kLegacy);
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaIpcGetMemHandle(&h, p);
    if (e != cudaSuccess) { printf("check exporter_ipc_handle FAIL err=%d\n", e); return 1; }
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool;
    cudaMemPoolCreate(&pool, &props);
    void *q = NULL;
    cudaMallocFromPoolAsync(&q, kPooled, pool, 0);
    cudaMemsetAsync(q, 0xa5, kPooled, 0);
    cudaStreamSynchronize(0);
    int fd = -1;
    e = cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0);
    cudaMemPoolPtrExportData exp;
    cudaError_t e2 = cudaMemPoolExportPointer(&exp, q);
    if (e != cudaSuccess || e2 != cudaSuccess) { printf("check exporter_pool FAIL err=%d/%d\n", e, e2); return 1; }
    int inherit = dup(fd); // dup clears close-on-exec
    char legacy_hex[2 * sizeof h + 1], export_hex[2 * sizeof exp + 1], fd_s[16];
    hex(&h, sizeof h, legacy_hex);
    hex(&exp, sizeof exp, export_hex);
    snprintf(fd_s, sizeof fd_s, "%d", inherit);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", argv[0], "import", legacy_hex, export_hex, fd_s, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    cudaFree(q);
    cudaFree(p);
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("check importer_passed %s status=%d\n", ok ? "ok" : "FAIL", status);
    return ok ? 0 : 1;
}
