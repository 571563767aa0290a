/* clock.h - the monotonic clock, in nanoseconds. */
#ifndef CUDEFER_CLOCK_H
#define CUDEFER_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t cd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A condition variable whose timed waits run on the monotonic clock. */
static inline void cd_cond_init_monotonic(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
}

#endif
