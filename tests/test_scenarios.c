/* test_scenarios.c - what programs do with cudefer preloaded, and what they
 * must observe: one test per scenario of the correctness issues (registered
 * pages, hidden waits, IPC, every way an object ends, 32-bit addresses,
 * double releases, teardown races, concurrent out-of-memory, captures,
 * green contexts, primary contexts, sticky errors, a quiet exit).
 *
 * Each test runs in its own process (Criterion forks), over the test driver
 * (tests/driver), which measures what the program cannot see directly: the
 * calls of a thread that may wait for the GPU, the time it spent blocked,
 * the objects still alive, the calls that named a dead context. Every wait
 * for the GPU is bounded: a kernel that waits for the host is released by a
 * watchdog, so that a hidden wait fails an assertion instead of hanging. */
#include "common.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

/* The 32-bit cuMemAlloc, by its ELF name (cuda.h maps cuMemAlloc to
 * cuMemAlloc_v2). */
extern CUresult cuMemAlloc_32(unsigned int *dptr, unsigned int bytesize) __asm__("cuMemAlloc");

/* The per-thread-default-stream twins (cuda.h declares them only for
 * programs built with per-thread default streams). */
extern CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
extern CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);

/* Found at run time, as a program that also runs without cudefer would. */
static int cudefer_flush(void)
{
    int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
    cr_assert_not_null(flush, "cudefer_flush is not there: is the shim preloaded?");
    return flush();
}

static void sleep_ms(unsigned ms)
{
    usleep(ms * 1000u);
}

/* Polls for up to ms milliseconds until done() holds; returns it. */
static bool poll_ms(bool (*done)(void), unsigned ms)
{
    for (unsigned i = 0; i < ms && !done(); i++)
        sleep_ms(1);
    return done();
}

/* Device memory neither live nor waiting for a synchronisation. */
static bool device_memory_back(void)
{
    return program_live(TESTDRV_DEVICE) == 0 && testdrv_pending_free_bytes() == 0;
}

static void expect_device_memory_back(const char *what)
{
    cr_expect(poll_ms(device_memory_back, 1000),
              "%s: device memory still held: %zu blocks, %zu bytes pending", what,
              program_live(TESTDRV_DEVICE), testdrv_pending_free_bytes());
}

static CUdevice device0(void)
{
    CUdevice dev;
    CU_OK(cuDeviceGet(&dev, 0));
    return dev;
}

/* A library whose kernel was loaded into the current context (its unload
 * then waits for the context in the driver), and that kernel's function. */
static CUlibrary library_loaded(CUfunction *fn)
{
    static const char image[] = "// the test driver accepts any image\n";
    CUlibrary lib;
    CUkernel k;
    CUfunction f;
    CU_OK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    CU_OK(cuLibraryGetKernel(&k, lib, "k"));
    CU_OK(cuKernelGetFunction(&f, k));
    if (fn)
        *fn = f;
    return lib;
}

/* What one call cost the calling thread. */
struct cost {
    uint64_t wait_calls;
    uint64_t blocked_ns;
    uint64_t wall_ns;
};

struct meter {
    uint64_t wait_calls, blocked_ns, t0;
};

static struct meter meter_start(void)
{
    return (struct meter){testdrv_thread_wait_calls(), testdrv_thread_blocked_ns(), now_ns()};
}

static struct cost meter_stop(struct meter m)
{
    return (struct cost){testdrv_thread_wait_calls() - m.wait_calls,
                         testdrv_thread_blocked_ns() - m.blocked_ns, now_ns() - m.t0};
}

static void expect_no_wait(struct cost c, const char *what)
{
    cr_expect_eq(c.wait_calls, 0, "%s made %llu calls that may wait", what,
                 (unsigned long long)c.wait_calls);
    cr_expect_lt(c.wall_ns, 200 * MS, "%s took %llu ms", what,
                 (unsigned long long)(c.wall_ns / MS));
}

/* ==== 9.1 Registered pages ================================================= */

struct second_kernel {
    CUcontext ctx;
    CUstream stream;
    atomic_int go;
    CUresult rc;
    uint64_t blocked_ns;
};

/* Another thread: 50 ms into the unregister, a longer kernel on a stream
 * of its own. */
static void *launch_during_unregister(void *arg)
{
    struct second_kernel *k = arg;
    cuCtxSetCurrent(k->ctx);
    while (!atomic_load(&k->go))
        sleep_ms(1);
    sleep_ms(50);
    uint64_t b0 = testdrv_thread_blocked_ns();
    k->rc = testdrv_launch(k->stream, 1500000, 0, 0, TESTDRV_NONE);
    k->blocked_ns = testdrv_thread_blocked_ns() - b0;
    return NULL;
}

static size_t stamps_in(const uint32_t *words, size_t n)
{
    size_t found = 0;
    for (size_t i = 0; i < n; i++)
        found += __atomic_load_n(&words[i], __ATOMIC_RELAXED) == TESTDRV_STAMP;
    return found;
}

/* When cuMemHostUnregister returns the pages are the program's: nothing
 * the GPU was doing with them writes them afterwards. It waits for the
 * kernel that uses them, not for work another thread submits meanwhile,
 * and that thread's launch goes through at once. */
Test(scenarios, registered_pages_are_the_programs_after_unregister, .timeout = 20)
{
    const size_t bytes = MIB;
    struct second_kernel k = {.ctx = test_context()};
    uint32_t *buf = aligned_alloc(4096, bytes);
    cr_assert_not_null(buf);
    memset(buf, 0, bytes);
    CU_OK(cuMemHostRegister(buf, bytes, 0));
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    k.stream = test_stream(CU_STREAM_NON_BLOCKING);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, launch_during_unregister, &k), 0);

    uint64_t launched = now_ns();
    CU_OK(testdrv_launch(s, 400000, (CUdeviceptr)(uintptr_t)buf, bytes, TESTDRV_WRITE));
    sleep_ms(50);
    atomic_store(&k.go, 1);
    uint64_t t0 = now_ns();
    CU_OK(cuMemHostUnregister(buf));
    uint64_t returned = now_ns(), took = returned - t0;
    memset(buf, 0, bytes); /* the program's memory again */
    pthread_join(t, NULL);
    CU_OK(k.rc);
    CU_OK(cuCtxSynchronize());
    sleep_ms(50);

    cr_expect_eq(stamps_in(buf, bytes / 4), 0, "the GPU wrote the pages after the unregister");
    /* The kernel's remaining time: it ends 400 ms after its launch. */
    cr_expect_geq(returned - launched, 390 * MS,
                  "the unregister returned after %llu ms, before its kernel ended",
                  (unsigned long long)(took / MS));
    cr_expect_lt(took, 1000 * MS, "the unregister took %llu ms: it waited for the later kernel",
                 (unsigned long long)(took / MS));
    cr_expect_lt(k.blocked_ns, 5 * MS, "the other thread's launch was blocked %llu ms",
                 (unsigned long long)(k.blocked_ns / MS));

    /* The range can be registered again: part of it, and all of it. */
    cr_expect_eq(cuMemHostRegister((char *)buf + 4096, 8192, 0), CUDA_SUCCESS,
                 "an overlapping registration failed");
    cr_expect_eq(cuMemHostUnregister((char *)buf + 4096), CUDA_SUCCESS);
    cr_expect_eq(cuMemHostRegister(buf, bytes, 0), CUDA_SUCCESS, "the same range failed");
    cr_expect_eq(cuMemHostUnregister(buf), CUDA_SUCCESS);
    CU_OK(cuCtxSynchronize());
}

/* A registration over a pending unregister makes that unregister first (it
 * may wait for its context's work), and no other: another context's
 * pending unregister stays pending, and the registration does not wait for
 * that context's kernel (the driver's unregister waits for all of its
 * context's work). */
Test(scenarios, registration_makes_only_the_unregister_it_overlaps, .timeout = 20)
{
    CUcontext first = test_context();
    char *pages = aligned_alloc(4096, 2 * 4096);
    cr_assert_not_null(pages);
    char *mine = pages, *theirs = pages + 4096;
    CUcontext second;
    CU_OK(cuCtxCreate(&second, NULL, 0, device0()));
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(cuMemHostRegister(theirs, 4096, 0));
    CU_OK(cuMemHostUnregister(theirs)); /* pending in the second context */
    CU_OK(cuCtxSetCurrent(first));
    CU_OK(cuMemHostRegister(mine, 4096, 0));
    CU_OK(cuMemHostUnregister(mine)); /* pending in the first */
    CU_OK(cuCtxSetCurrent(second));
    struct spin sp;
    spin_start(&sp, s);
    CU_OK(cuCtxSetCurrent(first));

    struct meter m = meter_start();
    CUresult rc = cuMemHostRegister(mine, 4096, 0);
    struct cost c = meter_stop(m);
    unsigned type = 0;
    CUresult theirs_rc = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                               (CUdeviceptr)(uintptr_t)theirs);
    spin_release(&sp);
    cr_expect_eq(rc, CUDA_SUCCESS, "the registration over its own pending unregister failed");
    cr_expect_lt(c.blocked_ns, 2 * MS, "the registration was blocked %llu ms in the driver",
                 (unsigned long long)(c.blocked_ns / MS));
    cr_expect_lt(c.wall_ns, 200 * MS, "the registration took %llu ms: it waited for the other "
                 "context's kernel", (unsigned long long)(c.wall_ns / MS));
    cr_expect_eq(theirs_rc, CUDA_SUCCESS, "the other context's pending unregister was made "
                 "(the driver no longer knows its pages: %d)", (int)theirs_rc);
    CU_OK(cuMemHostUnregister(mine));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxDestroy(second));
    free(pages);
}

/* The program unregisters its buffer and frees it (the pages are unmapped,
 * as free does for a large buffer); its next allocation of pinned or
 * managed memory may land on those addresses. The driver refuses a mapping
 * over a registration it still holds (ALREADY_MAPPED, INVALID_VALUE for
 * managed memory: measured, facts unmapped), and with cudefer the driver's
 * unregister is still pending: the allocation must succeed all the same,
 * as it does without cudefer. Allocations of half the buffer (the
 * process may have mapped a page at the top of the hole since) that land
 * elsewhere are kept until one lands there. */
/* Pinned or managed allocations of half of the freed [p, p + bytes) (the
 * process may have mapped a page at the top of the hole since), kept until
 * one lands there, eight at most: each must succeed (when: the moment, for
 * the message). Releases them. */
static void allocate_over_freed_pages(void *p, size_t bytes, bool managed, const char *when)
{
    enum { TRIES = 8 };
    void *got[TRIES];
    int n = 0, over = 0;
    for (; n < TRIES && !over; n++) {
        CUdeviceptr m = 0;
        CUresult rc = managed ? cuMemAllocManaged(&m, bytes / 2, CU_MEM_ATTACH_GLOBAL)
                              : cuMemAllocHost(&got[n], bytes / 2);
        cr_assert_eq(rc, CUDA_SUCCESS, "%s allocation %d %s: %d", managed ? "managed" : "pinned",
                     n + 1, when, (int)rc);
        if (managed)
            got[n] = (void *)(uintptr_t)m;
        over = (char *)got[n] < (char *)p + bytes && (char *)p < (char *)got[n] + bytes / 2;
    }
    cr_expect(over, "no allocation landed on the freed buffer's addresses (%d tries)", n);
    for (int i = 0; i < n; i++)
        CU_OK(managed ? cuMemFree((CUdeviceptr)(uintptr_t)got[i]) : cuMemFreeHost(got[i]));
}

static void allocate_over_freed_registration(bool managed)
{
    test_context();
    const size_t bytes = 8 * MIB;
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    CU_OK(cuMemHostRegister(p, bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
    CU_OK(testdrv_launch(s, 1000, (CUdeviceptr)(uintptr_t)p, bytes, TESTDRV_WRITE));
    CU_OK(cuMemHostUnregister(p));
    munmap(p, bytes);
    allocate_over_freed_pages(p, bytes, managed, "after the program freed its unregistered "
                              "buffer");
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_REGISTERED), 0);
    cr_expect_eq(testdrv_faults(), 0);
}

Test(scenarios, pinned_allocation_over_a_freed_unregistered_buffer, .timeout = 20)
{
    allocate_over_freed_registration(false);
}

Test(scenarios, managed_allocation_over_a_freed_unregistered_buffer, .timeout = 20)
{
    allocate_over_freed_registration(true);
}

/* An unregister waits for the work before it in its own context, and for
 * at most a few milliseconds more for other contexts' (their kernels can
 * write the pages; the driver's unregister does not wait for them): here
 * another context's kernel waits for the unregistering thread, which sets
 * its flag once the unregister has returned. It waited for the kernel,
 * which waited for it: until the watchdog, for ever on a GPU. */
Test(scenarios, unregister_beside_another_contexts_kernel_that_waits_for_it, .timeout = 20)
{
    CUcontext first = test_context();
    char *page = aligned_alloc(4096, 4096);
    cr_assert_not_null(page);
    CUcontext second;
    CU_OK(cuCtxCreate(&second, NULL, 0, device0()));
    struct spin sp;
    spin_start(&sp, test_stream(CU_STREAM_NON_BLOCKING));
    CU_OK(cuCtxSetCurrent(first));
    CU_OK(cuMemHostRegister(page, 4096, 0));
    uint64_t t0 = now_ns();
    CUresult rc = cuMemHostUnregister(page);
    uint64_t took = now_ns() - t0;
    int flag_then = sp.flag;
    spin_release(&sp);
    cr_expect_eq(rc, CUDA_SUCCESS);
    cr_expect_eq(flag_then, 0, "the watchdog had let the other context's kernel go: the "
                 "unregister waited %llu ms for it", (unsigned long long)(took / MS));
    cr_expect_lt(took, 200 * MS, "the unregister took %llu ms",
                 (unsigned long long)(took / MS));
    /* The pages can be registered again at once. */
    cr_expect_eq(cuMemHostRegister(page, 4096, 0), CUDA_SUCCESS);
    cr_expect_eq(cuMemHostUnregister(page), CUDA_SUCCESS);
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxDestroy(second));
    free(page);
}

struct destroyer {
    CUcontext ctx;
    atomic_int go, started;
    CUresult rc;
};

static void *destroy_context(void *arg)
{
    struct destroyer *d = arg;
    while (!atomic_load(&d->go))
        sleep_ms(1);
    atomic_store(&d->started, 1);
    d->rc = cuCtxDestroy(d->ctx);
    return NULL;
}

/* The program unregisters its pages in one context (cudefer queues the
 * driver's unregister behind a later kernel) and another thread destroys
 * that context, which waits for that kernel before it undoes the
 * registration. Meanwhile the
 * program registers the same pages in another context, or maps new memory
 * where it freed them: without cudefer both succeed (the pages were
 * unregistered long before). They must with cudefer too: the range stays
 * pending until the destruction has undone it, and the call waits for
 * that as for a queued unregister (tests/race.c race-across found it). */
static void reuse_pages_during_teardown(bool unmap)
{
    CUcontext first = test_context();
    const size_t bytes = 8 * MIB;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    struct destroyer d = {0};
    CU_OK(cuCtxCreate(&d.ctx, NULL, 0, device0()));
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    /* The thread first: its stack could land on the freed pages. */
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, destroy_context, &d), 0);
    CU_OK(cuMemHostRegister(p, bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
    CU_OK(testdrv_launch(s, 1000, (CUdeviceptr)(uintptr_t)p, bytes, TESTDRV_WRITE));
    CU_OK(cuMemHostUnregister(p)); /* waits for that kernel */
    /* Later work that the driver's unregister, and the destruction, wait
     * for: the unregister stays queued. */
    CU_OK(testdrv_launch(s, 300000, 0, 0, TESTDRV_NONE));
    if (unmap)
        munmap(p, bytes);
    CU_OK(cuCtxSetCurrent(first));
    atomic_store(&d.go, 1);
    while (!atomic_load(&d.started))
        sleep_ms(1);
    sleep_ms(50); /* the destruction waits for the kernel */
    if (!unmap) {
        CUresult rc = cuMemHostRegister(p, bytes, 0);
        cr_expect_eq(rc, CUDA_SUCCESS, "registering the pages again while the context that "
                     "held them ends: %d", (int)rc);
        if (rc == CUDA_SUCCESS)
            CU_OK(cuMemHostUnregister(p));
    } else {
        allocate_over_freed_pages(p, bytes, true, "while the context of the freed buffer's "
                                  "registration ends");
    }
    pthread_join(t, NULL);
    CU_OK(d.rc);
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_REGISTERED), 0);
    if (!unmap)
        munmap(p, bytes);
}

Test(scenarios, registration_while_the_context_of_its_unregister_ends, .timeout = 20)
{
    reuse_pages_during_teardown(false);
}

Test(scenarios, managed_allocation_while_the_context_of_its_unregister_ends, .timeout = 20)
{
    reuse_pages_during_teardown(true);
}

/* ==== 9.2 No hidden waits ==================================================== */
/* The rule: an allocation that succeeds never waits for the GPU (a kernel
 * that waits for this very thread would never end). */

Test(scenarios, no_hidden_wait_after_pinned_memory_over_the_limit, .timeout = 20)
{
    test_context();
    void *a, *b;
    CU_OK(cuMemAllocHost(&a, 160 * MIB));
    CU_OK(cuMemAllocHost(&b, 160 * MIB));
    CU_OK(cuMemFreeHost(a));
    CU_OK(cuMemFreeHost(b)); /* 320 MiB released: over the 256 MiB held at most */
    struct spin sp;
    spin_start(&sp, test_stream(CU_STREAM_NON_BLOCKING));
    CUdeviceptr d;
    struct meter m = meter_start();
    CUresult rc = cuMemAlloc(&d, MIB);
    struct cost c = meter_stop(m);
    spin_release(&sp);
    cr_expect_eq(rc, CUDA_SUCCESS);
    expect_no_wait(c, "cuMemAlloc after pinned releases over the limit");
    CU_OK(cuCtxSynchronize());
}

/* An allocation short of memory takes back what cudefer holds, waiting for
 * the work before each release: in its own context without bound, as the
 * driver's release did at the release, and in the other contexts for a
 * few milliseconds (their kernels can use the memory; the driver's release
 * does not wait for them). Here another context's kernel waits for the
 * allocating thread. */
Test(scenarios, out_of_memory_beside_another_contexts_kernel_that_waits_for_it, .timeout = 20)
{
    CUcontext first = test_context();
    CUcontext second;
    CU_OK(cuCtxCreate(&second, NULL, 0, device0()));
    struct spin sp;
    spin_start(&sp, test_stream(CU_STREAM_NON_BLOCKING));
    CU_OK(cuCtxSetCurrent(first));
    testdrv_set_device_capacity(program_live_bytes(TESTDRV_DEVICE) + 64 * MIB);
    CUdeviceptr d, e = 0;
    CU_OK(cuMemAlloc(&d, 48 * MIB));
    CU_OK(cuMemFree(d)); /* its fence has a record behind the other kernel */
    uint64_t t0 = now_ns();
    CUresult rc = cuMemAlloc(&e, 32 * MIB);
    uint64_t took = now_ns() - t0;
    int flag_then = sp.flag;
    spin_release(&sp);
    cr_expect_eq(rc, CUDA_SUCCESS, "the allocation answered %d after %llu ms", (int)rc,
                 (unsigned long long)(took / MS));
    cr_expect_eq(flag_then, 0, "the watchdog had let the other context's kernel go: the "
                 "allocation waited %llu ms for it", (unsigned long long)(took / MS));
    cr_expect_lt(took, 200 * MS, "the allocation took %llu ms", (unsigned long long)(took / MS));
    if (rc == CUDA_SUCCESS)
        CU_OK(cuMemFree(e));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxDestroy(second));
}


/* What memory serves: an allocation short of memory takes back only what
 * can serve it. Memory of another device cannot, nor device memory a
 * pinned allocation, and waiting for their contexts' work is a wait the
 * driver never makes: here a kernel there waits for the allocating thread
 * (a collective of another GPU waiting for this thread's next launch), and
 * another thread made the release, which the driver would have made wait,
 * not this one. */
struct release_in {
    CUcontext ctx;
    CUdeviceptr d;
    void *host;
};

static void *release_in_thread(void *arg)
{
    struct release_in *r = arg;
    CU_OK(cuCtxSetCurrent(r->ctx));
    if (r->d)
        CU_OK(cuMemFree(r->d));
    if (r->host)
        CU_OK(cuMemFreeHost(r->host));
    return NULL;
}

/* Starts sp's kernel, which waits for this thread, then releases r's
 * memory from another thread (behind that kernel), which returns once it
 * has. */
static void release_behind_waiting_kernel(struct release_in *r, struct spin *sp)
{
    spin_start(sp, test_stream(CU_STREAM_NON_BLOCKING));
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, release_in_thread, r), 0);
    pthread_join(t, NULL);
}

/* Two devices: the test's context on device 0 in *first, and a context
 * made on device 1, returned (and current). */
static CUcontext on_second_device(CUcontext *first)
{
    setenv("TESTDRIVER_DEVICES", "2", 1);
    *first = test_context();
    CUdevice dev1;
    CUcontext other;
    CU_OK(cuDeviceGet(&dev1, 1));
    CU_OK(cuCtxCreate(&other, NULL, 0, dev1));
    return other;
}

/* Makes first current and device 0 64 MiB, all of it allocated: returns
 * the block that fills it. */
static CUdeviceptr fill_first_device(CUcontext first)
{
    CU_OK(cuCtxSetCurrent(first));
    testdrv_set_device_capacity(64 * MIB);
    CUdeviceptr d;
    size_t free_b = 0, total = 0;
    CU_OK(cuMemGetInfo(&free_b, &total));
    CU_OK(cuMemAlloc(&d, free_b));
    return d;
}

/* Asks for bytes of device (or pinned) memory while sp's kernel waits for
 * this thread, then lets the kernel go: the driver's answer is out of
 * memory (why), and it must come at once, not after a wait for the kernel
 * (its watchdog lets it go after 2 s). */
static void expect_out_of_memory_at_once(struct spin *sp, bool pinned, size_t bytes,
                                         const char *why)
{
    CUdeviceptr d = 0;
    void *h = NULL;
    uint64_t t0 = now_ns();
    CUresult rc = pinned ? cuMemAllocHost(&h, bytes) : cuMemAlloc(&d, bytes);
    uint64_t took = now_ns() - t0;
    int flag_then = sp->flag;
    spin_release(sp);
    cr_expect_eq(rc, CUDA_ERROR_OUT_OF_MEMORY, "%s: the driver's answer is out of memory (got "
                 "%d)", why, (int)rc);
    cr_expect_eq(flag_then, 0, "the watchdog had let the kernel go: the allocation waited %llu "
                 "ms for it", (unsigned long long)(took / MS));
    cr_expect_lt(took, 200 * MS, "the allocation took %llu ms", (unsigned long long)(took / MS));
    if (rc == CUDA_SUCCESS && pinned)
        CU_OK(cuMemFreeHost(h));
    else if (rc == CUDA_SUCCESS)
        CU_OK(cuMemFree(d));
}

Test(scenarios, out_of_memory_ignores_another_devices_kernel_that_waits_for_it, .timeout = 20)
{
    CUcontext first, other = on_second_device(&first);
    struct release_in r = {.ctx = other};
    CU_OK(cuMemAlloc(&r.d, 48 * MIB));
    struct spin sp;
    release_behind_waiting_kernel(&r, &sp);
    CUdeviceptr d = fill_first_device(first);
    expect_out_of_memory_at_once(&sp, false, 16 * MIB, "device 0 is full");
    CU_OK(cuMemFree(d));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxDestroy(other));
}

Test(scenarios, pinned_out_of_memory_ignores_device_blocks_behind_a_waiting_kernel,
     .timeout = 20)
{
    CUcontext ctx = test_context();
    struct release_in r = {.ctx = ctx};
    CU_OK(cuMemAlloc(&r.d, 16 * MIB));
    struct spin sp;
    release_behind_waiting_kernel(&r, &sp);
    testdrv_set_host_capacity(testdrv_live_bytes(TESTDRV_HOST) + 4 * MIB);
    expect_out_of_memory_at_once(&sp, true, 8 * MIB, "pinned memory is short");
    CU_OK(cuCtxSynchronize());
}

/* A device that moves managed pages out of its memory makes room for a
 * device allocation itself (run 99 of bench/RESULTS.md): released managed
 * memory cannot serve it, and its release would wait for its context's
 * work. Here device 0 holds 40 of its 64 MiB in device blocks and another
 * thread released 20 MiB of managed memory behind a kernel that waits for
 * the allocating thread: 30 MiB do not fit, with or without that release. */
Test(scenarios, device_out_of_memory_ignores_managed_memory_behind_a_waiting_kernel,
     .timeout = 20)
{
    CUcontext ctx = test_context();
    testdrv_set_device_capacity(program_live_bytes(TESTDRV_DEVICE) +
                                program_live_bytes(TESTDRV_MANAGED) + 64 * MIB);
    CUdeviceptr held;
    CU_OK(cuMemAlloc(&held, 40 * MIB));
    struct release_in r = {.ctx = ctx};
    CU_OK(cuMemAllocManaged(&r.d, 20 * MIB, CU_MEM_ATTACH_GLOBAL));
    struct spin sp;
    release_behind_waiting_kernel(&r, &sp);
    expect_out_of_memory_at_once(&sp, false, 30 * MIB,
                                 "24 MiB are left beside the device blocks");
    CU_OK(cuMemFree(held));
    CU_OK(cuCtxSynchronize());
}

/* On a device without concurrent managed access, managed memory stays in
 * device memory: there a device allocation short of memory takes released
 * managed blocks back, after their fence. */
Test(scenarios, device_out_of_memory_takes_managed_memory_back_where_it_stays, .timeout = 20)
{
    setenv("TESTDRIVER_CONCURRENT_MANAGED", "0", 1);
    test_context();
    testdrv_set_device_capacity(program_live_bytes(TESTDRV_DEVICE) +
                                program_live_bytes(TESTDRV_MANAGED) + 64 * MIB);
    CUdeviceptr held, m, e = 0;
    CU_OK(cuMemAlloc(&held, 40 * MIB));
    CU_OK(cuMemAllocManaged(&m, 20 * MIB, CU_MEM_ATTACH_GLOBAL));
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 20000, 0, 0, TESTDRV_NONE));
    CU_OK(cuMemFree(m)); /* held by cudefer until the kernel ends */
    CUresult rc = cuMemAlloc(&e, 22 * MIB);
    cr_expect_eq(rc, CUDA_SUCCESS, "the released managed block was not taken back (got %d)",
                 (int)rc);
    if (rc == CUDA_SUCCESS)
        CU_OK(cuMemFree(e));
    CU_OK(cuMemFree(held));
    CU_OK(cuCtxSynchronize());
}

/* Nor does it wait for another thread's flush of another device's
 * releases: here cudefer_flush() in another thread waits for a pinned
 * block of device 1 behind a kernel that waits for the allocating thread,
 * whose allocation of device 0's memory cannot be served by it. */
static void *flush_in_thread(void *arg)
{
    (void)arg;
    cr_expect_eq(cudefer_flush(), 0);
    return NULL;
}

Test(scenarios, out_of_memory_ignores_another_devices_flush_under_way, .timeout = 20)
{
    CUcontext first, other = on_second_device(&first);
    struct release_in r = {.ctx = other};
    CU_OK(cuMemAllocHost(&r.host, 4 * MIB));
    struct spin sp;
    release_behind_waiting_kernel(&r, &sp);
    pthread_t flusher;
    cr_assert_eq(pthread_create(&flusher, NULL, flush_in_thread, NULL), 0);
    sleep_ms(50); /* the flush waits for the pinned block's fence */
    CUdeviceptr d = fill_first_device(first);
    expect_out_of_memory_at_once(&sp, false, 16 * MIB, "device 0 is full");
    pthread_join(flusher, NULL);
    CU_OK(cuMemFree(d));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxDestroy(other));
}

/* Pinned memory is the host's, whichever device's context released it. */
Test(scenarios, pinned_out_of_memory_takes_back_another_devices_pinned_blocks, .timeout = 20)
{
    CUcontext first, other = on_second_device(&first);
    struct release_in r = {.ctx = other};
    CU_OK(cuMemAllocHost(&r.host, 8 * MIB));
    struct spin sp; /* keeps the block from passing its fence until released */
    release_behind_waiting_kernel(&r, &sp);
    spin_release(&sp);
    CU_OK(cuCtxSetCurrent(first));
    testdrv_set_host_capacity(testdrv_live_bytes(TESTDRV_HOST) + 4 * MIB);
    void *h = NULL;
    CUresult rc = cuMemAllocHost(&h, 8 * MIB);
    cr_expect_eq(rc, CUDA_SUCCESS, "the 8 MiB device 1's context released were held back "
                 "(got %d)", (int)rc);
    if (rc == CUDA_SUCCESS)
        CU_OK(cuMemFreeHost(h));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxDestroy(other));
}

Test(scenarios, no_hidden_wait_with_a_cached_block_of_another_size, .timeout = 20)
{
    test_context();
    CUdeviceptr d, e;
    CU_OK(cuMemAlloc(&d, 64 * MIB));
    CU_OK(cuMemFree(d));
    sleep_ms(20); /* its fence passes: the block serves its size again */
    struct spin sp;
    spin_start(&sp, test_stream(CU_STREAM_NON_BLOCKING));
    struct meter m = meter_start();
    CUresult rc = cuMemAlloc(&e, 32 * MIB);
    struct cost c = meter_stop(m);
    spin_release(&sp);
    cr_expect_eq(rc, CUDA_SUCCESS);
    expect_no_wait(c, "cuMemAlloc of another size than the cached block");
    CU_OK(cuCtxSynchronize());
}

/* A managed allocation may wait for a block of its size that this same
 * thread released while the GPU still ran (the driver's release would have
 * waited then); never for one another thread released: the kernel before
 * it may be waiting for this thread. */
struct managed_release {
    CUcontext ctx;
    CUdeviceptr d;
    CUresult rc;
};

static void *release_managed(void *arg)
{
    struct managed_release *m = arg;
    CU_OK(cuCtxSetCurrent(m->ctx));
    CU_OK(cuMemAllocManaged(&m->d, 64 * MIB, CU_MEM_ATTACH_GLOBAL));
    m->rc = cuMemFree(m->d);
    return NULL;
}

Test(scenarios, no_hidden_wait_for_managed_memory_another_thread_released, .timeout = 20)
{
    struct managed_release mr = {.ctx = test_context()};
    struct spin sp;
    spin_start(&sp, test_stream(CU_STREAM_NON_BLOCKING));
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, release_managed, &mr), 0);
    pthread_join(t, NULL);
    CU_OK(mr.rc);
    CUdeviceptr e;
    struct meter m = meter_start();
    CUresult rc = cuMemAllocManaged(&e, 64 * MIB, CU_MEM_ATTACH_GLOBAL);
    struct cost c = meter_stop(m);
    spin_release(&sp);
    cr_expect_eq(rc, CUDA_SUCCESS);
    cr_expect_neq(e, mr.d, "the block came back while the kernel before its release ran");
    expect_no_wait(c, "cuMemAllocManaged of the size another thread released");
    CU_OK(cuCtxSynchronize());
}

Test(scenarios, no_hidden_wait_in_a_second_context, .timeout = 20)
{
    test_context();
    void *h;
    CUdeviceptr d, e;
    CU_OK(cuMemAllocHost(&h, MIB));
    CU_OK(cuMemAlloc(&d, MIB));
    struct spin sp;
    spin_start(&sp, test_stream(CU_STREAM_NON_BLOCKING));
    CU_OK(cuMemFreeHost(h)); /* the first context has a queue */
    CU_OK(cuMemFree(d));
    CUcontext second;
    struct meter m = meter_start();
    CUresult create_rc = cuCtxCreate(&second, NULL, 0, device0());
    struct cost create = meter_stop(m);
    m = meter_start();
    CUresult rc = cuMemAlloc(&e, 2 * MIB);
    struct cost c = meter_stop(m);
    spin_release(&sp);
    cr_expect_eq(create_rc, CUDA_SUCCESS);
    cr_expect_eq(rc, CUDA_SUCCESS);
    /* The new context's set-up may synchronise its own idle stream (a call
     * that may wait, and a moment blocked): not a wait for the first
     * context's kernel, which would last until the watchdog. */
    cr_expect_lt(create.wall_ns, 200 * MS, "cuCtxCreate took %llu ms",
                 (unsigned long long)(create.wall_ns / MS));
    expect_no_wait(c, "cuMemAlloc in a second context");
    CU_OK(cuCtxDestroy(second));
}

/* One context, and a second thread that retains and releases its primary
 * context over and over (a library doing its own set-up, say): during each
 * of those releases the engine keeps its own walks out of the context,
 * which is where a library's release is kept. With no other context to
 * take it, the release must still not become the driver's waiting unload:
 * the calling thread's current context takes it. */
struct retain_loop {
    CUdevice dev;
    atomic_int stop;
    atomic_long pairs;
    atomic_int failed; /* the CUresult that ended the loop early, if one did */
};

static void *retain_release_loop(void *arg)
{
    struct retain_loop *rl = arg;
    CUcontext ctx;
    while (!atomic_load(&rl->stop)) {
        CUresult rc = cuDevicePrimaryCtxRetain(&ctx, rl->dev);
        if (rc == CUDA_SUCCESS)
            rc = cuDevicePrimaryCtxRelease(rl->dev);
        if (rc != CUDA_SUCCESS) {
            atomic_store(&rl->failed, (int)rc);
            break;
        }
        atomic_fetch_add(&rl->pairs, 1);
    }
    return NULL;
}

/* Waits until the loop has made its first pair (up to 10 s): on a loaded
 * machine a new thread may not run at all for as long as the test's own
 * loop takes. */
static void retain_loop_started(struct retain_loop *rl)
{
    for (int i = 0; i < 10000 && atomic_load(&rl->pairs) == 0 && !atomic_load(&rl->failed); i++)
        usleep(1000);
}

Test(scenarios, library_unload_during_a_primary_release_in_one_context, .timeout = 30)
{
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    struct retain_loop rl = {.dev = device0()};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, retain_release_loop, &rl), 0);
    retain_loop_started(&rl);
    uint64_t worst_calls = 0, worst_ns = 0;
    for (int i = 0; i < 400; i++) {
        CUlibrary lib = library_loaded(NULL);
        /* Work in the context that the driver's unload would wait for. */
        CU_OK(testdrv_launch(s, 2000, 0, 0, TESTDRV_WRITE));
        struct meter m = meter_start();
        CU_OK(cuLibraryUnload(lib));
        struct cost c = meter_stop(m);
        if (c.wait_calls > worst_calls || (c.wait_calls == worst_calls && c.blocked_ns > worst_ns)) {
            worst_calls = c.wait_calls;
            worst_ns = c.blocked_ns;
        }
    }
    atomic_store(&rl.stop, 1);
    pthread_join(t, NULL);
    cr_expect_eq(atomic_load(&rl.failed), CUDA_SUCCESS, "the other thread's retain or release "
                 "failed");
    cr_expect_gt(atomic_load(&rl.pairs), 0, "the other thread made no retain/release pair");
    cr_expect_eq(worst_calls, 0, "an unload made %llu calls that may wait (blocked %llu us)",
                 (unsigned long long)worst_calls, (unsigned long long)(worst_ns / 1000));
    CU_OK(cuCtxSynchronize());
}

/* Four blocks, each released while a 50 ms kernel of its own writes it, on
 * one stream of a fresh test context; returns that stream. */
static CUstream released_under_kernels(void)
{
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    for (int i = 0; i < 4; i++) {
        CUdeviceptr d;
        CU_OK(cuMemAlloc(&d, (size_t)(i + 2) * MIB));
        CU_OK(testdrv_launch(s, 50000, d, MIB, TESTDRV_WRITE));
        CU_OK(cuMemFree(d));
    }
    return s;
}

/* The synchronisation waits for the program's work, then for the frees of
 * the blocks released before it (their fences passed in that wait) and for
 * nothing else: one more call that may wait, on a stream that holds only
 * those frees. The memory is back with the driver when it returns. */
Test(scenarios, ctx_synchronize_with_device_blocks_waits_only_itself, .timeout = 20)
{
    released_under_kernels();
    uint64_t calls = testdrv_thread_wait_calls(), kernels = testdrv_thread_kernel_waits();
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_thread_kernel_waits() - kernels, 1, "the program's synchronisation "
                 "waited for its kernels, and nothing else for any");
    cr_expect_leq(testdrv_thread_wait_calls() - calls, 2,
                  "cuCtxSynchronize made %llu calls that may wait (the program made one; its "
                  "frees, one)", (unsigned long long)(testdrv_thread_wait_calls() - calls));
    cr_expect(device_memory_back(), "right after cuCtxSynchronize: %zu blocks held, %zu bytes "
              "pending", program_live(TESTDRV_DEVICE), testdrv_pending_free_bytes());
    cr_expect_eq(testdrv_faults(), 0);
}

/* The same when the program has waited for its kernels already: the
 * synchronisation has no GPU work to wait for, and its own frees wait for
 * no kernel (the test driver counts the waits that found one under way). */
Test(scenarios, ctx_synchronize_after_the_work_waits_for_no_kernel, .timeout = 20)
{
    CUstream s = released_under_kernels();
    CU_OK(cuStreamSynchronize(s));
    uint64_t kernels = testdrv_thread_kernel_waits(), calls = testdrv_thread_wait_calls();
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_thread_kernel_waits() - kernels, 0, "cuCtxSynchronize waited for a "
                 "kernel, though the program had waited for all of its work");
    cr_expect_gt(testdrv_thread_wait_calls() - calls, 1, "precondition: the synchronisation "
                 "waited for the frees of the blocks released before it too");
    cr_expect(device_memory_back(), "right after cuCtxSynchronize: %zu blocks held, %zu bytes "
              "pending", program_live(TESTDRV_DEVICE), testdrv_pending_free_bytes());
    cr_expect_eq(testdrv_faults(), 0);
}

/* ==== 9.3 IPC ============================================================== */

/* A block another process may map is never handed out again while cudefer
 * holds it. (A block of another size, released the same way without a
 * handle, shows the reuse the exported one must not get.) */
Test(scenarios, exported_block_is_never_reused, .timeout = 10)
{
    test_context();
    CUdeviceptr plain, again;
    CU_OK(cuMemAlloc(&plain, 2 * MIB));
    CU_OK(cuMemFree(plain));
    sleep_ms(50);
    CU_OK(cuMemAlloc(&again, 2 * MIB));
    cr_assert_eq(again, plain, "precondition: a released block of that size serves it again");

    CUdeviceptr d, e;
    CUipcMemHandle h;
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(cuIpcGetMemHandle(&h, d));
    CU_OK(cuMemFree(d));
    sleep_ms(50); /* its fence has passed */
    uint64_t calls = testdrv_calls("cuMemAlloc_v2");
    CU_OK(cuMemAlloc(&e, MIB));
    cr_expect(e != d || testdrv_calls("cuMemAlloc_v2") > calls,
              "the exported block was handed out again");
}

/* ==== 9.4 What a program sets on a block ===================================== */

/* The driver's new allocation carries nothing the program set on a block it
 * freed, at the same address too (measured on the H200: tests/gpu/inherit.c,
 * bench/RESULTS.md run 111); a block cudefer hands out again must not
 * either. Each test sets something on a block, releases it, and allocates
 * the same kind and size again once the fence has passed; a block released
 * just before without it shows the reuse that could hand it on. */

static uintptr_t block_new(enum testdrv_kind kind, size_t bytes)
{
    CUdeviceptr d = 0;
    void *h = NULL;
    switch (kind) {
    case TESTDRV_MANAGED:
        CU_OK(cuMemAllocManaged(&d, bytes, CU_MEM_ATTACH_GLOBAL));
        return (uintptr_t)d;
    case TESTDRV_HOST:
        CU_OK(cuMemAllocHost(&h, bytes));
        return (uintptr_t)h;
    default:
        CU_OK(cuMemAlloc(&d, bytes));
        return (uintptr_t)d;
    }
}

static void block_free(enum testdrv_kind kind, uintptr_t p)
{
    CU_OK(kind == TESTDRV_HOST ? cuMemFreeHost((void *)p) : cuMemFree((CUdeviceptr)p));
}

/* set(p, bytes) on a block of kind, released; returns the block the next
 * allocation of that kind and size gets. */
static uintptr_t allocated_after(enum testdrv_kind kind, size_t bytes,
                                 void (*set)(uintptr_t p, size_t bytes))
{
    test_context();
    uintptr_t plain = block_new(kind, bytes);
    block_free(kind, plain);
    sleep_ms(50);
    uintptr_t p = block_new(kind, bytes);
    cr_assert_eq(p, plain, "precondition: a released block of that size serves it again");
    set(p, bytes);
    block_free(kind, p);
    sleep_ms(50); /* its fence has passed */
    return block_new(kind, bytes);
}

static CUmemLocation location(CUmemLocationType type)
{
    return (CUmemLocation){.type = type, .id = 0};
}

static int range_int(uintptr_t p, size_t bytes, CUmem_range_attribute attr)
{
    int v = 7;
    CU_OK(cuMemRangeGetAttribute(&v, sizeof v, attr, (CUdeviceptr)p, bytes));
    return v;
}

static void advise(uintptr_t p, size_t bytes)
{
    CU_OK(cuMemAdvise((CUdeviceptr)p, bytes, CU_MEM_ADVISE_SET_READ_MOSTLY,
                      location(CU_MEM_LOCATION_TYPE_DEVICE)));
    CU_OK(cuMemAdvise((CUdeviceptr)p, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                      location(CU_MEM_LOCATION_TYPE_HOST)));
    CU_OK(cuMemAdvise((CUdeviceptr)p, bytes, CU_MEM_ADVISE_SET_ACCESSED_BY,
                      location(CU_MEM_LOCATION_TYPE_DEVICE)));
    cr_assert_eq(range_int(p, bytes, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY), 1);
}

Test(scenarios, advice_stays_with_the_released_block, .timeout = 10)
{
    uintptr_t q = allocated_after(TESTDRV_MANAGED, 2 * MIB, advise);
    cr_expect_eq(range_int(q, 2 * MIB, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY), 0);
    cr_expect_eq(range_int(q, 2 * MIB, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION),
                 CU_DEVICE_INVALID);
    cr_expect_eq(range_int(q, 2 * MIB, CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY), CU_DEVICE_INVALID);
}

/* Advice on a page inside the block: cudefer asks the driver where the
 * block starts. */
static void advise_inside(uintptr_t p, size_t bytes)
{
    (void)bytes;
    CU_OK(cuMemAdvise((CUdeviceptr)p + 4096, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY,
                      location(CU_MEM_LOCATION_TYPE_DEVICE)));
}

Test(scenarios, advice_inside_a_block_stays_with_it, .timeout = 10)
{
    uintptr_t q = allocated_after(TESTDRV_MANAGED, MIB, advise_inside);
    cr_expect_eq(range_int(q, MIB, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY), 0);
}

static void prefetch(uintptr_t p, size_t bytes)
{
    CU_OK(cuMemPrefetchAsync((CUdeviceptr)p, bytes, location(CU_MEM_LOCATION_TYPE_DEVICE), 0,
                             NULL));
    CU_OK(cuStreamSynchronize(NULL));
    cr_assert_eq(range_int(p, bytes, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION), 0);
}

Test(scenarios, prefetch_location_stays_with_the_released_block, .timeout = 10)
{
    uintptr_t q = allocated_after(TESTDRV_MANAGED, 2 * MIB, prefetch);
    cr_expect_eq(range_int(q, 2 * MIB, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION),
                 CU_DEVICE_INVALID);
}

static void attach_to_host(uintptr_t p, size_t bytes)
{
    (void)bytes;
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(cuStreamAttachMemAsync(s, (CUdeviceptr)p, 0, CU_MEM_ATTACH_HOST));
    CU_OK(cuStreamSynchronize(s));
    cr_assert_eq(testdrv_managed_attachment((CUdeviceptr)p), CU_MEM_ATTACH_HOST);
}

Test(scenarios, stream_attachment_stays_with_the_released_block, .timeout = 10)
{
    uintptr_t q = allocated_after(TESTDRV_MANAGED, 2 * MIB, attach_to_host);
    cr_expect_eq(testdrv_managed_attachment((CUdeviceptr)q), CU_MEM_ATTACH_GLOBAL);
}

static unsigned sync_memops(uintptr_t p)
{
    unsigned v = 7;
    CU_OK(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)p));
    return v;
}

/* Through a pointer inside the block, as the driver allows. */
static void set_sync_memops(uintptr_t p, size_t bytes)
{
    const int one = 1;
    CU_OK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                                (CUdeviceptr)p + bytes / 2));
    cr_assert_eq(sync_memops(p), 1);
}

Test(scenarios, sync_memops_stays_with_the_released_device_block, .timeout = 10)
{
    cr_expect_eq(sync_memops(allocated_after(TESTDRV_DEVICE, MIB, set_sync_memops)), 0);
}

Test(scenarios, sync_memops_stays_with_the_released_pinned_block, .timeout = 10)
{
    cr_expect_eq(sync_memops(allocated_after(TESTDRV_HOST, MIB, set_sync_memops)), 0);
}

/* The program's mistake: it sets state on a block it has released. The
 * driver alone would refuse (the block is gone); with cudefer the driver
 * still holds the block and answers, so the block must not serve a later
 * allocation with what was set (fuzz_api found SYNC_MEMOPS 1 on a new
 * block). */
static uintptr_t allocated_after_setting_on_the_released(enum testdrv_kind kind, size_t bytes,
                                                         void (*set)(uintptr_t p, size_t bytes))
{
    test_context();
    uintptr_t p = block_new(kind, bytes);
    block_free(kind, p);
    sleep_ms(50); /* its fence has passed: it could serve the next one */
    set(p, bytes);
    return block_new(kind, bytes);
}

Test(scenarios, state_set_on_a_released_block_reaches_no_later_one, .timeout = 10)
{
    uintptr_t d = allocated_after_setting_on_the_released(TESTDRV_DEVICE, MIB, set_sync_memops);
    cr_expect_eq(sync_memops(d), 0, "a new device block answers SYNC_MEMOPS 1");
    uintptr_t h = allocated_after_setting_on_the_released(TESTDRV_HOST, MIB, set_sync_memops);
    cr_expect_eq(sync_memops(h), 0, "a new pinned block answers SYNC_MEMOPS 1");
    uintptr_t m = allocated_after_setting_on_the_released(TESTDRV_MANAGED, 2 * MIB, advise);
    cr_expect_eq(range_int(m, 2 * MIB, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY), 0,
                 "a new managed block is read-mostly");
}

/* A dma-buf of a block may be mapped by another device or process (an RDMA
 * NIC, another GPU): like an IPC handle, the block is never handed out
 * again, device and pinned memory alike. */
static void export_dma_buf(uintptr_t p, size_t bytes)
{
    int fd = -1;
    CU_OK(cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)p, bytes,
                                        CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert(testdrv_dmabuf_exported((CUdeviceptr)p));
}

Test(scenarios, dma_buf_exported_block_is_never_reused, .timeout = 10)
{
    uintptr_t d = allocated_after(TESTDRV_DEVICE, MIB, export_dma_buf);
    cr_expect(!testdrv_dmabuf_exported((CUdeviceptr)d), "the exported device block was handed "
              "out again");
}

Test(scenarios, dma_buf_exported_pinned_block_is_never_reused, .timeout = 10)
{
    uintptr_t h = allocated_after(TESTDRV_HOST, MIB, export_dma_buf);
    cr_expect(!testdrv_dmabuf_exported((CUdeviceptr)h), "the exported pinned block was handed "
              "out again");
}

/* ==== 16.2 Every way an object ends ========================================== */

/* A context destroyed with a block live leaves cudefer a tomb at its
 * address (a later cuMemFree of it gets the driver's answer for memory
 * freed so). The driver may hand that address out again through a call
 * cudefer does not see (external memory mapped with
 * cuExternalMemoryGetMappedBuffer, a pool pointer imported with
 * cuMemPoolImportPointer), which the program frees with cuMemFree: the
 * driver's release, and nothing left behind. */
Test(scenarios, free_of_an_unseen_allocation_where_a_destroyed_context_had_a_block,
     .timeout = 10)
{
    test_context();
    CUcontext gone, now;
    CUdeviceptr d;
    CU_OK(cuCtxCreate(&gone, NULL, 0, device0()));
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(cuCtxDestroy(gone));
    cr_assert_eq(cuMemFree(d), CUDA_ERROR_INVALID_VALUE, "precondition: the driver's answer for "
                 "a destroyed context's block");
    CU_OK(cuCtxCreate(&now, NULL, 0, device0()));
    CU_OK(testdrv_map_device_at(d, MIB));
    size_t live = program_live(TESTDRV_DEVICE);
    cr_expect_eq(cuMemFree(d), CUDA_SUCCESS, "cuMemFree of the driver's new allocation there");
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_DEVICE), live - 1, "the allocation was not released");
    CU_OK(cuCtxDestroy(now));
}

/* A block the program freed itself, stream-ordered: the driver's answer to
 * a cuMemFree of it, and its address is not served again by cudefer. */
Test(scenarios, block_freed_stream_ordered_is_gone, .timeout = 10)
{
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr d, e;
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(cuMemFreeAsync(d, s));
    CU_OK(cuStreamSynchronize(s));
    cr_expect_eq(cuMemFree(d), CUDA_ERROR_INVALID_VALUE, "a freed block was freed again");
    sleep_ms(50);
    uint64_t calls = testdrv_calls("cuMemAlloc_v2");
    CU_OK(cuMemAlloc(&e, MIB));
    cr_expect(e != d || testdrv_calls("cuMemAlloc_v2") > calls,
              "a freed address was handed out without the driver");
}

/* The process's resident memory in bytes. */
static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    unsigned long size = 0, resident = 0;
    cr_assert_eq(fscanf(f, "%lu %lu", &size, &resident), 2);
    fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static void alloc_free_async_pairs(CUstream s, long pairs)
{
    for (long i = 0; i < pairs; i++) {
        CUdeviceptr d;
        CU_OK(cuMemAlloc(&d, 256));
        CU_OK(cuMemFreeAsync(d, s));
        if (i % 1000 == 999)
            CU_OK(cuStreamSynchronize(s));
    }
    CU_OK(cuStreamSynchronize(s));
}

#define PAIRS 500000L
#define PAIR_GROWTH_BYTES 8 /* bound per pair, on average */

/* Pairs of cuMemAlloc / cuMemFreeAsync leave nothing behind in cudefer:
 * the process does not grow (by more than PAIR_GROWTH_BYTES a pair). */
Test(scenarios, stream_ordered_frees_leave_nothing_behind, .timeout = 60)
{
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer's quarantine keeps up to 256 MiB of freed host
     * memory: the growth is measured in the plain build. */
    cr_skip_test("the growth is measured without AddressSanitizer");
#endif
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    alloc_free_async_pairs(s, 20000); /* the first growth of every table */
    size_t before = rss_bytes();
    alloc_free_async_pairs(s, PAIRS);
    size_t after = rss_bytes();
    size_t growth = after > before ? after - before : 0;
    cr_expect_leq(growth, (size_t)(PAIRS * PAIR_GROWTH_BYTES),
                  "%ld pairs grew the process by %zu KiB", PAIRS, growth >> 10);
    cr_log_info("%ld pairs: %zu KiB of growth", PAIRS, growth >> 10);
}

/* ==== 16.3 The 32-bit cuMemAlloc ============================================== */

/* A block of 64-bit address released: the 32-bit call of its size gets an
 * address of its own from the driver, never the truncated one. */
Test(scenarios, narrow_allocation_never_gets_a_wide_block, .timeout = 10)
{
    test_context();
    CUdeviceptr wide;
    CU_OK(cuMemAlloc(&wide, 65536));
    cr_assert_gt(wide, (CUdeviceptr)UINT32_MAX, "precondition: a 64-bit address");
    CU_OK(cuMemFree(wide));
    sleep_ms(50);
    unsigned int narrow = 0;
    uint64_t calls = testdrv_calls("cuMemAlloc");
    CU_OK(cuMemAlloc_32(&narrow, 65536));
    cr_expect_neq(narrow, (unsigned int)wide, "the 32-bit call got the truncated address");
    cr_expect_eq(testdrv_calls("cuMemAlloc"), calls + 1, "the driver did not serve it");
    CUdeviceptr base = 0;
    size_t size = 0;
    cr_expect_eq(cuMemGetAddressRange(&base, &size, (CUdeviceptr)narrow), CUDA_SUCCESS,
                 "the address the 32-bit call got is no allocation");
    cr_expect_eq(base, (CUdeviceptr)narrow);
}

/* ==== 16.10 Second releases ================================================= */

/* Once cudefer_flush() really released them, a second cuArrayDestroy and a
 * second cuLibraryUnload of the same handles get the driver's answer
 * without reaching it (a real driver may have given the handle to a new
 * object by then). */
Test(scenarios, second_release_after_flush_stays_away_from_the_driver, .timeout = 10)
{
    test_context();
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR desc = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT,
                                  .NumChannels = 1};
    CU_OK(cuArrayCreate(&a, &desc));
    CUlibrary lib = library_loaded(NULL);
    CU_OK(cuArrayDestroy(a));
    CU_OK(cuLibraryUnload(lib));
    cr_assert_eq(cudefer_flush(), 0);
    cr_assert_eq(program_live(TESTDRV_ARRAY), 0, "the flush did not release the array");
    cr_assert_eq(program_live(TESTDRV_LIBRARY), 0, "the flush did not unload the library");

    uint64_t arrays = testdrv_calls("cuArrayDestroy");
    uint64_t libraries = testdrv_calls("cuLibraryUnload");
    cr_expect_eq(cuArrayDestroy(a), CUDA_ERROR_INVALID_HANDLE);
    cr_expect_eq(testdrv_calls("cuArrayDestroy"), arrays,
                 "the second cuArrayDestroy reached the driver");
    cr_expect_eq(cuLibraryUnload(lib), CUDA_ERROR_INVALID_HANDLE);
    cr_expect_eq(testdrv_calls("cuLibraryUnload"), libraries,
                 "the second cuLibraryUnload reached the driver");
}

/* ==== 10.1 A flush races a context's teardown ================================ */

#define TEARDOWN_ROUNDS 450

struct teardown_race {
    CUcontext primary;
    atomic_int done;
    /* thread B's first failure */
    const char *failed_call;
    CUresult failed_rc;
    int failed_round;
    /* thread A */
    long flushes, oom, other;
};

static void *flush_in_a_loop(void *arg)
{
    struct teardown_race *r = arg;
    cuCtxSetCurrent(r->primary);
    while (!atomic_load(&r->done)) {
        CUdeviceptr p;
        CUresult rc = cuMemAlloc(&p, (size_t)2 << 30); /* more than the device has */
        if (rc == CUDA_ERROR_OUT_OF_MEMORY)
            r->oom++;
        else
            r->other++;
        if (cudefer_flush() != 0)
            r->other++;
        r->flushes++;
    }
    return NULL;
}

static bool round_ok(struct teardown_race *r, int round, const char *call, CUresult rc)
{
    if (rc == CUDA_SUCCESS)
        return true;
    r->failed_call = call;
    r->failed_rc = rc;
    r->failed_round = round;
    return false;
}

/* One round of thread B: a context made, used and destroyed. */
static bool context_round(struct teardown_race *r, int round, CUdevice dev)
{
    CUcontext c;
    void *h[32];
    if (!round_ok(r, round, "cuCtxCreate", cuCtxCreate(&c, NULL, 0, dev)))
        return false;
    for (int i = 0; i < 32; i++)
        if (!round_ok(r, round, "cuMemAllocHost", cuMemAllocHost(&h[i], 64 << 10)))
            return false;
    if (!round_ok(r, round, "testdrv_launch",
                  testdrv_launch(CU_STREAM_LEGACY, 200, (CUdeviceptr)(uintptr_t)h[round % 32],
                                 64 << 10, TESTDRV_WRITE)))
        return false;
    for (int i = 0; i < 32; i++)
        if (!round_ok(r, round, "cuMemFreeHost", cuMemFreeHost(h[i])))
            return false;
    return round_ok(r, round, "cuCtxDestroy", cuCtxDestroy(c));
}

Test(scenarios, flush_races_context_teardown, .timeout = 40)
{
    struct teardown_race r = {.primary = test_context()};
    CUdevice dev = device0();
    pthread_t a;
    cr_assert_eq(pthread_create(&a, NULL, flush_in_a_loop, &r), 0);
    uint64_t t0 = now_ns();
    int round = 0;
    while (round < TEARDOWN_ROUNDS && context_round(&r, round, dev))
        round++;
    atomic_store(&r.done, 1);
    pthread_join(a, NULL);
    cr_expect_eq(round, TEARDOWN_ROUNDS, "round %d: %s returned %d", r.failed_round,
                 r.failed_call ? r.failed_call : "-", (int)r.failed_rc);
    cr_expect_eq(testdrv_dead_context_calls(), 0, "%llu calls named a destroyed context",
                 (unsigned long long)testdrv_dead_context_calls());
    cr_expect_eq(r.other, 0, "the flushing thread saw %ld unexpected answers", r.other);
    cr_expect_gt(r.flushes, 0);
    cr_log_info("%d rounds in %llu ms, %ld flushes", round,
                (unsigned long long)((now_ns() - t0) / MS), r.flushes);
}

/* ==== 10.2 Out of memory while another thread's flush holds the queue ======== */

struct flusher {
    atomic_int started;
    int rc;
};

static void *flush_once(void *arg)
{
    struct flusher *f = arg;
    atomic_store(&f->started, 1);
    f->rc = cudefer_flush();
    return NULL;
}

Test(scenarios, out_of_memory_during_another_threads_flush, .timeout = 20)
{
    setenv("TESTDRIVER_DEVICE_BYTES", "512m", 1);
    test_context();
    CUdeviceptr ballast, d1, d2, big;
    CU_OK(cuMemAlloc(&ballast, 200 * MIB));
    CU_OK(cuMemAlloc(&d1, 100 * MIB));
    CU_OK(cuMemAlloc(&d2, 100 * MIB));
    CU_OK(cuMemFree(d1));
    CU_OK(cuMemFree(d2)); /* 200 MiB held by cudefer */
    void *h;
    CU_OK(cuMemAllocHost(&h, MIB));
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 1500000,
                         (CUdeviceptr)(uintptr_t)h, MIB, TESTDRV_WRITE));
    CU_OK(cuMemFreeHost(h)); /* its real release waits for the 1.5 s kernel */

    struct flusher f = {0};
    pthread_t a;
    cr_assert_eq(pthread_create(&a, NULL, flush_once, &f), 0);
    while (!atomic_load(&f.started))
        sleep_ms(1);
    sleep_ms(100);
    /* 112 MiB free: 250 MiB fits only with the 200 MiB cudefer held. */
    uint64_t t0 = now_ns();
    CUresult rc = cuMemAlloc(&big, 250 * MIB);
    uint64_t took = now_ns() - t0;
    pthread_join(a, NULL);
    cr_expect_eq(rc, CUDA_SUCCESS, "the allocation failed (%d) after %llu ms", (int)rc,
                 (unsigned long long)(took / MS));
    cr_expect_eq(f.rc, 0);
    cr_log_info("the allocation took %llu ms", (unsigned long long)(took / MS));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0);
}

/* The same with the waiter thread as the other party: device blocks over
 * the cache go back through stream-ordered frees, which the waiter settles;
 * an allocation that runs out of memory while it does must still succeed
 * (the program freed everything it allocated: the driver alone, whose
 * cuMemFree is synchronous, never fails here). Many rounds, because the
 * window is short. */
Test(scenarios, out_of_memory_while_frees_settle, .timeout = 60)
{
    setenv("CUDEFER_DEVICE_CACHE", "0", 1); /* every block goes back at once */
    setenv("TESTDRIVER_DEVICE_BYTES", "384k", 1);
    test_context();
    for (int i = 0; i < 20000; i++) {
        CUdeviceptr d;
        CUresult rc = cuMemAlloc(&d, 256 << 10);
        cr_assert_eq(rc, CUDA_SUCCESS, "round %d: cuMemAlloc(256 KiB) of a 384 KiB device "
                     "returned %d with nothing allocated", i, (int)rc);
        CU_OK(cuMemFree(d));
    }
}

/* Threads that each hold at most one block, on a device (or host) that
 * fits one block per thread: the driver alone, whose releases are
 * synchronous, never answers out of memory here. With cudefer, what the
 * others release while a thread's reclaim runs is held again when it asks,
 * and what the reclaim gives back goes to the others first: a thread must
 * go on reclaiming for as long as that lasts (a fixed count of rounds
 * failed a few allocations in every run). */
#define SHARE_THREADS 8
#define SHARE_ROUNDS 400
#define SHARE_BYTES MIB

struct share {
    CUcontext ctx[2];
    bool host;
    atomic_int failures;
    atomic_int first_rc, first_round;
};

struct share_thread {
    struct share *sh;
    int index;
};

static void *hold_one_block(void *arg)
{
    struct share_thread *st = arg;
    struct share *sh = st->sh;
    CU_OK(cuCtxSetCurrent(sh->ctx[st->index % 2]));
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    unsigned seed = (unsigned)st->index;
    for (int i = 0; i < SHARE_ROUNDS; i++) {
        CUdeviceptr d = 0;
        void *h = NULL;
        CUresult rc = sh->host ? ((i + st->index) % 3 ? cuMemAllocHost(&h, SHARE_BYTES)
                                                      : cuMemHostAlloc(&h, SHARE_BYTES, 0))
                               : cuMemAlloc(&d, SHARE_BYTES);
        if (rc != CUDA_SUCCESS) {
            if (atomic_fetch_add(&sh->failures, 1) == 0) {
                atomic_store(&sh->first_rc, (int)rc);
                atomic_store(&sh->first_round, i);
            }
            continue;
        }
        CUdeviceptr p = sh->host ? (CUdeviceptr)(uintptr_t)h : d;
        CU_OK(testdrv_launch(s, 50 + rand_r(&seed) % 400, p, SHARE_BYTES, TESTDRV_WRITE));
        if (i % 17 == 0)
            CU_OK(cuCtxSynchronize());
        CU_OK(sh->host ? cuMemFreeHost(h) : cuMemFree(d));
    }
    CU_OK(cuStreamDestroy(s));
    return NULL;
}

static void out_of_memory_never_within_each_threads_share(bool host)
{
    struct share sh = {.host = host};
    sh.ctx[0] = test_context();
    CU_OK(cuCtxCreate(&sh.ctx[1], NULL, 0, device0()));
    CU_OK(cuCtxSetCurrent(sh.ctx[0]));
    CU_OK(cuCtxSynchronize());
    /* What is live already (cudefer's own pinned words, own.h) keeps its
     * room. */
    if (host)
        testdrv_set_host_capacity(testdrv_live_bytes(TESTDRV_HOST) +
                                  SHARE_THREADS * SHARE_BYTES);
    else
        testdrv_set_device_capacity(program_live_bytes(TESTDRV_DEVICE) +
                                    SHARE_THREADS * SHARE_BYTES);
    pthread_t t[SHARE_THREADS];
    struct share_thread st[SHARE_THREADS];
    for (int i = 0; i < SHARE_THREADS; i++) {
        st[i] = (struct share_thread){&sh, i};
        cr_assert_eq(pthread_create(&t[i], NULL, hold_one_block, &st[i]), 0);
    }
    for (int i = 0; i < SHARE_THREADS; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(atomic_load(&sh.failures), 0,
                 "%d of %d allocations of %s memory failed (the first, in round %d, with %d) "
                 "although each of %d threads held at most one block and the capacity fits one "
                 "each", atomic_load(&sh.failures), SHARE_THREADS * SHARE_ROUNDS,
                 host ? "pinned" : "device", atomic_load(&sh.first_round),
                 atomic_load(&sh.first_rc), SHARE_THREADS);
    CU_OK(cuCtxDestroy(sh.ctx[1]));
    CU_OK(cuCtxSetCurrent(sh.ctx[0]));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0);
}

Test(scenarios, pinned_out_of_memory_never_within_each_threads_share, .timeout = 60)
{
    out_of_memory_never_within_each_threads_share(true);
}

Test(scenarios, device_out_of_memory_never_within_each_threads_share, .timeout = 60)
{
    out_of_memory_never_within_each_threads_share(false);
}

/* A thread keeps a capture live on a stream of its own in ctx, in mode,
 * for as long as a program's capture may last: until told to end it. */
struct long_capture {
    CUcontext ctx;
    CUstreamCaptureMode mode;
    atomic_int live, end;
    CUresult begin_rc, end_rc;
};

/* Ends the capture of s and destroys s; the capture's result in *rc. */
static void end_capture_and_destroy(CUstream s, CUresult *rc)
{
    CUgraph g = NULL;
    *rc = cuStreamEndCapture(s, &g);
    if (g)
        cuGraphDestroy(g);
    CU_OK(cuStreamDestroy(s));
}

static void *capture_until_told(void *arg)
{
    struct long_capture *lc = arg;
    CU_OK(cuCtxSetCurrent(lc->ctx));
    CUstream s;
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    lc->begin_rc = cuStreamBeginCapture(s, lc->mode);
    if (lc->begin_rc == CUDA_SUCCESS)
        CU_OK(testdrv_launch(s, 10, 0, 0, TESTDRV_NONE));
    atomic_store(&lc->live, 1);
    while (!atomic_load(&lc->end))
        sleep_ms(1);
    end_capture_and_destroy(s, &lc->end_rc);
    return NULL;
}

/* Device blocks released (and fenced) before another thread began a
 * capture are in cudefer's cache; an allocation that needs their memory
 * while the capture is still live gets it, and the capture survives.
 * (A synchronisation's stream-ordered frees wait for the capture's end:
 * the out-of-memory flush must not.) With later_spin, a kernel launched
 * after the releases waits for this thread: the allocation may wait for
 * the work before the releases (their fence), never for that kernel. */
static void out_of_memory_while_another_thread_captures(bool later_spin)
{
    setenv("TESTDRIVER_DEVICE_BYTES", "512m", 1);
    setenv("CUDEFER_DEVICE_CACHE", "1g", 1); /* the released blocks stay cached */
    CUcontext ctx = test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr d1, d2, big;
    CU_OK(cuMemAlloc(&d1, 200 * MIB));
    CU_OK(cuMemAlloc(&d2, 200 * MIB));
    CU_OK(testdrv_launch(s, 20000, d1, 200 * MIB, TESTDRV_WRITE));
    CU_OK(cuMemFree(d1));
    CU_OK(cuMemFree(d2)); /* 400 MiB held by cudefer, fenced */
    struct spin sp;
    if (later_spin)
        spin_start(&sp, test_stream(CU_STREAM_NON_BLOCKING));
    struct long_capture lc = {.ctx = ctx, .mode = CU_STREAM_CAPTURE_MODE_GLOBAL};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, capture_until_told, &lc), 0);
    while (!atomic_load(&lc.live))
        sleep_ms(1);
    /* A program allocates during another thread's global capture only in
     * the relaxed mode (the driver refuses it otherwise). */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CU_OK(cuThreadExchangeStreamCaptureMode(&mode));
    uint64_t t0 = now_ns();
    CUresult rc = cuMemAlloc(&big, 300 * MIB);
    uint64_t took = now_ns() - t0;
    if (later_spin)
        spin_release(&sp);
    atomic_store(&lc.end, 1);
    pthread_join(t, NULL);
    cr_expect_eq(rc, CUDA_SUCCESS, "an allocation during another thread's capture failed "
                 "(%d) while cudefer held 400 MiB the program had released", (int)rc);
    cr_expect_eq(lc.begin_rc, CUDA_SUCCESS);
    cr_expect_eq(lc.end_rc, CUDA_SUCCESS, "the capture ended with %d", (int)lc.end_rc);
    cr_expect_eq(testdrv_invalidated_captures(), 0);
    if (later_spin)
        cr_expect_lt(took, 1000 * MS, "the allocation took %llu ms: it waited for a kernel "
                     "launched after the releases, which waits for this thread",
                     (unsigned long long)(took / MS));
    if (rc == CUDA_SUCCESS)
        CU_OK(cuMemFree(big));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0);
}

/* Stream-ordered frees on cudefer's non-blocking private stream. */
Test(scenarios, out_of_memory_while_another_thread_captures, .timeout = 20)
{
    out_of_memory_while_another_thread_captures(true);
}

/* Before driver 12.5 (a blocking private stream): the driver's cuMemFree,
 * which waits for the whole context, later kernels included. */
Test(scenarios, out_of_memory_while_another_thread_captures_before_12_5, .timeout = 20)
{
    setenv("TESTDRIVER_VERSION", "12040", 1);
    out_of_memory_while_another_thread_captures(false);
}

/* After a flush, no pinned memory is live in the driver. */
static bool pinned_memory_back(void)
{
    cudefer_flush();
    return program_live(TESTDRV_HOST) == 0;
}

/* A fence made while another thread releases (not for the last time) the
 * primary context of a second GPU cannot record that context's work then:
 * the record is marked, made later by cudefer's background thread, and the
 * fence passes once it is. A capture live in a third context, for as long
 * as the program likes, must not keep those records from being made: here
 * cudefer_flush gives back every released pinned block while the capture
 * is still live, and the capture survives. */
Test(scenarios, capture_elsewhere_does_not_hold_back_other_contexts_fences, .timeout = 60)
{
    setenv("TESTDRIVER_DEVICES", "2", 1);
    CUcontext ctx = test_context();
    CUdevice dev1;
    CUcontext primary1, third;
    CU_OK(cuDeviceGet(&dev1, 1));
    CU_OK(cuDevicePrimaryCtxRetain(&primary1, dev1)); /* the loop's releases are not the last */
    CUctxCreateParams params = {0};
    CU_OK(cuCtxCreate(&third, &params, 0, device0()));
    CU_OK(cuCtxSetCurrent(ctx));
    /* A few rounds: a record marked at the last moment before the capture
     * began is what the capture would hold back. */
    for (int round = 0; round < 12; round++) {
        struct retain_loop rl = {.dev = dev1};
        pthread_t loop, cap;
        cr_assert_eq(pthread_create(&loop, NULL, retain_release_loop, &rl), 0);
        while (atomic_load(&rl.pairs) < 10)
            sleep_ms(1);
        /* Fenced releases, many of them while the second GPU's primary
         * context is being released: their records there are marked. */
        for (int i = 0; i < 400; i++) {
            void *h;
            CU_OK(cuMemAllocHost(&h, 4096));
            CU_OK(cuMemFreeHost(h));
        }
        /* Relaxed: the main thread's calls stay allowed meanwhile. */
        struct long_capture ci = {.ctx = third, .mode = CU_STREAM_CAPTURE_MODE_RELAXED};
        cr_assert_eq(pthread_create(&cap, NULL, capture_until_told, &ci), 0);
        while (!atomic_load(&ci.live))
            sleep_ms(1);
        atomic_store(&rl.stop, 1);
        pthread_join(loop, NULL);
        bool back = poll_ms(pinned_memory_back, 2000);
        size_t left = program_live(TESTDRV_HOST);
        atomic_store(&ci.end, 1);
        pthread_join(cap, NULL);
        cr_expect(back, "round %d: %zu pinned blocks released before another context's "
                  "capture began are still held while it is live", round, left);
        cr_expect_eq(ci.begin_rc, CUDA_SUCCESS);
        cr_expect_eq(ci.end_rc, CUDA_SUCCESS, "the capture ended with %d", (int)ci.end_rc);
    }
    cr_expect_eq(testdrv_invalidated_captures(), 0);
    CU_OK(cuCtxDestroy(third));
    CU_OK(cuDevicePrimaryCtxRelease(dev1));
    CU_OK(cuCtxSetCurrent(ctx));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0);
}

/* ==== 10.3 Captures of every stream handle end for cudefer =================== */

enum capture_way {
    CAPTURE_CREATED_STREAM,
    CAPTURE_PER_THREAD_HANDLE,
    CAPTURE_PTSZ_STREAM_0,
    CAPTURE_TO_GRAPH,
    CAPTURE_INVALIDATED,
    CAPTURE_STREAM_DESTROYED,
};

struct syncer {
    CUcontext ctx;
    CUresult rc;
};

/* A thread in the global capture mode synchronises: the capture under way
 * is invalidated. */
static void *sync_on_thread(void *arg)
{
    struct syncer *sy = arg;
    cuCtxSetCurrent(sy->ctx);
    sy->rc = cuCtxSynchronize();
    return NULL;
}

/* A graph to capture into (the test driver makes graphs only by capture). */
static CUgraph captured_graph(CUstream s)
{
    CUgraph g;
    CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(testdrv_launch(s, 10, 0, 0, TESTDRV_NONE));
    CU_OK(cuStreamEndCapture(s, &g));
    return g;
}

/* Begins a capture one way, records a kernel in it, ends it. */
static void capture_and_end(enum capture_way way, CUcontext ctx)
{
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CUgraph g = NULL;
    const CUstreamCaptureMode global = CU_STREAM_CAPTURE_MODE_GLOBAL;
    switch (way) {
    case CAPTURE_CREATED_STREAM:
        CU_OK(cuStreamBeginCapture(s, global));
        CU_OK(testdrv_launch(s, 10, 0, 0, TESTDRV_NONE));
        CU_OK(cuStreamEndCapture(s, &g));
        break;
    case CAPTURE_PER_THREAD_HANDLE:
        CU_OK(cuStreamBeginCapture(CU_STREAM_PER_THREAD, global));
        CU_OK(testdrv_launch(CU_STREAM_PER_THREAD, 10, 0, 0, TESTDRV_NONE));
        CU_OK(cuStreamEndCapture(CU_STREAM_PER_THREAD, &g));
        break;
    case CAPTURE_PTSZ_STREAM_0:
        CU_OK(cuStreamBeginCapture_v2_ptsz(NULL, global));
        CU_OK(testdrv_launch(CU_STREAM_PER_THREAD, 10, 0, 0, TESTDRV_NONE));
        CU_OK(cuStreamEndCapture_ptsz(NULL, &g));
        break;
    case CAPTURE_TO_GRAPH: {
        CUgraph into = captured_graph(s);
        CU_OK(cuStreamBeginCaptureToGraph(s, into, NULL, NULL, 0, global));
        CU_OK(testdrv_launch(s, 10, 0, 0, TESTDRV_NONE));
        CU_OK(cuStreamEndCapture(s, &g));
        break;
    }
    case CAPTURE_INVALIDATED: {
        struct syncer sy = {.ctx = ctx};
        pthread_t t;
        CU_OK(cuStreamBeginCapture(s, global));
        CU_OK(testdrv_launch(s, 10, 0, 0, TESTDRV_NONE));
        cr_assert_eq(pthread_create(&t, NULL, sync_on_thread, &sy), 0);
        pthread_join(t, NULL);
        cr_assert_eq(sy.rc, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        break;
    }
    case CAPTURE_STREAM_DESTROYED:
        CU_OK(cuStreamBeginCapture(s, global));
        CU_OK(testdrv_launch(s, 10, 0, 0, TESTDRV_NONE));
        cuStreamDestroy(s); /* whatever it answers, the capture is over */
        break;
    }
}

/* After captures end, 8 rounds of 512 MiB (more than cudefer keeps for
 * reuse when held to CUDEFER_DEVICE_CACHE alone: cache_alone) allocated
 * and freed: once no capture is live the blocks go back
 * to the driver by themselves, without a flush point (a release queued as
 * if a capture were still live stays until one); after cuCtxSynchronize
 * too, cudefer holds no device memory. */
static void expect_releases_after_captures(const char *what)
{
    for (int i = 0; i < 8; i++) {
        CUdeviceptr d;
        CUresult rc = cuMemAlloc(&d, 512 * MIB);
        cr_expect_eq(rc, CUDA_SUCCESS, "%s: allocation %d returned %d", what, i + 1, (int)rc);
        if (rc == CUDA_SUCCESS)
            CU_OK(cuMemFree(d));
    }
    cr_expect(poll_ms(device_memory_back, 1000),
              "%s: the released blocks stayed queued as if a capture were live "
              "(%zu blocks held, %zu bytes pending)", what, program_live(TESTDRV_DEVICE),
              testdrv_pending_free_bytes());
    CU_OK(cuCtxSynchronize());
    expect_device_memory_back(what);
}

/* Before the shim reads its options: the device cache holds no 512 MiB
 * block (the program's peak would keep one). */
static void cache_alone(void)
{
    setenv("CUDEFER_DEVICE_CACHE_PEAK", "0", 1);
}

static void capture_scenario(enum capture_way way, const char *what)
{
    cache_alone();
    CUcontext ctx = test_context();
    capture_and_end(way, ctx);
    expect_releases_after_captures(what);
}

Test(scenarios, capture_on_a_created_stream_ends, .timeout = 20)
{
    capture_scenario(CAPTURE_CREATED_STREAM, "created stream");
}

Test(scenarios, capture_on_the_per_thread_handle_ends, .timeout = 20)
{
    capture_scenario(CAPTURE_PER_THREAD_HANDLE, "CU_STREAM_PER_THREAD");
}

Test(scenarios, capture_on_ptsz_stream_0_ends, .timeout = 20)
{
    capture_scenario(CAPTURE_PTSZ_STREAM_0, "stream 0 through the _ptsz calls");
}

Test(scenarios, capture_to_a_graph_ends, .timeout = 20)
{
    capture_scenario(CAPTURE_TO_GRAPH, "cuStreamBeginCaptureToGraph");
}

Test(scenarios, invalidated_capture_ends, .timeout = 20)
{
    capture_scenario(CAPTURE_INVALIDATED, "invalidated capture");
}

Test(scenarios, capture_of_a_destroyed_stream_ends, .timeout = 20)
{
    capture_scenario(CAPTURE_STREAM_DESTROYED, "stream destroyed mid-capture");
}

Test(scenarios, three_hundred_captures_at_once_end, .timeout = 20)
{
    cache_alone();
    test_context();
    enum { N = 300 };
    CUstream s[N];
    for (int i = 0; i < N; i++)
        s[i] = test_stream(CU_STREAM_NON_BLOCKING);
    for (int i = 0; i < N; i++) {
        CU_OK(cuStreamBeginCapture(s[i], CU_STREAM_CAPTURE_MODE_GLOBAL));
        CU_OK(testdrv_launch(s[i], 10, 0, 0, TESTDRV_NONE));
    }
    for (int i = 0; i < N; i++) {
        CUgraph g;
        CU_OK(cuStreamEndCapture(s[i], &g));
    }
    expect_releases_after_captures("300 captures");
}

/* Each context has its own per-thread stream. A thread captures its
 * per-thread stream in context A, pushes context B and captures B's too,
 * ends B's capture, pops back and destroys B: A's capture is still live,
 * and nothing cudefer does (the releases made meanwhile, fenced once the
 * captures it knows of are over) may invalidate it. */
Test(scenarios, per_thread_captures_of_two_contexts_on_one_thread, .timeout = 20)
{
    CUcontext a = test_context(), b, popped;
    CUctxCreateParams params = {0};
    CU_OK(cuCtxCreate(&b, &params, 0, device0()));
    CU_OK(cuCtxSetCurrent(a));
    void *early, *late;
    CUdeviceptr d;
    CU_OK(cuMemAllocHost(&early, 4096));
    CU_OK(cuMemAllocHost(&late, 4096));
    CU_OK(cuMemAlloc(&d, 4096));
    const CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    CU_OK(cuStreamBeginCapture(CU_STREAM_PER_THREAD, relaxed));
    CU_OK(testdrv_launch(CU_STREAM_PER_THREAD, 10, 0, 0, TESTDRV_NONE));
    CU_OK(cuCtxPushCurrent(b));
    CU_OK(cuStreamBeginCapture(CU_STREAM_PER_THREAD, relaxed));
    CU_OK(testdrv_launch(CU_STREAM_PER_THREAD, 10, 0, 0, TESTDRV_NONE));
    CUgraph gb = NULL, ga = NULL;
    CU_OK(cuStreamEndCapture(CU_STREAM_PER_THREAD, &gb));
    CU_OK(cuCtxPopCurrent(&popped));
    cr_assert_eq(popped, b);
    CU_OK(cuMemFreeHost(early)); /* queued while A's capture is live */
    CU_OK(cuCtxDestroy(b));
    CU_OK(cuMemFreeHost(late));
    CU_OK(cuMemFree(d));
    CUresult rc = cuStreamEndCapture(CU_STREAM_PER_THREAD, &ga);
    cr_expect_eq(rc, CUDA_SUCCESS, "context A's capture ended with %d", (int)rc);
    cr_expect_eq(testdrv_invalidated_captures(), 0);
    if (ga)
        CU_OK(cuGraphDestroy(ga));
    CU_OK(cuGraphDestroy(gb));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_HOST), 0, "pinned blocks still held after a synchronisation");
    cr_expect_eq(testdrv_faults(), 0);
}

/* ==== 10.4 Green contexts ================================================== */

/* Every kind of object the test driver counts, but the streams and events
 * cudefer may keep for the primary context. */
static const enum testdrv_kind counted_kinds[] = {
    TESTDRV_DEVICE, TESTDRV_HOST, TESTDRV_MANAGED, TESTDRV_REGISTERED, TESTDRV_ARRAY,
    TESTDRV_MODULE, TESTDRV_LIBRARY, TESTDRV_VMM, TESTDRV_CONTEXT,
};
#define COUNTED_KINDS (sizeof counted_kinds / sizeof counted_kinds[0])

static size_t live_at_start[COUNTED_KINDS];

static bool live_as_at_start(void)
{
    for (size_t i = 0; i < COUNTED_KINDS; i++)
        if (program_live(counted_kinds[i]) != live_at_start[i])
            return false;
    return testdrv_pending_free_bytes() == 0;
}

static void green_contexts_release_everything(void)
{
    CUcontext primary = test_context();
    CUdevice dev = device0();
    for (size_t i = 0; i < COUNTED_KINDS; i++)
        live_at_start[i] = program_live(counted_kinds[i]);
    size_t contexts_at_start = program_live(TESTDRV_CONTEXT);

    CUdevResource all, groups[3], rest;
    unsigned n = 3;
    CU_OK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    CU_OK(cuDevSmResourceSplitByCount(groups, &n, &all, &rest, 0, 40));
    cr_assert_eq(n, 3);
    for (int i = 0; i < 3; i++) {
        CUdevResourceDesc desc;
        CUgreenCtx green;
        CUcontext ctx;
        CUstream s;
        CUdeviceptr d;
        void *h;
        CU_OK(cuDevResourceGenerateDesc(&desc, &groups[i], 1));
        CU_OK(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
        CU_OK(cuCtxFromGreenCtx(&ctx, green));
        CU_OK(cuCtxSetCurrent(ctx));
        int version = 0;
        CU_OK(cuDriverGetVersion(&version));
        if (version >= 12050)
            CU_OK(cuGreenCtxStreamCreate(&s, green, CU_STREAM_NON_BLOCKING, 0));
        else /* cuGreenCtxStreamCreate came with 12.5 */
            CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU_OK(cuMemAlloc(&d, 64 * MIB));
        CU_OK(testdrv_launch(s, 100000, d, MIB, TESTDRV_WRITE));
        sleep_ms(10);
        CU_OK(cuMemFree(d)); /* while the kernel writes it */
        CU_OK(cuMemAllocHost(&h, MIB));
        CU_OK(cuMemFreeHost(h));
        CU_OK(cuCtxSetCurrent(primary));
        CU_OK(cuGreenCtxDestroy(green));
        /* A release after it: its fence must not name the green context's
         * streams, which its destruction ended. */
        CU_OK(cuMemAlloc(&d, MIB));
        CU_OK(cuMemFree(d));
    }
    CU_OK(cuCtxSynchronize());
    cr_expect(poll_ms(live_as_at_start, 1000),
              "left over: %zu device blocks, %zu pinned, %zu contexts (%zu at the start)",
              program_live(TESTDRV_DEVICE), program_live(TESTDRV_HOST),
              program_live(TESTDRV_CONTEXT), contexts_at_start);
    cr_expect_eq(testdrv_dead_context_calls(), 0, "%llu calls named a destroyed context",
                 (unsigned long long)testdrv_dead_context_calls());
    cr_expect_eq(testdrv_faults(), 0, "a kernel wrote freed memory");
}

Test(scenarios, green_contexts_release_everything, .timeout = 20)
{
    green_contexts_release_everything();
}

/* Before driver 12.5 the fences are events on the program's streams: the
 * streams a green context's destruction ended are forgotten with it. */
Test(scenarios, green_contexts_release_everything_before_12_5, .timeout = 20)
{
    setenv("TESTDRIVER_VERSION", "12040", 1);
    green_contexts_release_everything();
}

/* Before 12.5, a release made while a capture is live is fenced when the
 * capture ends; a green context destroyed in between still has its kernel
 * running (its destruction does not wait), and that kernel must still be
 * covered: the block goes back only after it. Found by fuzz_api_pre125. */
Test(scenarios, green_kernel_outlives_its_context_before_a_deferred_fence, .timeout = 20)
{
    setenv("TESTDRIVER_VERSION", "12040", 1);
    setenv("CUDEFER_DEVICE_CACHE", "0", 1);
    CUcontext primary = test_context();
    CUdevice dev = device0();
    CUdevResource all, group, rest;
    unsigned n = 1;
    CU_OK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    CU_OK(cuDevSmResourceSplitByCount(&group, &n, &all, &rest, 0, 16));
    CUdevResourceDesc desc;
    CUgreenCtx green;
    CUcontext ctx;
    CUstream s, cs;
    CUdeviceptr d;
    CU_OK(cuDevResourceGenerateDesc(&desc, &group, 1));
    CU_OK(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CU_OK(cuCtxFromGreenCtx(&ctx, green));
    cs = test_stream(CU_STREAM_NON_BLOCKING); /* in the primary context */
    CU_OK(cuCtxSetCurrent(ctx));
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(testdrv_launch(s, 300000, d, MIB, TESTDRV_WRITE));
    CU_OK(cuCtxSetCurrent(primary));
    CU_OK(cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_OK(cuMemFree(d)); /* while the capture is live: fenced when it ends */
    CU_OK(cuGreenCtxDestroy(green));
    CUgraph graph;
    CU_OK(cuStreamEndCapture(cs, &graph));
    CU_OK(cuGraphDestroy(graph));
    sleep_ms(400);
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0, "the green kernel wrote the block after it went back");
    cr_expect_eq(testdrv_dead_context_calls(), 0, "%llu calls named a destroyed context",
                 (unsigned long long)testdrv_dead_context_calls());
}

/* ==== 10.4b An unregister's fence over a context that kept walks out ======= */

/* A thread's cudefer_flush walks the primary context for as long as the
 * driver's cuMemFreeHost waits for a kernel; another thread's release of
 * that context (not its last) waits for the walk, and keeps the engine's
 * walks out meanwhile. A third thread's unregister in another context
 * then fences the primary context with a record to be made once it lets
 * walks in again; the waiter makes it, and the unregister waits for it.
 * With the waiter asleep and nothing to wake it, the unregister waited
 * forever (seen once in the loaded race harness). */
struct marked {
    CUcontext primary, other;
    CUstream long_stream;
    atomic_int flushing, releasing, unregistered;
    uint64_t unregister_ns;
    CUresult flush_rc, release_rc, unregister_rc;
};

static void *flush_through_a_long_free(void *arg)
{
    struct marked *m = arg;
    CU_OK(cuCtxSetCurrent(m->primary));
    void *h;
    CU_OK(cuMemAllocHost(&h, 4096));
    CU_OK(cuMemFreeHost(h)); /* its fence passes at once: nothing wakes the waiter */
    CU_OK(testdrv_launch(m->long_stream, 400000, 0, 0, TESTDRV_NONE));
    atomic_store(&m->flushing, 1);
    m->flush_rc = cudefer_flush() == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    return NULL;
}

static void *release_the_primary(void *arg)
{
    struct marked *m = arg;
    atomic_store(&m->releasing, 1);
    m->release_rc = cuDevicePrimaryCtxRelease(device0());
    return NULL;
}

static void *unregister_elsewhere(void *arg)
{
    struct marked *m = arg;
    static char pages[2 * 4096] __attribute__((aligned(4096)));
    CU_OK(cuCtxSetCurrent(m->other));
    CU_OK(cuMemHostRegister(pages, sizeof pages, 0));
    uint64_t t0 = now_ns();
    m->unregister_rc = cuMemHostUnregister(pages);
    m->unregister_ns = now_ns() - t0;
    atomic_store(&m->unregistered, 1);
    return NULL;
}

/* The recipe above up to the release: m's contexts made, then f flushes
 * through the driver's cuMemFreeHost behind a 400 ms kernel and r releases
 * the primary context (not for the last time), waiting for that flush's
 * walk: for about 300 ms, fences made in m->other mark their records in
 * the primary context. The caller joins f and r. */
static void primary_release_waits_for_a_flush(struct marked *m, pthread_t *f, pthread_t *r)
{
    m->primary = test_context();
    CUcontext again;
    CU_OK(cuDevicePrimaryCtxRetain(&again, device0())); /* the release is not the last */
    m->long_stream = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(cuCtxCreate(&m->other, NULL, 0, device0()));
    CU_OK(cuCtxSetCurrent(m->primary));
    sleep_ms(50); /* the waiter has nothing to do: asleep */
    cr_assert_eq(pthread_create(f, NULL, flush_through_a_long_free, m), 0);
    while (!atomic_load(&m->flushing))
        sleep_ms(1);
    sleep_ms(50); /* the flush is inside the driver's cuMemFreeHost */
    cr_assert_eq(pthread_create(r, NULL, release_the_primary, m), 0);
    while (!atomic_load(&m->releasing))
        sleep_ms(1);
    sleep_ms(50); /* the release waits for the flush's walk */
}

/* The recipe above, and during the release's wait the program unregisters
 * pages of the primary context (CUDEFER_REGISTERED=defer: at once, queued in
 * the slot the release keeps walks out of) and registers them again. The
 * registration makes that unregister, which the driver makes after the
 * context's work (the 400 ms kernel), as the driver's own unregister at
 * the program's call would have waited for. It cannot be made while the
 * slot is closed; it must be made once the release reopens it, not a
 * second later when the registration's wait for a change of the pending
 * ranges times out (it waited the full second: nothing it waited for told
 * it that the slot was open again). */
Test(scenarios, registration_over_an_unregister_in_a_released_context_waits_for_the_release,
     .timeout = 30)
{
    setenv("CUDEFER_REGISTERED", "defer", 1);
    struct marked m = {0};
    pthread_t f, r;
    static char page[4096] __attribute__((aligned(4096)));
    CUcontext primary = test_context();
    CU_OK(cuMemHostRegister(page, sizeof page, 0));
    uint64_t start = now_ns();
    primary_release_waits_for_a_flush(&m, &f, &r);
    cr_assert_eq(m.primary, primary);
    CU_OK(cuCtxSetCurrent(m.primary));
    CU_OK(cuMemHostUnregister(page));
    uint64_t t0 = now_ns();
    CUresult rc = cuMemHostRegister(page, sizeof page, 0);
    uint64_t took = now_ns() - t0, since = now_ns() - start;
    pthread_join(f, NULL);
    pthread_join(r, NULL);
    cr_expect_eq(rc, CUDA_SUCCESS);
    cr_expect_eq(m.flush_rc, CUDA_SUCCESS);
    cr_expect_eq(m.release_rc, CUDA_SUCCESS);
    /* The kernel ends about 450 ms after start; the release right then. */
    cr_expect_lt(since, 800 * MS, "the registration returned %llu ms after the recipe began "
                 "(%llu ms in the call): it waited past the release that closed the slot",
                 (unsigned long long)(since / MS), (unsigned long long)(took / MS));
    cr_log_info("the registration returned %llu ms after the recipe began (%llu ms in the "
                "call)", (unsigned long long)(since / MS), (unsigned long long)(took / MS));
    CU_OK(cuMemHostUnregister(page));
    CU_OK(cuCtxDestroy(m.other));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_dead_context_calls(), 0);
}

/* Makes ctx current, begins a relaxed capture of a new stream of it (its
 * result in *rc), then sets *capturing. Returns the stream. */
static CUstream begin_relaxed_capture(CUcontext ctx, CUresult *rc, atomic_int *capturing)
{
    CU_OK(cuCtxSetCurrent(ctx));
    CUstream s;
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    *rc = cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED);
    atomic_store(capturing, 1);
    return s;
}

/* Starts thread *c (fn(arg)), which sets *capturing once its capture is
 * live; then lets the flush f and the release r of
 * primary_release_waits_for_a_flush end, and gives the waiter a moment to
 * find the capture in the way of the records marked meanwhile. */
static void capture_while_the_release_ends(pthread_t *c, void *(*fn)(void *), void *arg,
                                           atomic_int *capturing, pthread_t f, pthread_t r)
{
    cr_assert_eq(pthread_create(c, NULL, fn, arg), 0);
    while (!atomic_load(capturing))
        sleep_ms(1);
    pthread_join(f, NULL);
    pthread_join(r, NULL);
    sleep_ms(20);
}

/* The end of the tests below: the capture ended well (end_rc) and no
 * capture was invalidated; m's second context goes; no call named a dead
 * context and no kernel faulted. */
static void capture_survived_and_nothing_else(struct marked *m, CUresult end_rc)
{
    cr_expect_eq(end_rc, CUDA_SUCCESS, "the capture ended with %d", (int)end_rc);
    cr_expect_eq(testdrv_invalidated_captures(), 0);
    CU_OK(cuCtxDestroy(m->other));
    CU_OK(cuCtxSetCurrent(m->primary));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_dead_context_calls(), 0);
    cr_expect_eq(testdrv_faults(), 0);
}

Test(scenarios, unregister_beside_a_release_waiting_for_a_flush_returns, .timeout = 30)
{
    struct marked m = {0};
    pthread_t f, r, u;
    primary_release_waits_for_a_flush(&m, &f, &r);
    cr_assert_eq(pthread_create(&u, NULL, unregister_elsewhere, &m), 0);
    /* The kernel ends 400 ms after its launch; the flush, the release and
     * then the unregister follow within milliseconds. */
    for (int i = 0; i < 5000 && !atomic_load(&m.unregistered); i++)
        sleep_ms(1);
    bool returned = atomic_load(&m.unregistered);
    cr_expect(returned, "cuMemHostUnregister has not returned 5 s after the primary "
              "context's release: its fence waits for a record nobody makes");
    if (!returned) {
        /* Anything that wakes the waiter ends the wait, then the test. */
        CU_OK(cuCtxSetCurrent(m.primary));
        CUdeviceptr d;
        CU_OK(cuMemAlloc(&d, 4096));
        CU_OK(testdrv_launch(m.long_stream, 100000, d, 4096, TESTDRV_WRITE));
        CU_OK(cuMemFree(d));
    }
    pthread_join(f, NULL);
    pthread_join(r, NULL);
    pthread_join(u, NULL);
    cr_expect_eq(m.flush_rc, CUDA_SUCCESS);
    cr_expect_eq(m.release_rc, CUDA_SUCCESS);
    cr_expect_eq(m.unregister_rc, CUDA_SUCCESS);
    cr_log_info("the unregister took %llu ms", (unsigned long long)(m.unregister_ns / MS));
    CU_OK(cuCtxDestroy(m.other));
    CU_OK(cuCtxSetCurrent(m.primary));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_dead_context_calls(), 0);
}

/* The same recipe, then a capture: pinned blocks released in another
 * context while the primary context's release waits for a flush get
 * fences whose records in the primary context are marked. A thread then
 * begins a capture in the primary context before that release ends: the
 * records cannot be made while the capture is live, and the same thread,
 * still capturing, allocates the memory those blocks hold. With the
 * driver alone it would get it (its release was made and waited for its
 * own context's work only); cudefer gives them back after their own
 * context's work, as the driver would have. Before, every round of the
 * allocation's reclaim was "held back" for 10 s and it then answered out
 * of memory while cudefer held the blocks (tests/race.c, 'stall'). */
struct captured_mark {
    struct marked m;
    atomic_int capturing, allocate, allocated;
    CUresult begin_rc, alloc_rc, end_rc;
    uint64_t alloc_ns;
};

static void *capture_then_allocate(void *arg)
{
    struct captured_mark *cm = arg;
    CUstream s = begin_relaxed_capture(cm->m.primary, &cm->begin_rc, &cm->capturing);
    while (!atomic_load(&cm->allocate))
        sleep_ms(1);
    void *h = NULL;
    uint64_t t0 = now_ns();
    cm->alloc_rc = cuMemAllocHost(&h, 64 * 4096);
    cm->alloc_ns = now_ns() - t0;
    atomic_store(&cm->allocated, 1);
    end_capture_and_destroy(s, &cm->end_rc);
    if (h)
        CU_OK(cuMemFreeHost(h));
    return NULL;
}

Test(scenarios, out_of_memory_beside_a_capture_that_holds_back_a_record, .timeout = 60)
{
    struct captured_mark cm = {0};
    struct marked *m = &cm.m;
    pthread_t f, r, c;
    primary_release_waits_for_a_flush(m, &f, &r);
    /* 64 pinned blocks released in the other context: their fences mark
     * records of the primary context. */
    CU_OK(cuCtxSetCurrent(m->other));
    void *blocks[64];
    for (int i = 0; i < 64; i++)
        CU_OK(cuMemAllocHost(&blocks[i], 4096));
    for (int i = 0; i < 64; i++)
        CU_OK(cuMemFreeHost(blocks[i]));
    capture_while_the_release_ends(&c, capture_then_allocate, &cm, &cm.capturing, f, r);
    /* Only what the released blocks hold is left for the allocation. */
    testdrv_set_host_capacity(testdrv_live_bytes(TESTDRV_HOST));
    atomic_store(&cm.allocate, 1);
    for (int i = 0; i < 30000 && !atomic_load(&cm.allocated); i++)
        sleep_ms(1);
    pthread_join(c, NULL);
    cr_expect_eq(cm.begin_rc, CUDA_SUCCESS);
    cr_expect_eq(cm.alloc_rc, CUDA_SUCCESS,
                 "the allocation beside the capture answered %d after %llu ms, while cudefer "
                 "held %zu released pinned blocks", (int)cm.alloc_rc,
                 (unsigned long long)(cm.alloc_ns / MS), program_live(TESTDRV_HOST));
    cr_expect_lt(cm.alloc_ns, 2000 * MS, "the allocation took %llu ms: its reclaim waited "
                 "for records that the capture of its own thread kept from being made",
                 (unsigned long long)(cm.alloc_ns / MS));
    capture_survived_and_nothing_else(m, cm.end_rc);
}

/* An unregister in another context while the primary context's release
 * waits for a flush: its fence marks a record of the primary context. A
 * thread then begins a capture there and waits, still capturing, for the
 * unregister to return (the program's own order). The record cannot be
 * made while the capture is live: the unregister must not wait for it
 * (it waited for the capture to end: forever, in this program). It makes
 * the driver's own unregister instead, which waits for its own context's
 * work only, as without cudefer. */
struct captured_unregister {
    struct marked m;
    atomic_int capturing;
    CUresult begin_rc, end_rc;
    uint64_t waited_ns;
};

static void *capture_until_unregistered(void *arg)
{
    struct captured_unregister *cu = arg;
    CUstream s = begin_relaxed_capture(cu->m.primary, &cu->begin_rc, &cu->capturing);
    uint64_t t0 = now_ns();
    for (int i = 0; i < 5000 && !atomic_load(&cu->m.unregistered); i++)
        sleep_ms(1);
    cu->waited_ns = now_ns() - t0;
    end_capture_and_destroy(s, &cu->end_rc);
    return NULL;
}

Test(scenarios, unregister_beside_a_capture_that_holds_back_a_record, .timeout = 60)
{
    struct captured_unregister cu = {0};
    struct marked *m = &cu.m;
    pthread_t f, r, u, c;
    primary_release_waits_for_a_flush(m, &f, &r);
    cr_assert_eq(pthread_create(&u, NULL, unregister_elsewhere, m), 0);
    sleep_ms(50); /* its fence is made, its record in the primary context marked */
    cr_assert_eq(pthread_create(&c, NULL, capture_until_unregistered, &cu), 0);
    pthread_join(f, NULL);
    pthread_join(r, NULL);
    pthread_join(u, NULL);
    pthread_join(c, NULL);
    cr_expect_eq(m->unregister_rc, CUDA_SUCCESS);
    cr_expect_lt(m->unregister_ns, 2000 * MS, "the unregister took %llu ms: it waited for a "
                 "record that the capture kept from being made, while the capturing thread "
                 "waited for it", (unsigned long long)(m->unregister_ns / MS));
    cr_expect_eq(cu.begin_rc, CUDA_SUCCESS);
    capture_survived_and_nothing_else(m, cu.end_rc);
}

/* With CUDEFER_REGISTERED=defer an unregister returns at once and its
 * fence is waited for later, by a registration of the same pages. The
 * unregister is made in another context while the primary context's
 * release waits for a flush (its fence marks a record of the primary
 * context), then a thread captures in the primary context until the pages
 * are registered again. The registration must not wait for that record:
 * it makes the pending unregister after its own context's work, as the
 * driver's unregister would. Before, it gave up after ten rounds and
 * answered CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED for pages the program
 * had unregistered. */
struct captured_register {
    struct marked m;
    atomic_int capturing, registered;
    CUresult begin_rc, end_rc, register_rc;
    uint64_t register_ns;
};

static void *capture_until_registered(void *arg)
{
    struct captured_register *cr = arg;
    CUstream s = begin_relaxed_capture(cr->m.primary, &cr->begin_rc, &cr->capturing);
    for (int i = 0; i < 5000 && !atomic_load(&cr->registered); i++)
        sleep_ms(1);
    end_capture_and_destroy(s, &cr->end_rc);
    return NULL;
}

Test(scenarios, register_beside_a_capture_that_holds_back_a_record, .timeout = 60)
{
    static char pages[2 * 4096] __attribute__((aligned(4096)));
    setenv("CUDEFER_REGISTERED", "defer", 1);
    struct captured_register cr = {0};
    struct marked *m = &cr.m;
    pthread_t f, r, c;
    primary_release_waits_for_a_flush(m, &f, &r);
    CU_OK(cuCtxSetCurrent(m->other));
    CU_OK(cuMemHostRegister(pages, sizeof pages, 0));
    CU_OK(cuMemHostUnregister(pages)); /* deferred: its record in the primary marked */
    capture_while_the_release_ends(&c, capture_until_registered, &cr, &cr.capturing, f, r);
    uint64_t t0 = now_ns();
    cr.register_rc = cuMemHostRegister(pages, sizeof pages, 0);
    cr.register_ns = now_ns() - t0;
    atomic_store(&cr.registered, 1);
    pthread_join(c, NULL);
    cr_expect_eq(cr.register_rc, CUDA_SUCCESS, "the registration of pages the program had "
                 "unregistered answered %d after %llu ms", (int)cr.register_rc,
                 (unsigned long long)(cr.register_ns / MS));
    cr_expect_lt(cr.register_ns, 2000 * MS, "the registration took %llu ms",
                 (unsigned long long)(cr.register_ns / MS));
    cr_expect_eq(cr.begin_rc, CUDA_SUCCESS);
    if (cr.register_rc == CUDA_SUCCESS)
        CU_OK(cuMemHostUnregister(pages));
    capture_survived_and_nothing_else(m, cr.end_rc);
}

/* ==== 10.5 A primary release cudefer could not count ======================= */

static int primary_active(CUdevice dev)
{
    unsigned flags;
    int active = -1;
    CU_OK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    return active;
}

static bool everything_released(void)
{
    for (int k = 0; k < TESTDRV_KIND_COUNT; k++)
        if (program_live((enum testdrv_kind)k))
            return false;
    return testdrv_pending_free_bytes() == 0;
}

/* Retained twice, reset, retained again to be used (after a reset the test
 * driver has no retain left: cuda.h says a reset does not release them,
 * see the report), and also held by a green context, whose reference
 * cudefer cannot count as a retain: the program's release is not the
 * context's last. cudefer goes on using it: a block allocated before the
 * release is freed, really, at the next flush, neither kept as torn nor
 * leaked. The last reference, the green context's, ends the context and
 * everything of it, with no call naming it afterwards. */
Test(scenarios, primary_release_that_is_not_the_last, .timeout = 20)
{
    CU_OK(cuInit(0));
    CUdevice dev = device0();
    CUcontext ctx;
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU_OK(cuCtxSetCurrent(ctx));
    CU_OK(cuDevicePrimaryCtxReset(dev));
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));

    CUdevResource all, group, rest;
    unsigned n = 1;
    CUdevResourceDesc desc;
    CUgreenCtx green;
    CU_OK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    CU_OK(cuDevSmResourceSplitByCount(&group, &n, &all, &rest, 0, 8));
    CU_OK(cuDevResourceGenerateDesc(&desc, &group, 1));
    CU_OK(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));

    CUdeviceptr d;
    void *h;
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 50000, d, MIB, TESTDRV_WRITE));
    CU_OK(cuMemAllocHost(&h, MIB));
    CU_OK(cuMemFreeHost(h)); /* something queued */
    CU_OK(cuDevicePrimaryCtxRelease(dev));
    cr_assert_eq(primary_active(dev), 1, "the green context holds the primary context");

    cr_expect_eq(cuMemFree(d), CUDA_SUCCESS, "a live block of a live context");
    CU_OK(cuCtxSynchronize());
    cr_expect(poll_ms(device_memory_back, 1000), "the block was not released (%zu left)",
              program_live(TESTDRV_DEVICE));
    cr_expect_eq(program_live(TESTDRV_HOST), 0, "the queued pinned block was not released");
    cr_expect_eq(cuMemFree(d), CUDA_ERROR_INVALID_VALUE, "freed: the driver's answer");

    CU_OK(cuGreenCtxDestroy(green)); /* the last reference */
    cr_assert_eq(primary_active(dev), 0);
    cr_expect(poll_ms(everything_released, 1000), "objects left after the last reference");
    cr_expect_eq(testdrv_dead_context_calls(), 0, "%llu calls named a destroyed context",
                 (unsigned long long)testdrv_dead_context_calls());
    cr_expect_eq(testdrv_faults(), 0);
}

/* A thread creates contexts on a device while another retains and
 * releases that device's primary context. The primary context must end at
 * the program's last release, in that call: if cudefer itself held a
 * reference meanwhile (to learn whether a new context is the primary one),
 * its own release would be the last, made inside the creating thread's
 * cuCtxCreate, which then waits for the GPU; and cudefer would go on naming
 * a context it did not see end. The other thread is retain_release_loop. */
Test(scenarios, context_creation_beside_primary_releases, .timeout = 60)
{
    CU_OK(cuInit(0));
    struct retain_loop pc = {.dev = device0()};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, retain_release_loop, &pc), 0);
    uint64_t waits = 0, t0 = now_ns();
    int made = 0;
    while (now_ns() - t0 < 2000 * MS) {
        CUcontext ctx;
        uint64_t w0 = testdrv_thread_wait_calls();
        CU_OK(cuCtxCreate(&ctx, NULL, 0, pc.dev));
        waits += testdrv_thread_wait_calls() - w0;
        CU_OK(cuCtxDestroy(ctx));
        made++;
    }
    atomic_store(&pc.stop, 1);
    pthread_join(t, NULL);
    cr_expect_gt(atomic_load(&pc.pairs), 100, "the other thread made %ld pairs",
                 atomic_load(&pc.pairs));
    cr_expect_eq(waits, 0, "%llu of %d context creations made a call that waits for the GPU",
                 (unsigned long long)waits, made);
    cr_expect_eq(primary_active(pc.dev), 0, "the primary context outlived the last release");
    cr_expect_eq(testdrv_dead_context_calls(), 0, "%llu calls named a destroyed context",
                 (unsigned long long)testdrv_dead_context_calls());
}

/* ==== 10.6 Sticky error ===================================================== */

/* A registration's unregister and a library's unload queued, then a kernel
 * fault; the context destroyed: nothing is left. The fault ended the
 * device: a new context answers the driver's CUDA_ERROR_ILLEGAL_ADDRESS
 * (measured on an H200: tests/gpu/sticky.c, tests/gpu/facts.c xctx). */
Test(scenarios, sticky_error_then_destroy_leaves_nothing, .timeout = 20)
{
    CU_OK(cuInit(0));
    CUdevice dev = device0();
    CUcontext ctx;
    CU_OK(cuCtxCreate(&ctx, NULL, 0, dev));
    const size_t bytes = 1 << 16;
    void *pages = aligned_alloc(4096, bytes);
    cr_assert_not_null(pages);
    CU_OK(cuMemHostRegister(pages, bytes, 0));
    CU_OK(cuMemHostUnregister(pages));
    CUlibrary lib = library_loaded(NULL);
    CU_OK(cuLibraryUnload(lib));

    /* The fault: the program's own free, on another stream, under a writer. */
    CUdeviceptr buf;
    CUstream a = test_stream(CU_STREAM_NON_BLOCKING), b = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(cuMemAlloc(&buf, MIB));
    CU_OK(testdrv_launch(a, 100000, buf, MIB, TESTDRV_WRITE));
    CU_OK(cuMemFreeAsync(buf, b));
    cr_assert_eq(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS, "precondition: the fault");

    cr_expect_eq(cuCtxDestroy(ctx), CUDA_SUCCESS);
    cr_expect(poll_ms(everything_released, 1000), "left: %zu registrations, %zu libraries, "
              "%zu streams, %zu events, %zu contexts", program_live(TESTDRV_REGISTERED),
              program_live(TESTDRV_LIBRARY), program_live(TESTDRV_STREAM),
              program_live(TESTDRV_EVENT), program_live(TESTDRV_CONTEXT));

    CUcontext again;
    cr_expect_eq(cuCtxCreate(&again, NULL, 0, dev), CUDA_ERROR_ILLEGAL_ADDRESS,
                 "a context made after the fault");
    cr_expect_eq(testdrv_dead_context_calls(), 0, "%llu calls named a destroyed context",
                 (unsigned long long)testdrv_dead_context_calls());
    cr_expect(everything_released(), "objects left after the attempt");
}

/* ==== 10.7 Quiet exit ======================================================= */

/* A line of text that starts with prefix, or NULL. */
static const char *line_starting(const char *text, const char *prefix)
{
    for (const char *line = text; *line;) {
        if (strncmp(line, prefix, strlen(prefix)) == 0)
            return line;
        const char *end = strchr(line, '\n');
        if (!end)
            break;
        line = end + 1;
    }
    return NULL;
}

/* A program whose exit handler, registered before its first CUDA call,
 * unloads its library after the driver tore itself down: with CUDEFER_LOG
 * unset, its stderr holds no line of cudefer's. */
Test(scenarios, exit_handlers_after_the_driver_are_quiet, .timeout = 20)
{
    char path[] = "/tmp/cudefer-quiet-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fd, 2);
        unsetenv("CUDEFER_LOG");
        setenv("TESTDRIVER_EXIT", "atexit", 1); /* the driver's teardown as CUDA's */
        execl(QUIET_CHILD, QUIET_CHILD, (char *)NULL);
        _exit(127);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    char text[8192] = {0};
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    close(fd);
    unlink(path);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child failed (status %d): %s", status, n > 0 ? text : "");
    cr_expect_not_null(strstr(text, "unload at exit: 4"),
                       "precondition: the unload ran after the driver's teardown "
                       "(CUDA_ERROR_DEINITIALIZED): %s", text);
    cr_expect_null(line_starting(text, "cudefer:"), "cudefer spoke at exit: %s", text);
}
