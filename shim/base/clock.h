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

/* The monotonic time ns nanoseconds from now, for a timed wait on a
 * condition variable made by cd_cond_init_monotonic. */
static inline struct timespec cd_monotonic_in(uint64_t ns)
{
    uint64_t at = cd_now_ns() + ns;
    return (struct timespec){(time_t)(at / 1000000000u), (long)(at % 1000000000u)};
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
