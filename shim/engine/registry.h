/* registry.h - every object cudefer has seen allocated, by address or
 * handle.
 *
 * A record is LIVE from its allocation until the program releases it, then
 * RETIRED while cudefer holds the object. It ends in one of three ways: its
 * real release (then, for a handle, a GONE tomb), its reuse (LIVE again), or
 * its context's destruction (a TORN tomb). A tomb answers a later release of
 * the same handle with the driver's code, so that a dead handle never
 * reaches the driver (which crashes on some; a registration's TORN tomb
 * lets the driver answer: backends.c, ASK); it lasts until the driver
 * hands the same address or handle out again, or until it is the oldest of
 * too many (TOMBS_MAX in registry.c, logged once). The driver may hand a
 * memory address out through a call cudefer does not see; a release of a
 * torn block's address asks the driver first whether it knows it again
 * (retire.c, stale_tomb).
 *
 * The registry answers the release path without asking the driver. It is
 * sharded; a shard's lock is held for a few instructions and never across a
 * driver call. Its cost does not grow with the number of records: each
 * shard's table doubles as it fills.
 */
#ifndef CUDEFER_REGISTRY_H
#define CUDEFER_REGISTRY_H

#include "kinds.h"
#include "list.h"

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cd_ctx;

enum cd_record_state { CD_LIVE, CD_RETIRED, CD_TORN, CD_GONE };

/* About 96 bytes with malloc's own, per object the program holds or
 * cudefer holds for it. */
struct cd_record {
    struct cd_record *hash_next; /* registry chain, under the shard lock */
    struct cd_link age;          /* its context's deferred list (oldest first),
                                    a batch of frees, or its shard's tombs */
    struct cd_link bin;          /* its context's bin of equal blocks */
    uintptr_t key;               /* address or handle */
    size_t bytes;
    struct cd_ctx *ctx;          /* the context it was allocated in */
    CUevent done;                /* its fence; NULL while not fenced */
    uint64_t far;                /* its fence's number in other contexts (fence.h), or 0 */
    uint32_t word;               /* its fence's number in its context's word (fence.h), or 0 */
    uint64_t debtor;             /* the thread (cd_thread_token) that released it
                                    while its fence had not passed, or 0 */
    unsigned flags;              /* the allocating call's flags */
    unsigned gen;                /* ctx's generation at the allocation */
    uint8_t kind;                /* enum cd_kind */
    uint8_t state;               /* enum cd_record_state, under the shard lock */
    bool linked;                 /* in the registry, under the shard lock */
    bool claimed;                /* a reuse is looking at it (context lock) */
    _Atomic bool no_reuse;       /* never serves another allocation: it was
                                    exported (IPC, dma-buf), or the program
                                    set state on it (cd_block_altered), even
                                    after its release (set under the shard
                                    lock, read anywhere) */
    bool pending;                /* a registration whose range is pending (books.c) */
    bool kept;                   /* a flush leaves it for reuse (books.c, context lock) */
};

enum cd_retire_result {
    CD_NOT_FOUND,       /* not an object cudefer tracks */
    CD_RETIRED_NOW,     /* *out is the record, now RETIRED: the caller owns its fate */
    CD_ALREADY_RETIRED, /* released before and still held */
    CD_WAS_TORN,        /* its context's destruction freed it */
    CD_WAS_GONE,        /* released for real before */
};

/* The lookup class of a kind: managed memory shares device addresses. */
enum cd_kind cd_kind_class(enum cd_kind kind);

/* A new record, zeroed but for kind, key, bytes, flags; NULL when out of
 * memory (the object's release then passes through). */
struct cd_record *cd_record_new(enum cd_kind kind, uintptr_t key, size_t bytes, unsigned flags);

/* Adds r, LIVE. Whatever the registry held for the same class and key is a
 * stale record (the driver handed the address or handle out again): a LIVE
 * one or a tomb is freed; a RETIRED one cannot exist (cudefer still holds
 * that object) and is left to its owner. */
void cd_registry_insert(struct cd_record *r);

/* Finds the record of class cls and key, and makes it RETIRED. */
enum cd_retire_result cd_registry_retire(enum cd_kind cls, uintptr_t key, struct cd_record **out);

/* Whether the record of class cls and key is RETIRED. */
bool cd_registry_is_retired(enum cd_kind cls, uintptr_t key);

/* Marks the LIVE or RETIRED record of class cls and key never to serve
 * another allocation (no_reuse); returns its size, or 0 when there is
 * none. */
size_t cd_registry_bar_reuse(enum cd_kind cls, uintptr_t key);

/* Puts a RETIRED record back to LIVE (it serves an allocation again). */
void cd_registry_unretire(struct cd_record *r);

/* The retired record r now belongs to ctx of generation gen (an object
 * that outlived the context it was made in). */
void cd_registry_move(struct cd_record *r, struct cd_ctx *ctx, unsigned gen);

/* What a LIVE record that cd_registry_forget freed stood for. */
struct cd_forgotten {
    struct cd_ctx *ctx;
    unsigned gen;
    size_t bytes;
    enum cd_kind kind;
};

/* Forgets the LIVE record or tomb of class cls and key, if any (the program
 * freed the object through a call cudefer does not defer, or an allocation
 * cudefer does not track returned that address). Returns what it was:
 * CD_NOT_FOUND, CD_RETIRED_NOW for a LIVE one (now freed; *was, unless
 * NULL, says what it was), CD_ALREADY_RETIRED for a RETIRED one (left
 * alone), CD_WAS_TORN or CD_WAS_GONE. */
enum cd_retire_result cd_registry_forget(enum cd_kind cls, uintptr_t key,
                                         struct cd_forgotten *was);

/* Ends a RETIRED record: with state CD_GONE (really released) or CD_TORN
 * (freed by its context's destruction) it becomes a tomb, for handle kinds
 * and TORN memory; otherwise, or when it is not in the registry, it is
 * unlinked and freed. The caller must not use r afterwards. */
void cd_registry_end(struct cd_record *r, enum cd_record_state state);

/* How many times memory went back to the driver so far: each record that
 * ended CD_GONE (after its release), and each cd_registry_note_returned
 * (a context's destruction). An allocation that failed for lack of memory
 * asks again if this moved since it asked (reclaim.c). */
unsigned long long cd_registry_returned(void);
void cd_registry_note_returned(void);

/* Makes every LIVE record of ctx whose kind is in mask a TORN tomb (its
 * context was destroyed, and with it those objects). RETIRED ones are left
 * to their owners. Walks the whole registry. */
void cd_registry_tear(struct cd_ctx *ctx, unsigned mask);

/* Records of a kind in a state (statistics and tests). */
size_t cd_registry_count(enum cd_kind kind, enum cd_record_state state);

/* Forgets everything without freeing (a forked child). */
void cd_registry_reset(void);

#endif
