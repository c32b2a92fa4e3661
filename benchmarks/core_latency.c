/* One cache line passed back and forth between two cores: the one-way time, in ns.
 *
 * On a virtual machine the host may place the two cores of a 2-core guest on one
 * core complex (one shared L3, about 30 ns here) or on two (about 170 ns, every line
 * the other core wrote crosses the fabric), and it moves them while a benchmark runs.
 * A threaded step's time follows that placement, so the benchmarks record it beside
 * their timings. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

static _Alignas(64) atomic_long line;

typedef struct {
    int cpu;
    long rounds;
} Partner;

static int pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *partner(void *arg) {
    Partner *p = arg;
    pin(p->cpu);
    for (long i = 0; i < p->rounds; i++) {
        while (atomic_load_explicit(&line, memory_order_acquire) != 2 * i + 1) {}
        atomic_store_explicit(&line, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

/* The one-way time between cpus `a` (the caller, pinned for the measurement and then
 * given back its affinity) and `b`; negative when a thread could not be started or pinned. */
double mlirnn_one_way_ns(int a, int b, long rounds) {
    cpu_set_t saved;
    if (pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) != 0) return -1.0;
    atomic_store(&line, 0);
    Partner p = {b, rounds};
    pthread_t thread;
    if (pthread_create(&thread, NULL, partner, &p) != 0) return -1.0;
    int pinned = pin(a) == 0; /* unpinned, the partner still needs its rounds to finish */
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < rounds; i++) {
        atomic_store_explicit(&line, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&line, memory_order_acquire) != 2 * i + 2) {}
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double ns = (end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec);
    double result = pinned ? ns / (2.0 * rounds) : -1.0;
    pthread_join(thread, NULL);
    pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    return result;
}
