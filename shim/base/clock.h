/* clock.h - the monotonic clock, in nanoseconds. */
#ifndef CUDEFER_CLOCK_H
#define CUDEFER_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t cd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
