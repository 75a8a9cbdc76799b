/* Crash aid for the GPU machine, which has no gdb: preloaded before libcuhook.so, it prints on
 * SIGSEGV the faulting address, the registers that matter, and object+offset of the faulting
 * instruction, of the words on top of the stack (a call through a bad pointer leaves its return
 * address there) and of a backtrace. Resolve our offsets with `addr2line -fie` on the unstripped
 * library of the same build. It also catches SIGBUS, SIGILL and SIGFPE, and keeps its handler
 * when the process later asks for its own (each refusal is printed as SEGV_SHIM_KEEP).
 * Build: cc -O1 -shared -fPIC -o segv_shim.so segv_shim.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>
static void show(const char *what, void *p) {
    Dl_info i;
    if (dladdr(p, &i) && i.dli_fname)
        fprintf(stderr, "  %s %p %s+0x%lx (%s+0x%lx)\n", what, p, i.dli_fname, (unsigned long)((char *)p - (char *)i.dli_fbase),
                i.dli_sname ? i.dli_sname : "?", i.dli_saddr ? (unsigned long)((char *)p - (char *)i.dli_saddr) : 0UL);
    else
        fprintf(stderr, "  %s %p ?\n", what, p);
}
static void handler(int sig, siginfo_t *si, void *ucv) {
    ucontext_t *uc = ucv;
    greg_t *g = uc->uc_mcontext.gregs;
    fprintf(stderr, "SEGV_SHIM sig %d addr %p code %d\n", sig, si->si_addr, si->si_code);
    fprintf(stderr, "  rax %llx rbx %llx rcx %llx rdx %llx rdi %llx rsi %llx rbp %llx rsp %llx r12 %llx r13 %llx r14 %llx r15 %llx\n",
            g[REG_RAX], g[REG_RBX], g[REG_RCX], g[REG_RDX], g[REG_RDI], g[REG_RSI], g[REG_RBP], g[REG_RSP], g[REG_R12], g[REG_R13],
            g[REG_R14], g[REG_R15]);
    show("rip", (void *)g[REG_RIP]);
    void **rsp = (void **)g[REG_RSP];
    for (int k = 0; k < 32; k++) show("stk", rsp[k]);
    void *bt[48];
    int n = backtrace(bt, 48);
    for (int k = 0; k < n; k++) show("bt", bt[k]);
    fflush(stderr);
    signal(sig, SIG_DFL);
}
static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
static int is_fatal(int sig) {
    for (unsigned k = 0; k < sizeof fatal / sizeof fatal[0]; k++)
        if (fatal[k] == sig) return 1;
    return 0;
}
typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
/* The process (the driver, a framework) may install its own handlers for these signals later
 * and hide the frame: keep ours, and tell the caller its handler was taken. */
int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    static sigaction_fn real;
    if (!real) real = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (act && is_fatal(sig) && act->sa_sigaction != handler) {
        fprintf(stderr, "SEGV_SHIM_KEEP: a handler for signal %d was not installed\n", sig);
        return real(sig, 0, old);
    }
    return real(sig, act, old);
}
__attribute__((constructor)) static void init(void) {
    void *bt[4];
    backtrace(bt, 4);
    stack_t ss = {.ss_sp = malloc(1 << 17), .ss_size = 1 << 17};
    sigaltstack(&ss, 0);
    struct sigaction sa = {0};
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    for (unsigned k = 0; k < sizeof fatal / sizeof fatal[0]; k++) sigaction(fatal[k], &sa, 0);
}
