/* stall.c - check 2: how long each release blocks.
 *
 * For each release, while a 1 s kernel runs on a non-blocking stream of its
 * own: how long the releasing call blocked its caller, and how long a
 * kernel launch (a tiny kernel on a third stream) made by another thread
 * 5 ms into the release blocked that thread. Everything is warmed up first
 * (first launches, module loads, the first release of each kind). The
 * first case releases nothing: its launch_ms is what the launch costs when
 * nothing blocks it, the baseline of the others' launch_ms.
 *
 * usage: stall [reps] [spin_ms]     (defaults: 3 and 1000)
 *
 * prints, per release and repetition:
 *   RESULT stall release=<call(memory)> rep=<n> release_ms=<ms> launch_ms=<ms>
 *          rc=<code> launch_rc=<code> spin_before=<0|1> spin_after=<0|1>
 * (spin_before/spin_after: the 1 s kernel was still running just before /
 * just after the release; spin_before=0 would make the row meaningless).
 */
#include "gpucheck.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define OBJECT_BYTES (1 * GC_MIB)
#define LAUNCH_DELAY_MS 5.0
#define SETTLE_MS 50.0

static struct gc_kernels kernels;
static CUcontext context;
static CUstream spin_stream;   /* the long kernel */
static CUstream launch_stream; /* the other thread's tiny kernels */
static CUstream setup_stream;  /* first launches of loaded kernels */

/* ---- the launching thread ------------------------------------------------ */

static struct {
    pthread_t thread;
    _Atomic int go;   /* round to launch in */
    _Atomic int done; /* last round launched */
    _Atomic bool quit;
    double delay_ms;
    double launch_ms;
    CUresult rc;
} launcher;

static void *launcher_main(void *arg)
{
    (void)arg;
    GC_CHECK(cuCtxSetCurrent(context));
    int round = 0;
    for (;;) {
        while (atomic_load(&launcher.go) == round && !atomic_load(&launcher.quit))
            gc_sleep_ms(0.02);
        if (atomic_load(&launcher.quit))
            return NULL;
        round = atomic_load(&launcher.go);
        gc_sleep_ms(launcher.delay_ms);
        double t0 = gc_now_ms();
        launcher.rc = gc_touch(&kernels, launch_stream, 0, 0);
        launcher.launch_ms = gc_now_ms() - t0;
        atomic_store(&launcher.done, round);
    }
}

static int launcher_start_round(void)
{
    int round = atomic_load(&launcher.go) + 1;
    atomic_store(&launcher.go, round);
    return round;
}

static void launcher_wait(int round)
{
    while (atomic_load(&launcher.done) != round)
        gc_sleep_ms(0.1);
}

/* ---- the objects released ------------------------------------------------ */

struct object {
    CUdeviceptr dptr;
    void *host;
    CUarray array;
    CUmodule module;
    CUlibrary library;
};

static void prep_nothing(struct object *o)
{
    (void)o;
}

static void prep_device(struct object *o)
{
    GC_CHECK(cuMemAlloc(&o->dptr, OBJECT_BYTES));
}

static void prep_managed(struct object *o)
{
    GC_CHECK(cuMemAllocManaged(&o->dptr, OBJECT_BYTES, CU_MEM_ATTACH_GLOBAL));
}

static void prep_alloc_host(struct object *o)
{
    GC_CHECK(cuMemAllocHost(&o->host, OBJECT_BYTES));
}

static void prep_host_alloc(struct object *o)
{
    GC_CHECK(cuMemHostAlloc(&o->host, OBJECT_BYTES, CU_MEMHOSTALLOC_DEVICEMAP));
}

static void prep_registered(struct object *o)
{
    o->host = gc_xpages(OBJECT_BYTES);
    GC_CHECK(cuMemHostRegister(o->host, OBJECT_BYTES, 0));
}

static void prep_array(struct object *o)
{
    CUDA_ARRAY_DESCRIPTOR d = {
        .Width = 256, .Height = 256, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    GC_CHECK(cuArrayCreate(&o->array, &d));
}

static void prep_module(struct object *o)
{
    CUfunction f;
    GC_CHECK(cuModuleLoadData(&o->module, cudefer_kernels_ptx));
    GC_CHECK(cuModuleGetFunction(&f, o->module, "cudefer_touch"));
    GC_CHECK(gc_touch_with(f, setup_stream, 0, 0));
    GC_CHECK(cuStreamSynchronize(setup_stream));
}

/* A library one of whose kernels is loaded into the context and has run:
 * only then does the real cuLibraryUnload wait for the GPU. */
static void prep_library(struct object *o)
{
    CUkernel k;
    CUfunction f;
    GC_CHECK(cuLibraryLoadData(&o->library, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    GC_CHECK(cuLibraryGetKernel(&k, o->library, "cudefer_touch"));
    GC_CHECK(cuKernelGetFunction(&f, k));
    GC_CHECK(gc_touch_with(f, setup_stream, 0, 0));
    GC_CHECK(cuStreamSynchronize(setup_stream));
}

static CUresult rel_nothing(struct object *o)
{
    (void)o;
    return CUDA_SUCCESS;
}

static CUresult rel_mem_free(struct object *o) { return cuMemFree(o->dptr); }
static CUresult rel_free_host(struct object *o) { return cuMemFreeHost(o->host); }
static CUresult rel_unregister(struct object *o) { return cuMemHostUnregister(o->host); }
static CUresult rel_array(struct object *o) { return cuArrayDestroy(o->array); }
static CUresult rel_module(struct object *o) { return cuModuleUnload(o->module); }
static CUresult rel_library(struct object *o) { return cuLibraryUnload(o->library); }

static void after_registered(struct object *o)
{
    free(o->host);
}

struct release_case {
    const char *name;
    void (*prepare)(struct object *o);
    CUresult (*release)(struct object *o);
    void (*after)(struct object *o); /* once the context is synchronised */
};

static const struct release_case cases[] = {
    {"nothing(launch_alone)", prep_nothing, rel_nothing, NULL},
    {"cuMemFree(cuMemAlloc)", prep_device, rel_mem_free, NULL},
    {"cuMemFree(cuMemAllocManaged)", prep_managed, rel_mem_free, NULL},
    {"cuMemFreeHost(cuMemAllocHost)", prep_alloc_host, rel_free_host, NULL},
    {"cuMemFreeHost(cuMemHostAlloc)", prep_host_alloc, rel_free_host, NULL},
    {"cuMemHostUnregister", prep_registered, rel_unregister, after_registered},
    {"cuArrayDestroy", prep_array, rel_array, NULL},
    {"cuModuleUnload(second_module)", prep_module, rel_module, NULL},
    {"cuLibraryUnload(kernel_loaded)", prep_library, rel_library, NULL},
};

/* ---- one measurement ----------------------------------------------------- */

struct sample {
    double release_ms, launch_ms;
    CUresult rc, launch_rc;
    bool spin_before, spin_after;
};

static bool spinning(void)
{
    return cuStreamQuery(spin_stream) == CUDA_ERROR_NOT_READY;
}

static struct sample measure(const struct release_case *c, double spin_ms)
{
    struct object o = {0};
    struct sample s;

    c->prepare(&o);
    GC_CHECK(gc_spin(&kernels, spin_stream, spin_ms, 0, 0));
    gc_sleep_ms(spin_ms > 2 * SETTLE_MS ? SETTLE_MS : 0);

    s.spin_before = spinning();
    int round = launcher_start_round();
    double t0 = gc_now_ms();
    s.rc = c->release(&o);
    s.release_ms = gc_now_ms() - t0;
    s.spin_after = spinning();
    launcher_wait(round);
    s.launch_ms = launcher.launch_ms;
    s.launch_rc = launcher.rc;

    GC_CHECK(cuCtxSynchronize());
    if (c->after)
        c->after(&o);
    return s;
}

static void print_sample(const struct release_case *c, int rep, const struct sample *s)
{
    printf("RESULT stall release=%s rep=%d release_ms=%.4f launch_ms=%.4f rc=%s", c->name, rep,
           s->release_ms, s->launch_ms, gc_rc(s->rc));
    printf(" launch_rc=%s spin_before=%d spin_after=%d\n", gc_rc(s->launch_rc),
           (int)s->spin_before, (int)s->spin_after);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    double spin_ms = argc > 2 ? atof(argv[2]) : 1000.0;
    if (reps < 1 || spin_ms <= 0)
        gc_die("usage: stall [reps] [spin_ms]");
    size_t ncases = sizeof cases / sizeof cases[0];

    context = gc_init();
    gc_load_kernels(&kernels);
    GC_CHECK(cuStreamCreate(&spin_stream, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&launch_stream, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&setup_stream, CU_STREAM_NON_BLOCKING));

    /* Warm-up: the launcher launches at once; every release once, under a
     * short kernel. */
    launcher.delay_ms = 0;
    if (pthread_create(&launcher.thread, NULL, launcher_main, NULL) != 0)
        gc_die("pthread_create failed");
    for (size_t i = 0; i < ncases; i++) {
        struct sample s = measure(&cases[i], 2.0);
        if (s.rc != CUDA_SUCCESS || s.launch_rc != CUDA_SUCCESS)
            gc_die("warm-up of %s: %s / launch %s", cases[i].name, gc_rc(s.rc),
                   gc_rc(s.launch_rc));
    }

    printf("RESULT stall_setup reps=%d spin_ms=%.0f launch_delay_ms=%.1f shim_loaded=%d\n", reps,
           spin_ms, LAUNCH_DELAY_MS, gc_cudefer_loaded());
    launcher.delay_ms = LAUNCH_DELAY_MS;
    for (size_t i = 0; i < ncases; i++) {
        for (int rep = 1; rep <= reps; rep++) {
            struct sample s = measure(&cases[i], spin_ms);
            print_sample(&cases[i], rep, &s);
        }
    }

    atomic_store(&launcher.quit, true);
    pthread_join(launcher.thread, NULL);
    GC_CHECK(cuStreamDestroy(spin_stream));
    GC_CHECK(cuStreamDestroy(launch_stream));
    GC_CHECK(cuStreamDestroy(setup_stream));
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    printf("RESULT stall_done ok=1\n");
    return 0;
}
