/* conform.c - check 6: the return codes of releases and allocations given
 * bad input, and how the context behaves afterwards, on the real driver.
 *
 * The cases are tests/conformance/cases.h's, the table that
 * tests/test_conformance.c runs over the test driver too. Each case runs in
 * a process of its own (some break the context, the driver crashes on
 * some); scripts/gpu-check.sh runs every case without and with cudefer and
 * tests/gpu/report.py compares the codes.
 *
 * usage: conform list        prints the case names, one a line
 *        conform <case>      runs one case
 *
 * prints, per code the case sees:
 *   RESULT conform case=<name> rc=<code> after=<behaviour afterwards>
 *          h200=<code|crash> by_design=<code|->
 * (the capture cases also report cuStreamEndCapture, as <name>.end_capture;
 * h200 and by_design are the table's: the code measured on the H200 without
 * cudefer, and cudefer's where it differs by design). Each line is printed
 * twice: at once with after=pending, so that the code is kept if the
 * follow-up dies, and again with the behaviour afterwards once it ran (the
 * last line counts). The behaviour afterwards (conform_follow_up) is, in
 * whatever context the case left current: a 1 MiB cuMemAlloc, a launch of
 * a kernel writing it (cuKernelGetFunction of a library loaded before the
 * case, then cuLaunchKernel on the legacy stream), cuCtxSynchronize:
 *   after=alloc:<code>,launch:<code>,sync:<code>
 * with codes without their CUDA_ / CUDA_ERROR_ prefix.
 * A set-up call that fails ends the program with status 2 and no RESULT.
 */
#include "gpu.h"

#include "../conformance/cases.h"

static const struct conform_case *current;
static CUkernel touch_kernel; /* of a library loaded before the case */

/* ---- the harness ----------------------------------------------------------------- */

static void fail(const char *what, CUresult rc)
{
    gc_fail(what, rc, current ? current->name : "conform", 0);
}

static CUresult launch_touch(CUstream s, CUdeviceptr buf, unsigned long long words)
{
    CUfunction f;
    CUresult rc = cuKernelGetFunction(&f, touch_kernel);
    return rc == CUDA_SUCCESS ? gc_touch_with(f, s, buf, words) : rc;
}

static const char *table_code(int code)
{
    if (code == CONFORM_CRASH)
        return "crash";
    if (code == CONFORM_AS_DRIVER)
        return "-";
    return gc_rc((CUresult)code);
}

static int code_index(const char *suffix)
{
    return strcmp(suffix, ".end_capture") == 0 ? 1 : 0;
}

static void print_line(const char *suffix, CUresult rc, const char *after)
{
    struct conform_answer a = conform_answer_of(current, code_index(suffix));
    printf("RESULT conform case=%s%s rc=%s after=%s h200=%s", current->name, suffix, gc_rc(rc),
           after, table_code(a.driver));
    printf(" by_design=%s\n", table_code(a.cudefer));
    fflush(stdout);
}

static void seen(const char *suffix, CUresult rc)
{
    print_line(suffix, rc, "pending");
}

static const struct conform_harness harness = {fail, launch_touch, seen};

/* ---- the behaviour afterwards ------------------------------------------------------ */

static const char *brief(CUresult rc)
{
    const char *name = gc_rc(rc);
    if (strncmp(name, "CUDA_ERROR_", 11) == 0)
        return name + 11;
    if (strncmp(name, "CUDA_", 5) == 0)
        return name + 5;
    return name;
}

static void finish_case(const struct conform_run *r)
{
    struct conform_after_codes a = conform_follow_up(&harness);
    char after[256], alloc[64], launch[64];
    snprintf(alloc, sizeof alloc, "%s", brief(a.alloc));
    snprintf(launch, sizeof launch, "%s", brief(a.launch));
    snprintf(after, sizeof after, "alloc:%s,launch:%s,sync:%s", alloc, launch, brief(a.sync));
    for (int i = 0; i < r->n; i++)
        print_line(r->codes[i].suffix, r->codes[i].rc, after);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        gc_die("usage: conform list | conform <case>");
    if (strcmp(argv[1], "list") == 0) {
        for (size_t i = 0; i < CONFORM_N_CASES; i++)
            printf("%s\n", conform_cases[i].name);
        return 0;
    }
    current = conform_find(argv[1]);
    if (!current)
        gc_die("unknown case '%s' (conform list names them)", argv[1]);

    struct conform_run r = {.h = &harness, .primary = gc_init()};
    CUlibrary lib;
    GC_CHECK(cuLibraryLoadData(&lib, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    GC_CHECK(cuLibraryGetKernel(&touch_kernel, lib, "cudefer_touch"));
    current->run(&r);
    finish_case(&r);
    return 0;
}
