/* memory.c - the allocation registry and the classic memory API:
 * cuMemAlloc*, cuMemFree*, pinned host memory, managed memory,
 * registrations, pointer queries, synchronous copies and memset, and the
 * interprocess handles of cuMemAlloc memory (cuIpc*MemHandle).
 *
 * Device memory has no backing: its addresses come from a PROT_NONE
 * reservation (unique, never reused, a host dereference crashes). The
 * 32-bit cuMemAlloc / cuMemFree pair gets addresses from a second
 * reservation below 2 GiB (MAP_32BIT); without one they fail with
 * CUDA_ERROR_OUT_OF_MEMORY. Pinned host and managed memory is real host
 * memory; once released its pages become PROT_NONE and wait in a
 * quarantine of the last QUARANTINE_RANGES released ranges (a late host
 * access crashes, no allocation can alias them meanwhile); the oldest is
 * then unmapped, so that later allocations may get its addresses again, as
 * a real driver's do (and a long run does not exhaust the process's
 * mappings).
 *
 * The waiting releases (cuMemFree of device or managed memory,
 * cuMemFreeHost, cuMemHostUnregister) validate first (bad input returns
 * at once), then wait until every stream of the allocation's context is
 * idle while holding that context's launch lock (td_ctx_wait_idle). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE ((size_t)4096)

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* ------------------------------------------------------------------ */
/* Address arenas                                                      */

struct arena {
    uintptr_t next, end;
    bool tried;
};

static struct arena high_arena, low_arena;

/* Reserves the arena on first use: the largest of a few sizes that the
 * kernel grants (PROT_NONE + MAP_NORESERVE costs no memory). */
static void arena_init(struct arena *a, bool low)
{
    a->tried = true;
    static const size_t high_sizes[] = { (size_t)1 << 40, (size_t)1 << 38, (size_t)1 << 36, (size_t)1 << 34 };
    static const size_t low_sizes[] = { (size_t)1 << 30, (size_t)1 << 28, (size_t)1 << 26 };
    const size_t *sizes = low ? low_sizes : high_sizes;
    size_t n = low ? 3 : 4;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
#ifdef MAP_32BIT
    if (low)
        flags |= MAP_32BIT;
#else
    if (low)
        return;
#endif
    for (size_t i = 0; i < n; i++) {
        void *p = mmap(NULL, sizes[i], PROT_NONE, flags, -1, 0);
        if (p == MAP_FAILED)
            continue;
        if (low && (uintptr_t)p + sizes[i] > UINT32_MAX) {
            munmap(p, sizes[i]);
            continue;
        }
        a->next = (uintptr_t)p + PAGE; /* never hand out the first page */
        a->end = (uintptr_t)p + sizes[i];
        return;
    }
}

uintptr_t td_va_reserve(size_t bytes, bool low)
{
    struct arena *a = low ? &low_arena : &high_arena;
    if (!a->tried)
        arena_init(a, low);
    size_t span = round_up(bytes, PAGE) + PAGE; /* one guard page after */
    if (!a->next || span < bytes || a->end - a->next < span)
        return 0;
    uintptr_t base = a->next;
    a->next += span;
    return base;
}

void *td_host_map(size_t bytes)
{
    void *p = mmap(NULL, round_up(bytes, PAGE), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ------------------------------------------------------------------ */
/* Registry: live allocations sorted by base (ranges never overlap)    */

static struct td_alloc **reg;
static size_t reg_n, reg_cap;

/* Index of the first allocation whose base is >= p. */
static size_t reg_lower(uintptr_t p)
{
    size_t lo = 0, hi = reg_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (reg[mid]->base < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

struct td_alloc *td_alloc_at(uintptr_t p)
{
    size_t i = reg_lower(p);
    return i < reg_n && reg[i]->base == p ? reg[i] : NULL;
}

struct td_alloc *td_alloc_covering(uintptr_t p, size_t bytes)
{
    size_t i = reg_lower(p + 1);
    if (i == 0)
        return NULL;
    struct td_alloc *a = reg[i - 1];
    size_t len = bytes ? bytes : 1;
    if (p < a->base || p - a->base >= a->size || len > a->size - (p - a->base))
        return NULL;
    return a;
}

/* First live allocation overlapping [p, p + len), or NULL. */
static struct td_alloc *reg_overlap(uintptr_t p, size_t len)
{
    size_t i = reg_lower(p);
    if (i > 0 && reg[i - 1]->base + reg[i - 1]->size > p)
        return reg[i - 1];
    if (i < reg_n && reg[i]->base < p + len)
        return reg[i];
    return NULL;
}

static void reg_insert(struct td_alloc *a)
{
    if (reg_n == reg_cap) {
        reg_cap = reg_cap ? reg_cap * 2 : 256;
        struct td_alloc **v = realloc(reg, reg_cap * sizeof *v);
        if (!v)
            abort();
        reg = v;
    }
    size_t i = reg_lower(a->base);
    memmove(&reg[i + 1], &reg[i], (reg_n - i) * sizeof *reg);
    reg[i] = a;
    reg_n++;
}

static void reg_remove(struct td_alloc *a)
{
    size_t i = reg_lower(a->base);
    if (i < reg_n && reg[i] == a) {
        memmove(&reg[i], &reg[i + 1], (reg_n - i - 1) * sizeof *reg);
        reg_n--;
    }
}

static void graveyard_forget(uintptr_t base, size_t size);

struct td_alloc *td_alloc_add(uintptr_t base, size_t size, size_t span,
                              enum testdrv_kind kind, enum td_cap cap,
                              struct td_ctx *ctx)
{
    struct td_alloc *a = td_xcalloc(1, sizeof *a);
    a->base = base;
    a->size = size;
    a->span = span;
    a->kind = kind;
    a->cap = cap;
    a->ctx = ctx;
    a->id = td.next_id++;
    a->preferred = a->accessed_by = a->last_prefetch = CU_DEVICE_INVALID;
    a->linked = true;
    if (kind != TESTDRV_DEVICE) /* device addresses are never handed out again */
        graveyard_forget(base, span);
    reg_insert(a);
    td_live_add(kind, 1, (long long)size);
    return a;
}

/* ------------------------------------------------------------------ */
/* Quarantine of released host ranges                                  */

#define QUARANTINE_RANGES 4096

static struct { void *base; size_t len; } quarantine[QUARANTINE_RANGES];
static size_t quarantine_next, quarantine_n;

/* Makes [base, base + len) inaccessible and queues it; unmaps the range
 * that leaves the quarantine. */
static void quarantine_add(void *base, size_t len)
{
    mmap(base, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
    if (quarantine_n == QUARANTINE_RANGES)
        munmap(quarantine[quarantine_next].base, quarantine[quarantine_next].len);
    else
        quarantine_n++;
    quarantine[quarantine_next].base = base;
    quarantine[quarantine_next].len = len;
    quarantine_next = (quarantine_next + 1) % QUARANTINE_RANGES;
}

void td_alloc_unlink(struct td_alloc *a)
{
    if (!a->linked)
        return;
    reg_remove(a);
    a->linked = false;
    td_live_add(a->kind, -1, -(long long)a->size);
    if (a->host_backed)
        quarantine_add((void *)a->base, round_up(a->span, PAGE));
}

/* Gives bytes of an allocation of kind outside pools back to cap. */
static void give_cap_of(enum testdrv_kind kind, enum td_cap cap, size_t bytes)
{
    if (kind == TESTDRV_MANAGED)
        td_cap_give_managed(cap, bytes);
    else
        td_cap_give(cap, bytes);
}

/* Gives a's bytes back to its capacity (an imported mapping took none). */
void td_alloc_give_cap(struct td_alloc *a)
{
    if (a->imported)
        return;
    if (a->pool)
        td_cap_give(a->cap, a->size);
    else
        give_cap_of(a->kind, a->cap, a->size);
}

/* td_alloc_unlink, gives its capacity back, frees the record. */
static void alloc_destroy(struct td_alloc *a)
{
    td_alloc_unlink(a);
    td_alloc_give_cap(a);
    free(a);
}

/* ------------------------------------------------------------------ */
/* Graveyard: ranges freed by a context teardown                       */

static struct { uintptr_t base; size_t size; } *grave;
static size_t grave_n, grave_cap;

/* Remembers a range freed by a context teardown. */
static void graveyard_add(uintptr_t base, size_t size)
{
    if (grave_n == grave_cap) {
        grave_cap = grave_cap ? grave_cap * 2 : 64;
        void *v = realloc(grave, grave_cap * sizeof *grave);
        if (!v)
            abort();
        grave = v;
    }
    grave[grave_n].base = base;
    grave[grave_n].size = size;
    grave_n++;
}

/* Drops the remembered ranges that [base, base + size) reuses: the
 * addresses belong to a new allocation now. */
static void graveyard_forget(uintptr_t base, size_t size)
{
    for (size_t i = grave_n; i-- > 0;)
        if (grave[i].base < base + size && base < grave[i].base + grave[i].size)
            grave[i] = grave[--grave_n];
}

bool td_graveyard_has(uintptr_t p)
{
    for (size_t i = 0; i < grave_n; i++)
        if (p >= grave[i].base && p - grave[i].base < grave[i].size)
            return true;
    return false;
}

/* Unknown pointer passed to a release: counts a dead-context call if it
 * belonged to a torn-down context. Returns rc. */
static CUresult unknown_pointer(uintptr_t p, CUresult rc)
{
    if (td_graveyard_has(p))
        td_dead_call();
    return rc;
}

size_t td_live_sized(enum testdrv_kind kind, size_t bytes)
{
    size_t n = 0;
    for (size_t i = 0; i < reg_n; i++)
        n += reg[i]->kind == kind && reg[i]->size == bytes && !reg[i]->imported;
    return n;
}

void td_mem_teardown_ctx(struct td_ctx *ctx)
{
    for (size_t i = reg_n; i-- > 0;) {
        struct td_alloc *a = reg[i];
        if (!a->owned || a->ctx != ctx)
            continue;
        graveyard_add(a->base, a->size);
        td_alloc_unlink(a);
        td_alloc_give_cap(a);
        if (a->busy)
            a->torn = true; /* its pending release frees the record */
        else
            free(a);
    }
}

/* ------------------------------------------------------------------ */
/* Allocation                                                          */

/* The rest of an allocating call whose arguments passed (td.mu held): a
 * usable current context and the capture rules (td_cur_ctx_unsafe), a
 * non-zero size, then a context-owned allocation of kind (DEVICE, HOST or
 * MANAGED); its base goes to *base_out. With a green context current the
 * memory belongs to its primary context (measured on an H200, driver
 * 580.159.04, 2026-12-01, tests/gpu/facts.c green). */
static CUresult alloc_new(enum testdrv_kind kind, size_t size, unsigned flags, bool low,
                          uintptr_t *base_out)
{
    struct td_ctx *c;
    CUresult rc = td_cur_ctx_unsafe(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    enum td_cap cap = kind == TESTDRV_HOST ? TD_CAP_HOST : td_cap_dev(c->dev);
    if (!(kind == TESTDRV_MANAGED ? td_cap_take_managed(cap, size) : td_cap_take(cap, size)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base;
    if (kind == TESTDRV_DEVICE)
        base = td_va_reserve(size, low);
    else
        base = (uintptr_t)td_host_map(size);
    if (!base) {
        give_cap_of(kind, cap, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* The new pages may land where a registration still is whose pages
     * the program has unmapped without unregistering them: the driver
     * refuses the mapping (measured on an H200, driver 580.159.04,
     * 2026-12-03, tests/gpu/facts.c unmapped: cuMemAllocHost and
     * cuMemHostAlloc answer ALREADY_MAPPED, cuMemAllocManaged
     * INVALID_VALUE; each succeeds at the same address once the
     * registration is undone). */
    if (kind != TESTDRV_DEVICE && reg_overlap(base, size)) {
        munmap((void *)base, round_up(size, PAGE));
        give_cap_of(kind, cap, size);
        return kind == TESTDRV_HOST ? CUDA_ERROR_ALREADY_MAPPED : CUDA_ERROR_INVALID_VALUE;
    }
    struct td_alloc *a = td_alloc_add(base, size, size, kind, cap, td_ctx_root(c));
    a->owned = true;
    a->flags = flags;
    a->low = low;
    a->host_backed = kind != TESTDRV_DEVICE;
    *base_out = a->base;
    return CUDA_SUCCESS;
}

/* testdrv_map_device_at (testdriver.h): device memory at a chosen address
 * that no live allocation covers (the caller's: one the driver handed out
 * before), made by no call the shim wraps; freed by cuMemFree like any. */
TD_EXPORT CUresult testdrv_map_device_at(CUdeviceptr at, size_t bytes)
{
    CUresult rc = td_enter_args(at && bytes);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_ctx *c;
    if ((rc = td_cur_ctx_usable(&c)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (reg_overlap((uintptr_t)at, bytes))
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    enum td_cap cap = td_cap_dev(c->dev);
    if (!td_cap_take(cap, bytes))
        return td_leave(CUDA_ERROR_OUT_OF_MEMORY);
    graveyard_forget((uintptr_t)at, bytes);
    struct td_alloc *a = td_alloc_add((uintptr_t)at, bytes, bytes, TESTDRV_DEVICE, cap,
                                      td_ctx_root(c));
    a->owned = true;
    return td_leave(CUDA_SUCCESS);
}

/* cuMemAlloc*: device memory of the current context. */
static CUresult mem_alloc(uintptr_t *out, size_t size, bool low)
{
    CUresult rc = td_enter_args(out != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    return td_leave_alloc(alloc_new(TESTDRV_DEVICE, size, 0, low, out), TESTDRV_DEVICE);
}

TD_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    TD_COUNT(cuMemAlloc_v2);
    uintptr_t p = 0;
    CUresult rc = mem_alloc(dptr ? &p : NULL, bytesize, false);
    if (rc == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)p;
    return rc;
}

TD_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    TD_COUNT(cuMemAlloc);
    uintptr_t p = 0;
    CUresult rc = mem_alloc(dptr ? &p : NULL, bytesize, true);
    if (rc == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)p;
    return rc;
}

/* cuMemAllocPitch*: rows padded to 512 bytes; element size 4, 8 or 16. */
static CUresult mem_alloc_pitch(uintptr_t *out, size_t *pitch, size_t width, size_t height,
                                unsigned elem, bool low)
{
    if (!out || !pitch || width == 0 || height == 0 ||
        (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = round_up(width, 512);
    if (height > SIZE_MAX / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = mem_alloc(out, p * height, low);
    if (rc == CUDA_SUCCESS)
        *pitch = p;
    return rc;
}

TD_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                      size_t Height, unsigned int ElementSizeBytes)
{
    TD_COUNT(cuMemAllocPitch_v2);
    uintptr_t p = 0;
    CUresult rc = mem_alloc_pitch(dptr ? &p : NULL, pPitch, WidthInBytes, Height,
                                  ElementSizeBytes, false);
    if (rc == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)p;
    return rc;
}

TD_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch,
                                   unsigned int WidthInBytes, unsigned int Height,
                                   unsigned int ElementSizeBytes)
{
    TD_COUNT(cuMemAllocPitch);
    uintptr_t p = 0;
    size_t pitch = 0;
    CUresult rc = mem_alloc_pitch(dptr ? &p : NULL, pPitch ? &pitch : NULL, WidthInBytes,
                                  Height, ElementSizeBytes, true);
    if (rc == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)p;
        *pPitch = (unsigned)pitch;
    }
    return rc;
}

/* cuMemAllocHost / cuMemHostAlloc: pinned host memory (host capacity). */
static CUresult host_alloc(void **pp, size_t size, unsigned flags)
{
    const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                           CU_MEMHOSTALLOC_WRITECOMBINED;
    CUresult rc = td_enter_args(pp && !(flags & ~known));
    if (rc != CUDA_SUCCESS)
        return rc;
    uintptr_t base;
    if ((rc = alloc_new(TESTDRV_HOST, size, flags, false, &base)) == CUDA_SUCCESS)
        *pp = (void *)base;
    return td_leave_alloc(rc, TESTDRV_HOST);
}

TD_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    TD_COUNT(cuMemAllocHost_v2);
    return host_alloc(pp, bytesize, 0);
}

TD_EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
    TD_COUNT(cuMemAllocHost);
    return host_alloc(pp, bytesize, 0);
}

TD_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    TD_COUNT(cuMemHostAlloc);
    return host_alloc(pp, bytesize, Flags);
}

/* cuMemAllocManaged: host-accessible memory counted as device memory. */
TD_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    TD_COUNT(cuMemAllocManaged);
    CUresult rc = td_enter_args(dptr &&
                                (flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST));
    if (rc != CUDA_SUCCESS)
        return rc;
    uintptr_t base;
    if ((rc = alloc_new(TESTDRV_MANAGED, bytesize, flags, false, &base)) == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)base;
    return td_leave_alloc(rc, TESTDRV_MANAGED);
}

/* cuMemHostRegister*: pins [p, p + size) of the program's memory (host
 * capacity). Overlapping any pinned range fails with
 * CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED. Does not wait. The
 * registration belongs to the current context (its root): the context's
 * destruction undoes it (td_mem_teardown_ctx), after which the range is
 * unknown to cuMemHostUnregister (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
 * and can be registered again, in another context too (measured on an
 * H200, driver 580.159.04, 2026-12-01, tests/gpu/facts.c register). */
static CUresult host_register(void *p, size_t size, unsigned flags)
{
    struct td_ctx *c;
    CUresult rc = td_enter_unsafe(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!p || size == 0 || (flags & ~0x0Fu) || (uintptr_t)p + size < (uintptr_t)p)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (reg_overlap((uintptr_t)p, size))
        return td_leave(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    if (!td_cap_take(TD_CAP_HOST, size))
        return td_leave(CUDA_ERROR_OUT_OF_MEMORY);
    struct td_alloc *a = td_alloc_add((uintptr_t)p, size, size, TESTDRV_REGISTERED,
                                      TD_CAP_HOST, td_ctx_root(c));
    a->owned = true;
    a->flags = flags;
    return td_leave_alloc(CUDA_SUCCESS, TESTDRV_REGISTERED);
}

TD_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    TD_COUNT(cuMemHostRegister_v2);
    return host_register(p, bytesize, Flags);
}

TD_EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    TD_COUNT(cuMemHostRegister);
    return host_register(p, bytesize, Flags);
}

/* ------------------------------------------------------------------ */
/* Waiting releases                                                    */

/* Second half of a waiting release of a validated allocation: the sticky
 * error of its context, else waits for that context (or cur, for pool
 * memory whose context is gone) with the launch lock held, then releases
 * it. */
static CUresult release_wait_and_free(struct td_alloc *a, struct td_ctx *cur)
{
    struct td_ctx *wctx = a->ctx && a->ctx->alive ? a->ctx : cur;
    if (wctx && wctx->sticky != CUDA_SUCCESS)
        return wctx->sticky;
    a->busy = true;
    if (wctx)
        td_ctx_wait_idle(wctx, true);
    if (a->torn) {
        free(a);
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    if (a->pool)
        td_pool_free_now(a);
    else
        alloc_destroy(a);
    return CUDA_SUCCESS;
}

/* A waiting release by base address (cuMemFree*, cuMemFreeHost); may
 * wait. p 0 is CUDA_SUCCESS; CUDA_ERROR_INVALID_VALUE for a p that is not
 * the base of a live allocation (see unknown_pointer), for an allocation
 * whose release is under way and for one that takes(a) refuses. */
static CUresult release_at(uintptr_t p, bool (*takes)(const struct td_alloc *a))
{
    struct td_ctx *c;
    CUresult rc = td_enter_release(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (p == 0)
        return td_leave(CUDA_SUCCESS);
    struct td_alloc *a = td_alloc_at(p);
    if (!a)
        return td_leave(unknown_pointer(p, CUDA_ERROR_INVALID_VALUE));
    if (a->busy || !takes(a))
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    return td_leave(release_wait_and_free(a, c));
}

/* cuMemFree* takes device, pool or managed memory (not host pool memory,
 * nor another process's memory opened by cuIpcOpenMemHandle_v2, which only
 * cuIpcCloseMemHandle unmaps: a guess, not measured), by its base address;
 * no current context needed (see td_enter_release). */
static bool mem_free_takes(const struct td_alloc *a)
{
    return (a->kind == TESTDRV_DEVICE || a->kind == TESTDRV_MANAGED) &&
           !(a->pool && a->pool->kind == TESTDRV_HOST) && !a->imported;
}

TD_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    TD_COUNT(cuMemFree_v2);
    return release_at((uintptr_t)dptr, mem_free_takes);
}

TD_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    TD_COUNT(cuMemFree);
    return release_at((uintptr_t)dptr, mem_free_takes);
}

/* cuMemFreeHost takes pinned memory of cuMemAllocHost / cuMemHostAlloc. */
static bool free_host_takes(const struct td_alloc *a)
{
    return a->kind == TESTDRV_HOST && !a->pool;
}

/* cuMemFreeHost: memory from cuMemAllocHost / cuMemHostAlloc only; no
 * current context needed (a guess by analogy with cuMemFree). NULL is
 * CUDA_SUCCESS, free(NULL) semantics (measured on an RTX 4090, driver
 * 590.48.01, by lupinemachines/lupine#850; cudaFreeHost(NULL) forwards it;
 * and on an H200, driver 580.159.04, 2026-11-29, by tests/gpu/conform.c). */
TD_EXPORT CUresult cuMemFreeHost(void *p)
{
    TD_COUNT(cuMemFreeHost);
    return release_at((uintptr_t)p, free_host_takes);
}

/* cuMemHostUnregister: p must be the base of a registration; no current
 * context needed (a guess by analogy with cuMemFree). Measured on an H200,
 * driver 580.159.04, 2026-11-29 (tests/gpu/conform.c): NULL is
 * CUDA_ERROR_INVALID_VALUE (as on an RTX 4090, lupinemachines/lupine#858);
 * so is an address the driver knows that is not the base of a
 * registration: inside a registration, pinned by cuMemAllocHost, device
 * memory. Only an address of no allocation (never registered, or
 * unregistered already) is CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED. */
TD_EXPORT CUresult cuMemHostUnregister(void *p)
{
    TD_COUNT(cuMemHostUnregister);
    struct td_ctx *c;
    CUresult rc = td_enter_release(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!p)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    struct td_alloc *a = td_alloc_at((uintptr_t)p);
    if (a && a->kind == TESTDRV_REGISTERED && !a->busy)
        return td_leave(release_wait_and_free(a, c));
    if (a && a->kind == TESTDRV_REGISTERED) /* its unregister is under way */
        return td_leave(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    if (td_alloc_covering((uintptr_t)p, 0))
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    return td_leave(unknown_pointer((uintptr_t)p, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED));
}

/* ------------------------------------------------------------------ */
/* Queries                                                             */

/* td_enter_args, then a usable current context (which the query itself
 * does not use): the front of the memory queries. */
static CUresult query_enter_ctx(bool args_ok, struct td_ctx **c)
{
    CUresult rc = td_enter_args(args_ok);
    if (rc == CUDA_SUCCESS && (rc = td_cur_ctx_usable(c)) != CUDA_SUCCESS)
        td_leave(rc);
    return rc;
}

static CUresult query_enter(bool args_ok)
{
    struct td_ctx *c;
    return query_enter_ctx(args_ok, &c);
}

static CUresult mem_get_info(size_t *free_b, size_t *total_b)
{
    struct td_ctx *c;
    CUresult rc = query_enter_ctx(free_b && total_b, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* The current context's device (a green context's is its primary's). */
    enum td_cap cap = td_cap_dev(c->dev);
    *total_b = td.cap_total[cap];
    *free_b = *total_b - td.cap_used[cap];
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    TD_COUNT(cuMemGetInfo_v2);
    return mem_get_info(free, total);
}

static unsigned clamp_u32(size_t v) { return v > UINT32_MAX ? UINT32_MAX : (unsigned)v; }

TD_EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    TD_COUNT(cuMemGetInfo);
    size_t f = 0, t = 0;
    CUresult rc = mem_get_info(free ? &f : NULL, total ? &t : NULL);
    if (rc == CUDA_SUCCESS) {
        *free = clamp_u32(f);
        *total = clamp_u32(t);
    }
    return rc;
}

/* Base and size of the allocation containing p (either output may be
 * NULL); CUDA_ERROR_NOT_FOUND for a pointer of no live allocation. */
static CUresult get_address_range(uintptr_t *pbase, size_t *psize, uintptr_t p)
{
    CUresult rc = query_enter(true);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = td_alloc_covering(p, 0);
    if (!a)
        return td_leave(unknown_pointer(p, CUDA_ERROR_NOT_FOUND));
    if (pbase)
        *pbase = a->base;
    if (psize)
        *psize = a->size;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    TD_COUNT(cuMemGetAddressRange_v2);
    uintptr_t b = 0;
    CUresult rc = get_address_range(&b, psize, (uintptr_t)dptr);
    if (rc == CUDA_SUCCESS && pbase)
        *pbase = (CUdeviceptr)b;
    return rc;
}

TD_EXPORT CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize,
                                        CUdeviceptr_v1 dptr)
{
    TD_COUNT(cuMemGetAddressRange);
    uintptr_t b = 0;
    size_t s = 0;
    CUresult rc = get_address_range(&b, &s, (uintptr_t)dptr);
    if (rc == CUDA_SUCCESS) {
        if (pbase)
            *pbase = (CUdeviceptr_v1)b;
        if (psize)
            *psize = clamp_u32(s);
    }
    return rc;
}

TD_EXPORT CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
    TD_COUNT(cuMemHostGetFlags);
    CUresult rc = query_enter(pFlags != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = td_alloc_covering((uintptr_t)p, 0);
    if (!a || a->kind != TESTDRV_HOST)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    *pFlags = a->flags;
    return td_leave(CUDA_SUCCESS);
}

/* Pinned and registered memory is mapped at the same address on the
 * device (unified addressing). */
static CUresult host_get_device_pointer(uintptr_t *out, void *p, unsigned flags)
{
    CUresult rc = query_enter(out && flags == 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = td_alloc_covering((uintptr_t)p, 0);
    if (!a || (a->kind != TESTDRV_HOST && a->kind != TESTDRV_REGISTERED))
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    *out = (uintptr_t)p;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    TD_COUNT(cuMemHostGetDevicePointer_v2);
    uintptr_t d = 0;
    CUresult rc = host_get_device_pointer(pdptr ? &d : NULL, p, Flags);
    if (rc == CUDA_SUCCESS)
        *pdptr = (CUdeviceptr)d;
    return rc;
}

TD_EXPORT CUresult cuMemHostGetDevicePointer(CUdeviceptr_v1 *pdptr, void *p, unsigned int Flags)
{
    TD_COUNT(cuMemHostGetDevicePointer);
    uintptr_t d = 0;
    CUresult rc = host_get_device_pointer(pdptr ? &d : NULL, p, Flags);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (d > UINT32_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr_v1)d;
    return rc;
}

/* Writes one pointer attribute of allocation a (p inside it). */
static CUresult pointer_attribute(void *data, CUpointer_attribute attr, struct td_alloc *a,
                                  uintptr_t p)
{
    bool host_visible = a->kind != TESTDRV_DEVICE;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = (CUcontext)a->ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = a->kind == TESTDRV_HOST || a->kind == TESTDRV_REGISTERED
                                ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = (CUdeviceptr)p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!host_visible)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = a->id;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned *)data = a->kind == TESTDRV_MANAGED;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a->ctx ? a->ctx->dev : 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)a->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = a->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned *)data = 1;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: /* 4 bytes written (measured) */
        *(unsigned *)data = a->sync_memops;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(CUmemoryPool *)data = (CUmemoryPool)a->pool;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

TD_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    TD_COUNT(cuPointerGetAttribute);
    CUresult rc = td_enter_args(data != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = td_alloc_covering((uintptr_t)ptr, 0);
    if (!a)
        return td_leave(unknown_pointer((uintptr_t)ptr, CUDA_ERROR_INVALID_VALUE));
    return td_leave(pointer_attribute(data, attribute, a, (uintptr_t)ptr));
}

/* What cuPointerGetAttributes writes for an attribute it has no value for
 * (a pointer of no live allocation, freed memory included): measured on an
 * H200, driver 580.159.04, 2026-12-01 (tests/gpu/facts.c freed): MEMORY_TYPE
 * 0 and CONTEXT NULL written, RANGE_SIZE left unwritten. The others follow
 * cuda.h ("default NULL values"), except RANGE_START_ADDR and
 * DEVICE_ORDINAL, left unwritten like RANGE_SIZE (not measured).
 * CUDA_ERROR_INVALID_VALUE for an unknown attribute. */
static CUresult pointer_default(void *data, CUpointer_attribute attr)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = NULL;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        *(unsigned *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *(void **)data = NULL;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(CUmemoryPool *)data = NULL;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* cuPointerGetAttributes: unlike cuPointerGetAttribute, a pointer of no
 * live allocation is CUDA_SUCCESS with default values (pointer_default);
 * so is an attribute that does not apply to the allocation (the host
 * pointer of device memory). */
TD_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                          CUpointer_attribute *attributes, void **data,
                                          CUdeviceptr ptr)
{
    TD_COUNT(cuPointerGetAttributes);
    CUresult rc = td_enter_args(numAttributes > 0 && attributes && data);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = td_alloc_covering((uintptr_t)ptr, 0);
    if (!a)
        unknown_pointer((uintptr_t)ptr, CUDA_SUCCESS);
    for (unsigned i = 0; i < numAttributes && rc == CUDA_SUCCESS; i++) {
        if (!data[i])
            rc = CUDA_ERROR_INVALID_VALUE;
        else if (!a || pointer_attribute(data[i], attributes[i], a, (uintptr_t)ptr) != CUDA_SUCCESS)
            rc = pointer_default(data[i], attributes[i]);
    }
    return td_leave(rc);
}

/* ------------------------------------------------------------------ */
/* Synchronous copies and memset                                       */

/* The stream a synchronous copy or memset runs on (legacy, or the
 * per-thread stream for _ptds), after the capture rules. A capturing
 * per-thread stream cannot take a synchronous operation. */
static CUresult sync_op_stream(bool ptds, struct td_stream **out)
{
    CUresult rc = td_stream_get(NULL, ptds, out);
    if (rc != CUDA_SUCCESS)
        return rc;
    bool captured;
    if ((rc = td_stream_submit_check(*out, &captured)) != CUDA_SUCCESS)
        return rc;
    if (captured) {
        td_capture_invalidate((*out)->capture);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return CUDA_SUCCESS;
}

/* A synchronous copy's place on the legacy (or per-thread) stream: an
 * ordering point queued there, and waited for (td.mu dropped meanwhile). */
static CUresult sync_point(bool ptds)
{
    struct td_stream *s;
    CUresult rc;
    if ((rc = sync_op_stream(ptds, &s)) != CUDA_SUCCESS ||
        (rc = td_stream_enqueue(s, td_op_new(TD_OP_NOP))) != CUDA_SUCCESS)
        return rc;
    struct td_deps deps = { 0 };
    td_deps_add(&deps, s, s->submitted);
    td_wait_deps(&deps);
    td_deps_free(&deps);
    return CUDA_SUCCESS;
}

/* cuMemcpyHtoD / DtoH: the device range must lie in one live allocation;
 * the copy is ordered on the legacy (or per-thread) stream and the call
 * returns once it ran. Host-backed memory (managed, pinned) is really
 * copied; plain device memory has no contents (DtoH leaves dst as is). */
static CUresult sync_copy(uintptr_t dev, void *host, size_t n, bool to_device, bool ptds)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    td_note_wait_call();
    struct td_ctx *c;
    if ((rc = td_cur_ctx_unsafe(&c)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (n == 0)
        return td_leave(CUDA_SUCCESS);
    if (!host || !td_alloc_covering(dev, n))
        return td_leave(unknown_pointer(dev, CUDA_ERROR_INVALID_VALUE));
    if ((rc = sync_point(ptds)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_alloc *a = td_alloc_covering(dev, n);
    if (a && a->host_backed)
        memcpy(to_device ? (void *)dev : host, to_device ? host : (void *)dev, n);
    return td_leave(c->sticky);
}

TD_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    TD_COUNT(cuMemcpyHtoD_v2);
    return sync_copy((uintptr_t)dstDevice, (void *)srcHost, ByteCount, true, false);
}

TD_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    TD_COUNT(cuMemcpyHtoD_v2_ptds);
    return sync_copy((uintptr_t)dstDevice, (void *)srcHost, ByteCount, true, true);
}

TD_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount)
{
    TD_COUNT(cuMemcpyHtoD);
    return sync_copy((uintptr_t)dstDevice, (void *)srcHost, ByteCount, true, false);
}

TD_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    TD_COUNT(cuMemcpyDtoH_v2);
    return sync_copy((uintptr_t)srcDevice, dstHost, ByteCount, false, false);
}

TD_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    TD_COUNT(cuMemcpyDtoH_v2_ptds);
    return sync_copy((uintptr_t)srcDevice, dstHost, ByteCount, false, true);
}

TD_EXPORT CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
    TD_COUNT(cuMemcpyDtoH);
    return sync_copy((uintptr_t)srcDevice, dstHost, ByteCount, false, false);
}

/* cuMemcpyHtoA / AtoH: the range must lie in a live array of this driver
 * (a released or unknown handle: CUDA_ERROR_INVALID_HANDLE, a range past
 * its end or no host pointer: CUDA_ERROR_INVALID_VALUE); ordered on the
 * legacy (or per-thread) stream like cuMemcpyHtoD, and the call returns
 * once it ran. The array keeps what is copied into it (made at the first
 * copy in; never written, it reads as zeros). */
static CUresult array_copy(CUarray h, size_t offset, void *host, size_t n, bool to_array,
                           bool ptds)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    td_note_wait_call();
    struct td_ctx *c;
    struct td_obj *o;
    if ((rc = td_cur_ctx_unsafe(&c)) != CUDA_SUCCESS ||
        (rc = td_obj_get(h, TD_OBJ_ARRAY, &o)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_array *a = (struct td_array *)o;
    if (!host || offset > a->bytes || n > a->bytes - offset)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (n == 0)
        return td_leave(CUDA_SUCCESS);
    if ((rc = sync_point(ptds)) != CUDA_SUCCESS)
        return td_leave(rc);
    /* Destroyed meanwhile by another thread: nothing to copy. */
    if (a->h.released)
        return td_leave(CUDA_ERROR_INVALID_HANDLE);
    if (to_array) {
        if (!a->data)
            a->data = td_xcalloc(1, a->bytes);
        memcpy(a->data + offset, host, n);
    } else if (a->data) {
        memcpy(host, a->data + offset, n);
    } else {
        memset(host, 0, n);
    }
    return td_leave(c->sticky);
}

TD_EXPORT CUresult cuMemcpyHtoA_v2(CUarray dstArray, size_t dstOffset, const void *srcHost,
                                   size_t ByteCount)
{
    TD_COUNT(cuMemcpyHtoA_v2);
    return array_copy(dstArray, dstOffset, (void *)srcHost, ByteCount, true, false);
}

TD_EXPORT CUresult cuMemcpyHtoA_v2_ptds(CUarray dstArray, size_t dstOffset, const void *srcHost,
                                        size_t ByteCount)
{
    TD_COUNT(cuMemcpyHtoA_v2_ptds);
    return array_copy(dstArray, dstOffset, (void *)srcHost, ByteCount, true, true);
}

TD_EXPORT CUresult cuMemcpyAtoH_v2(void *dstHost, CUarray srcArray, size_t srcOffset,
                                   size_t ByteCount)
{
    TD_COUNT(cuMemcpyAtoH_v2);
    return array_copy(srcArray, srcOffset, dstHost, ByteCount, false, false);
}

TD_EXPORT CUresult cuMemcpyAtoH_v2_ptds(void *dstHost, CUarray srcArray, size_t srcOffset,
                                        size_t ByteCount)
{
    TD_COUNT(cuMemcpyAtoH_v2_ptds);
    return array_copy(srcArray, srcOffset, dstHost, ByteCount, false, true);
}

/* cuMemsetD8: validates the range and queues an ordering point on the
 * legacy (or per-thread) stream without waiting; host-backed memory is
 * set at once. */
static CUresult memset_d8(uintptr_t dev, unsigned char v, size_t n, bool ptds)
{
    struct td_ctx *c;
    struct td_stream *s;
    CUresult rc = td_enter_unsafe(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (n == 0)
        return td_leave(CUDA_SUCCESS);
    struct td_alloc *a = td_alloc_covering(dev, n);
    if (!a)
        return td_leave(unknown_pointer(dev, CUDA_ERROR_INVALID_VALUE));
    if ((rc = sync_op_stream(ptds, &s)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (a->host_backed)
        memset((void *)dev, v, n);
    return td_leave(td_stream_enqueue(s, td_op_new(TD_OP_NOP)));
}

TD_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    TD_COUNT(cuMemsetD8_v2);
    return memset_d8((uintptr_t)dstDevice, uc, N, false);
}

TD_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    TD_COUNT(cuMemsetD8_v2_ptds);
    return memset_d8((uintptr_t)dstDevice, uc, N, true);
}

TD_EXPORT CUresult cuMemsetD8(CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N)
{
    TD_COUNT(cuMemsetD8);
    return memset_d8((uintptr_t)dstDevice, uc, N, false);
}

/* cuMemsetD8Async, D16, D32: a range not within one allocation of this
 * driver gets CUDA_ERROR_INVALID_VALUE at the call, as cuMemsetD8; a
 * D16 or D32 address not aligned to its width, CUDA_ERROR_INVALID_VALUE.
 * The fill is queued like a kernel (it waits at a waiting release's
 * launch gate, a capture records it) and made when the stream reaches it
 * (td_memset_run: into host-backed memory; the range freed meanwhile
 * faults the context). */
static CUresult memset_async(uintptr_t dev, uint32_t v, unsigned width, size_t count, CUstream h,
                             bool ptsz)
{
    struct td_ctx *c;
    CUresult rc = td_enter_unsafe(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (dev % width)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (count == 0)
        return td_leave(CUDA_SUCCESS);
    if (!td_alloc_covering(dev, count * width))
        return td_leave(unknown_pointer(dev, CUDA_ERROR_INVALID_VALUE));
    struct td_op *op = td_op_new(TD_OP_MEMSET);
    op->u.memset.addr = dev;
    op->u.memset.value = v;
    op->u.memset.width = width;
    op->u.memset.count = count;
    return td_leave(td_launch_op(h, ptsz, NULL, op));
}

/* The six entry points: D8, D16 and D32, each also per-thread. */
#define MEMSET_ASYNC(name, type, width, ptsz)                                           \
    TD_EXPORT CUresult name(CUdeviceptr dstDevice, type value, size_t N, CUstream hStream) \
    {                                                                                   \
        TD_COUNT(name);                                                                 \
        return memset_async((uintptr_t)dstDevice, value, width, N, hStream, ptsz);      \
    }

MEMSET_ASYNC(cuMemsetD8Async, unsigned char, 1, false)
MEMSET_ASYNC(cuMemsetD8Async_ptsz, unsigned char, 1, true)
MEMSET_ASYNC(cuMemsetD16Async, unsigned short, 2, false)
MEMSET_ASYNC(cuMemsetD16Async_ptsz, unsigned short, 2, true)
MEMSET_ASYNC(cuMemsetD32Async, unsigned int, 4, false)
MEMSET_ASYNC(cuMemsetD32Async_ptsz, unsigned int, 4, true)

/* ------------------------------------------------------------------ */
/* Interprocess memory handles                                         */

#define IPC_MAGIC "tdipc01"

/* What a CUipcMemHandle of this driver holds: the exporting process and
 * its allocation (ids are never reused, so a handle names one allocation,
 * as the real driver's do even when an address comes back). */
struct ipc_handle {
    char magic[8];
    uint64_t pid;
    uint64_t id;
    uint64_t size;
    uint64_t dev;
};

_Static_assert(sizeof(struct ipc_handle) <= sizeof(((CUipcMemHandle *)0)->reserved),
               "an IPC handle holds 64 bytes");

/* cuIpcGetMemHandle: dptr must be the base of a live cuMemAlloc*
 * allocation of the current context (root): anything else - inside one,
 * pool, managed or pinned memory, another context's memory, memory opened
 * from another process, freed memory - is CUDA_ERROR_INVALID_VALUE. The
 * same allocation always gives the same handle. Does not wait. */
TD_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    TD_COUNT(cuIpcGetMemHandle);
    struct td_ctx *c;
    CUresult rc = td_enter_args(pHandle != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_cur_ctx_usable(&c)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_alloc *a = td_alloc_at((uintptr_t)dptr);
    if (!a)
        return td_leave(unknown_pointer((uintptr_t)dptr, CUDA_ERROR_INVALID_VALUE));
    if (a->kind != TESTDRV_DEVICE || a->pool || a->imported || a->busy ||
        a->ctx != td_ctx_root(c))
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    struct ipc_handle h = { .pid = (uint64_t)getpid(), .id = a->id, .size = a->size,
                            .dev = (uint64_t)a->ctx->dev };
    memcpy(h.magic, IPC_MAGIC, sizeof h.magic);
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &h, sizeof h);
    return td_leave(CUDA_SUCCESS);
}

/* The mapping of handle h already open in ctx, or NULL. */
static struct td_alloc *ipc_open_mapping(const struct ipc_handle *h, struct td_ctx *ctx)
{
    for (size_t i = 0; i < reg_n; i++)
        if (reg[i]->imported && reg[i]->ctx == ctx && reg[i]->ipc_pid == h->pid &&
            reg[i]->ipc_id == h->id)
            return reg[i];
    return NULL;
}

/* cuIpcOpenMemHandle_v2: maps another process's allocation into the
 * current context at a fresh address (no contents, like all device
 * memory here); opening it again in that context gives the same address
 * and one more reference. A handle this process exported is refused with
 * CUDA_ERROR_INVALID_CONTEXT ("invalid device context", as reported from
 * the real driver by openucx/ucx#11603; not measured here); bytes that
 * are no handle of this driver are CUDA_ERROR_INVALID_VALUE (a guess).
 * Whether the exporter still lives is not checked. Does not wait. */
static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    struct td_ctx *c;
    CUresult rc = td_enter_args(pdptr && !(Flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_cur_ctx_usable(&c)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct ipc_handle h;
    memcpy(&h, handle.reserved, sizeof h);
    if (memcmp(h.magic, IPC_MAGIC, sizeof h.magic) != 0 || h.size == 0 ||
        h.dev >= (uint64_t)td.ndevices)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (h.pid == (uint64_t)getpid())
        return td_leave(CUDA_ERROR_INVALID_CONTEXT);
    struct td_ctx *root = td_ctx_root(c);
    struct td_alloc *a = ipc_open_mapping(&h, root);
    if (!a) {
        uintptr_t base = td_va_reserve(h.size, false);
        if (!base)
            return td_leave(CUDA_ERROR_MAP_FAILED);
        a = td_alloc_add(base, h.size, h.size, TESTDRV_DEVICE, td_cap_dev(root->dev), root);
        a->owned = true; /* the context's destruction unmaps it */
        a->imported = true;
        a->ipc_pid = h.pid;
        a->ipc_id = h.id;
    }
    a->ipc_opens++;
    *pdptr = (CUdeviceptr)a->base;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                         unsigned int Flags)
{
    TD_COUNT(cuIpcOpenMemHandle_v2);
    return ipc_open(pdptr, handle, Flags);
}

/* The name of drivers before 11.0, the same call. */
TD_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                      unsigned int Flags)
{
    TD_COUNT(cuIpcOpenMemHandle);
    return ipc_open(pdptr, handle, Flags);
}

/* cuIpcCloseMemHandle: one reference of a mapping cuIpcOpenMemHandle_v2
 * made, unmapped with its last; anything else is CUDA_ERROR_INVALID_VALUE.
 * Needs a current context (without one: CUDA_ERROR_INVALID_CONTEXT, as
 * reported by openucx/ucx#10618). Does not wait (a guess: the exporter's
 * memory is not freed by it). */
TD_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    TD_COUNT(cuIpcCloseMemHandle);
    struct td_ctx *c;
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_cur_ctx_usable(&c)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_alloc *a = td_alloc_at((uintptr_t)dptr);
    if (!a)
        return td_leave(unknown_pointer((uintptr_t)dptr, CUDA_ERROR_INVALID_VALUE));
    if (!a->imported)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (--a->ipc_opens == 0)
        alloc_destroy(a);
    return td_leave(CUDA_SUCCESS);
}
