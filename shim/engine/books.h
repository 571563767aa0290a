/* books.h - what a context holds for the program, and how much.
 *
 * Each context's deferred releases, oldest first, with the reusable ones
 * (device, managed and pinned memory) also in bins of equal blocks, and
 * the sums the limits are checked against. Every function takes the
 * context's lock itself, for a few instructions; none calls the driver;
 * none waits. The caller has entered the context (cd_ctx_enter).
 *
 * Also here: the ranges of registrations whose driver unregister is still
 * pending, which a new registration must not overlap.
 */
#ifndef CUDEFER_BOOKS_H
#define CUDEFER_BOOKS_H

#include "contexts.h"

/* Puts the retired record r (fenced or not) on c's books. */
void cd_books_defer(struct cd_ctx *c, struct cd_record *r);

/* Whether c holds room for r within CUDEFER_MAX_DEFERRED_BYTES and
 * _ENTRIES (device memory has the cache limit instead: always true). The
 * limits are soft: past them releases are counted, not refused. */
bool cd_books_room(struct cd_ctx *c, const struct cd_record *r);

/* Takes r, which is on c's books, off them (claimed by the caller or not). */
void cd_books_take(struct cd_ctx *c, struct cd_record *r);

/* Which entries a flush takes off a context's books: those whose kind is
 * in mask, that no reuse claims, whose fence's number in other contexts is
 * at most far (fence.h) and, where hi is not 0, whose range [key, key +
 * bytes) overlaps [lo, hi) (a registration over pending unregisters),
 * except the newest fenced reusable blocks whose sizes add up to at most
 * keep bytes, which stay for reuse. */
struct cd_take {
    unsigned mask;
    long long keep;
    uint64_t far;
    uintptr_t lo, hi;
};

/* Every entry of the kinds in mask. */
#define CD_TAKE_ALL(kinds) ((struct cd_take){.mask = (kinds), .far = UINT64_MAX})

/* Takes the entries t picks off c's books, oldest first, onto out (by
 * their age links); *kept (may be NULL): the bytes left for reuse. Returns
 * how many it took. */
size_t cd_books_take_all(struct cd_ctx *c, const struct cd_take *t, long long *kept,
                         struct cd_link *out);

/* Device memory the program holds in c: a block of bytes allocated or
 * reused (sign 1) or released (sign -1). The most it has held at once, in
 * bytes and in blocks, is kept beside it. */
void cd_books_live(struct cd_ctx *c, size_t bytes, int sign);

/* The registry forgets the record or tomb of class cls at key
 * (cd_registry_forget); if it was a LIVE record of device memory of a
 * context still the same, the program no longer holds that memory there.
 * A stale record that an allocation replaces (cd_registry_insert) is not
 * counted out: the count then stays high, which only makes the room
 * smaller. */
void cd_books_forget(enum cd_kind cls, uintptr_t key);

/* How far the program's device memory in c is below percent of its peaks,
 * in bytes and in blocks: the room that CUDEFER_DEVICE_CACHE_PEAK gives
 * the device cache. */
void cd_books_below_peak(struct cd_ctx *c, long long percent, long long *bytes,
                         long long *blocks);

/* Bytes of device memory on c's books (released by the program, not yet
 * handed to the driver). */
long long cd_books_device_bytes(struct cd_ctx *c);

/* Whether c's cache of device blocks holds more than bytes or blocks. */
bool cd_books_over_cache(struct cd_ctx *c, long long bytes, long long blocks);

/* Takes the oldest fenced device blocks whose fence's number in other
 * contexts is at most far off c's books, onto out, until the cache holds
 * at most bytes and blocks. Returns how many. */
size_t cd_books_take_over_cache(struct cd_ctx *c, long long bytes, long long blocks, uint64_t far,
                                struct cd_link *out);

/* Takes the device blocks whose fence the caller found passed: the oldest
 * fenced ones while pass(r) says so (fences pass in order). */
size_t cd_books_take_passed(struct cd_ctx *c, bool (*pass)(struct cd_record *r),
                            struct cd_link *out);

/* Takes the entries queued unfenced (while a capture was live). */
size_t cd_books_take_unfenced(struct cd_ctx *c, struct cd_link *out);

/* Claims the oldest fenced, unclaimed block of (kind, bytes, flags) whose
 * key is below max_key, for a reuse: it stays on the books, and flushes
 * leave it alone, until cd_books_take or cd_books_unclaim. *depth is how
 * many blocks that bin holds; *streak how many allocations in a row, this
 * one included, found a block come into it since the one before (a loop
 * that releases what it allocates; 0 for a run of allocations, and for the
 * first after a run of releases). again: a later look of the same
 * allocation (after a nap), which counts nothing. NULL when there is
 * none. */
struct cd_record *cd_books_claim(struct cd_ctx *c, enum cd_kind kind, size_t bytes,
                                 unsigned flags, uintptr_t max_key, bool again,
                                 size_t *depth, unsigned *streak);
void cd_books_unclaim(struct cd_ctx *c, struct cd_record *r);

/* How many entries c's books hold. */
size_t cd_books_entries(struct cd_ctx *c);

/* How many entries reuses claim in c. */
int cd_books_claims(struct cd_ctx *c);
/* Whether c's books hold entries of the kinds in mask (device frees not
 * yet batched count as device blocks). */
bool cd_books_holds(struct cd_ctx *c, unsigned mask);

/* The driver's unregister of r is done, or its context's destruction undid
 * the registration: its range is no longer pending. */
void cd_books_unregistered(struct cd_record *r);
/* r, a pending registration (r->pending), is in a context being
 * destroyed, and the destruction undoes it only when it returns: r lets go
 * of its range, which stays pending until cd_books_range_undone(r->key,
 * r->key + r->bytes). */
void cd_books_unregistered_later(struct cd_record *r);
void cd_books_range_undone(uintptr_t lo, uintptr_t hi);

/* How many pending registrations have been undone so far. */
unsigned long long cd_books_unregisters_done(void);
/* Registrations whose unregister is pending, in every context. */
long long cd_books_registered_pending(void);
bool cd_books_registered_overlap(uintptr_t lo, uintptr_t hi);
/* Copies up to max pending ranges [lo, hi) into out; returns how many. */
size_t cd_books_registered_ranges(uintptr_t (*out)[2], size_t max);
/* WAITS (for other threads, not for the GPU) until no pending registration
 * overlaps [lo, hi), at most ms milliseconds, or until the count of
 * cd_books_registered_gen moves past gen (one may have come within reach):
 * one that another thread's flush holds while the driver unregisters it,
 * or one in a slot that a primary release keeps closed. True when none
 * overlaps. */
bool cd_books_registered_wait(uintptr_t lo, uintptr_t hi, int ms, unsigned long long gen);
/* A count that moves whenever a pending range may have come within reach
 * (one undone, a registration's entry back on the books, a poke). */
unsigned long long cd_books_registered_gen(void);
/* A closed slot is open again: its pending unregisters can be made. */
void cd_books_registered_poke(void);
/* Whether a pending registration's range could not be noted (no memory for
 * the table): then no overlap can be ruled out. */
bool cd_books_registered_unnoted(void);

/* Entries in transit: taken off the books and not yet released, handed to
 * the waiter nor put back (a flush's, an eviction's, a reclaim's, a
 * capture's end fencing its backlog; a context's teardown counts itself
 * until its destruction has returned). The taker counts them before it
 * takes them, and stops counting only once they are back with the driver
 * or on the books. Counted by the device of the entries' context (dev; a
 * negative one when not known), so that an allocation of one device's
 * memory need not wait for what another device's releases hold. */
void cd_books_transit(int dev, long long delta);
/* What is in transit now for dev (CD_TRANSIT_ALL: for any device; for a
 * device, what no device was known for too), and in *moves (may be NULL)
 * how many times that changed so far. A look at the books of every
 * context (of dev's contexts) that falls between two reads finding nothing
 * in transit and the same count saw every entry the engine held (there):
 * none was in transit meanwhile, on its way out of the books or back. */
#define CD_TRANSIT_ALL (-1)
long long cd_books_in_transit(int dev, unsigned long long *moves);
/* WAITS (for other threads, not for the GPU) until nothing is in transit
 * for dev, at most seconds; false if something still is. */
bool cd_books_transit_wait(int dev, int seconds);

/* Forgets the pending ranges and what is in transit (a forked child). */
void cd_books_reset(void);

#endif
