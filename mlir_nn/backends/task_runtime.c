/* The thread runtime of compiled steps: the functions of libomp's ABI (__kmpc_*) that
 * MLIR's OpenMP lowering of a parallel loop calls, on a pool where the calling thread works too.
 *
 * A step's parallel loop becomes a fork (__kmpc_fork_call) of a team that runs one outlined
 * function (the microtask) on every thread of the team; each thread asks for its share of the
 * loop's iterations (__kmpc_for_static_init_8u: one contiguous range per thread, the same
 * ranges in every loop of the same trip count, so a pass over a product's rows finds them in
 * the cache of the core that wrote them; or, in the loops of split steps, __kmpc_dispatch_*:
 * the same ranges first, then what the other threads have not started, see "Dynamic
 * schedules") and the team joins at the region's end. The caller of the step is thread 0 of the team; the pool has one thread
 * less than the computing threads asked for. Idle pool threads spin for a short while before
 * they sleep, so that the next parallel loop of a step starts without a wake-up through the
 * kernel (after YIELD_AFTER_NS of it, yielding their core between looks).
 *
 * The functions are exported as __wrap___kmpc_* (the steps' shared objects are linked with the
 * linker's --wrap for each, and the JIT is given their addresses): a libomp in the same process
 * (a library's OpenMP) never binds to this partial runtime, nor the steps to it.
 *
 * One team runs at a time: a fork while another team runs (a step called from a second Python
 * thread, or a parallel loop inside a team's microtask) runs its microtask serially on the
 * thread that forks, as a team of one. A pool thread that cannot be started leaves its share
 * to the others: the team is the threads that run. After a fork the child has none of the
 * parent's pool threads: its pool is reset and starts again on the next fork.
 */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define API __attribute__((visibility("default")))
#define KMPC(name) __wrap___kmpc_##name /* see the top: linked with --wrap */
#define SPIN_NS 200000 /* how long an idle thread looks for work before it sleeps */
/* After this long without work a spinning thread yields its core between looks: on a machine
 * with more runnable threads than cores, the thread it waits for (the one running the last part
 * of a parallel loop) may be queued behind it. A 100-wide MLP step (Adam, batch 5000) on two
 * threads of two busy cores (load 3-4) took 22-26 ms without the yields, 17-18 ms with them. */
#define YIELD_AFTER_NS 20000
#define MAX_ARGS 8       /* captured arguments of a microtask (OpenMPIRBuilder passes one struct) */
#define MAX_TEAM 64      /* threads of a team at most (the dynamic schedules' ranges) */
#define KMP_SCH_STATIC 34 /* the schedule of a worksharing loop without a schedule clause */

typedef void (*Microtask)(int32_t *gtid, int32_t *btid, ...);
typedef struct Ident Ident; /* the source location libomp takes; unused */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t work;      /* pool threads sleep here: a team was forked */
    pthread_cond_t done;      /* the forking thread sleeps here: the team finished */
    atomic_int threads;       /* computing threads: the pool's plus the caller */
    atomic_int started;       /* pool threads started in this process */
    atomic_bool busy;         /* a team runs */
    atomic_uint generation;   /* forks so far: pool threads wait for it to change */
    atomic_int sleeping;      /* pool threads asleep on `work` */
    /* the team's seats: its generation (high 32 bits), its size (bits 24-31), whether it is
     * closed to threads that have not joined yet (SEAT_CLOSED) and the pool threads that joined */
    _Atomic uint64_t seats;
    atomic_int finished;      /* pool threads that joined the team and finished its microtask */
    atomic_int expected;      /* pool threads the forking thread waits for (set once it is done) */
    atomic_bool waiting;      /* the forking thread sleeps on `done` */
    atomic_int arrived;       /* threads at the current barrier */
    atomic_uint barriers;     /* barriers passed */
    /* the team: its microtask and arguments, its size */
    Microtask fn;
    int argc;
    void *args[MAX_ARGS];
    int size;
    bool published;           /* the pool's threads were asked to join (see publish) */
    bool closable;            /* its loop is dynamic: it may end without the threads that never joined */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 1};

static _Thread_local int32_t thread_id;       /* in the team this thread runs in */
static _Thread_local int32_t team_size = 1;   /* of that team (1: none, or a serial one) */
static _Thread_local bool forks_alone;       /* this thread's forks run serially (a step timed alone) */
/* This thread forked a team that its pool threads have not joined yet: they join when the
 * team's loop has more than one iteration (the first call of __kmpc_for_static_init_8u). */
static _Thread_local bool unpublished;
static atomic_llong teams_forked; /* teams of more than one thread (for Python) */

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Spin on `changed(arg)` for SPIN_NS at most (yielding the core after YIELD_AFTER_NS); true
 * if it became true. */
static bool spin_until(bool (*changed)(unsigned), unsigned arg) {
    long long start = now_ns();
    for (;;) {
        if (changed(arg)) return true;
        for (int i = 0; i < 64; i++) CPU_RELAX();
        long long waited = now_ns() - start;
        if (waited > SPIN_NS) return false;
        if (waited > YIELD_AFTER_NS) sched_yield();
    }
}

static void invoke(Microtask fn, int argc, void **a, int32_t id) {
    int32_t gtid = id, btid = id;
    switch (argc) {
    case 0: fn(&gtid, &btid); break;
    case 1: fn(&gtid, &btid, a[0]); break;
    case 2: fn(&gtid, &btid, a[0], a[1]); break;
    case 3: fn(&gtid, &btid, a[0], a[1], a[2]); break;
    case 4: fn(&gtid, &btid, a[0], a[1], a[2], a[3]); break;
    case 5: fn(&gtid, &btid, a[0], a[1], a[2], a[3], a[4]); break;
    case 6: fn(&gtid, &btid, a[0], a[1], a[2], a[3], a[4], a[5]); break;
    case 7: fn(&gtid, &btid, a[0], a[1], a[2], a[3], a[4], a[5], a[6]); break;
    default: fn(&gtid, &btid, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]); break;
    }
}

/* Run `fn` as thread `id` of a team of `size`. */
static void run_as(int32_t id, int32_t size, Microtask fn, int argc, void **args) {
    int32_t outer_id = thread_id, outer_size = team_size;
    thread_id = id;
    team_size = size;
    invoke(fn, argc, args, id);
    thread_id = outer_id;
    team_size = outer_size;
}

static bool generation_changed(unsigned seen) { return atomic_load(&pool.generation) != seen; }
static bool team_finished(unsigned unused) {
    (void)unused;
    return atomic_load(&pool.finished) == atomic_load(&pool.expected);
}

#define SEAT_CLOSED (1ull << 23)
#define SEATS(generation, size) ((uint64_t)(generation) << 32 | (uint64_t)(size) << 24)

/* Take a seat in team `generation` as thread `id`: false when the team is another, closed, or
 * has no seat `id`. */
static bool join(unsigned generation, int32_t id) {
    uint64_t old = atomic_load(&pool.seats);
    while ((old >> 32) == generation && !(old & SEAT_CLOSED) && (uint64_t)id < ((old >> 24) & 0xff))
        if (atomic_compare_exchange_weak(&pool.seats, &old, old + 1)) return true;
    return false;
}

/* A pool thread's number in the teams and the fork it was started in: it runs that one. */
typedef struct {
    int32_t id;
    unsigned seen;
} Start;

static void *pool_thread(void *arg) {
    Start start = *(Start *)arg;
    free(arg);
    int32_t id = start.id;
    unsigned seen = start.seen;
    for (;;) {
        if (!spin_until(generation_changed, seen)) {
            pthread_mutex_lock(&pool.mu);
            atomic_fetch_add(&pool.sleeping, 1); /* before the last look: see __kmpc_fork_call */
            while (!generation_changed(seen)) pthread_cond_wait(&pool.work, &pool.mu);
            atomic_fetch_sub(&pool.sleeping, 1);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = atomic_load(&pool.generation);
        if (!join(seen, id)) continue; /* not of this team, or it ended without this thread */
        run_as(id, pool.size, pool.fn, pool.argc, pool.args);
        atomic_fetch_add(&pool.finished, 1);
        if (atomic_load(&pool.waiting)) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
    return NULL;
}

/* Start the pool's threads (under pool.mu); a thread that cannot be started is left out. */
static void start_locked(void) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (atomic_load(&pool.started) < atomic_load(&pool.threads) - 1) {
        pthread_t thread;
        Start *start = malloc(sizeof(Start));
        if (!start) break;
        *start = (Start){atomic_load(&pool.started) + 1, atomic_load(&pool.generation)};
        if (pthread_create(&thread, &attr, pool_thread, start) != 0) {
            free(start);
            break;
        }
        atomic_fetch_add(&pool.started, 1);
    }
    pthread_attr_destroy(&attr);
}

static void reset_in_child(void) {
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.work, NULL);
    pthread_cond_init(&pool.done, NULL);
    atomic_store(&pool.started, 0); /* pool.threads stays: the count asked for */
    atomic_store(&pool.busy, false);
    atomic_store(&pool.sleeping, 0);
    atomic_store(&pool.seats, 0);
    atomic_store(&pool.finished, 0);
    atomic_store(&pool.expected, 0);
    atomic_store(&pool.waiting, false);
    atomic_store(&pool.arrived, 0);
    thread_id = 0;
    team_size = 1;
}

/* ---- libomp's ABI, the part that MLIR's OpenMP lowering of a parallel loop calls ---- */

API void KMPC(fork_call)(Ident *loc, int32_t argc, Microtask fn, ...) {
    (void)loc;
    if (argc > MAX_ARGS) {
        fprintf(stderr, "mlir-nn task runtime: a parallel region with %d arguments (at most %d)\n", argc, MAX_ARGS);
        abort();
    }
    void *args[MAX_ARGS];
    va_list list;
    va_start(list, fn);
    for (int i = 0; i < argc; i++) args[i] = va_arg(list, void *);
    va_end(list);
    bool idle = false;
    if (team_size > 1 || atomic_load(&pool.threads) <= 1 || forks_alone ||
        !atomic_compare_exchange_strong(&pool.busy, &idle, true)) {
        run_as(0, 1, fn, argc, args); /* nested, one thread, a call run alone, or another team runs */
        return;
    }
    if (atomic_load(&pool.started) < atomic_load(&pool.threads) - 1) {
        pthread_mutex_lock(&pool.mu);
        start_locked();
        pthread_mutex_unlock(&pool.mu);
    }
    int size = atomic_load(&pool.started) + 1;
    if (size > atomic_load(&pool.threads)) size = atomic_load(&pool.threads);
    if (size > MAX_TEAM) size = MAX_TEAM;
    if (size == 1) {
        run_as(0, 1, fn, argc, args);
        atomic_store(&pool.busy, false);
        return;
    }
    pool.fn = fn;
    pool.argc = argc;
    for (int i = 0; i < argc; i++) pool.args[i] = args[i];
    pool.size = size;
    pool.published = false;
    unpublished = true;
    run_as(0, size, fn, argc, args);
    unpublished = false;
    if (pool.published) {
        /* a dynamic loop's iterations are all taken: the threads that have not joined need not */
        uint64_t seats = pool.closable ? atomic_fetch_or(&pool.seats, SEAT_CLOSED) : (uint64_t)(size - 1);
        atomic_store(&pool.expected, (int)(seats & 0xff));
    }
    if (pool.published && !spin_until(team_finished, 0)) {
        pthread_mutex_lock(&pool.mu);
        atomic_store(&pool.waiting, true); /* before the last look: see pool_thread */
        while (!team_finished(0)) pthread_cond_wait(&pool.done, &pool.mu);
        atomic_store(&pool.waiting, false);
        pthread_mutex_unlock(&pool.mu);
    }
    atomic_store(&pool.busy, false);
}

/* The pool threads join the team that the calling thread formed (they run its microtask). */
static void publish(bool closable) {
    atomic_fetch_add(&teams_forked, 1);
    pool.published = true;
    pool.closable = closable;
    atomic_store(&pool.finished, 0);
    atomic_store(&pool.expected, -1); /* (until the forking thread is done) */
    atomic_store(&pool.seats, SEATS(atomic_load(&pool.generation) + 1, pool.size));
    atomic_fetch_add(&pool.generation, 1); /* publishes the team (sequentially consistent) */
    if (atomic_load(&pool.sleeping) > 0) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.work);
        pthread_mutex_unlock(&pool.mu);
    }
}

/* True for the forking thread of a team at its loop of `trips` iterations, which the pool's
 * threads then join (publish); a loop of one iteration runs on the forking thread alone. */
static bool team_loop_starts(uint64_t trips) {
    if (!unpublished) return false;
    unpublished = false;
    if (trips < 2) team_size = 1;
    return trips >= 2;
}

API int32_t KMPC(global_thread_num)(Ident *loc) {
    (void)loc;
    return thread_id;
}

static bool barrier_passed(unsigned seen) { return atomic_load(&pool.barriers) != seen; }

API void KMPC(barrier)(Ident *loc, int32_t gtid) {
    (void)loc, (void)gtid;
    if (team_size <= 1) return;
    unsigned seen = atomic_load(&pool.barriers);
    if (atomic_fetch_add(&pool.arrived, 1) == team_size - 1) {
        atomic_store(&pool.arrived, 0);
        atomic_fetch_add(&pool.barriers, 1);
        return;
    }
    while (!spin_until(barrier_passed, seen)) sched_yield();
}

/* This thread's share of iterations *plower..*pupper (inclusive, step 1): the team's threads
 * take contiguous ranges in order, the first trips % size of them one iteration more. A thread
 * with none gets *pupper = *plower - 1. */
API void KMPC(for_static_init_8u)(Ident *loc, int32_t gtid, int32_t schedule, int32_t *plast, uint64_t *plower,
                                   uint64_t *pupper, int64_t *pstride, int64_t incr, int64_t chunk) {
    (void)loc, (void)gtid, (void)chunk;
    if (schedule != KMP_SCH_STATIC || incr != 1) {
        fprintf(stderr, "mlir-nn task runtime: a loop of schedule %d, increment %lld (only %d, 1)\n", schedule,
                (long long)incr, KMP_SCH_STATIC);
        abort();
    }
    uint64_t trips = *pupper - *plower + 1; /* 0 when the loop has none (upper = lower - 1) */
    if (team_loop_starts(trips)) publish(false);
    uint64_t size = (uint64_t)team_size, id = (uint64_t)thread_id;
    uint64_t base = trips / size, extra = trips % size;
    uint64_t first = id * base + (id < extra ? id : extra);
    uint64_t count = base + (id < extra ? 1 : 0);
    *plower += first;
    *pupper = *plower + count - 1;
    *plast = count > 0 && first + count == trips;
    *pstride = (int64_t)trips;
}

API void KMPC(for_static_fini)(Ident *loc, int32_t gtid) { (void)loc, (void)gtid; }

/* Dynamic schedules: each thread of the team starts with the contiguous range that a static
 * schedule would give it, the same in every loop of the same trip count, and takes its
 * iterations one at a time from the range's front; a thread whose range is empty takes them
 * from the back of the range with the most left. So a thread keeps the rows it ran in the loops
 * before (a pass over a product's rows finds them in the cache of the core that wrote them),
 * and when a core is busy with another process, the other threads run what its thread has not
 * started (a static schedule waited for it: a 100-wide MLP step at batch 5000 on two threads
 * beside a busy loop on one core took 6.1-6.6 ms, against 4.4-4.7 ms with MLIR's async runtime's
 * queue). A range is (front, back) in one 64-bit word, offsets from the loop's first iteration,
 * changed by compare-and-swap only. The forking thread sets every range before the pool's
 * threads join the team (publish), once per team: a region holds one worksharing loop. A team
 * of one (a serial fork, or a loop of one iteration) keeps its range in its thread instead. */
static struct {
    _Alignas(64) atomic_uint_fast64_t range; /* front in the high 32 bits, back in the low */
} ranges[MAX_TEAM];
static uint64_t team_lower, team_trips;                  /* the team's loop */
static _Thread_local uint64_t alone_lower, alone_front, alone_back; /* a team of one's loop */

static uint64_t packed(uint64_t front, uint64_t back) { return front << 32 | back; }

/* Take one iteration of thread `victim`'s range, from its front if `own`, else from its back;
 * UINT64_MAX when the range is empty. */
static uint64_t take(int victim, bool own) {
    uint64_t old = atomic_load(&ranges[victim].range);
    for (;;) {
        uint64_t front = old >> 32, back = old & 0xffffffffu;
        if (front >= back) return UINT64_MAX;
        uint64_t next = own ? packed(front + 1, back) : packed(front, back - 1);
        if (atomic_compare_exchange_weak(&ranges[victim].range, &old, next)) return own ? front : back - 1;
    }
}

/* An iteration for this thread of the team's loop: its own, else one taken from the back of
 * the range with the most left; UINT64_MAX when none is left. */
static uint64_t next_in_team(void) {
    uint64_t at = take(thread_id, true);
    while (at == UINT64_MAX) {
        int victim = -1;
        uint64_t most = 0;
        for (int id = 0; id < team_size; id++) {
            uint64_t range = atomic_load(&ranges[id].range), front = range >> 32, back = range & 0xffffffffu;
            if (back > front && back - front > most) most = back - front, victim = id;
        }
        if (victim < 0) return UINT64_MAX;
        at = take(victim, false);
    }
    return at;
}

API void KMPC(dispatch_init_8u)(Ident *loc, int32_t gtid, int32_t schedule, uint64_t lower, uint64_t upper,
                                int64_t incr, int64_t chunk) {
    (void)loc, (void)gtid, (void)schedule, (void)chunk;
    uint64_t trips = upper >= lower ? upper - lower + 1 : 0;
    if (incr != 1 || trips > 0xffffffffu) {
        fprintf(stderr, "mlir-nn task runtime: a dynamic loop of increment %lld, %llu iterations (only 1, < 2^32)\n",
                (long long)incr, (unsigned long long)trips);
        abort();
    }
    if (team_loop_starts(trips)) {
        uint64_t size = (uint64_t)team_size, base = trips / size, extra = trips % size;
        for (uint64_t id = 0, first = 0; id < size; first += base + (id < extra), id++)
            atomic_store(&ranges[id].range, packed(first, first + base + (id < extra)));
        team_lower = lower;
        team_trips = trips;
        publish(true); /* after the ranges: the pool's threads read them once they join */
    }
    if (team_size == 1) {
        alone_lower = lower;
        alone_front = 0;
        alone_back = trips;
    }
}

/* The next iteration for this thread, as the range *plower..*pupper (inclusive); 0 when none is left. */
API int32_t KMPC(dispatch_next_8u)(Ident *loc, int32_t gtid, int32_t *plast, uint64_t *plower, uint64_t *pupper,
                                   int64_t *pstride) {
    (void)loc, (void)gtid;
    bool team = team_size > 1;
    uint64_t at = team ? next_in_team() : alone_front < alone_back ? alone_front++ : UINT64_MAX;
    uint64_t lower = team ? team_lower : alone_lower, trips = team ? team_trips : alone_back;
    if (at == UINT64_MAX) return 0;
    *plower = *pupper = lower + at;
    *plast = at == trips - 1;
    *pstride = 1;
    return 1;
}

/* ---- Team width by measurement ----
 *
 * A step that forks teams runs either on every computing thread or on its caller alone, and
 * which is faster depends on the step and on where the host put the cores at the time: on a
 * 2-core virtual machine whose cores the host moves between sharing an L3 and not (every few
 * hundred ms), a 10-4096-1 MLP step at batch 100 took 0.50 ms on two threads and 0.72 on one
 * while the cores shared an L3, and 1.1 ms on two while they did not (each pass hands its rows
 * to the other core). mlirnn_runtime_run_step times the calls of a step and keeps the last RING
 * times of each width; after a burst of BURST calls on each width, a step runs on the width whose
 * median is less, and now and then (probe_interval) a burst of BURST calls runs on the other width to
 * refresh its times, so that the choice follows the host. A call on a width other than the
 * call before it is not timed: it starts with the pool's threads asleep or the step's rows in
 * the other core's cache (a single call on two threads after calls on one took 0.9 ms where
 * calls in a row took 0.5). Probes are spaced so that they cost about PROBE_COST of the step's
 * time: the slower the other width, the rarer. A step running alone probes all threads at least
 * once per PROBE_PERIOD_NS of its calls, so that a burst timed while the host took a core away for a
 * moment (all threads 4x slower) does not keep a long step on one thread for minutes (the
 * 784-1024-1024-10 step at batch 512 ran alone at 71-74 ms for a grid point's whole rounds, where
 * two threads take 37-39). A step on all threads probes alone at least once per PROBE_PERIOD_ALL_NS:
 * there the cost share is the rule (with a burst alone each second, that step averaged 28.3-29.1 ms
 * a call on a Zen 4 host where its median was 26.1-26.5; with bursts by the cost share, 26.0-27.5). */
#define RING 3               /* step times kept per width */
#define BURST 3              /* calls in a row on a width being measured (the first is not timed) */
#define PROBE_COST 0.01      /* the share of step time that probes of the other width may cost */
#define PROBE_EVERY_MIN 8    /* calls between probes, at least */
#define PROBE_EVERY_MAX 3000 /* and at most */
#define PROBE_PERIOD_NS 1e9      /* step time alone between probes of all threads, at most */
#define PROBE_PERIOD_ALL_NS 1e10 /* step time on all threads between probes alone, at most */
enum { ALONE, ALL, WIDTHS };

/* Zeroed before a step's first call at a batch size; it lives in the header of that batch
 * size's workspace (workspace.py: CHOICE_OFFSET, CHOICE_BYTES), so it fits in 48 bytes. */
typedef struct {
    uint32_t times[WIDTHS][RING]; /* the last step times (ns, at most UINT32_MAX) on each width */
    uint32_t timed[WIDTHS];       /* calls timed on each width (up to UINT32_MAX) */
    uint32_t since_probe;         /* calls since the other width was last probed */
    uint8_t next[WIDTHS];         /* where each width's next time goes in times */
    uint8_t using;                /* the width chosen (once both are measured) */
    uint8_t previous;             /* the width of the call before (ALONE before the first, on ALL) */
    uint8_t burst;                /* calls left in a burst on `previous` */
} TeamChoice;
_Static_assert(sizeof(TeamChoice) <= 48, "the team choice fits in the workspace header");

/* The median of the times kept for `width` (the mean of two when only two are). */
static uint32_t typical(const TeamChoice *c, int width) {
    const uint32_t *t = c->times[width];
    if (c->timed[width] == 1) return t[0];
    if (c->timed[width] == 2) return (uint32_t)(((uint64_t)t[0] + t[1]) / 2);
    uint32_t lo = t[0] < t[1] ? t[0] : t[1], hi = t[0] < t[1] ? t[1] : t[0];
    return t[2] < lo ? lo : t[2] > hi ? hi : t[2];
}

/* Calls between probes of the width not used: a burst's extra time spread over them costs
 * PROBE_COST of the step's, or those that take the width in use's probe period when fewer. */
static uint32_t probe_interval(const TeamChoice *c) {
    double used = typical(c, c->using), other = typical(c, !c->using);
    double every = used > 0 ? BURST * (other - used) / used / PROBE_COST : PROBE_EVERY_MIN;
    double period = c->using == ALONE ? PROBE_PERIOD_NS : PROBE_PERIOD_ALL_NS;
    if (used > 0 && every > period / used) every = period / used;
    return every < PROBE_EVERY_MIN ? PROBE_EVERY_MIN : every > PROBE_EVERY_MAX ? PROBE_EVERY_MAX : (uint32_t)every;
}

/* Both widths timed: after a burst on each. */
static bool measured(const TeamChoice *c) { return c->timed[ALONE] >= BURST - 1 && c->timed[ALL] >= BURST - 1; }

/* The width of the next call. */
static int next_width(TeamChoice *c) {
    if (c->burst > 0) {
        c->burst--;
        return c->previous;
    }
    int width = c->using;
    if (!measured(c)) {
        width = c->timed[ALL] <= c->timed[ALONE] ? ALL : ALONE; /* bursts on each in turn */
    } else if (++c->since_probe >= probe_interval(c)) {
        width = !c->using;
        c->since_probe = 0;
    }
    if (width != c->using || !measured(c)) c->burst = BURST - 1;
    return width;
}

/* Run step(args) on the width that `choice` measures best, or in a burst measuring the other. */
API void mlirnn_runtime_run_step(void (*step)(void **), void **args, TeamChoice *c) {
    int width = next_width(c);
    bool outer = forks_alone;
    forks_alone = width == ALONE;
    long long start = now_ns();
    step(args);
    long long took = now_ns() - start;
    forks_alone = outer;
    if (width == c->previous) {
        c->times[width][c->next[width]] = took > UINT32_MAX ? UINT32_MAX : (uint32_t)took;
        c->next[width] = (uint8_t)((c->next[width] + 1) % RING);
        if (c->timed[width] < UINT32_MAX) c->timed[width]++;
        if (measured(c)) c->using = typical(c, ALL) <= typical(c, ALONE) ? ALL : ALONE;
    }
    c->previous = (uint8_t)width;
}

/* Whether this thread's forks run serially now (in a call that mlirnn_runtime_run_step runs alone). */
API int mlirnn_runtime_forks_alone(void) { return forks_alone; }

/* What `choice` knows: calls timed alone and on all threads, the median of each one's last
 * times (ns; 0 before the first), the width used (0: alone, 1: all; -1 until both are
 * measured) and the calls between probes. */
API void mlirnn_runtime_choice_report(const TeamChoice *c, long long out[6]) {
    out[0] = c->timed[ALONE];
    out[1] = c->timed[ALL];
    out[2] = c->timed[ALONE] ? typical(c, ALONE) : 0;
    out[3] = c->timed[ALL] ? typical(c, ALL) : 0;
    out[4] = measured(c) ? c->using : -1;
    out[5] = measured(c) ? probe_interval(c) : 0;
}

/* ---- For Python ---- */

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, reset_in_child); }

/* Set the number of computing threads (at least 1); pool threads start on the next fork.
 * Returns the number set. Threads already started stay. */
API int mlirnn_runtime_set_threads(int threads) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
    atomic_store(&pool.threads, threads > 0 ? threads : 1);
    return atomic_load(&pool.threads);
}

API int mlirnn_runtime_threads(void) { return atomic_load(&pool.threads); }

/* Pool threads running in this process. */
API int mlirnn_runtime_started_threads(void) { return atomic_load(&pool.started); }

/* Teams of more than one thread forked in this process. */
API long long mlirnn_runtime_teams_forked(void) { return atomic_load(&teams_forked); }
