/* test_conformance.c - bad input gets the real driver's answer.
 *
 * The cases are tests/conformance/cases.h's, the table that the real-GPU
 * check tests/gpu/conform.c runs too; each is a test of its own here
 * (conformance::cases, one parameter per case, its name in every message),
 * run over the test driver. Each test asserts the code the REAL driver gave
 * on the H200 (the table's), then the behaviour afterwards: a follow-up
 * allocation, a kernel writing it and cuCtxSynchronize still succeed, or
 * the context is broken in the same way as on the real driver. Some cases
 * then check what only the test driver can tell (driver_checks below):
 * objects still live or gone, calls into a destroyed context.
 *
 * The suite runs twice (tests/meson.build): with the shim preloaded
 * ("conformance"), where the shim must give the driver's codes, and over
 * the test driver alone ("conformance-driver"), which checks that the test
 * driver imitates the real driver on these cases. Where cudefer differs by
 * design (a release during a global capture only queues, so the capture
 * stays valid) the table names both codes. Where the real driver crashes (a
 * second cuArrayDestroy, cuMipmappedArrayDestroy or cuLibraryUnload of one
 * handle: SIGSEGV measured) only cudefer's answer is checked. Where it
 * crashes with cudefer too (cuMemAllocAsync on a destroyed stream) both
 * runs expect the test driver's answer, the table's stand-in.
 *
 * Criterion runs each test in a process of its own, so a case may break
 * its context for good. */
#include "common.h"

#include "conformance/cases.h"

#include <criterion/parameterized.h>

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------- */

static bool shim_loaded(void)
{
    return dlsym(RTLD_DEFAULT, "cudefer_version") != NULL;
}

static const char *name_of(CUresult rc)
{
    const char *s = NULL;
    if (cuGetErrorName(rc, &s) != CUDA_SUCCESS || !s)
        return "an unknown code";
    return s;
}

static int cudefer_flush(void)
{
    int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
    return flush ? flush() : 0;
}

/* The case under test, for the messages. */
static const struct conform_case *current;

static void expect_code(const char *what, CUresult got, CUresult want)
{
    cr_expect_eq(got, want, "%s: %s returned %s (%d), expected %s (%d)", current->name, what,
                 name_of(got), (int)got, name_of(want), (int)want);
}

/* ---- the harness --------------------------------------------------------- */

static void fail(const char *what, CUresult rc)
{
    cr_assert_fail("%s: %s failed: %s (%d)", current->name, what, name_of(rc), (int)rc);
}

/* A simulated kernel of 50 us writing buf[0 .. words). */
static CUresult launch(CUstream s, CUdeviceptr buf, unsigned long long words)
{
    return testdrv_launch(s, 50, buf, (size_t)words * 4, words ? TESTDRV_WRITE : TESTDRV_NONE);
}

static const struct conform_harness harness = {fail, launch, NULL};

/* ---- the behaviour afterwards ---------------------------------------------- */

/* conform_follow_up, expecting alloc, launch and sync, and no use of freed
 * memory. */
static void expect_after(CUresult alloc, CUresult launch_rc, CUresult sync)
{
    struct conform_after_codes a = conform_follow_up(&harness);
    cr_expect_eq(a.alloc, alloc, "%s: afterwards cuMemAlloc returned %s, expected %s",
                 current->name, name_of(a.alloc), name_of(alloc));
    cr_expect_eq(a.launch, launch_rc, "%s: afterwards a launch returned %s, expected %s",
                 current->name, name_of(a.launch), name_of(launch_rc));
    cr_expect_eq(a.sync, sync, "%s: afterwards cuCtxSynchronize returned %s, expected %s",
                 current->name, name_of(a.sync), name_of(sync));
    if (a.alloc == CUDA_SUCCESS)
        cr_expect_eq(a.free, a.sync == CUDA_SUCCESS ? CUDA_SUCCESS : a.sync,
                     "%s: afterwards cuMemFree returned %s", current->name, name_of(a.free));
    cr_expect_eq(testdrv_faults(), 0, "%s: a kernel touched memory that was not live",
                 current->name);
}

static void expect_after_as_measured(enum conform_after after)
{
    CUresult want = after == CONFORM_AFTER_OK ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
    expect_after(want, want, want);
}

/* ---- what only the test driver can tell -------------------------------------- */

/* The block given to the wrong release is still live: its own release
 * succeeds. */
static void device_block_still_live(struct conform_run *r)
{
    expect_code("cuMemFree of the block", cuMemFree(r->dptr), CUDA_SUCCESS);
}

static void host_block_still_live(struct conform_run *r)
{
    expect_code("cuMemFreeHost of the block", cuMemFreeHost(r->host), CUDA_SUCCESS);
}

static void registration_still_live(struct conform_run *r)
{
    expect_code("cuMemHostUnregister of the range", cuMemHostUnregister(r->host), CUDA_SUCCESS);
}

/* UNMEASURED: with no context the follow-up has nothing to work in
 * (INVALID_CONTEXT, the documented code; the GPU check runs its follow-up
 * with the context pushed back, where all of it succeeds: measured). And
 * the block released with no context is gone. */
static void freed_with_no_context(struct conform_run *r)
{
    CUcontext popped;
    CU_OK(cuCtxPopCurrent(&popped));
    expect_after(CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT,
                 CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cuCtxPushCurrent(popped));
    expect_code("a second cuMemFree", cuMemFree(r->dptr), CUDA_ERROR_INVALID_VALUE);
}

/* The other context's block is gone, and nothing reaches that context once
 * it is destroyed. */
static void other_context_block_freed(struct conform_run *r)
{
    expect_code("a second cuMemFree", cuMemFree(r->dptr), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuCtxDestroy(r->other));
    cudefer_flush();
    cr_expect_eq(program_live(TESTDRV_DEVICE), 0, "%s: device blocks left", current->name);
    cr_expect_eq(testdrv_dead_context_calls(), 0, "%s: a call named a destroyed context",
                 current->name);
}

static void other_context_host_freed(struct conform_run *r)
{
    CU_OK(cuCtxDestroy(r->other));
    cr_expect_eq(program_live(TESTDRV_HOST), 0, "%s: pinned blocks left", current->name);
    cr_expect_eq(testdrv_dead_context_calls(), 0, "%s: a call named a destroyed context",
                 current->name);
}

/* With cudefer the queued free happens after the capture; without it the
 * free failed and the block is still live. */
static void freed_after_capture(struct conform_run *r)
{
    (void)r;
    cudefer_flush();
    cr_expect_eq(program_live(TESTDRV_DEVICE), shim_loaded() ? 0 : 1,
                 "%s: with the shim the queued free happens after the capture", current->name);
}

/* cuCtxSynchronize (in the follow-up) releases what was queued during the
 * capture. */
static void host_freed_after_capture(struct conform_run *r)
{
    (void)r;
    cr_expect_eq(program_live(TESTDRV_HOST), shim_loaded() ? 0 : 1,
                 "%s: cuCtxSynchronize releases what was queued during the capture",
                 current->name);
}

/* After another thread's release during the capture: once everything is
 * synchronised and flushed, nothing is left if the release succeeded. */
static void nothing_left_after_other_thread(struct conform_run *r)
{
    CU_OK(cuCtxSynchronize());
    cudefer_flush();
    if (r->codes[0].rc == CUDA_SUCCESS) {
        cr_expect_eq(program_live(TESTDRV_DEVICE), 0, "%s: device blocks left", current->name);
        cr_expect_eq(program_live(TESTDRV_HOST), 0, "%s: pinned blocks left", current->name);
    }
}

/* The same after another thread's allocation, its block freed here first. */
static void nothing_left_after_other_thread_alloc(struct conform_run *r)
{
    if (r->codes[0].rc == CUDA_SUCCESS)
        CU_OK(cuMemFree(r->dptr));
    nothing_left_after_other_thread(r);
}

/* A release with no context current really happens (at a flush at the
 * latest): a second release of the object is an error, or none is live. */
static void flushed(void)
{
    cr_expect_eq(cudefer_flush(), 0);
}

static void host_freed_with_no_context(struct conform_run *r)
{
    flushed();
    expect_code("a second cuMemFreeHost", cuMemFreeHost(r->host), CUDA_ERROR_INVALID_VALUE);
}

static void unregistered_with_no_context(struct conform_run *r)
{
    flushed();
    expect_code("a second cuMemHostUnregister", cuMemHostUnregister(r->host),
                CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

static void array_gone(struct conform_run *r)
{
    (void)r;
    flushed();
    cr_expect_eq(program_live(TESTDRV_ARRAY), 0, "%s: the array was not destroyed",
                 current->name);
}

static void module_gone(struct conform_run *r)
{
    (void)r;
    flushed();
    cr_expect_eq(program_live(TESTDRV_MODULE), 0, "%s: the module was not unloaded",
                 current->name);
}

static void library_gone(struct conform_run *r)
{
    (void)r;
    flushed();
    cr_expect_eq(program_live(TESTDRV_LIBRARY), 0, "%s: the library was not unloaded",
                 current->name);
}

/* The cases with a check of their own, run after the follow-up. */
static const struct {
    const char *name;
    void (*check)(struct conform_run *r);
} driver_checks[] = {
    {"cuMemFree(interior_pointer)", device_block_still_live},
    {"cuMemFree(cuMemAllocHost_pointer)", host_block_still_live},
    {"cuMemFree(no_current_context)", freed_with_no_context},
    {"cuMemFree(registered_pointer)", registration_still_live},
    {"cuMemFree(managed_interior_pointer)", device_block_still_live},
    {"cuMemFree(other_context_pointer)", other_context_block_freed},
    {"cuMemFreeHost(device_pointer)", device_block_still_live},
    {"cuMemFreeHost(interior_pointer)", host_block_still_live},
    {"cuMemFreeHost(managed_pointer)", device_block_still_live},
    {"cuMemFreeHost(registered_pointer)", registration_still_live},
    {"cuMemFreeHost(other_context_pointer)", other_context_host_freed},
    {"cuMemFreeHost(no_current_context)", host_freed_with_no_context},
    {"cuMemHostUnregister(cuMemAllocHost_pointer)", host_block_still_live},
    {"cuMemHostUnregister(interior_pointer)", registration_still_live},
    {"cuMemHostUnregister(device_pointer)", device_block_still_live},
    {"cuMemHostUnregister(no_current_context)", unregistered_with_no_context},
    {"cuArrayDestroy(no_current_context)", array_gone},
    {"cuMipmappedArrayDestroy(no_current_context)", array_gone},
    {"cuModuleUnload(no_current_context)", module_gone},
    {"cuLibraryUnload(no_current_context)", library_gone},
    {"cuMemFree(in_global_capture)", freed_after_capture},
    {"cuMemFreeHost(in_global_capture)", host_freed_after_capture},
    {"cuMemFree(global_capture_other_thread)", nothing_left_after_other_thread},
    {"cuMemFree(relaxed_thread_during_capture)", nothing_left_after_other_thread},
    {"cuMemFreeHost(relaxed_thread_during_capture)", nothing_left_after_other_thread},
    {"cuMemAlloc(relaxed_thread_during_capture)", nothing_left_after_other_thread_alloc},
};

static void run_driver_check(struct conform_run *r)
{
    for (size_t i = 0; i < sizeof driver_checks / sizeof driver_checks[0]; i++)
        if (strcmp(driver_checks[i].name, current->name) == 0)
            driver_checks[i].check(r);
}

/* ---- the tests ------------------------------------------------------------ */

/* The code this run expects for answer a: the real driver's, or with the
 * shim loaded the shim's; the stand-in where the real driver crashes with
 * and without the shim. */
static CUresult wanted(const struct conform_case *c, struct conform_answer a)
{
    int want = conform_expected(a, shim_loaded());
    return want == CONFORM_CRASH ? (CUresult)c->stand_in : (CUresult)want;
}

static void run_case(const struct conform_case *c)
{
    current = c;
    if (conform_expected(c->call, false) == CONFORM_CRASH && !shim_loaded() &&
        conform_expected(c->call, true) != CONFORM_CRASH)
        cr_skip_test("%s: the real driver crashes here; only the shim's answer is checked",
                     c->name);

    struct conform_run r = {.h = &harness, .primary = test_context()};
    c->run(&r);
    cr_assert_eq(r.n, conform_n_codes(c), "%s: saw %d codes, expected %d", c->name, r.n,
                 conform_n_codes(c));
    for (int i = 0; i < r.n; i++) {
        struct conform_answer a = conform_answer_of(c, i);
        CUresult want = wanted(c, a);
        char what[64];
        snprintf(what, sizeof what, "the call%s", r.codes[i].suffix);
        expect_code(what, r.codes[i].rc, want);
        if (shim_loaded() && a.cudefer != CONFORM_AS_DRIVER && a.cudefer != CONFORM_CRASH)
            cr_log_info("%s: %s is the shim's answer by design", c->name, what);
    }
    expect_after_as_measured(c->after);
    run_driver_check(&r);
}

/* The parameters are indices into the table: Criterion copies them into
 * each test's process, where pointers of the parent would not hold. */
static size_t case_numbers[CONFORM_N_CASES];

ParameterizedTestParameters(conformance, cases)
{
    for (size_t i = 0; i < CONFORM_N_CASES; i++)
        case_numbers[i] = i;
    return cr_make_param_array(size_t, case_numbers, CONFORM_N_CASES);
}

ParameterizedTest(size_t *number, conformance, cases)
{
    run_case(&conform_cases[*number]);
}

/* Every case of the table has a distinct name (the GPU check runs them by
 * name), and every case with a check of its own is in the table. */
Test(conformance, table)
{
    for (size_t i = 0; i < CONFORM_N_CASES; i++) {
        cr_expect_eq(conform_find(conform_cases[i].name), &conform_cases[i],
                     "%s appears twice", conform_cases[i].name);
        cr_expect(conform_n_codes(&conform_cases[i]) <= CONFORM_MAX_CODES);
    }
    for (size_t i = 0; i < sizeof driver_checks / sizeof driver_checks[0]; i++)
        cr_expect_not_null(conform_find(driver_checks[i].name), "%s has a check but no case",
                           driver_checks[i].name);
}
