/* waiter.h - the waiter thread: it settles device frees in flight and
 * watches the work that releases did not wait for.
 *
 * A host synchronisation that covers a stream-ordered free is what gives
 * the memory back to the driver's allocator (a successful query is not
 * enough, measured). The waiter records a marker event behind each batch of
 * frees on the private stream, polls it, and synchronises it once it has
 * completed (which then returns at once). It polls rather than blocks, so
 * that it is never inside a long driver call when the process exits, and
 * it runs in the relaxed capture mode, so that its calls never invalidate a
 * capture. It sleeps on a monotonic clock and wakes for new work.
 */
#ifndef CUDEFER_WAITER_H
#define CUDEFER_WAITER_H

#include "contexts.h"

void cd_waiter_start(void);
/* Stops the thread and waits for it (at exit). */
void cd_waiter_stop(void);
/* Forgets the thread and the work (a forked child). */
void cd_waiter_reset(void);

/* fn runs for every context in each pass of the waiter (the process module
 * hands it the eviction of device blocks that wait for other contexts'
 * records: retire.h); when it returns true, the waiter looks again within a
 * millisecond. */
void cd_waiter_on_visit(bool (*fn)(struct cd_ctx *c));
/* Wakes the waiter if it sleeps for want of work (a context left work for
 * the visit above). Does not wait. */
void cd_waiter_poke(void);
/* Wakes the waiter if any context has a record marked for another
 * context's fence (fence.h): only the waiter makes them, and it sleeps
 * through a mark made after it looked. A caller whose fence may have
 * marked one, or that let walks into a context again, calls it; otherwise
 * a wait for that record lasted until something else woke the waiter.
 * Does not wait. */
void cd_waiter_see_marks(void);

/* Device frees were issued for the n records of list (by their age links;
 * their fence events already given back): the waiter settles them. One
 * lock and at most one wake for the whole list (a synchronisation may hand
 * over thousands). c entered. Does not wait. */
void cd_waiter_add(struct cd_ctx *c, struct cd_link *list, long long n);

/* A release of kind was made while the work before it still ran: the
 * waiter notes how long that work ran on, at least. While the newest
 * watch's work still runs, the release joins it (no driver call but one
 * query): its work ends no earlier than that. Otherwise it begins a watch,
 * at most one a millisecond per context (a release in between adds
 * nothing). c entered, its context current, inside the capture gate.
 * Does not wait. */
void cd_waiter_watch(struct cd_ctx *c, enum cd_kind kind);

/* Settles c's frees whose marker has completed, now; with wait, first
 * WAITS for everything on c's private stream, so that every free issued
 * before the call is settled. c entered. Returns how many were settled. */
size_t cd_waiter_settle(struct cd_ctx *c, bool wait);

/* Counts c's watches whose work has ended, now (after a synchronisation
 * of c, all of them: the waiter may not look again before the exit). c
 * entered. Does not wait. */
void cd_waiter_see(struct cd_ctx *c);

/* Whether c has frees in flight. */
bool cd_waiter_pending(struct cd_ctx *c);

/* c is closed for good: its frees in flight end with it (its destruction
 * completes them; with alive false it is already gone), and its watches
 * are dropped. */
void cd_waiter_forget(struct cd_ctx *c, bool alive);

#endif
