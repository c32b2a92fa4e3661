/* The task runtime of compiled steps: MLIR's async runtime C API (the mlirAsyncRuntime*
 * functions that the async dialect lowers to), on a pool where the calling thread works too.
 *
 * MLIR's own runtime runs tasks on a pool of its own and puts the caller to sleep at every
 * await: with a pool as large as the machine, the caller's share of a parallel loop (its first
 * block) runs beside every pool thread, one thread more than there are cores. Here the pool
 * has one thread less than the computing threads asked for, and a thread that waits (the
 * caller at the end of a parallel loop, or a task waiting on another) runs queued tasks until
 * what it waits for is ready. Idle threads spin for a short while before they sleep, so
 * that the next parallel loop of a step starts without a wake-up through the kernel (after
 * YIELD_AFTER_NS of it, yielding their core between looks).
 *
 * Objects (tokens, values, groups) are reference counted as MLIR's runtime counts them: a
 * token or value starts with two references (the caller's and the task's, dropped when it is
 * emplaced), a group with one. What runs when an object becomes ready (coroutines waiting on
 * it, and the groups a token belongs to) runs on the thread that made it ready.
 *
 * After a fork the child has none of the parent's pool threads: its pool is reset and starts
 * again on first use.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define API __attribute__((visibility("default")))
#define SPIN_NS 200000 /* how long an idle thread looks for work before it sleeps */
/* After this long without work a spinning thread yields its core between looks: on a machine
 * with more runnable threads than cores, the thread it waits for (the one running the last task
 * of a parallel loop) may be queued behind it. A 100-wide MLP step (Adam, batch 5000) on two
 * threads of two busy cores (load 3-4) took 22-26 ms without the yields, 17-18 ms with them. */
#define YIELD_AFTER_NS 20000

typedef void *CoroHandle;
typedef void (*CoroResume)(void *);

enum { PENDING = 0, READY = 1, FAILED = 2 };

typedef struct Object Object;

/* What runs when an object becomes ready: a coroutine to resume, or a group to count into. */
typedef struct Waiter {
    struct Waiter *next;
    CoroHandle handle;
    CoroResume resume;
    Object *group;
} Waiter;

/* A token, a value or a group. */
struct Object {
    atomic_llong refs;
    pthread_mutex_t mu;   /* guards waiters and, for groups, pending */
    Waiter *waiters;
    atomic_int state;     /* tokens and values: PENDING, READY or FAILED */
    atomic_int pending;   /* groups: tokens still to come */
    atomic_int errors;    /* groups: tokens that failed */
    atomic_int rank;      /* groups: tokens added so far */
    _Alignas(max_align_t) unsigned char storage[]; /* values: the payload */
};

typedef struct Task {
    struct Task *next, *prev; /* the queue, oldest first */
    CoroHandle handle;
    CoroResume resume;
    int owner;                /* the thread that queued it */
} Task;

/* Threads are numbered as they first queue or look for a task; the queue counts the tasks of
 * each number (modulo OWNERS) so that a thread with none queued does not search for its own. */
#define OWNERS 64
static _Thread_local int self = -1;
static atomic_int threads_numbered;

static int self_number(void) {
    if (self < 0) self = atomic_fetch_add(&threads_numbered, 1);
    return self;
}

/* The pool: the queued tasks, oldest first (pop_locked says which one a thread takes), and the
 * threads that run them. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t work;  /* pool threads sleep here: a task was queued */
    pthread_cond_t ready; /* waiting threads sleep here: a task was queued, or an object became ready */
    Task *head, *tail;
    int owned[OWNERS];    /* tasks in the queue by their owner's number modulo OWNERS */
    atomic_long queued;   /* tasks in the queue */
    atomic_int idle;      /* pool threads waiting on `work` */
    atomic_int waiting;   /* waiting threads asleep on `ready` */
    atomic_int threads;   /* computing threads: the pool's plus the one that waits */
    atomic_int started;   /* pool threads started in this process */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, {0}, 0, 0, 0, 1, 0};

static atomic_llong live_objects;

/* The next task for thread `me`: the newest it queued itself, else the oldest in the queue.
 * A parallel loop's dispatch queues the upper half of its blocks, then the upper half of the
 * lower half, and so on: a thread that takes back its newest task keeps working next to the
 * blocks it ran, and one that takes another's oldest task takes the largest range left. So the
 * caller runs the lower blocks and the pool thread the upper ones, loop after loop, and a pass
 * over a product's rows finds them in the cache of the core that wrote them. Taking tasks in
 * queue order instead made that split change with the threads' timing: on two cores a step
 * whose passes read the other core's rows ran about 25% slower (784-1024-1024-10 at batch 512:
 * 33 ms against 26.5, in phases of seconds within one process). */
static Task *pop_locked(int me) {
    Task *task = NULL;
    if (pool.owned[me % OWNERS] > 0)
        for (Task *t = pool.tail; t && !task; t = t->prev)
            if (t->owner == me) task = t;
    if (!task) task = pool.head;
    if (task) {
        if (task->prev) task->prev->next = task->next; else pool.head = task->next;
        if (task->next) task->next->prev = task->prev; else pool.tail = task->prev;
        pool.owned[task->owner % OWNERS]--;
        atomic_fetch_sub(&pool.queued, 1);
    }
    return task;
}

/* Run one queued task, if there is one; true if it ran one. */
static bool run_one(void) {
    if (atomic_load(&pool.queued) == 0) return false;
    int me = self_number();
    pthread_mutex_lock(&pool.mu);
    Task *task = pop_locked(me);
    pthread_mutex_unlock(&pool.mu);
    if (!task) return false;
    CoroHandle handle = task->handle;
    CoroResume resume = task->resume;
    free(task);
    resume(handle);
    return true;
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Run queued tasks until `done(arg)`; spin a while when there are none, then sleep until a
 * task is queued or an object becomes ready. `done` is NULL for the pool's threads. */
static void work_until(bool (*done)(Object *), Object *arg) {
    for (;;) {
        long long deadline = now_ns() + SPIN_NS;
        for (;;) {
            if (done && done(arg)) return;
            if (run_one()) {
                deadline = now_ns() + SPIN_NS;
                continue;
            }
            for (int i = 0; i < 64; i++) CPU_RELAX();
            long long now = now_ns();
            if (now > deadline) break;
            if (now > deadline - SPIN_NS + YIELD_AFTER_NS) sched_yield();
        }
        atomic_int *sleepers = done ? &pool.waiting : &pool.idle;
        pthread_mutex_lock(&pool.mu);
        atomic_fetch_add(sleepers, 1); /* before the last look: see notify_ready */
        while (atomic_load(&pool.queued) == 0 && !(done && done(arg)))
            pthread_cond_wait(done ? &pool.ready : &pool.work, &pool.mu);
        atomic_fetch_sub(sleepers, 1);
        pthread_mutex_unlock(&pool.mu);
    }
}

static void *pool_thread(void *unused) {
    (void)unused;
    work_until(NULL, NULL);
    return NULL;
}

/* Start the pool's threads (under pool.mu). A thread that cannot be started leaves its share
 * of the work to the others: the one that waits always runs what is left. */
static void start_locked(void) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (atomic_load(&pool.started) < atomic_load(&pool.threads) - 1) {
        pthread_t thread;
        if (pthread_create(&thread, &attr, pool_thread, NULL) != 0) break;
        atomic_fetch_add(&pool.started, 1);
    }
    pthread_attr_destroy(&attr);
}

/* Wake the waiting threads: an object became ready (its state is already stored). Pool
 * threads wait for no object: they sleep on. */
static void notify_ready(void) {
    if (atomic_load(&pool.waiting) == 0) return;
    pthread_mutex_lock(&pool.mu);
    pthread_cond_broadcast(&pool.ready);
    pthread_mutex_unlock(&pool.mu);
}

static void reset_in_child(void) {
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.work, NULL);
    pthread_cond_init(&pool.ready, NULL);
    /* tasks and objects of the parent's other threads: nothing in the child can finish them */
    pool.head = pool.tail = NULL;
    for (int i = 0; i < OWNERS; i++) pool.owned[i] = 0;
    atomic_store(&pool.queued, 0);
    atomic_store(&live_objects, 0);
    atomic_store(&pool.idle, 0);
    atomic_store(&pool.waiting, 0);
    atomic_store(&pool.started, 0); /* pool.threads stays: the count asked for */
}

/* ---- Objects ---- */

static Object *create(int64_t storage, long long refs, int pending) {
    Object *object = calloc(1, sizeof(Object) + (size_t)(storage > 0 ? storage : 0));
    if (!object) abort(); /* the compiled code has no way to report it */
    atomic_init(&object->refs, refs);
    pthread_mutex_init(&object->mu, NULL);
    atomic_init(&object->pending, pending);
    atomic_fetch_add(&live_objects, 1);
    return object;
}

static void destroy(Object *object) {
    for (Waiter *w = object->waiters, *next; w; w = next) {
        next = w->next;
        free(w);
    }
    pthread_mutex_destroy(&object->mu);
    free(object);
    atomic_fetch_sub(&live_objects, 1);
}

static void drop(Object *object, int64_t count) {
    if (atomic_fetch_sub(&object->refs, count) == count) destroy(object);
}

static void add_waiter_locked(Object *object, CoroHandle handle, CoroResume resume, Object *group) {
    Waiter *waiter = malloc(sizeof(Waiter));
    if (!waiter) abort();
    *waiter = (Waiter){object->waiters, handle, resume, group};
    object->waiters = waiter;
}

static void run_waiters(Waiter *waiters, bool failed);

/* One token of `group` is ready. */
static void count_into(Object *group, bool failed) {
    if (failed) atomic_fetch_add(&group->errors, 1);
    Waiter *waiters = NULL;
    pthread_mutex_lock(&group->mu);
    if (atomic_fetch_sub(&group->pending, 1) == 1) {
        waiters = group->waiters;
        group->waiters = NULL;
    }
    pthread_mutex_unlock(&group->mu);
    run_waiters(waiters, false);
    notify_ready();
}

static void run_waiters(Waiter *waiters, bool failed) {
    while (waiters) {
        Waiter *waiter = waiters;
        waiters = waiter->next;
        if (waiter->group) {
            count_into(waiter->group, failed);
            drop(waiter->group, 1); /* the reference the token's membership held */
        } else {
            waiter->resume(waiter->handle);
        }
        free(waiter);
    }
}

/* A token or value reaches its final state: run what waits on it, then drop the task's
 * reference. */
static void settle(Object *object, int state) {
    pthread_mutex_lock(&object->mu);
    atomic_store(&object->state, state);
    Waiter *waiters = object->waiters;
    object->waiters = NULL;
    pthread_mutex_unlock(&object->mu);
    run_waiters(waiters, state == FAILED);
    notify_ready();
    drop(object, 1);
}

static bool settled(Object *object) { return atomic_load(&object->state) != PENDING; }
static bool group_done(Object *group) { return atomic_load(&group->pending) <= 0; }

/* Resume the coroutine now if `ready`, else when `object` becomes ready. */
static void resume_when(Object *object, bool (*ready)(Object *), CoroHandle handle, CoroResume resume) {
    pthread_mutex_lock(&object->mu);
    if (ready(object)) {
        pthread_mutex_unlock(&object->mu);
        resume(handle);
        return;
    }
    add_waiter_locked(object, handle, resume, NULL);
    pthread_mutex_unlock(&object->mu);
}

/* ---- The C API ---- */

API void mlirAsyncRuntimeAddRef(void *object, int64_t count) { atomic_fetch_add(&((Object *)object)->refs, count); }
API void mlirAsyncRuntimeDropRef(void *object, int64_t count) { drop(object, count); }

API void *mlirAsyncRuntimeCreateToken(void) { return create(0, 2, 0); }
API void *mlirAsyncRuntimeCreateValue(int64_t size) { return create(size, 2, 0); }
API void *mlirAsyncRuntimeCreateGroup(int64_t size) { return create(0, 1, (int)size); }

API int64_t mlirAsyncRuntimeAddTokenToGroup(Object *token, Object *group) {
    int64_t rank = atomic_fetch_add(&group->rank, 1);
    pthread_mutex_lock(&token->mu);
    int state = atomic_load(&token->state);
    if (state == PENDING) {
        atomic_fetch_add(&group->refs, 1);
        add_waiter_locked(token, NULL, NULL, group);
        pthread_mutex_unlock(&token->mu);
    } else {
        pthread_mutex_unlock(&token->mu);
        count_into(group, state == FAILED);
    }
    return rank;
}

API void mlirAsyncRuntimeEmplaceToken(Object *token) { settle(token, READY); }
API void mlirAsyncRuntimeEmplaceValue(Object *value) { settle(value, READY); }
API void mlirAsyncRuntimeSetTokenError(Object *token) { settle(token, FAILED); }
API void mlirAsyncRuntimeSetValueError(Object *value) { settle(value, FAILED); }
API bool mlirAsyncRuntimeIsTokenError(Object *token) { return atomic_load(&token->state) == FAILED; }
API bool mlirAsyncRuntimeIsValueError(Object *value) { return atomic_load(&value->state) == FAILED; }
API bool mlirAsyncRuntimeIsGroupError(Object *group) { return atomic_load(&group->errors) > 0; }

API void mlirAsyncRuntimeAwaitToken(Object *token) { work_until(settled, token); }
API void mlirAsyncRuntimeAwaitValue(Object *value) { work_until(settled, value); }
API void mlirAsyncRuntimeAwaitAllInGroup(Object *group) { work_until(group_done, group); }

API void *mlirAsyncRuntimeGetValueStorage(Object *value) { return value->storage; }

static atomic_llong tasks_started; /* tasks queued since the process started (for Python) */

API void mlirAsyncRuntimeExecute(CoroHandle handle, CoroResume resume) {
    atomic_fetch_add(&tasks_started, 1);
    Task *task = malloc(sizeof(Task));
    if (!task) abort();
    *task = (Task){NULL, NULL, handle, resume, self_number()};
    pthread_mutex_lock(&pool.mu);
    if (atomic_load(&pool.started) < atomic_load(&pool.threads) - 1) start_locked();
    task->prev = pool.tail;
    if (pool.tail) pool.tail->next = task; else pool.head = task;
    pool.tail = task;
    pool.owned[task->owner % OWNERS]++;
    atomic_fetch_add(&pool.queued, 1);
    /* one thread for one task: an idle pool thread, else a waiting one (with no pool thread,
     * the waiting threads run every task) */
    if (atomic_load(&pool.idle) > 0) pthread_cond_signal(&pool.work);
    else if (atomic_load(&pool.waiting) > 0) pthread_cond_signal(&pool.ready);
    pthread_mutex_unlock(&pool.mu);
}

API void mlirAsyncRuntimeAwaitTokenAndExecute(Object *token, CoroHandle handle, CoroResume resume) {
    resume_when(token, settled, handle, resume);
}

API void mlirAsyncRuntimeAwaitValueAndExecute(Object *value, CoroHandle handle, CoroResume resume) {
    resume_when(value, settled, handle, resume);
}

API void mlirAsyncRuntimeAwaitAllInGroupAndExecute(Object *group, CoroHandle handle, CoroResume resume) {
    resume_when(group, group_done, handle, resume);
}

/* The parallel loops split their work into blocks for this many threads. */
API int64_t mlirAsyncRuntimGetNumWorkerThreads(void) { return atomic_load(&pool.threads); }

/* ---- For Python ---- */

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, reset_in_child); }

/* Set the number of computing threads (at least 1); pool threads start on the first task.
 * Returns the number set. Threads already started stay. */
API int mlirnn_runtime_set_threads(int threads) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
    atomic_store(&pool.threads, threads > 0 ? threads : 1);
    return atomic_load(&pool.threads);
}

/* Pool threads running in this process. */
API int mlirnn_runtime_started_threads(void) { return atomic_load(&pool.started); }

/* Tasks queued in this process: a parallel loop of one block calls its body directly and
 * queues none. */
API long long mlirnn_runtime_tasks_started(void) { return atomic_load(&tasks_started); }

/* Tokens, values and groups not yet destroyed (0 between steps: a leak test's measure). */
API long long mlirnn_runtime_live_objects(void) { return atomic_load(&live_objects); }
