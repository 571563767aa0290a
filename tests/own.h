/* own.h - the program's objects in the test driver's counts.
 *
 * The test driver counts every live object, cudefer's own included. Of
 * memory, cudefer holds one pinned word of its own in each context it knows
 * (4 bytes, made at the context's set-up, freed by its destruction:
 * shim/engine/fence.h). No test program allocates pinned blocks of that
 * size, so the blocks the program holds are the others. */
#ifndef CUDEFER_TESTS_OWN_H
#define CUDEFER_TESTS_OWN_H

#include <stddef.h>

#include "testdriver.h"

#define CUDEFER_WORD_BYTES 4

/* Live objects of kind that are the program's. */
static inline size_t program_live(enum testdrv_kind kind)
{
    size_t n = testdrv_live(kind);
    return kind == TESTDRV_HOST ? n - testdrv_live_sized(TESTDRV_HOST, CUDEFER_WORD_BYTES) : n;
}

/* Their bytes. */
static inline size_t program_live_bytes(enum testdrv_kind kind)
{
    size_t n = testdrv_live_bytes(kind);
    return kind == TESTDRV_HOST
               ? n - CUDEFER_WORD_BYTES * testdrv_live_sized(TESTDRV_HOST, CUDEFER_WORD_BYTES)
               : n;
}

#endif
