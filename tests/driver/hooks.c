/* hooks.c - simulated kernels and the testdrv_* hooks of testdriver.h.
 *
 * A kernel runs on its stream's worker: it sleeps in slices of at most
 * 1 ms and touches its memory range before the first slice and after
 * every slice (so also once at its end). A touch of memory that is not
 * live (freed, unregistered, never allocated) is a fault: counted, and
 * the context gets the sticky CUDA_ERROR_ILLEGAL_ADDRESS, with every
 * context of its device (td_ctx_set_sticky); the kernel stops there.
 * Kernels of a context with a sticky error end at once.
 *
 * A writing kernel (TESTDRV_WRITE) over host memory - pinned, managed or
 * registered - really writes: at each touch it stores TESTDRV_STAMP in
 * the first aligned word of the range in every 4 KiB page the range
 * covers, as the real GPU overwrites them (a program that reuses pages the
 * GPU may still write sees it). The words are written by the kernel
 * (process_vm_writev), not by C stores: that is no data race in the C
 * sense, it cannot crash on a page the program unmapped while its
 * registration was still live (the write is skipped), and ThreadSanitizer
 * does not report a simulated GPU as a thread. Where that system call is
 * refused, relaxed atomic stores write the driver's own memory (pinned,
 * managed) and registered memory is left alone. */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define TOUCH_SLICE_NS 1000000u
#define SPIN_POLL_NS 50000u
#define STAMP_PAGE ((uintptr_t)4096)
#define STAMP_BATCH 256 /* words per system call (below IOV_MAX) */

/* ------------------------------------------------------------------ */
/* Kernels                                                             */

/* process_vm_writev works here (false once refused); td.mu guards it. */
static bool vm_write_ok = true;

/* Stores TESTDRV_STAMP at each of the n words of remote (4 bytes each),
 * skipping those the process cannot write (see the file comment); without
 * process_vm_writev only if driver_owned. */
static void stamp_words(const struct iovec *remote, size_t n, bool driver_owned)
{
    uint32_t src[STAMP_BATCH];
    for (size_t i = 0; i < n; i++)
        src[i] = TESTDRV_STAMP;
    size_t i = 0;
    while (i < n && vm_write_ok) {
        struct iovec local = { src, (n - i) * sizeof src[0] };
        ssize_t k = process_vm_writev(getpid(), &local, 1, remote + i, n - i, 0);
        if (k < 0 && errno != EFAULT) {
            vm_write_ok = false;
            break;
        }
        i += k > 0 ? (size_t)k / sizeof src[0] : 0;
        if (i < n)
            i++; /* the word that faulted: skipped */
    }
    for (; !vm_write_ok && driver_owned && i < n; i++)
        __atomic_store_n((uint32_t *)remote[i].iov_base, TESTDRV_STAMP, __ATOMIC_RELAXED);
}

/* Stamps [p, p + bytes): the first 4-byte aligned word of the range in
 * each 4 KiB page it covers. */
static void stamp_range(uintptr_t p, size_t bytes, bool driver_owned)
{
    uintptr_t end = p + bytes, w = (p + 3) & ~(uintptr_t)3;
    while (w + 4 <= end) {
        struct iovec remote[STAMP_BATCH];
        size_t n = 0;
        for (; n < STAMP_BATCH && w + 4 <= end; n++) {
            remote[n] = (struct iovec){ (void *)w, 4 };
            w = (w & ~(STAMP_PAGE - 1)) + STAMP_PAGE;
        }
        stamp_words(remote, n, driver_owned);
    }
}

/* Whether the GPU may not write a: a registration made read-only. */
static bool read_only(const struct td_alloc *a)
{
    return a->kind == TESTDRV_REGISTERED && (a->flags & CU_MEMHOSTREGISTER_READ_ONLY);
}

/* Whether a's bytes are the host's (pinned, managed, registered): what
 * the GPU writes there is really written. */
static bool host_visible(const struct td_alloc *a)
{
    return a->host_backed || a->kind == TESTDRV_REGISTERED;
}

/* One touch of the kernel's range: false if it may not access it now (a
 * fault); a write over host memory leaves its stamps. */
static bool touch(const struct td_op *op)
{
    uintptr_t p = op->u.kernel.ptr;
    if (!p)
        return true;
    const struct td_alloc *a = td_alloc_covering(p, op->u.kernel.bytes);
    if (!a)
        return false;
    if (!(op->u.kernel.access & TESTDRV_WRITE))
        return true;
    if (read_only(a))
        return false;
    if (host_visible(a))
        stamp_range(p, op->u.kernel.bytes, a->host_backed);
    return true;
}

static void fault(struct td_ctx *c)
{
    td.faults++;
    td_ctx_set_sticky(c, CUDA_ERROR_ILLEGAL_ADDRESS);
    pthread_cond_broadcast(&td.cv);
}

void td_write_value_run(struct td_stream *s, struct td_op *op)
{
    struct td_ctx *c = s->h.ctx;
    if (c->sticky != CUDA_SUCCESS)
        return;
    uintptr_t p = op->u.write.addr;
    const struct td_alloc *a = td_alloc_covering(p, sizeof(uint32_t));
    if (!a || read_only(a)) {
        fault(c);
        return;
    }
    if (host_visible(a))
        __atomic_store_n((uint32_t *)p, op->u.write.value, __ATOMIC_RELEASE);
}

void td_memset_run(struct td_stream *s, struct td_op *op)
{
    struct td_ctx *c = s->h.ctx;
    if (c->sticky != CUDA_SUCCESS)
        return;
    uintptr_t p = op->u.memset.addr;
    size_t bytes = op->u.memset.count * op->u.memset.width;
    const struct td_alloc *a = td_alloc_covering(p, bytes);
    if (!a || read_only(a)) {
        fault(c);
        return;
    }
    if (!host_visible(a))
        return;
    for (size_t i = 0; i < op->u.memset.count; i++) {
        void *at = (char *)p + i * op->u.memset.width;
        uint32_t v = op->u.memset.value;
        if (op->u.memset.width == 1)
            *(uint8_t *)at = (uint8_t)v;
        else if (op->u.memset.width == 2)
            *(uint16_t *)at = (uint16_t)v;
        else
            *(uint32_t *)at = v;
    }
}

/* A kernel that spins (polling, without the lock) until *flag != 0. */
static void spin_run(struct td_ctx *c, const volatile int *flag)
{
    while (!*flag && c->sticky == CUDA_SUCCESS) {
        pthread_mutex_unlock(&td.mu);
        td_sleep_ns(SPIN_POLL_NS);
        pthread_mutex_lock(&td.mu);
    }
}

void td_kernel_run(struct td_stream *s, struct td_op *op)
{
    struct td_ctx *c = s->h.ctx;
    if (c->sticky != CUDA_SUCCESS)
        return;
    if (op->kind == TD_OP_SPIN) {
        spin_run(c, op->u.spin.flag);
        return;
    }
    uint64_t end = td_now_ns() + op->u.kernel.usec * 1000u;
    for (;;) {
        if (!touch(op)) {
            fault(c);
            return;
        }
        if (c->sticky != CUDA_SUCCESS)
            return;
        uint64_t now = td_now_ns();
        if (now >= end)
            return;
        uint64_t slice = end - now < TOUCH_SLICE_NS ? end - now : TOUCH_SLICE_NS;
        pthread_mutex_unlock(&td.mu);
        td_sleep_ns(slice);
        pthread_mutex_lock(&td.mu);
    }
}

CUresult td_launch_op(CUstream h, bool ptsz, struct td_ctx *fctx, struct td_op *op)
{
    struct td_stream *s;
    bool captured;
    CUresult rc = td_launch_stream(h, ptsz, &s);
    if (rc == CUDA_SUCCESS && fctx && fctx != td_ctx_root(s->h.ctx))
        rc = CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS)
        rc = td_stream_submit_check(s, &captured);
    if (rc != CUDA_SUCCESS) {
        td_op_free(op);
        return rc;
    }
    if (captured) {
        td_capture_record(s, op);
        return CUDA_SUCCESS;
    }
    return td_stream_enqueue(s, op);
}

TD_EXPORT CUresult testdrv_launch(CUstream s, unsigned usec, CUdeviceptr ptr, size_t bytes,
                                  enum testdrv_access access)
{
    TD_COUNT(testdrv_launch);
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_op *op = td_op_new(TD_OP_KERNEL);
    op->u.kernel.usec = usec;
    op->u.kernel.ptr = (uintptr_t)ptr;
    op->u.kernel.bytes = bytes;
    op->u.kernel.access = access;
    return td_leave(td_launch_op(s, false, NULL, op));
}

TD_EXPORT CUresult testdrv_launch_spin(CUstream s, const volatile int *flag)
{
    TD_COUNT(testdrv_launch_spin);
    CUresult rc = td_enter_args(flag != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_op *op = td_op_new(TD_OP_SPIN);
    op->u.spin.flag = flag;
    return td_leave(td_launch_op(s, false, NULL, op));
}

/* Stands for a thread descheduled while it holds the driver's lock: takes
 * it, sets *held, and keeps it for ns. */
TD_EXPORT CUresult testdrv_hold_lock(uint64_t ns, volatile int *held)
{
    TD_COUNT(testdrv_hold_lock);
    CUresult rc = td_enter_args(held != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    *held = 1;
    td_sleep_ns(ns);
    return td_leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ */
/* Counters                                                            */

static const char *const ep_names[TD_EP_COUNT] = {
#define TD_EP(name) #name,
#include "entrypoints.h"
#undef TD_EP
};

TD_EXPORT uint64_t testdrv_calls(const char *name)
{
    if (!name)
        return 0;
    for (size_t i = 0; i < TD_EP_COUNT; i++)
        if (strcmp(ep_names[i], name) == 0)
            return atomic_load_explicit(&td_call_counts[i], memory_order_relaxed);
    return 0;
}

TD_EXPORT uint64_t testdrv_thread_wait_calls(void) { return td_tls.wait_calls; }

TD_EXPORT uint64_t testdrv_thread_blocked_ns(void) { return td_tls.blocked_ns; }

TD_EXPORT uint64_t testdrv_thread_kernel_waits(void) { return td_tls.kernel_waits; }

TD_EXPORT uint64_t testdrv_lock_stall_end_ns(void) { return atomic_load(&td_lock_stall_end); }

/* Reads one counter under the lock (the hooks work before cuInit). */
static uint64_t read_u64(const uint64_t *p)
{
    pthread_mutex_lock(&td.mu);
    uint64_t v = *p;
    pthread_mutex_unlock(&td.mu);
    return v;
}

static size_t read_size(const size_t *p)
{
    pthread_mutex_lock(&td.mu);
    size_t v = *p;
    pthread_mutex_unlock(&td.mu);
    return v;
}

TD_EXPORT uint64_t testdrv_faults(void) { return read_u64(&td.faults); }

TD_EXPORT uint64_t testdrv_foreign_syncs(void) { return read_u64(&td.foreign_syncs); }

TD_EXPORT uint64_t testdrv_thread_foreign_syncs(void) { return td_tls.foreign_syncs; }

TD_EXPORT size_t testdrv_live(enum testdrv_kind kind)
{
    return (unsigned)kind < TESTDRV_KIND_COUNT ? read_size(&td.live[kind]) : 0;
}

TD_EXPORT size_t testdrv_live_bytes(enum testdrv_kind kind)
{
    return (unsigned)kind < TESTDRV_KIND_COUNT ? read_size(&td.live_bytes[kind]) : 0;
}

TD_EXPORT size_t testdrv_live_sized(enum testdrv_kind kind, size_t bytes)
{
    if (kind != TESTDRV_DEVICE && kind != TESTDRV_HOST && kind != TESTDRV_MANAGED &&
        kind != TESTDRV_REGISTERED)
        return 0;
    pthread_mutex_lock(&td.mu);
    size_t n = td_live_sized(kind, bytes);
    pthread_mutex_unlock(&td.mu);
    return n;
}

TD_EXPORT size_t testdrv_pending_free_bytes_on(int dev)
{
    if (dev < 0 || dev >= TD_MAX_DEVICES)
        return 0;
    return read_size(&td.pending_bytes[td_cap_dev(dev)]);
}

TD_EXPORT size_t testdrv_capacity_used(int dev)
{
    if (dev >= TD_MAX_DEVICES)
        return 0;
    return read_size(&td.cap_used[dev < 0 ? TD_CAP_HOST : td_cap_dev(dev)]);
}

TD_EXPORT size_t testdrv_managed_resident(int dev)
{
    if (dev < 0 || dev >= TD_MAX_DEVICES)
        return 0;
    return read_size(&td.managed_resident[td_cap_dev(dev)]);
}

TD_EXPORT size_t testdrv_pending_free_bytes(void)
{
    size_t n = 0;
    for (int d = 0; d < TD_MAX_DEVICES; d++)
        n += testdrv_pending_free_bytes_on(d);
    return n;
}

TD_EXPORT uint64_t testdrv_dead_context_calls(void) { return read_u64(&td.dead_calls); }

TD_EXPORT uint64_t testdrv_invalidated_captures(void) { return read_u64(&td.invalidated); }

/* Sets one capacity under the lock (the hooks work before cuInit) and
 * wakes the waiters. */
static void set_capacity(enum td_cap cap, size_t bytes)
{
    pthread_mutex_lock(&td.mu);
    td_config_ensure();
    if (td_cap_is_device(cap))
        for (int d = 0; d < TD_MAX_DEVICES; d++)
            td.cap_total[td_cap_dev(d)] = bytes;
    else
        td.cap_total[cap] = bytes;
    pthread_cond_broadcast(&td.cv);
    pthread_mutex_unlock(&td.mu);
}

TD_EXPORT void testdrv_set_device_capacity(size_t bytes) { set_capacity(TD_CAP_DEVICE, bytes); }

TD_EXPORT void testdrv_set_host_capacity(size_t bytes) { set_capacity(TD_CAP_HOST, bytes); }

TD_EXPORT void testdrv_set_alloc_cost(enum testdrv_kind kind, unsigned usec)
{
    if ((unsigned)kind >= TESTDRV_KIND_COUNT)
        return;
    pthread_mutex_lock(&td.mu);
    td.alloc_cost_us[kind] = usec;
    pthread_mutex_unlock(&td.mu);
}
