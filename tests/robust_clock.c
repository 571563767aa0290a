/* robust_clock.c - a library preloaded before cudefer that shifts what the
 * process reads of the wall clock (tests/test_robust.c).
 *
 * clock_gettime(CLOCK_REALTIME and CLOCK_REALTIME_COARSE), gettimeofday
 * and time answer the real time plus ROBUST_CLOCK_SHIFT seconds (default
 * -3600: the clock set back by an hour). The kernel still times absolute
 * waits against the real clock, as it does for a wait made just before the
 * system's clock is stepped: with a positive shift, a wait until "now plus
 * a millisecond" computed from CLOCK_REALTIME lasts the shift. Monotonic
 * clocks are untouched. The real clock is read with the system call, so
 * that no lookup (and no dlsym) is needed.
 */
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static long shift(void)
{
    static long seconds = 1; /* 1: not read yet */
    if (seconds == 1) {
        const char *text = getenv("ROBUST_CLOCK_SHIFT");
        seconds = text ? strtol(text, NULL, 10) : -3600;
    }
    return seconds;
}

EXPORT int clock_gettime(clockid_t clock, struct timespec *ts)
{
    int rc = (int)syscall(SYS_clock_gettime, clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
        ts->tv_sec += shift();
    return rc;
}

EXPORT int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

EXPORT time_t time(time_t *out)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
