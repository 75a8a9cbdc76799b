// Under qemu-user 7.2 a child forked while other threads of the parent keep starting threads,
// which then starts threads itself, can hang for good; its alarm never ends it. Two threads here
// map, unmap and start threads; the main thread forks N children (first argument, default 200),
// each starting 16 threads under alarm(5), and kills a child still running after 15 s.
//
//   aarch64-linux-gnu-gcc -O2 -pthread fork_threads.c -o fork_threads
//   qemu-aarch64-static -L /usr/aarch64-linux-gnu ./fork_threads 10   # most children hang
//   gcc -O2 -pthread fork_threads.c -o fork_threads && ./fork_threads   # none
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;
static pthread_barrier_t all_started;

static void *nothing(void *unused) {
    return unused;
}

static void *busy(void *unused) {
    while (!stop) {
        free(malloc(4096 + rand() % 100000));
        void *m = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        munmap(m, 1 << 20);
        pthread_t t;
        pthread_create(&t, 0, nothing, 0);
        pthread_join(t, 0);
    }
    return unused;
}

static void *child_thread(void *unused) {
    free(malloc(100));
    pthread_barrier_wait(&all_started);
    return unused;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 200;
    pthread_t b[2];
    for (int i = 0; i < 2; i++) pthread_create(&b[i], 0, busy, 0);
    int alarmed = 0, hung = 0;
    for (int k = 0; k < forks; k++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(5);
            pthread_barrier_init(&all_started, 0, 16);
            pthread_t t[16];
            for (int i = 0; i < 16; i++) pthread_create(&t[i], 0, child_thread, 0);
            for (int i = 0; i < 16; i++) pthread_join(t[i], 0);
            _exit(0);
        }
        int status;
        time_t start = time(0);
        for (;;) {
            if (waitpid(pid, &status, WNOHANG) == pid) {
                alarmed += WIFSIGNALED(status);
                break;
            }
            if (time(0) - start > 15) {
                hung++;
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                break;
            }
            usleep(1000);
        }
    }
    stop = 1;
    printf("forks %d: ended by their alarm %d, hung past it (killed) %d\n", forks, alarmed, hung);
    return 0;
}
