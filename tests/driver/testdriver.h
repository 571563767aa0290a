/* testdriver.h - test-only hooks of the cudefer test driver.
 *
 * The test driver is a libcuda.so.1 built from this folder for the test
 * suites. It imitates the behaviour of the real CUDA driver that cudefer
 * depends on (measured on an H200, see DESIGN notes in the README): streams
 * that run timed work in order, releases that wait for every stream and stall
 * other threads' launches, cuMemFreeAsync that unmaps memory when its stream
 * reaches it, graph-capture invalidation, out-of-memory at a set capacity.
 * It is a test double: it runs no GPU code and no user should ever load it.
 *
 * Everything below is exported by the test driver only (prefix testdrv_).
 * Tests link against the test driver and call these directly.
 *
 * Environment read by the test driver at cuInit:
 *   TESTDRIVER_DEVICE_BYTES  each device's memory capacity (default 1 GiB)
 *   TESTDRIVER_HOST_BYTES    pinned host memory capacity (default 1 GiB)
 *   TESTDRIVER_VERSION       value of cuDriverGetVersion (default 13000);
 *                            below 12050 cuCtxRecordEvent does not exist
 *   TESTDRIVER_DEVICES       number of devices (default 1)
 *   TESTDRIVER_CONCURRENT_MANAGED
 *                            0: devices without concurrent managed access,
 *                            whose managed memory a device allocation does
 *                            not move out (default 1, as on an H200)
 *   TESTDRIVER_EXIT          "atexit": the exit-time teardown (see the end
 *                            of this list) is an exit handler registered by
 *                            cuInit, not the library's finaliser, so exit
 *                            handlers registered before cuInit run after it
 * (Byte counts accept a k/m/g suffix. The environment is read at the first
 * of cuInit, cuDriverGetVersion and cuGetProcAddress*.)
 *
 * Behaviour worth knowing when writing a test (details in the sources):
 *  - Waiting calls: cuMemFree* (device, managed and pool memory),
 *    cuMemFreeHost, cuMemHostUnregister, cuArrayDestroy,
 *    cuMipmappedArrayDestroy and cuModuleLoad* validate their arguments
 *    (bad input fails at once), then wait until every stream of the
 *    context (legacy and per-thread ones included) has finished the work
 *    queued before the call, holding the context's launch lock meanwhile:
 *    kernel launches (cuLaunchKernel*, testdrv_launch*) from any thread
 *    into that context stall until the call returns. cuLibraryUnload does
 *    the same once one of its kernels was loaded into a context (else it
 *    returns at once); cuModuleUnload waits without the launch lock.
 *    Context teardown waits too. cuMemFree*, cuMemFreeHost and
 *    cuMemHostUnregister need no current context (measured for
 *    cuMemFree): they wait for the context the memory belongs to.
 *    Allocations, stream-ordered calls, stream/event destruction, queries
 *    and cuMemCreate/cuMemRelease never wait.
 *  - cuStreamWriteValue32 (and _v2, _ptsz): the 32-bit word is stored when
 *    the stream reaches it, where the memory is backed on the host (pinned
 *    through its device pointer, registered, managed); a word outside live
 *    memory, or in read-only registered memory, faults the context then.
 *    Flags other than the two defined, or an address that is 0 or not
 *    4-byte aligned, get CUDA_ERROR_INVALID_VALUE at once.
 *  - Legacy stream: an op queued on it waits for the work already queued
 *    on the blocking streams of its context (streams made without
 *    CU_STREAM_NON_BLOCKING, per-thread default streams) and an op queued
 *    on a blocking stream waits for the legacy stream's; non-blocking
 *    streams are independent of it.
 *  - testdrv_thread_wait_calls counts: cuCtxSynchronize*,
 *    cuStreamSynchronize*, cuEventSynchronize, the waiting calls above,
 *    cuLibraryUnload, context teardown (cuCtxDestroy*, the last primary
 *    release, a reset) and synchronous cuMemcpyHtoD / cuMemcpyDtoH.
 *    cuStreamQuery and cuEventQuery are not counted (they never wait).
 *  - cuMemFreeAsync(p, s): p stops being live when s reaches the free,
 *    whatever other streams still do. Its bytes stay counted against
 *    capacity until a host synchronisation that waited on s at or after
 *    the free (cuStreamSynchronize(s), cuEventSynchronize of an event
 *    recorded on s after it, cuCtxSynchronize); dependencies reached
 *    through other streams' event waits are not followed. The first
 *    cuMemFreeAsync of non-pool memory in a process takes 10 ms (the real
 *    driver's one-time set-up), counted in testdrv_thread_blocked_ns.
 *  - Pools keep freed memory reserved up to their release threshold
 *    (default 0); cuMemPoolTrimTo gives it back. Addresses are never
 *    reused, pool or not.
 *  - Device memory has no contents and a PROT_NONE address; managed and
 *    pinned host memory is real memory that becomes PROT_NONE once freed.
 *    Registered memory counts against the host capacity.
 *  - A simulated kernel that writes (TESTDRV_WRITE) over pinned, managed
 *    or registered memory really writes it, as the GPU does: at every
 *    touch it stores TESTDRV_STAMP in the first 4-byte aligned word of
 *    the range in each 4 KiB page the range covers, so a program that
 *    reuses pages the GPU may still write sees it (on an H200 the GPU
 *    overwrote registered pages reused after cuMemHostUnregister had
 *    returned). A page the program has unmapped is skipped, never a
 *    crash. Reads write nothing.
 *  - Memory that was freed is unknown to every call (measured on an H200,
 *    driver 580.159.04, 2026-12-01, tests/gpu/facts.c freed): cuMemFree
 *    and cuMemFreeAsync of it, cuPointerGetAttribute, cuMemHostGetFlags
 *    and cuMemHostGetDevicePointer -> CUDA_ERROR_INVALID_VALUE;
 *    cuMemGetAddressRange -> CUDA_ERROR_NOT_FOUND; cuPointerGetAttributes
 *    -> CUDA_SUCCESS with MEMORY_TYPE 0 and CONTEXT NULL, RANGE_SIZE left
 *    unwritten.
 *  - A context's destruction undoes the registrations made in it:
 *    cuMemHostUnregister of them then answers
 *    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED (and counts a dead-context
 *    call) and the range can be registered again (measured: facts
 *    register).
 *  - cuDevicePrimaryCtxGetState is exact: active from a retain (or a
 *    green context's creation) until the last release with no green
 *    context left, or a reset.
 *  - Green contexts (from version 12040; measured: facts green and
 *    green-dead): cuCtxFromGreenCtx gives a CUcontext of its own (not the
 *    primary's, the same on every call) whose streams
 *    (cuGreenCtxStreamCreate, or cuStreamCreate while it is current) are
 *    its own: cuStreamGetCtx answers it. Memory, events, modules and
 *    arrays made while it is current belong to the primary context and
 *    outlive it. A green context holds a reference on the primary context
 *    (the last one to go tears the primary down). cuCtxRecordEvent,
 *    cuCtxSynchronize and cuCtxWaitEvent on the primary cover its green
 *    contexts' streams; on a green context (or cuGreenCtxRecordEvent)
 *    only its own. Waiting releases wait for the green streams too, and
 *    stall launches on them. cuGreenCtxDestroy does not wait; its
 *    streams' queued work runs on, and later calls on those streams get
 *    CUDA_ERROR_CONTEXT_IS_DESTROYED. Naming a destroyed green context
 *    counts a dead-context call: cuCtxRecordEvent ->
 *    CUDA_ERROR_CONTEXT_IS_DESTROYED, cuCtxGetApiVersion ->
 *    CUDA_ERROR_INVALID_CONTEXT, cuCtxPushCurrent -> CUDA_SUCCESS (then
 *    calls with it current fail with CUDA_ERROR_CONTEXT_IS_DESTROYED).
 *    A device has 132 SMs; partitions take at least 8, in multiples of 8.
 *  - Allocations take no host time unless testdrv_set_alloc_cost gives a
 *    kind a cost; that time is not a wait (not in testdrv_thread_*).
 *  - A destroyed context that is still current makes calls fail with
 *    CUDA_ERROR_CONTEXT_IS_DESTROYED (as cuda.h documents); naming a dead
 *    context or a stream/event/module/array of one gives
 *    CUDA_ERROR_INVALID_CONTEXT; a pointer of one is unknown
 *    (CUDA_ERROR_INVALID_VALUE). All of these count a dead-context call.
 *    Primary contexts keep their handle across release/retain.
 *  - Stream capture records work without running it; a graph can be
 *    instantiated (cuGraphInstantiateWithFlags, cuGraphExecDestroy) but
 *    not launched. See capture.c for the invalidation rules.
 *  - cuLaunchKernelEx runs on config->hStream and cuLaunchCooperativeKernel
 *    on its stream, like cuLaunchKernel (launch lock, capture, _ptsz).
 *  - IPC (memory.c): cuIpcGetMemHandle takes only the base of a live
 *    cuMemAlloc* block of the current context (else
 *    CUDA_ERROR_INVALID_VALUE); the handle names that allocation. Opened
 *    in the process that exported it, cuIpcOpenMemHandle_v2 answers
 *    CUDA_ERROR_INVALID_CONTEXT; in another process it maps a fresh
 *    device address (counted in testdrv_live(TESTDRV_DEVICE), not against
 *    capacity) until cuIpcCloseMemHandle closes its last open. None of
 *    them waits.
 *  - In a process forked from one that initialised the driver, every call
 *    returns CUDA_ERROR_NOT_INITIALIZED (the real driver cannot be used
 *    across fork either). At process exit the driver tears itself down
 *    when its library is finalised: later calls return
 *    CUDA_ERROR_DEINITIALIZED and the first one prints a line on stderr.
 */
#ifndef CUDEFER_TESTDRIVER_H
#define CUDEFER_TESTDRIVER_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The word a writing simulated kernel stores in host memory (see the
 * behaviour list above). */
#define TESTDRV_STAMP 0x5A17C0DEu

/* How a simulated kernel uses its memory range. */
enum testdrv_access {
    TESTDRV_NONE = 0,
    TESTDRV_READ = 1,
    TESTDRV_WRITE = 2,
};

/* Kinds of driver objects the test driver accounts for. */
enum testdrv_kind {
    TESTDRV_DEVICE,     /* cuMemAlloc*, cuMemAllocPitch*, cuMemAllocAsync / pools */
    TESTDRV_HOST,       /* cuMemAllocHost*, cuMemHostAlloc */
    TESTDRV_MANAGED,    /* cuMemAllocManaged */
    TESTDRV_REGISTERED, /* cuMemHostRegister* */
    TESTDRV_ARRAY,      /* cuArrayCreate*, cuArray3DCreate*, cuMipmappedArrayCreate */
    TESTDRV_MODULE,     /* cuModuleLoad* */
    TESTDRV_LIBRARY,    /* cuLibraryLoad* */
    TESTDRV_VMM,        /* cuMemCreate handles */
    TESTDRV_STREAM,     /* streams created by the program (not the built-in ones) */
    TESTDRV_EVENT,
    TESTDRV_CONTEXT,    /* live contexts: primary ones while active, green ones */
    TESTDRV_KIND_COUNT
};

/* Queue a simulated kernel on stream s (CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD accepted, as is NULL for the legacy stream) that runs
 * for usec microseconds once the stream reaches it. While it runs it touches
 * [ptr, ptr + bytes) about every millisecond and once at its end; ptr may be
 * device, managed, pinned-host or registered memory. A touch of memory that
 * is no longer live counts a fault (testdrv_faults) and sets the context's
 * sticky CUDA_ERROR_ILLEGAL_ADDRESS, which every context of its device gets
 * too, and every context made or activated on that device afterwards (as
 * on an H200: no new context can be made after a fault). ptr == 0 touches
 * nothing.
 * Takes the context's launch lock like cuLaunchKernel, so it stalls while a
 * waiting release holds that lock. On a capturing stream it is captured, not
 * run. Returns what cuLaunchKernel would. */
CUresult testdrv_launch(CUstream s, unsigned usec, CUdeviceptr ptr, size_t bytes,
                        enum testdrv_access access);

/* Queue a simulated kernel that spins until *flag becomes non-zero (the
 * kernel-waits-for-host case). Launch lock as for testdrv_launch. */
CUresult testdrv_launch_spin(CUstream s, const volatile int *flag);

/* Calls made so far to the exported entry point with exactly this ELF name
 * (for example "cuMemFree_v2"), from any thread, whichever way it was
 * reached (direct link, dlsym or cuGetProcAddress). */
uint64_t testdrv_calls(const char *name);

/* Calls made by the calling thread so far to entry points that may wait for
 * GPU work (synchronisations, event queries that spin, the waiting releases,
 * blocking allocations), whether or not they actually had to wait. */
uint64_t testdrv_thread_wait_calls(void);

/* Nanoseconds the calling thread has spent blocked inside the driver waiting
 * for GPU work or for a lock that a waiting release held. */
uint64_t testdrv_thread_blocked_ns(void);

/* Waits of the calling thread for GPU work (host synchronisations, waiting
 * releases) that found an unfinished kernel among what they waited for,
 * directly or through the waits of the streams it waited for: a wait for
 * stream-ordered frees or event records alone is not counted, whatever it
 * took. */
uint64_t testdrv_thread_kernel_waits(void);

/* The CLOCK_MONOTONIC time, in ns, at which the latest call ended a wait of
 * 1 ms or more for the test driver's own lock (0: none so far). One lock
 * serialises the whole simulation; on an overloaded machine a thread that
 * holds it may be descheduled for tens of milliseconds, and every call made
 * meanwhile waits, on no GPU work: a test that times calls skips those that
 * ran while this happened. The real driver has no such lock. */
uint64_t testdrv_lock_stall_end_ns(void);

/* Takes the test driver's lock, sets *held, and keeps the lock for ns
 * nanoseconds: a thread descheduled while it holds it (for tests of
 * testdrv_lock_stall_end_ns). */
CUresult testdrv_hold_lock(uint64_t ns, volatile int *held);

/* Kernel touches of memory that was not live (use after free). */
uint64_t testdrv_faults(void);

/* cuCtxSynchronize* calls (all threads, and the calling thread's) that, when
 * made, had to wait for unfinished work of another context: work of the
 * synchronised context waited, on the GPU, for work of a stream of another
 * context (a device context and its green contexts count as one). The real
 * driver waits there too; a program that did not make such a stream wait
 * itself sees a synchronisation wait for work it did not ask for. */
uint64_t testdrv_foreign_syncs(void);
uint64_t testdrv_thread_foreign_syncs(void);

/* Live objects of a kind, and their bytes (0 for kinds without a size). */
size_t testdrv_live(enum testdrv_kind kind);
size_t testdrv_live_bytes(enum testdrv_kind kind);
/* Live memory objects of a kind (DEVICE, HOST, MANAGED or REGISTERED) of
 * exactly bytes bytes: the tests tell cudefer's own pinned words (one of 4
 * bytes a context, shim/engine/fence.h) from the program's blocks. */
size_t testdrv_live_sized(enum testdrv_kind kind, size_t bytes);

/* The stream attachment of the managed allocation starting at ptr: its
 * CU_MEM_ATTACH_* flags (those of cuStreamAttachMemAsync once made, else
 * the allocation's), or -1 when there is none there. The real driver has
 * no query of it. */
int testdrv_managed_attachment(CUdeviceptr ptr);

/* Device memory of bytes at address at, in the current context, made by a
 * call the shim does not see: what the real driver does with
 * cuExternalMemoryGetMappedBuffer or cuMemPoolImportPointer, at an address
 * it handed out before (the test driver's own allocations never reuse a
 * device address). The program frees it with cuMemFree. CUDA_SUCCESS, or
 * CUDA_ERROR_INVALID_VALUE when a live allocation overlaps the range. */
CUresult testdrv_map_device_at(CUdeviceptr at, size_t bytes);

/* 1 when cuMemGetHandleForAddressRange gave a dma-buf of the live
 * allocation holding ptr, else 0 (the real driver has no query of it). */
int testdrv_dmabuf_exported(CUdeviceptr ptr);

/* Device bytes freed with cuMemFreeAsync (or by a pool) whose stream has
 * passed the free but that no host synchronisation has covered yet: still
 * counted against capacity, as on the real driver. */
size_t testdrv_pending_free_bytes(void);
/* The same for device dev alone. */
size_t testdrv_pending_free_bytes_on(int dev);

/* What device dev's capacity (dev -1: the pinned host capacity) counts as
 * taken now: live allocations, pending frees and pools' reserves. */
size_t testdrv_capacity_used(int dev);

/* Managed bytes resident on device dev (counted in its capacity): a device
 * allocation that does not fit moves up to its size of them out to the
 * host, as the real driver does (bench/RESULTS.md, run 99). */
size_t testdrv_managed_resident(int dev);

/* Calls that named a destroyed context or an object of one. */
uint64_t testdrv_dead_context_calls(void);

/* Change each device's memory capacity (bytes) from now on. */
void testdrv_set_device_capacity(size_t bytes);

/* Change the pinned host memory capacity (bytes) from now on (covers
 * cuMemAllocHost*, cuMemHostAlloc, cuMemHostRegister* and host pools).
 * Added for the shim's host-side out-of-memory paths. */
void testdrv_set_host_capacity(size_t bytes);

/* Number of stream captures invalidated so far. */
uint64_t testdrv_invalidated_captures(void);

/* From now on every successful allocation of kind (TESTDRV_DEVICE:
 * cuMemAlloc*, cuMemAllocPitch*, stream-ordered and pool allocations;
 * TESTDRV_HOST: cuMemAllocHost*, cuMemHostAlloc, host pools;
 * TESTDRV_MANAGED: cuMemAllocManaged, managed pools; TESTDRV_REGISTERED:
 * cuMemHostRegister*) takes usec microseconds more on the calling thread,
 * slept after the driver's lock is dropped, so other threads carry on.
 * It is host work, not a wait for the GPU: testdrv_thread_wait_calls and
 * testdrv_thread_blocked_ns do not count it. Failed allocations cost
 * nothing. Default 0; other kinds are ignored. For tests of a reuse
 * policy that weighs waiting against allocating. Works before cuInit. */
void testdrv_set_alloc_cost(enum testdrv_kind kind, unsigned usec);

#ifdef __cplusplus
}
#endif
#endif
