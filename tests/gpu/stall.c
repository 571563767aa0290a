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
 * cudefer's cuMemHostUnregister waits for the work submitted before it (the
 * 1 s kernel): the program may unmap or reuse the pages once it returns, so
 * the GPU must be done with them. Its row is judged by the other thread's
 * launch only, which must not block (judge=launch); every other release by
 * both figures (judge=both). The release_cases table says which.
 *
 * usage: stall [reps] [spin_ms]     (defaults: 3 and 1000)
 *
 * prints, per release and repetition:
 *   RESULT stall release=<call(memory)> rep=<n> release_ms=<ms> launch_ms=<ms>
 *          rc=<code> launch_rc=<code> spin_before=<0|1> spin_after=<0|1>
 *          judge=<both|launch>
 * (spin_before/spin_after: the 1 s kernel was still running just before /
 * just after the release; spin_before=0 would make the row meaningless).
 */
#include "release_cases.h"

#include <stdbool.h>

#define SETTLE_MS 50.0

static struct gc_kernels kernels;

/* ---- the cases ----------------------------------------------------------- */

/* The baseline's object: none. */
static void prep_nothing(struct object *o)
{
    (void)o;
}

/* The baseline's release: none. */
static CUresult rel_nothing(struct object *o)
{
    (void)o;
    return CUDA_SUCCESS;
}

/* The first case releases nothing: its launch_ms is what the launch costs
 * when nothing blocks it. */
static const struct release_case baseline = {
    "nothing(launch_alone)", NULL, NULL, prep_nothing, rel_nothing, NULL, false};

/* Case i of this check: the baseline, then every release of
 * release_cases.h in its order. */
static const struct release_case *stall_case(size_t i)
{
    return i == 0 ? &baseline : &release_cases[i - 1];
}

#define N_CASES (1 + N_RELEASE_CASES)

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
    printf(" launch_rc=%s spin_before=%d spin_after=%d judge=%s\n", gc_rc(s->launch_rc),
           (int)s->spin_before, (int)s->spin_after, c->waits_for_prior ? "launch" : "both");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    double spin_ms = argc > 2 ? atof(argv[2]) : 1000.0;
    if (reps < 1 || spin_ms <= 0)
        gc_die("usage: stall [reps] [spin_ms]");

    CUcontext context = gc_init();
    gc_load_kernels(&kernels);

    /* Warm-up: the launcher launches at once; every release once, under a
     * short kernel. */
    release_start(context, kernels.touch);
    for (size_t i = 0; i < N_CASES; i++) {
        struct sample s = measure(stall_case(i), 2.0);
        if (s.rc != CUDA_SUCCESS || s.launch_rc != CUDA_SUCCESS)
            gc_die("warm-up of %s: %s / launch %s", stall_case(i)->name, gc_rc(s.rc),
                   gc_rc(s.launch_rc));
    }

    printf("RESULT stall_setup reps=%d spin_ms=%.0f launch_delay_ms=%.1f shim_loaded=%d\n", reps,
           spin_ms, RELEASE_LAUNCH_DELAY_MS, gc_cudefer_loaded());
    launcher.delay_ms = RELEASE_LAUNCH_DELAY_MS;
    for (size_t i = 0; i < N_CASES; i++) {
        for (int rep = 1; rep <= reps; rep++) {
            struct sample s = measure(stall_case(i), spin_ms);
            print_sample(stall_case(i), rep, &s);
        }
    }

    release_stop();
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    printf("RESULT stall_done ok=1\n");
    return 0;
}
