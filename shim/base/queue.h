/* queue.h - the lock-free lists of records: pushed one at a time by any
 * thread, taken whole by whoever drains them. Taking the whole list (an
 * exchange) rules out the ABA problem of popping single entries. */
#ifndef CUDEFER_QUEUE_H
#define CUDEFER_QUEUE_H

#include "registry.h"

#include <stdatomic.h>

static inline void cd_push(_Atomic(struct cd_record *) *head, struct cd_record *r)
{
    struct cd_record *old = atomic_load_explicit(head, memory_order_relaxed);
    do
        r->queue_next = old;
    while (!atomic_compare_exchange_weak_explicit(head, &old, r, memory_order_release,
                                                  memory_order_relaxed));
}

static inline void cd_push_all(_Atomic(struct cd_record *) *head, struct cd_record *list)
{
    while (list) {
        struct cd_record *next = list->queue_next;
        cd_push(head, list);
        list = next;
    }
}

/* Takes the whole list, oldest entry first. */
static inline struct cd_record *cd_take_all(_Atomic(struct cd_record *) *head)
{
    struct cd_record *r = atomic_exchange_explicit(head, NULL, memory_order_acquire);
    struct cd_record *fifo = NULL;
    while (r) {
        struct cd_record *next = r->queue_next;
        r->queue_next = fifo;
        fifo = r;
        r = next;
    }
    return fifo;
}

/* Puts a list taken with atomic_exchange (newest first, as it was) back
 * under whatever was pushed meanwhile. Walks only the entries pushed
 * meanwhile, not the list. */
static inline void cd_push_list(_Atomic(struct cd_record *) *head, struct cd_record *list)
{
    while (list) {
        struct cd_record *expected = NULL;
        if (atomic_compare_exchange_strong_explicit(head, &expected, list, memory_order_release,
                                                    memory_order_relaxed))
            return;
        struct cd_record *newer = atomic_exchange_explicit(head, NULL, memory_order_acquire);
        if (!newer)
            continue;
        struct cd_record *last = newer;
        while (last->queue_next)
            last = last->queue_next;
        last->queue_next = list;
        list = newer;
    }
}

#endif
