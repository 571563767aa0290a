/* robust_next_b.c - the second of two libraries that define probe_target
 * (tests/robust_next.c). */
#define EXPORT __attribute__((visibility("default")))

EXPORT char probe_target(void)
{
    return 'b';
}

/* Used by the program, so that the linker keeps this library. */
EXPORT char probe_b(void)
{
    return 'b';
}
