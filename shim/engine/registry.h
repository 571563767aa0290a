/* registry.h - every allocation the shim has seen, by address or handle.
 *
 * A record is LIVE from its allocation until the program releases it, then
 * RETIRED until the real release is done. The registry answers the release
 * path at once, without asking the driver: "is this ours, and was it already
 * released?". Its lock is per shard and never held across a driver call.
 */
#ifndef CUDEFER_REGISTRY_H
#define CUDEFER_REGISTRY_H

#include "engine.h"

#include <stdatomic.h>
#include <stdbool.h>

struct cd_ctx;

/* TORN: freed by its context's destruction, which the program may not know;
 * every release of it gets the driver's answer for such an object
 * (cd_backend's torn_release), without the dead handle reaching the driver.
 * It stays until its address or handle is handed out again (up to 65,536
 * TORN records; past that the release reaches the driver). */
enum cd_record_state { CD_LIVE, CD_RETIRED, CD_TORN };

struct cd_record {
    struct cd_record *hash_next;  /* registry chain, under the shard lock */
    struct cd_record *queue_next; /* deferred or in-flight list */
    uintptr_t key;                /* address or handle */
    size_t bytes;
    unsigned flags;               /* the allocating call's flags */
    struct cd_ctx *ctx;           /* the context it was allocated in */
    CUevent done;                 /* fence (deferred) or free (device) done */
    enum cd_kind kind;
    int state;                    /* under the shard lock */
    bool linked;                  /* in the registry; under the shard lock */
};

enum cd_retire_result { CD_NOT_FOUND, CD_ALREADY_RETIRED, CD_RETIRED_NOW, CD_WAS_TORN };

/* The lookup class of a kind: managed memory shares device addresses. */
enum cd_kind cd_kind_class(enum cd_kind kind);

/* Adds r (LIVE). A RETIRED record of the same class and key (its address was
 * really freed and handed out again) is unlinked; a LIVE one (released
 * behind the shim's back) is unlinked and freed. */
void cd_registry_insert(struct cd_record *r);

/* Finds the record of class cls and key, and makes it RETIRED. */
enum cd_retire_result cd_registry_retire(enum cd_kind cls, uintptr_t key,
                                         struct cd_record **out);

/* Whether the record of class cls and key is RETIRED: released by the
 * program and held by the shim. */
bool cd_registry_is_retired(enum cd_kind cls, uintptr_t key);

/* Puts a RETIRED record back to LIVE (its deferral failed before anything
 * was done to it). */
void cd_registry_unretire(struct cd_record *r);

/* Unlinks r if it is still linked. The caller owns r afterwards. */
void cd_registry_remove(struct cd_record *r);

/* Makes the RETIRED record r TORN (its context's destruction freed the
 * object the program had released): a later release of the same address
 * or handle gets the answer for one released already, and the dead handle
 * does not reach the driver. True when r stays in the registry, which owns
 * it from then on; false (no room, or r not linked) when the caller still
 * owns r. */
bool cd_registry_entomb(struct cd_record *r);

/* Unlinks every record of ctx, except LIVE ones for which torn(kind) says
 * the context's destruction frees the object: those stay, TORN, with no
 * context (up to a bound; past it they are freed like the others). Other
 * LIVE records are freed; RETIRED ones stay owned by their queues. */
void cd_registry_drop_context(struct cd_ctx *ctx, bool (*torn)(enum cd_kind kind));

/* Live records of a kind (for statistics and tests). */
size_t cd_registry_count(enum cd_kind kind, int state);

/* Forgets everything without freeing (a forked child). */
void cd_registry_reset(void);

#endif
