/* Time stamps that an instrumented step takes around each call of a kernel (kernel_times.py). */
#include <stdint.h>
#include <time.h>

#define MAX_TICKS 65536

int64_t mlirnn_ticks[MAX_TICKS];
int64_t mlirnn_tick_count;

void mlirnn_tick(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (mlirnn_tick_count < MAX_TICKS)
        mlirnn_ticks[mlirnn_tick_count++] = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
}
