/* registry.c - a sharded hash table of allocation records. */
#include "registry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define SHARDS 64
#define BUCKETS 1024 /* per shard */

struct shard {
    pthread_mutex_t lock;
    struct cd_record *bucket[BUCKETS];
};

static struct shard shards[SHARDS];

/* Torn records kept at most: a program that leaks objects in contexts it
 * destroys must not make the registry grow without end. */
#define MAX_TORN 65536
static _Atomic long torn_count;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_locks(void)
{
    for (int i = 0; i < SHARDS; i++)
        pthread_mutex_init(&shards[i].lock, NULL);
}

enum cd_kind cd_kind_class(enum cd_kind kind)
{
    return kind == CD_MANAGED ? CD_DEVICE : kind;
}

static uint64_t hash(enum cd_kind cls, uintptr_t key)
{
    uint64_t h = (uint64_t)key ^ ((uint64_t)cls << 56);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

static struct shard *shard_of(uint64_t h)
{
    pthread_once(&init_once, init_locks);
    return &shards[h % SHARDS];
}

static struct cd_record **slot_of(struct shard *s, uint64_t h)
{
    return &s->bucket[(h / SHARDS) % BUCKETS];
}

/* The link that points at the record of (cls, key), or at the chain's end. */
static struct cd_record **find(struct cd_record **link, enum cd_kind cls, uintptr_t key)
{
    while (*link && !((*link)->key == key && cd_kind_class((*link)->kind) == cls))
        link = &(*link)->hash_next;
    return link;
}

void cd_registry_insert(struct cd_record *r)
{
    enum cd_kind cls = cd_kind_class(r->kind);
    uint64_t h = hash(cls, r->key);
    struct shard *s = shard_of(h);
    struct cd_record *stale = NULL;
    pthread_mutex_lock(&s->lock);
    struct cd_record **link = find(slot_of(s, h), cls, r->key);
    if (*link) {
        struct cd_record *old = *link;
        *link = old->hash_next;
        old->linked = false;
        if (old->state == CD_TORN)
            atomic_fetch_sub(&torn_count, 1);
        if (old->state != CD_RETIRED)
            stale = old;
    }
    r->state = CD_LIVE;
    r->linked = true;
    r->hash_next = *slot_of(s, h);
    *slot_of(s, h) = r;
    pthread_mutex_unlock(&s->lock);
    free(stale);
}

enum cd_retire_result cd_registry_retire(enum cd_kind cls, uintptr_t key, struct cd_record **out)
{
    uint64_t h = hash(cls, key);
    struct shard *s = shard_of(h);
    enum cd_retire_result res = CD_NOT_FOUND;
    pthread_mutex_lock(&s->lock);
    struct cd_record **link = find(slot_of(s, h), cls, key);
    struct cd_record *r = *link;
    if (r && r->state == CD_TORN) {
        res = CD_WAS_TORN; /* it stays: every later release gets that answer */
    } else if (r && r->state == CD_RETIRED) {
        res = CD_ALREADY_RETIRED;
    } else if (r) {
        r->state = CD_RETIRED;
        *out = r;
        res = CD_RETIRED_NOW;
    }
    pthread_mutex_unlock(&s->lock);
    return res;
}

bool cd_registry_is_retired(enum cd_kind cls, uintptr_t key)
{
    uint64_t h = hash(cls, key);
    struct shard *s = shard_of(h);
    pthread_mutex_lock(&s->lock);
    struct cd_record *r = *find(slot_of(s, h), cls, key);
    bool retired = r && r->state == CD_RETIRED;
    pthread_mutex_unlock(&s->lock);
    return retired;
}

void cd_registry_unretire(struct cd_record *r)
{
    uint64_t h = hash(cd_kind_class(r->kind), r->key);
    struct shard *s = shard_of(h);
    pthread_mutex_lock(&s->lock);
    r->state = CD_LIVE;
    pthread_mutex_unlock(&s->lock);
}

void cd_registry_remove(struct cd_record *r)
{
    enum cd_kind cls = cd_kind_class(r->kind);
    uint64_t h = hash(cls, r->key);
    struct shard *s = shard_of(h);
    pthread_mutex_lock(&s->lock);
    if (r->linked) {
        struct cd_record **link = slot_of(s, h);
        while (*link && *link != r)
            link = &(*link)->hash_next;
        if (*link)
            *link = r->hash_next;
        r->linked = false;
    }
    pthread_mutex_unlock(&s->lock);
}

/* Takes one of the MAX_TORN places for a TORN record. */
static bool torn_reserve(void)
{
    if (atomic_fetch_add(&torn_count, 1) < MAX_TORN)
        return true;
    atomic_fetch_sub(&torn_count, 1);
    return false;
}

/* Makes r TORN: it names no context any more. Under r's shard lock. */
static void set_torn(struct cd_record *r)
{
    r->state = CD_TORN;
    r->ctx = NULL;
    r->done = NULL;
}

bool cd_registry_entomb(struct cd_record *r)
{
    uint64_t h = hash(cd_kind_class(r->kind), r->key);
    struct shard *s = shard_of(h);
    bool kept = false;
    pthread_mutex_lock(&s->lock);
    if (r->linked && r->state == CD_RETIRED && torn_reserve()) {
        set_torn(r);
        kept = true;
    }
    pthread_mutex_unlock(&s->lock);
    return kept;
}

void cd_registry_drop_context(struct cd_ctx *ctx, bool (*torn)(enum cd_kind kind))
{
    for (int i = 0; i < SHARDS; i++) {
        struct shard *s = shard_of((uint64_t)i);
        struct cd_record *dead = NULL;
        pthread_mutex_lock(&s->lock);
        for (int b = 0; b < BUCKETS; b++) {
            struct cd_record **link = &s->bucket[b];
            while (*link) {
                struct cd_record *r = *link;
                if (r->ctx != ctx) {
                    link = &r->hash_next;
                    continue;
                }
                if (r->state == CD_LIVE && torn(r->kind) && torn_reserve()) {
                    set_torn(r);
                    link = &r->hash_next;
                    continue;
                }
                *link = r->hash_next;
                r->linked = false;
                if (r->state == CD_LIVE) {
                    r->hash_next = dead;
                    dead = r;
                }
            }
        }
        pthread_mutex_unlock(&s->lock);
        while (dead) {
            struct cd_record *next = dead->hash_next;
            free(dead);
            dead = next;
        }
    }
}

size_t cd_registry_count(enum cd_kind kind, int state)
{
    size_t n = 0;
    for (int i = 0; i < SHARDS; i++) {
        struct shard *s = shard_of((uint64_t)i);
        pthread_mutex_lock(&s->lock);
        for (int b = 0; b < BUCKETS; b++)
            for (struct cd_record *r = s->bucket[b]; r; r = r->hash_next)
                n += r->kind == kind && r->state == state;
        pthread_mutex_unlock(&s->lock);
    }
    return n;
}

void cd_registry_reset(void)
{
    atomic_store(&torn_count, 0);
    for (int i = 0; i < SHARDS; i++) {
        pthread_mutex_init(&shards[i].lock, NULL);
        for (int b = 0; b < BUCKETS; b++)
            shards[i].bucket[b] = NULL;
    }
}
