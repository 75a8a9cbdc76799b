/*
 * cuhook: intercept every CUDA allocation and free by GOT/PLT patching.
 *
 * Link with -lcuhook (libcuhook.so), or dlopen it and look these functions up.
 * Every function returns 0 or a negative status; cuhook_strerror() explains a status.
 * No function crashes on NULL or invalid arguments: it returns CUHOOK_ERR_INVALID_ARGUMENT.
 */
#ifndef CUHOOK_H
#define CUHOOK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ---------------------------------------------------------------------- */
#define CUHOOK_OK                      0
#define CUHOOK_ERR_INVALID_ARGUMENT   -1
#define CUHOOK_ERR_BAD_OBJECT         -2
#define CUHOOK_ERR_PROTECTION         -3
#define CUHOOK_ERR_NOT_INSTALLED      -4
#define CUHOOK_ERR_CAPACITY           -5
#define CUHOOK_ERR_NO_SUCH_SUBSCRIBER -6
#define CUHOOK_ERR_BUSY               -7
#define CUHOOK_ERR_INTERNAL           -8
#define CUHOOK_ERR_NOT_FOUND          -9
#define CUHOOK_ERR_IO                 -10

/* A static, human-readable message for a status. Never NULL. */
const char *cuhook_strerror(int status);

/* ---- CUDA memory events (ucm-style) ----------------------------------------------------- */

/* Install the CUDA hook set and the registry; idempotent. */
int cuhook_install(void);
/* Restore every slot the CUDA hooks patched. */
int cuhook_uninstall(void);

/* Event bits (the `events` argument and the callback's `event`). */
#define CUHOOK_EVENT_MEM_TYPE_ALLOC   (1 << 0)
#define CUHOOK_EVENT_MEM_TYPE_FREE    (1 << 1)
/* Flags for cuhook_set_event_handler's `events`. */
#define CUHOOK_EVENT_FLAG_NO_INSTALL     (1 << 16) /* subscribe without installing the hooks */
#define CUHOOK_EVENT_FLAG_EXISTING_ALLOC (1 << 17) /* first replay every range already known */

/* Memory types. */
#define CUHOOK_MEM_TYPE_HOST          0
#define CUHOOK_MEM_TYPE_CUDA          1
#define CUHOOK_MEM_TYPE_CUDA_MANAGED  2
#define CUHOOK_MEM_TYPE_UNKNOWN       3

/* Allocation flags. */
#define CUHOOK_FLAG_STREAM_ORDERED (1u << 0)
#define CUHOOK_FLAG_POOL           (1u << 1)
#define CUHOOK_FLAG_VMM            (1u << 2)
#define CUHOOK_FLAG_PINNED_HOST    (1u << 3)
#define CUHOOK_FLAG_REGISTERED     (1u << 4)
#define CUHOOK_FLAG_EXISTING       (1u << 5) /* replayed to a new subscriber */
#define CUHOOK_FLAG_PURGED         (1u << 6) /* freed by context destroy / device reset / unload */
#define CUHOOK_FLAG_GLOBAL         (1u << 7) /* module/library global; pool = its CUmodule/CUlibrary */
#define CUHOOK_FLAG_IMPORTED       (1u << 8) /* opened/imported from another process (IPC, VMM) */
#define CUHOOK_FLAG_GRAPH          (1u << 9) /* a graph memory node: captured, or added explicitly */

typedef struct cuhook_mem_event {
    void *address;
    size_t size;          /* alloc: as requested; free: the registry's record (0 if unknown) */
    int mem_type;         /* CUHOOK_MEM_TYPE_* */
    int device;           /* device ordinal, -1 if unknown */
    unsigned int flags;   /* CUHOOK_FLAG_* */
    const char *api;      /* the API the application called, e.g. "cudaMallocAsync" */
    void *stream;
    void *pool;           /* CUmemoryPool; for CUHOOK_FLAG_GLOBAL the CUmodule/CUlibrary */
    void *context;
} cuhook_mem_event_t;

typedef struct cuhook_mem_info {
    void *address;        /* start of the allocation */
    size_t size;
    int mem_type;
    int device;
    unsigned int flags;
    const char *api;
    void *stream;
    void *pool;
    void *context;
    uint64_t seq;         /* increases with every insert: a reused address gets a new seq */
} cuhook_mem_info_t;

typedef void (*cuhook_event_callback_t)(int event, const cuhook_mem_event_t *ev, void *arg);

/* Subscribe; lower priority runs first, equal priorities in subscription order. Installs the
 * hooks unless CUHOOK_EVENT_FLAG_NO_INSTALL is given. The callback runs inside the host's CUDA
 * call: it must return normally (a C++ exception or longjmp out of it is undefined behaviour). */
int cuhook_set_event_handler(int events, int priority, cuhook_event_callback_t cb, void *arg);
/* Unsubscribe; when it returns, `cb` runs on no thread and will never be called again. */
int cuhook_unset_event_handler(int events, cuhook_event_callback_t cb, void *arg);
/* Registry only: the allocation containing [address, address+length). CUHOOK_ERR_NOT_FOUND
 * when none does. */
int cuhook_lookup(const void *address, size_t length, cuhook_mem_info_t *info);
/* Call stacks (CUHOOK_STACKS=N, `cuhook run --stacks N`): the id of the stack that allocated the
 * range containing `address` (0: none recorded, 1: the stack table was full), or
 * CUHOOK_ERR_NOT_FOUND; then up to `capacity` of that stack's return addresses (innermost
 * first) into `frames`, returning how many it has (0: no such stack). */
int cuhook_stack_of(const void *address, uint32_t *stack);
size_t cuhook_stack_frames(uint32_t id, void **frames, size_t capacity);
/* What kind of memory `address` points to: the registry's record if it has one (as
 * cuhook_lookup), else the CUDA driver's answer (Open MPI's algorithm: pointer attributes, then
 * VMM and memory-pool probes for memory without a context), else CUHOOK_MEM_TYPE_HOST. Works with or
 * without the hooks installed. A driver answer fills mem_type, device, flags
 * (CUHOOK_FLAG_VMM, CUHOOK_FLAG_POOL | CUHOOK_FLAG_STREAM_ORDERED, CUHOOK_FLAG_PINNED_HOST),
 * pool and context (NULL for pool and VMM memory), with address = the address asked about,
 * size 0, api "" and seq 0. When the calling thread has no current context and meets pool or
 * VMM memory, the device's primary context is retained (once per thread, never released) and
 * made current. Returns 0, or CUHOOK_ERR_INVALID_ARGUMENT for a NULL `info`. */
int cuhook_classify(const void *address, cuhook_mem_info_t *info);

/* ---- for language bindings (the Python package) ---------------------------------------- */

/* A counted installation of the CUDA hooks: they stay until every installation (this one,
 * the constructor's, cuhook_install's, a Rust guard's) is gone. Also starts the exit report's
 * counters (per API; live and peak bytes), which cuhook_report and cuhook_usage read. */
int cuhook_installation_open(uint64_t *id);
/* Undo one cuhook_installation_open (CUHOOK_ERR_NOT_INSTALLED when none is left). */
int cuhook_installation_close(uint64_t id);
/* 1 when the CUDA hooks of the copy of cuhook that serves the process are installed (by
 * anyone), else 0. */
int cuhook_installed(void);

/* The next three read this copy's own engine: when another copy serves the process (see "one
 * engine per process" in docs/api.md) they return CUHOOK_ERR_NOT_INSTALLED; ask that copy. */

/* Copy up to `capacity` live allocations, in address order, into `out` (NULL when capacity is
 * 0); returns how many there are. */
ptrdiff_t cuhook_live(cuhook_mem_info_t *out, size_t capacity);

typedef struct cuhook_usage {
    int mem_type;         /* CUHOOK_MEM_TYPE_* */
    int device;           /* -1: host or unknown */
    uint64_t live;        /* bytes live now */
    uint64_t peak;        /* the most bytes live at once */
} cuhook_usage_t;
/* Live and peak bytes per memory type and device, counted from the first counted installation
 * (or the constructor's report); copies up to `capacity` rows, returns how many there are. */
ptrdiff_t cuhook_usage(cuhook_usage_t *out, size_t capacity);
/* The exit report as it would be written now, NUL-terminated in `buf` (truncated to `len`
 * bytes); returns the full length without the NUL. */
ptrdiff_t cuhook_report(char *buf, size_t len);

typedef struct cuhook_stats {
    size_t live;              /* ranges registered now */
    size_t live_bytes;
    uint64_t missed_frees;    /* inserts over a live range */
    uint64_t unknown_frees;   /* frees of pointers the registry never held */
    uint64_t failed_frees;    /* frees announced, then refused by the driver */
    uint64_t untracked;       /* allocations not registered: no memory to record them */
} cuhook_stats_t;
/* The registry's counters (of the copy that serves the process). */
int cuhook_stats(cuhook_stats_t *out);

/* A trace scoped to a block: the JSON lines of CUHOOK_TRACE for every event until closed.
 * `%p` in the path is the process id, `%r` the MPI rank; the file is appended to, never
 * opened through a symbolic link. Does not install the hooks. */
typedef struct cuhook_trace cuhook_trace_t;
int cuhook_trace_open(const char *path, cuhook_trace_t **out);
/* When it returns, no line is written any more; the file is closed. */
int cuhook_trace_close(cuhook_trace_t *trace);

/* An event queue: the subscriber that runs inside the hook copies each event into a bounded
 * lock-free ring (no allocation, no lock, never waiting; a full ring drops the event and
 * counts it), and a thread of the caller's pops the events outside any hook. */
typedef struct cuhook_queue cuhook_queue_t;
typedef struct cuhook_queued_event {
    cuhook_mem_event_t ev;
    int event;            /* CUHOOK_EVENT_MEM_TYPE_ALLOC or CUHOOK_EVENT_MEM_TYPE_FREE */
    int tid;              /* the allocating (freeing) thread */
    uint64_t time_ns;     /* wall clock, ns since the Unix epoch */
} cuhook_queued_event_t;
typedef struct cuhook_queue_stats {
    uint64_t queued;      /* events put in */
    uint64_t dropped;     /* events dropped: the queue was full */
    uint64_t popped;      /* events taken out */
} cuhook_queue_stats_t;
/* `events`: CUHOOK_EVENT_MEM_TYPE_ALLOC and/or _FREE; `capacity`: 1 to 2^24 events (rounded
 * up to a power of two). Does not install the hooks. */
int cuhook_queue_open(int events, size_t capacity, cuhook_queue_t **out);
/* Take up to `capacity` events, oldest first; returns how many. Waits at most `timeout_ms` for
 * the first (0: no wait; negative: until an event or cuhook_queue_interrupt). One consumer at a
 * time: CUHOOK_ERR_BUSY while another thread pops. */
ptrdiff_t cuhook_queue_pop(cuhook_queue_t *queue, cuhook_queued_event_t *out, size_t capacity,
                           int timeout_ms);
/* Make a waiting (or the next) pop return at once. Any thread, also a signal handler. */
int cuhook_queue_interrupt(cuhook_queue_t *queue);
int cuhook_queue_stats(cuhook_queue_t *queue, cuhook_queue_stats_t *out);
/* Unsubscribe, wake a waiting pop and wait for it to return, free the queue (events still in
 * it are lost). No pop may start after this call. */
int cuhook_queue_close(cuhook_queue_t *queue);

/* ---- generic GOT/PLT hooks -------------------------------------------------------------- */

/* One symbol to hook. `original` receives the real function before any slot points at
 * `replacement`; it must stay valid while the hook is installed (use a static variable) and
 * the replacement calls through it. `version` NULL hooks every import of the symbol; a version
 * ("V2", "GLIBC_2.2.5") hooks only imports of exactly that version. */
typedef struct cuhook_hook {
    const char *symbol;
    const char *version;
    void *replacement;
    void **original;
} cuhook_hook_t;

/* Relocation kinds in cuhook_slot_info_t.kind. */
#define CUHOOK_RELOC_JUMP_SLOT 1
#define CUHOOK_RELOC_GLOB_DAT  2
#define CUHOOK_RELOC_ABS64     3

typedef struct cuhook_slot_info {
    char set[64];          /* hook set name ("cuhook-dl": the loader interposers) */
    char object[256];      /* path of the patched object ("<main program>" for the executable) */
    char symbol[128];
    uintptr_t address;     /* address of the GOT slot */
    int kind;              /* CUHOOK_RELOC_* */
    uintptr_t old_value;   /* slot value before the patch */
    uintptr_t new_value;   /* slot value written (the replacement) */
    char protection[4];    /* page protection, "r--" / "rw-" as in /proc/self/maps */
} cuhook_slot_info_t;

typedef struct cuhook_uninstall_report {
    size_t restored;       /* slots put back bit for bit */
    size_t foreign;        /* slots someone else re-patched after us: left alone */
    size_t gone;           /* slots of objects unloaded meanwhile */
} cuhook_uninstall_report_t;

/* The most hooks one set may hold; a larger count returns CUHOOK_ERR_INVALID_ARGUMENT. */
#define CUHOOK_MAX_HOOKS 65536

/* Patch every loaded object (and, with the dl interposers, every object loaded later).
 * Installing the same set (same name, symbols, replacements, originals) again only adds a
 * reference and returns the same id. */
int cuhook_hooks_install(const char *set_name, const cuhook_hook_t *hooks, size_t count,
                         uint64_t *id_out);
/* Drop one reference; the last one puts every slot back (report may be NULL). */
int cuhook_hooks_uninstall(uint64_t id, cuhook_uninstall_report_t *report);
/* Patch objects loaded since the last scan; returns the number of slots patched (>= 0), or
 * CUHOOK_ERR_BUSY when another thread's patching did not end within 10 s (a constructor or
 * destructor calling this while that thread waits for the loader's lock). */
int cuhook_hooks_rescan(void);
/* Comma-separated substrings of object paths never to patch; NULL or "" clears the list.
 * Configuration: each replaced list stays allocated (readers never lock), so not in a loop. */
int cuhook_set_exclude(const char *list);
/* Copy up to `capacity` patched slots into `out`; returns how many exist. */
ptrdiff_t cuhook_patched_slots(cuhook_slot_info_t *out, size_t capacity);
/* What the engine noticed, as text, one finding per line, `kind detail`: "skipped <reason>
 * <path>", "unpinnable <path>", "other_namespace <path>", "unreadable <why>", "conflict <object>
 * <symbol> slot= bound_to= original=", "foreign <object> <symbol> slot= found= ours=",
 * "text_relocations <path> references=N", "constructors_before_patch <path>", and last one
 * "counters resolver_races= rechecked_slots= objects_indexed= rescans= quick_scans=
 * group_scans= dependencies_in_scope= direct_patches= chained_slots= deferred_scans=
 * deferred_for_memory= pinned_by_name= constructors_before_patch=" (the last: how many
 * libraries' constructors ran before they were patched; at most 256 are listed by name).
 * Writes at most `len` bytes including the NUL; returns the full length. */
ptrdiff_t cuhook_diagnostics(char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* CUHOOK_H */
