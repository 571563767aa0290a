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
 *   TESTDRIVER_DEVICE_BYTES  device memory capacity (default 1 GiB)
 *   TESTDRIVER_HOST_BYTES    pinned host memory capacity (default 1 GiB)
 *   TESTDRIVER_VERSION       value of cuDriverGetVersion (default 13000);
 *                            below 12050 cuCtxRecordEvent does not exist
 *   TESTDRIVER_DEVICES       number of devices (default 1)
 */
#ifndef CUDEFER_TESTDRIVER_H
#define CUDEFER_TESTDRIVER_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
    TESTDRV_CONTEXT,    /* live contexts, primary ones included while active */
    TESTDRV_KIND_COUNT
};

/* Queue a simulated kernel on stream s (CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD accepted, as is NULL for the legacy stream) that runs
 * for usec microseconds once the stream reaches it. While it runs it touches
 * [ptr, ptr + bytes) about every millisecond and once at its end; ptr may be
 * device, managed, pinned-host or registered memory. A touch of memory that
 * is no longer live counts a fault (testdrv_faults) and sets the context's
 * sticky CUDA_ERROR_ILLEGAL_ADDRESS. ptr == 0 touches nothing.
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

/* Kernel touches of memory that was not live (use after free). */
uint64_t testdrv_faults(void);

/* Live objects of a kind, and their bytes (0 for kinds without a size). */
size_t testdrv_live(enum testdrv_kind kind);
size_t testdrv_live_bytes(enum testdrv_kind kind);

/* Device bytes freed with cuMemFreeAsync (or by a pool) whose stream has
 * passed the free but that no host synchronisation has covered yet: still
 * counted against capacity, as on the real driver. */
size_t testdrv_pending_free_bytes(void);

/* Calls that named a destroyed context or an object of one. */
uint64_t testdrv_dead_context_calls(void);

/* Change the device memory capacity (bytes) from now on. */
void testdrv_set_device_capacity(size_t bytes);

/* Number of stream captures invalidated so far. */
uint64_t testdrv_invalidated_captures(void);

#ifdef __cplusplus
}
#endif
#endif
