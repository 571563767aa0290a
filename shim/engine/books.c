/* books.c - a context's deferred entries, bins and sums. */
#include "books.h"

#include "array.h"
#include "backends.h"
#include "clock.h"
#include "options.h"
#include "registry.h"
#include "stats.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- pending registrations --------------------------------------------- */

static _Atomic long long registered_pending;
static _Atomic unsigned long long unregisters_done;
static pthread_mutex_t ranges_lock = PTHREAD_MUTEX_INITIALIZER;
/* Broadcast when a range stops being pending. */
static pthread_cond_t ranges_cond;
static struct range {
    uintptr_t lo, hi;
} *ranges;
static size_t nranges, cap_ranges;

/* Pending registrations whose range the table had no room for (under
 * ranges_lock). */
static size_t unnoted;

/* Bumped whenever a pending range may have come within reach: one undone,
 * a registration's entry back on the books, a closed slot open again
 * (cd_books_registered_poke). Threads in cd_books_registered_wait are
 * counted, so that a bump broadcasts only when one waits. */
static _Atomic unsigned long long ranges_gen;
static _Atomic int range_waiters;

void cd_books_registered_poke(void)
{
    atomic_fetch_add(&ranges_gen, 1);
    if (atomic_load(&range_waiters)) {
        pthread_mutex_lock(&ranges_lock);
        pthread_cond_broadcast(&ranges_cond);
        pthread_mutex_unlock(&ranges_lock);
    }
}

unsigned long long cd_books_registered_gen(void)
{
    return atomic_load(&ranges_gen);
}

static void note_range(uintptr_t lo, uintptr_t hi, int sign)
{
    struct range want = {lo, hi};
    atomic_fetch_add(&registered_pending, sign);
    pthread_mutex_lock(&ranges_lock);
    /* Without room the range is not noted, only counted; the registration's
     * own CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED then leads to a flush. */
    if (sign > 0) {
        if (cd_array_room((void **)&ranges, &cap_ranges, nranges + 1, sizeof *ranges))
            ranges[nranges++] = want;
        else
            unnoted++;
    } else {
        size_t i = 0;
        while (i < nranges && (ranges[i].lo != want.lo || ranges[i].hi != want.hi))
            i++;
        if (i < nranges)
            ranges[i] = ranges[--nranges];
        else if (unnoted)
            unnoted--;
        atomic_fetch_add(&ranges_gen, 1);
        pthread_cond_broadcast(&ranges_cond);
    }
    pthread_mutex_unlock(&ranges_lock);
}

void cd_books_unregistered(struct cd_record *r)
{
    if (r->kind == CD_REGISTERED && r->pending) {
        r->pending = false;
        cd_books_range_undone(r->key, r->key + r->bytes);
    }
}

void cd_books_unregistered_later(struct cd_record *r)
{
    r->pending = false;
}

void cd_books_range_undone(uintptr_t lo, uintptr_t hi)
{
    note_range(lo, hi, -1);
    atomic_fetch_add(&unregisters_done, 1);
}

unsigned long long cd_books_unregisters_done(void)
{
    return atomic_load(&unregisters_done);
}

long long cd_books_registered_pending(void)
{
    return atomic_load(&registered_pending);
}

bool cd_books_registered_unnoted(void)
{
    pthread_mutex_lock(&ranges_lock);
    bool any = unnoted > 0;
    pthread_mutex_unlock(&ranges_lock);
    return any;
}

/* Under ranges_lock. */
static bool overlap_locked(uintptr_t lo, uintptr_t hi)
{
    for (size_t i = 0; i < nranges; i++)
        if (ranges[i].lo < hi && lo < ranges[i].hi)
            return true;
    return false;
}

bool cd_books_registered_overlap(uintptr_t lo, uintptr_t hi)
{
    pthread_mutex_lock(&ranges_lock);
    bool found = overlap_locked(lo, hi);
    pthread_mutex_unlock(&ranges_lock);
    return found;
}

size_t cd_books_registered_ranges(uintptr_t (*out)[2], size_t max)
{
    pthread_mutex_lock(&ranges_lock);
    size_t n = nranges < max ? nranges : max;
    for (size_t i = 0; i < n; i++) {
        out[i][0] = ranges[i].lo;
        out[i][1] = ranges[i].hi;
    }
    pthread_mutex_unlock(&ranges_lock);
    return n;
}

bool cd_books_registered_wait(uintptr_t lo, uintptr_t hi, int ms, unsigned long long gen)
{
    struct timespec until = cd_monotonic_in((uint64_t)ms * 1000000u);
    pthread_mutex_lock(&ranges_lock);
    /* Counted before the bump is read: a poke after this reads the count
     * and broadcasts; one before it has bumped the number already. */
    atomic_fetch_add(&range_waiters, 1);
    int err = 0;
    while (overlap_locked(lo, hi) && atomic_load(&ranges_gen) == gen && err != ETIMEDOUT)
        err = pthread_cond_timedwait(&ranges_cond, &ranges_lock, &until);
    atomic_fetch_sub(&range_waiters, 1);
    bool clear = !overlap_locked(lo, hi);
    pthread_mutex_unlock(&ranges_lock);
    return clear;
}

/* ---- entries in transit ------------------------------------------------------ */

/* Each device's (the last slot: a device not known); all of it is their
 * sum. */
#define TRANSIT_SLOTS 65
static pthread_mutex_t transit_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t transit_cond;
static long long transit_of[TRANSIT_SLOTS];
static unsigned long long moves_of[TRANSIT_SLOTS];

static int transit_slot(int dev)
{
    return dev >= 0 && dev < TRANSIT_SLOTS - 1 ? dev : TRANSIT_SLOTS - 1;
}

/* Under transit_lock: what is in transit for dev (CD_TRANSIT_ALL: all of
 * it; a device's count includes what no device was known for). */
static long long transit_for(int dev, unsigned long long *moves)
{
    if (dev == CD_TRANSIT_ALL) {
        long long n = 0;
        unsigned long long m = 0;
        for (int s = 0; s < TRANSIT_SLOTS; s++) {
            n += transit_of[s];
            m += moves_of[s];
        }
        if (moves)
            *moves = m;
        return n;
    }
    int s = transit_slot(dev), u = TRANSIT_SLOTS - 1;
    if (moves)
        *moves = moves_of[s] + (s != u ? moves_of[u] : 0);
    return transit_of[s] + (s != u ? transit_of[u] : 0);
}

__attribute__((constructor)) static void books_init(void)
{
    cd_cond_init_monotonic(&ranges_cond);
    cd_cond_init_monotonic(&transit_cond);
}

void cd_books_transit(int dev, long long delta)
{
    int s = transit_slot(dev);
    pthread_mutex_lock(&transit_lock);
    transit_of[s] += delta;
    moves_of[s]++;
    /* The change that empties all of it empties its own slot. */
    if (transit_of[s] == 0)
        pthread_cond_broadcast(&transit_cond);
    pthread_mutex_unlock(&transit_lock);
}

long long cd_books_in_transit(int dev, unsigned long long *moves)
{
    pthread_mutex_lock(&transit_lock);
    long long n = transit_for(dev, moves);
    pthread_mutex_unlock(&transit_lock);
    return n;
}

bool cd_books_transit_wait(int dev, int seconds)
{
    struct timespec until = cd_monotonic_in((uint64_t)seconds * 1000000000u);
    pthread_mutex_lock(&transit_lock);
    int err = 0;
    while (transit_for(dev, NULL) > 0 && err != ETIMEDOUT)
        err = pthread_cond_timedwait(&transit_cond, &transit_lock, &until);
    bool clear = transit_for(dev, NULL) == 0;
    pthread_mutex_unlock(&transit_lock);
    return clear;
}

void cd_books_reset(void)
{
    pthread_mutex_init(&ranges_lock, NULL);
    cd_cond_init_monotonic(&ranges_cond);
    nranges = 0;
    unnoted = 0;
    atomic_store(&registered_pending, 0);
    atomic_store(&range_waiters, 0);
    pthread_mutex_init(&transit_lock, NULL);
    cd_cond_init_monotonic(&transit_cond);
    memset(transit_of, 0, sizeof transit_of);
    memset(moves_of, 0, sizeof moves_of);
}

/* ---- sums ------------------------------------------------------------------ */

static void account(struct cd_ctx *c, const struct cd_record *r, int sign)
{
    long long bytes = sign * (long long)r->bytes;
    c->kind_entries[r->kind] += sign;
    if (r->kind == CD_DEVICE) {
        c->cached_bytes += bytes;
        c->cached_entries += sign;
        cd_stats_add_cached_device_bytes(bytes);
        return;
    }
    c->held_bytes += bytes;
    c->held_entries += sign;
    cd_stats_add_deferred_bytes(bytes);
}

/* Adds delta to *live, and raises *peak to it. */
static long long rise(_Atomic long long *live, _Atomic long long *peak, long long delta)
{
    long long now = atomic_fetch_add(live, delta) + delta;
    long long most = atomic_load(peak);
    while (now > most && !atomic_compare_exchange_weak(peak, &most, now))
        ;
    return now;
}

void cd_books_live(struct cd_ctx *c, size_t bytes, int sign)
{
    rise(&c->live_bytes, &c->peak_bytes, sign * (long long)bytes);
    cd_stats_add_program_device_bytes(sign * (long long)bytes);
    rise(&c->live_blocks, &c->peak_blocks, sign);
}

void cd_books_forget(enum cd_kind cls, uintptr_t key)
{
    struct cd_forgotten was;
    if (cd_registry_forget(cls, key, &was) == CD_RETIRED_NOW && was.ctx &&
        was.kind == CD_DEVICE && atomic_load(&was.ctx->gen) == was.gen)
        cd_books_live(was.ctx, was.bytes, -1);
}

void cd_books_below_peak(struct cd_ctx *c, long long percent, long long *bytes,
                         long long *blocks)
{
    /* Past 100 times the peak is as good as no bound, and the products
     * stay far from overflow (2^47 bytes times 2^14). */
    if (percent > 10000)
        percent = 10000;
    *bytes = atomic_load(&c->peak_bytes) * percent / 100 - atomic_load(&c->live_bytes);
    *blocks = atomic_load(&c->peak_blocks) * percent / 100 - atomic_load(&c->live_blocks);
    if (*bytes < 0)
        *bytes = 0;
    if (*blocks < 0)
        *blocks = 0;
}

/* ---- bins -------------------------------------------------------------------- */

static size_t bin_slot(enum cd_kind kind, size_t bytes, unsigned flags)
{
    uint64_t h = (uint64_t)bytes * 0x9e3779b97f4a7c15ull ^ ((uint64_t)flags << 8) ^ (uint64_t)kind;
    return (size_t)(h >> 56) % CD_BIN_BUCKETS;
}

static struct cd_bin **bin_link(struct cd_ctx *c, enum cd_kind kind, size_t bytes, unsigned flags)
{
    struct cd_bin **link = &c->bins[bin_slot(kind, bytes, flags)];
    while (*link && !((*link)->kind == kind && (*link)->bytes == bytes && (*link)->flags == flags))
        link = &(*link)->next;
    return link;
}

/* Adds r to its bin, made if needed; without memory for a bin, r is only
 * on the age list (it is not reused, it is released in order). */
static void bin_add(struct cd_ctx *c, struct cd_record *r)
{
    struct cd_bin **link = bin_link(c, (enum cd_kind)r->kind, r->bytes, r->flags);
    if (!*link) {
        struct cd_bin *b = calloc(1, sizeof *b);
        if (!b)
            return;
        b->kind = (enum cd_kind)r->kind;
        b->bytes = r->bytes;
        b->flags = r->flags;
        cd_list_init(&b->list);
        *link = b;
    }
    cd_list_append(&(*link)->list, &r->bin);
    (*link)->n++;
    (*link)->refilled = (*link)->looked;
}

static void bin_remove(struct cd_ctx *c, struct cd_record *r)
{
    if (!cd_linked(&r->bin))
        return;
    cd_list_remove(&r->bin);
    struct cd_bin **link = bin_link(c, (enum cd_kind)r->kind, r->bytes, r->flags);
    struct cd_bin *b = *link;
    if (b && --b->n == 0) {
        *link = b->next;
        free(b);
    }
}

/* ---- entries ----------------------------------------------------------------- */

void cd_books_defer(struct cd_ctx *c, struct cd_record *r)
{
    /* A registration's range stays pending from its first deferral until
     * its driver unregister is done (cd_books_unregistered), whoever holds
     * the entry meanwhile. */
    bool again = r->kind == CD_REGISTERED && r->pending;
    if (r->kind == CD_REGISTERED && !r->pending) {
        r->pending = true;
        note_range(r->key, r->key + r->bytes, +1);
    }
    pthread_mutex_lock(&c->lock);
    account(c, r, +1);
    cd_list_append(&c->deferred, &r->age);
    if (cd_backend((enum cd_kind)r->kind)->reusable && !atomic_load(&r->no_reuse))
        bin_add(c, r);
    pthread_mutex_unlock(&c->lock);
    /* A pending unregister back on the books (a flush held it back): a
     * registration waiting for its range may take it now. */
    if (again)
        cd_books_registered_poke();
}

bool cd_books_room(struct cd_ctx *c, const struct cd_record *r)
{
    if (r->kind == CD_DEVICE)
        return true;
    long long max_bytes = cd_option_int(CD_OPT_MAX_DEFERRED_BYTES);
    long long max_entries = cd_option_int(CD_OPT_MAX_DEFERRED_ENTRIES);
    pthread_mutex_lock(&c->lock);
    bool room = c->held_bytes + (long long)r->bytes <= max_bytes && c->held_entries < max_entries;
    pthread_mutex_unlock(&c->lock);
    return room;
}

/* Under c->lock. */
static void take_locked(struct cd_ctx *c, struct cd_record *r)
{
    if (r->claimed) {
        r->claimed = false;
        c->claims--;
    }
    bin_remove(c, r);
    cd_list_remove(&r->age);
    account(c, r, -1);
}

void cd_books_take(struct cd_ctx *c, struct cd_record *r)
{
    pthread_mutex_lock(&c->lock);
    take_locked(c, r);
    pthread_mutex_unlock(&c->lock);
}

/* Takes the entries for which want() says yes, oldest first, until it says
 * stop; under c->lock. */
static size_t take_while(struct cd_ctx *c, struct cd_link *out,
                         int (*want)(struct cd_ctx *c, struct cd_record *r, void *arg), void *arg)
{
    size_t n = 0;
    struct cd_link *e = c->deferred.next;
    while (e != &c->deferred) {
        struct cd_link *next = e->next;
        struct cd_record *r = CD_CONTAINER(e, struct cd_record, age);
        int w = want(c, r, arg);
        if (w < 0)
            break;
        if (w > 0) {
            take_locked(c, r);
            cd_list_append(out, &r->age);
            n++;
        }
        e = next;
    }
    return n;
}

static bool picked(const struct cd_take *t, const struct cd_record *r)
{
    return !r->claimed && (t->mask & (1u << r->kind)) && r->far <= t->far &&
           (!t->hi || (r->key < t->hi && t->lo < r->key + r->bytes));
}

static int want_picked(struct cd_ctx *c, struct cd_record *r, void *arg)
{
    (void)c;
    if (r->kept) {
        r->kept = false;
        return 0;
    }
    return picked(arg, r);
}

size_t cd_books_take_all(struct cd_ctx *c, const struct cd_take *t, long long *kept,
                         struct cd_link *out)
{
    struct cd_take pick = *t;
    long long left = pick.keep;
    pthread_mutex_lock(&c->lock);
    /* Newest first: the sizes the program released last are the likeliest
     * to be asked for again. Only blocks a reuse could take (in a bin,
     * fenced) are kept; the flush leaves them where they are. */
    for (struct cd_link *e = c->deferred.prev; e != &c->deferred && left > 0; e = e->prev) {
        struct cd_record *r = CD_CONTAINER(e, struct cd_record, age);
        if (r->done && cd_linked(&r->bin) && (long long)r->bytes <= left && picked(&pick, r)) {
            r->kept = true;
            left -= (long long)r->bytes;
        }
    }
    size_t n = take_while(c, out, want_picked, &pick);
    pthread_mutex_unlock(&c->lock);
    if (kept)
        *kept = pick.keep - left;
    return n;
}

struct cache_limit {
    long long bytes, blocks;
    uint64_t far;
};

static int want_over_cache(struct cd_ctx *c, struct cd_record *r, void *arg)
{
    const struct cache_limit *l = arg;
    if (c->cached_bytes <= l->bytes && c->cached_entries <= l->blocks)
        return -1;
    return r->kind == CD_DEVICE && r->done && !r->claimed && r->far <= l->far;
}

long long cd_books_device_bytes(struct cd_ctx *c)
{
    pthread_mutex_lock(&c->lock);
    long long bytes = c->cached_bytes;
    pthread_mutex_unlock(&c->lock);
    return bytes;
}

bool cd_books_over_cache(struct cd_ctx *c, long long bytes, long long blocks)
{
    pthread_mutex_lock(&c->lock);
    bool over = c->cached_bytes > bytes || c->cached_entries > blocks;
    pthread_mutex_unlock(&c->lock);
    return over;
}

size_t cd_books_take_over_cache(struct cd_ctx *c, long long bytes, long long blocks, uint64_t far,
                                struct cd_link *out)
{
    struct cache_limit l = {bytes, blocks, far};
    pthread_mutex_lock(&c->lock);
    size_t n = 0;
    if (c->cached_bytes > bytes || c->cached_entries > blocks)
        n = take_while(c, out, want_over_cache, &l);
    pthread_mutex_unlock(&c->lock);
    return n;
}

static int want_passed(struct cd_ctx *c, struct cd_record *r, void *arg)
{
    (void)c;
    bool (*pass)(struct cd_record *) = *(bool (**)(struct cd_record *))arg;
    if (r->kind != CD_DEVICE || !r->done || r->claimed)
        return 0;
    return pass(r) ? 1 : -1;
}

size_t cd_books_take_passed(struct cd_ctx *c, bool (*pass)(struct cd_record *r),
                            struct cd_link *out)
{
    pthread_mutex_lock(&c->lock);
    size_t n = take_while(c, out, want_passed, &pass);
    pthread_mutex_unlock(&c->lock);
    return n;
}

static int want_unfenced(struct cd_ctx *c, struct cd_record *r, void *arg)
{
    (void)c;
    (void)arg;
    return !r->done && !r->claimed;
}

size_t cd_books_take_unfenced(struct cd_ctx *c, struct cd_link *out)
{
    pthread_mutex_lock(&c->lock);
    size_t n = take_while(c, out, want_unfenced, NULL);
    pthread_mutex_unlock(&c->lock);
    return n;
}

struct cd_record *cd_books_claim(struct cd_ctx *c, enum cd_kind kind, size_t bytes,
                                 unsigned flags, uintptr_t max_key, bool again,
                                 size_t *depth, unsigned *streak)
{
    struct cd_record *found = NULL;
    pthread_mutex_lock(&c->lock);
    struct cd_bin *b = *bin_link(c, kind, bytes, flags);
    *depth = b ? b->n : 0;
    if (b && !again) {
        b->streak = b->refilled ? b->streak + (b->streak < UINT_MAX) : 0;
        b->refilled = false;
        b->looked = true;
    }
    *streak = b ? b->streak : 0;
    for (struct cd_link *e = b ? b->list.next : NULL; e && e != &b->list; e = e->next) {
        struct cd_record *r = CD_CONTAINER(e, struct cd_record, bin);
        if (!r->claimed && r->done && r->key < max_key && !atomic_load(&r->no_reuse)) {
            found = r;
            r->claimed = true;
            c->claims++;
            break;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return found;
}

void cd_books_unclaim(struct cd_ctx *c, struct cd_record *r)
{
    pthread_mutex_lock(&c->lock);
    if (r->claimed) {
        r->claimed = false;
        c->claims--;
    }
    pthread_mutex_unlock(&c->lock);
}

size_t cd_books_entries(struct cd_ctx *c)
{
    pthread_mutex_lock(&c->lock);
    size_t n = (size_t)(c->held_entries + c->cached_entries);
    pthread_mutex_unlock(&c->lock);
    return n;
}

bool cd_books_holds(struct cd_ctx *c, unsigned mask)
{
    bool any = false;
    pthread_mutex_lock(&c->lock);
    for (int k = 0; k < CD_KIND_COUNT && !any; k++)
        any = (mask & (1u << k)) && c->kind_entries[k] > 0;
    if (mask & (1u << CD_DEVICE))
        any = any || !cd_list_empty(&c->inflight);
    pthread_mutex_unlock(&c->lock);
    return any;
}

int cd_books_claims(struct cd_ctx *c)
{
    pthread_mutex_lock(&c->lock);
    int n = c->claims;
    pthread_mutex_unlock(&c->lock);
    return n;
}
