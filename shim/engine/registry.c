/* registry.c - a sharded hash table of records, each shard's table growing
 * as it fills, and each shard's tombs in age order. */
#include "registry.h"

#include "log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define SHARDS 64
#define FIRST_BUCKETS 1024 /* per shard; a power of two */

/* Tombs kept at most, per shard: 262,144 in all (about 25 MB). Past that
 * the oldest goes: a second release of its handle reaches the driver. */
#define TOMBS_MAX (262144 / SHARDS)

struct shard {
    pthread_mutex_t lock;
    struct cd_record **bucket;
    size_t nbuckets, count;
    struct cd_link tombs; /* oldest first */
    size_t ntombs;
};

static struct shard shards[SHARDS];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static atomic_flag tombs_logged = ATOMIC_FLAG_INIT;

static void init_shards(void)
{
    for (int i = 0; i < SHARDS; i++) {
        pthread_mutex_init(&shards[i].lock, NULL);
        cd_list_init(&shards[i].tombs);
    }
}

enum cd_kind cd_kind_class(enum cd_kind kind)
{
    return kind == CD_MANAGED ? CD_DEVICE : kind;
}

struct cd_record *cd_record_new(enum cd_kind kind, uintptr_t key, size_t bytes, unsigned flags)
{
    struct cd_record *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->kind = (uint8_t)kind;
    r->key = key;
    r->bytes = bytes;
    r->flags = flags;
    return r;
}

static uint64_t hash(enum cd_kind cls, uintptr_t key)
{
    uint64_t h = (uint64_t)key ^ ((uint64_t)cls << 56);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static struct shard *shard_of(uint64_t h)
{
    pthread_once(&init_once, init_shards);
    return &shards[h % SHARDS];
}

static size_t bucket_index(const struct shard *s, uint64_t h)
{
    return (size_t)(h / SHARDS) & (s->nbuckets - 1);
}

/* The link that points at the record of (cls, key), or at its chain's end.
 * Under the shard lock, with a table. */
static struct cd_record **find(struct shard *s, uint64_t h, enum cd_kind cls, uintptr_t key)
{
    struct cd_record **link = &s->bucket[bucket_index(s, h)];
    while (*link && !((*link)->key == key && cd_kind_class((*link)->kind) == cls))
        link = &(*link)->hash_next;
    return link;
}

/* Doubles the table when it holds twice as many records as buckets (and
 * makes the first one). A failed allocation keeps the old table: chains
 * grow longer, nothing is lost. */
static void grow(struct shard *s)
{
    if (s->bucket && s->count < 2 * s->nbuckets)
        return;
    size_t n = s->bucket ? s->nbuckets * 2 : FIRST_BUCKETS;
    struct cd_record **b = calloc(n, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (struct cd_record *r = s->bucket[i], *next; r; r = next) {
            next = r->hash_next;
            size_t j = (size_t)(hash(cd_kind_class(r->kind), r->key) / SHARDS) & (n - 1);
            r->hash_next = b[j];
            b[j] = r;
        }
    }
    free(s->bucket);
    s->bucket = b;
    s->nbuckets = n;
}

static bool is_tomb(const struct cd_record *r)
{
    return r->state == CD_TORN || r->state == CD_GONE;
}

/* Unlinks the record at *link; a tomb also leaves the tomb list. */
static struct cd_record *unlink_at(struct shard *s, struct cd_record **link)
{
    struct cd_record *r = *link;
    *link = r->hash_next;
    r->hash_next = NULL;
    r->linked = false;
    s->count--;
    if (is_tomb(r)) {
        cd_list_remove(&r->age);
        s->ntombs--;
    }
    return r;
}

void cd_registry_insert(struct cd_record *r)
{
    enum cd_kind cls = cd_kind_class(r->kind);
    uint64_t h = hash(cls, r->key);
    struct shard *s = shard_of(h);
    struct cd_record *stale = NULL;
    pthread_mutex_lock(&s->lock);
    grow(s);
    if (!s->bucket) {
        pthread_mutex_unlock(&s->lock);
        free(r);
        return;
    }
    struct cd_record **link = find(s, h, cls, r->key);
    if (*link && (*link)->state != CD_RETIRED)
        stale = unlink_at(s, link);
    r->state = CD_LIVE;
    r->linked = true;
    size_t b = bucket_index(s, h);
    r->hash_next = s->bucket[b];
    s->bucket[b] = r;
    s->count++;
    pthread_mutex_unlock(&s->lock);
    free(stale);
}

static enum cd_retire_result state_answer(const struct cd_record *r)
{
    switch (r->state) {
    case CD_RETIRED: return CD_ALREADY_RETIRED;
    case CD_TORN: return CD_WAS_TORN;
    case CD_GONE: return CD_WAS_GONE;
    default: return CD_RETIRED_NOW;
    }
}

enum cd_retire_result cd_registry_retire(enum cd_kind cls, uintptr_t key, struct cd_record **out)
{
    uint64_t h = hash(cls, key);
    struct shard *s = shard_of(h);
    enum cd_retire_result res = CD_NOT_FOUND;
    pthread_mutex_lock(&s->lock);
    struct cd_record *r = s->bucket ? *find(s, h, cls, key) : NULL;
    if (r) {
        res = state_answer(r);
        if (res == CD_RETIRED_NOW) {
            r->state = CD_RETIRED;
            *out = r;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return res;
}

/* The state of the record of (cls, key), or -1; with bar_reuse, a LIVE or
 * RETIRED one is marked no_reuse and *bytes is its size. */
static int peek(enum cd_kind cls, uintptr_t key, bool bar_reuse, size_t *bytes)
{
    uint64_t h = hash(cls, key);
    struct shard *s = shard_of(h);
    pthread_mutex_lock(&s->lock);
    struct cd_record *r = s->bucket ? *find(s, h, cls, key) : NULL;
    int state = r ? r->state : -1;
    if (r && bar_reuse && (state == CD_LIVE || state == CD_RETIRED)) {
        atomic_store(&r->no_reuse, true);
        *bytes = r->bytes;
    }
    pthread_mutex_unlock(&s->lock);
    return state;
}

bool cd_registry_is_retired(enum cd_kind cls, uintptr_t key)
{
    return peek(cls, key, false, NULL) == CD_RETIRED;
}

size_t cd_registry_bar_reuse(enum cd_kind cls, uintptr_t key)
{
    size_t bytes = 0;
    peek(cls, key, true, &bytes);
    return bytes;
}

void cd_registry_move(struct cd_record *r, struct cd_ctx *ctx, unsigned gen)
{
    struct shard *s = shard_of(hash(cd_kind_class(r->kind), r->key));
    pthread_mutex_lock(&s->lock);
    r->ctx = ctx;
    r->gen = gen;
    pthread_mutex_unlock(&s->lock);
}

void cd_registry_unretire(struct cd_record *r)
{
    struct shard *s = shard_of(hash(cd_kind_class(r->kind), r->key));
    pthread_mutex_lock(&s->lock);
    r->state = CD_LIVE;
    pthread_mutex_unlock(&s->lock);
}

enum cd_retire_result cd_registry_forget(enum cd_kind cls, uintptr_t key,
                                         struct cd_forgotten *was)
{
    uint64_t h = hash(cls, key);
    struct shard *s = shard_of(h);
    struct cd_record *gone = NULL;
    enum cd_retire_result res = CD_NOT_FOUND;
    pthread_mutex_lock(&s->lock);
    struct cd_record **link = s->bucket ? find(s, h, cls, key) : NULL;
    if (link && *link) {
        res = state_answer(*link);
        if (res != CD_ALREADY_RETIRED)
            gone = unlink_at(s, link);
    }
    pthread_mutex_unlock(&s->lock);
    if (was && gone && res == CD_RETIRED_NOW)
        *was = (struct cd_forgotten){gone->ctx, gone->gen, gone->bytes, (enum cd_kind)gone->kind};
    free(gone);
    return res;
}

/* Handle kinds keep a tomb after their real release; every kind after its
 * context's destruction. */
static bool wants_tomb(const struct cd_record *r, enum cd_record_state state)
{
    if (state == CD_TORN)
        return true;
    return state == CD_GONE && (r->kind == CD_ARRAY || r->kind == CD_MIPMAPPED ||
                                r->kind == CD_MODULE || r->kind == CD_LIBRARY);
}

/* Makes the linked record r a tomb; under the shard lock. Returns the tomb
 * that had to go to make room, if any (the caller frees it). */
static struct cd_record *entomb(struct shard *s, struct cd_record *r, enum cd_record_state state)
{
    struct cd_record *evicted = NULL;
    if (s->ntombs >= TOMBS_MAX) {
        struct cd_record *old = CD_CONTAINER(s->tombs.next, struct cd_record, age);
        struct cd_record **link = find(s, hash(cd_kind_class(old->kind), old->key),
                                       cd_kind_class(old->kind), old->key);
        evicted = unlink_at(s, link);
        if (!atomic_flag_test_and_set(&tombs_logged))
            cd_log(CD_LOG_INFO, "more than %d released handles remembered: the oldest are "
                   "forgotten (a second release of one reaches the driver)", TOMBS_MAX * SHARDS);
    }
    r->state = (uint8_t)state;
    r->ctx = NULL;
    r->done = NULL;
    cd_list_append(&s->tombs, &r->age);
    s->ntombs++;
    return evicted;
}

/* Moments memory went back to the driver (registry.h). */
static _Atomic unsigned long long returned;

unsigned long long cd_registry_returned(void)
{
    return atomic_load_explicit(&returned, memory_order_acquire);
}

void cd_registry_note_returned(void)
{
    atomic_fetch_add_explicit(&returned, 1, memory_order_release);
}

void cd_registry_end(struct cd_record *r, enum cd_record_state state)
{
    struct shard *s = shard_of(hash(cd_kind_class(r->kind), r->key));
    struct cd_record *gone = r, *evicted = NULL;
    pthread_mutex_lock(&s->lock);
    if (r->linked && wants_tomb(r, state)) {
        evicted = entomb(s, r, state);
        gone = NULL;
    } else if (r->linked) {
        struct cd_record **link = &s->bucket[bucket_index(s, hash(cd_kind_class(r->kind), r->key))];
        while (*link && *link != r)
            link = &(*link)->hash_next;
        if (*link)
            unlink_at(s, link);
    }
    pthread_mutex_unlock(&s->lock);
    free(gone);
    free(evicted);
    if (state == CD_GONE)
        cd_registry_note_returned();
}

void cd_registry_tear(struct cd_ctx *ctx, unsigned mask)
{
    for (int i = 0; i < SHARDS; i++) {
        struct shard *s = shard_of((uint64_t)i);
        struct cd_record *evicted = NULL;
        pthread_mutex_lock(&s->lock);
        for (size_t b = 0; b < s->nbuckets; b++) {
            for (struct cd_record *r = s->bucket[b]; r; r = r->hash_next) {
                if (r->state != CD_LIVE || r->ctx != ctx || !(mask & (1u << r->kind)))
                    continue;
                struct cd_record *e = entomb(s, r, CD_TORN);
                if (e) {
                    /* An evicted tomb may sit later in this very chain:
                     * freed after the walk. */
                    e->hash_next = evicted;
                    evicted = e;
                }
            }
        }
        pthread_mutex_unlock(&s->lock);
        while (evicted) {
            struct cd_record *next = evicted->hash_next;
            free(evicted);
            evicted = next;
        }
    }
}

size_t cd_registry_count(enum cd_kind kind, enum cd_record_state state)
{
    size_t n = 0;
    for (int i = 0; i < SHARDS; i++) {
        struct shard *s = shard_of((uint64_t)i);
        pthread_mutex_lock(&s->lock);
        for (size_t b = 0; b < s->nbuckets; b++)
            for (struct cd_record *r = s->bucket[b]; r; r = r->hash_next)
                n += r->kind == kind && r->state == state;
        pthread_mutex_unlock(&s->lock);
    }
    return n;
}

void cd_registry_reset(void)
{
    pthread_once(&init_once, init_shards);
    for (int i = 0; i < SHARDS; i++) {
        struct shard *s = &shards[i];
        pthread_mutex_init(&s->lock, NULL);
        s->bucket = NULL; /* the parent's table stays with the parent's records */
        s->nbuckets = s->count = s->ntombs = 0;
        cd_list_init(&s->tombs);
    }
}
