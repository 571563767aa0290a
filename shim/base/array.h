/* array.h - growing an array of elements. */
#ifndef CUDEFER_ARRAY_H
#define CUDEFER_ARRAY_H

#include <stdbool.h>
#include <stdlib.h>

/* Makes room in *arr (of *cap elements of elem bytes) for need elements,
 * doubling it (16 at first). False when out of memory: *arr is as it was. */
static inline bool cd_array_room(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*arr, n * elem);
    if (!p)
        return false;
    *arr = p;
    *cap = n;
    return true;
}

#endif
