/* test_robust.c - the interposition and the process under conditions that
 * programs and platforms create: glibc's dlsym hard to find, stderr
 * replaced by a data file, the wall clock moved, the environment area
 * rewritten, a second driver named by CUDEFER_DRIVER, hundreds of contexts
 * and captures at once.
 *
 * Over the test driver with the shim preloaded. Every test runs
 * tests/robust_child (a plain program, see its header) as a process of its
 * own, to read its stderr and its files, some with a helper library
 * preloaded before cudefer (tests/robust_hide.c, tests/robust_clock.c).
 * RTLD_NEXT through the dlsym override is tests/robust_next.c, a test of
 * its own ('rtld-next'). */
#include "common.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if !defined(ROBUST_CHILD) || !defined(ROBUST_NOVERSIONS) || !defined(ROBUST_NOLIBS) || \
    !defined(ROBUST_CLOCK)
#error "ROBUST_CHILD, ROBUST_NOVERSIONS, ROBUST_NOLIBS and ROBUST_CLOCK must name the helpers"
#endif

/* ---- running the child ---------------------------------------------------------- */

struct run {
    int status;
    double secs;
    char out[8192]; /* its stdout, cut */
    char err[16384]; /* its stderr, cut */
};

/* LD_PRELOAD with lib inserted just before cudefer (after a sanitizer's
 * runtime, which must stay first). */
static void preload_before_shim(const char *lib, char *out, size_t size)
{
    const char *list = getenv("LD_PRELOAD");
    cr_assert_not_null(list, "LD_PRELOAD is not set: is the shim preloaded?");
    const char *shim = strstr(list, "libcudefer");
    cr_assert_not_null(shim, "LD_PRELOAD (%s) has no libcudefer", list);
    while (shim > list && shim[-1] != ' ' && shim[-1] != ':')
        shim--;
    int n = snprintf(out, size, "%.*s%s %s", (int)(shim - list), list, lib, shim);
    cr_assert_lt((size_t)n, size, "LD_PRELOAD too long");
}

/* Whether a sanitizer's runtime is preloaded: it looks its own functions
 * up with dlsym and dlvsym and lists the libraries with dl_iterate_phdr, so
 * the helpers that hide those would break it, not cudefer. */
static bool sanitizer_preloaded(void)
{
    const char *list = getenv("LD_PRELOAD");
    return list && (strstr(list, "libasan") || strstr(list, "libtsan"));
}

static void drain(int fd, char *buf, size_t size, size_t *len, bool *open)
{
    char scratch[4096];
    ssize_t n = size - 1 > *len ? read(fd, buf + *len, size - 1 - *len)
                                : read(fd, scratch, sizeof scratch);
    if (n > 0 && size - 1 > *len)
        *len += (size_t)n;
    else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
        *open = false;
}

/* Runs robust_child with args (up to two), this process's environment
 * plus the NAME=value strings of extra (NULL-terminated, or NULL), and, if
 * before is not NULL, that library preloaded before cudefer. The child is
 * killed after limit_s. */
static struct run run_child(const char *mode, const char *arg, char *const extra[],
                            const char *before, unsigned limit_s)
{
    static struct run r;
    memset(&r, 0, sizeof r);
    char preload[8192] = "LD_PRELOAD=";
    if (before)
        preload_before_shim(before, preload + strlen(preload), sizeof preload - strlen(preload));
    int out[2], err[2];
    cr_assert_eq(pipe(out), 0);
    cr_assert_eq(pipe(err), 0);
    uint64_t t0 = now_ns();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        close(out[0]), close(out[1]), close(err[0]), close(err[1]);
        for (size_t i = 0; extra && extra[i]; i++)
            putenv(extra[i]);
        if (before)
            putenv(preload);
        execl(ROBUST_CHILD, ROBUST_CHILD, mode, arg, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    size_t nout = 0, nerr = 0;
    bool out_open = true, err_open = true, killed = false;
    while (out_open || err_open) {
        struct pollfd p[2] = {{out_open ? out[0] : -1, POLLIN, 0},
                              {err_open ? err[0] : -1, POLLIN, 0}};
        int n = poll(p, 2, 100);
        if (n > 0 && p[0].revents)
            drain(out[0], r.out, sizeof r.out, &nout, &out_open);
        if (n > 0 && p[1].revents)
            drain(err[0], r.err, sizeof r.err, &nerr, &err_open);
        if (!killed && now_ns() - t0 > (uint64_t)limit_s * 1000 * MS) {
            kill(pid, SIGKILL);
            killed = true;
        }
    }
    close(out[0]);
    close(err[0]);
    cr_assert_eq(waitpid(pid, &r.status, 0), pid);
    r.secs = (double)(now_ns() - t0) / 1e9;
    return r;
}

static void expect_success(const struct run *r, const char *what)
{
    cr_expect(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0,
              "%s: %s %d\nstdout:\n%.2000s\nstderr:\n%.2000s", what,
              WIFSIGNALED(r->status) ? "killed by signal" : "exit status",
              WIFSIGNALED(r->status) ? WTERMSIG(r->status) : WEXITSTATUS(r->status), r->out,
              r->err);
}

static int count_lines(const char *text)
{
    int n = 0;
    for (const char *p = text; *p; p++)
        n += *p == '\n';
    return n;
}

static int count_of(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

static size_t read_file(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
    return n;
}

/* ---- glibc's dlsym found without the usual versions, or not at all ------------ */

/* dlvsym refuses GLIBC_2.34 and GLIBC_2.2.5 (a platform where neither
 * names dlsym): cudefer still finds glibc's dlsym and works (a release is
 * deferred, the dlsym door hands out its wrapper, a flush gives the block
 * back), silently. */
Test(lookup, dlsym_without_its_usual_versions, .timeout = 30)
{
    if (sanitizer_preloaded())
        cr_skip_test("a sanitizer's runtime looks its functions up with dlvsym");
    struct run r = run_child("release", NULL, NULL, ROBUST_NOVERSIONS, 15);
    expect_success(&r, "robust_child release (dlvsym refusing the usual versions)");
    cr_expect_eq(r.err[0], '\0', "cudefer said something:\n%s", r.err);
}

/* dlvsym refuses everything and dl_iterate_phdr lists no library: nothing
 * can find glibc's dlsym. The program must not crash, cudefer must say
 * once that it is disabled, and the program's driver calls must work. */
Test(lookup, dlsym_nowhere_to_be_found, .timeout = 30)
{
    if (sanitizer_preloaded())
        cr_skip_test("a sanitizer's runtime lists the libraries with dl_iterate_phdr");
    struct run r = run_child("passthrough", NULL, NULL, ROBUST_NOLIBS, 15);
    cr_expect_not(WIFSIGNALED(r.status), "killed by signal %d\nstdout:\n%s\nstderr:\n%s",
                  WTERMSIG(r.status), r.out, r.err);
    expect_success(&r, "robust_child passthrough (nothing to be found)");
    cr_expect_eq(count_lines(r.err), 1, "stderr is not one line:\n%s", r.err);
    cr_expect_not_null(strstr(r.err, "disabled"), "no line says cudefer is disabled:\n%s",
                       r.err);
}

/* ---- messages never land in the program's files ------------------------------ */

static void expect_nothing_in_the_data_file(const char *how)
{
    char path[] = "/tmp/cudefer-robust-data-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    /* A warning (read at the first wrapped call), the options and a flush
     * at info level, the statistics at exit. */
    char *extra[] = {"CUDEFER_DEVICE=maybe", "CUDEFER_STATS=1", "CUDEFER_LOG=info", NULL};
    struct run r = run_child(how, path, extra, NULL, 15);
    char data[16384];
    read_file(path, data, sizeof data);
    unlink(path);
    expect_success(&r, how);
    cr_expect_str_eq(data, "data 1\ndata 2\n", "%s: the program's file holds more than its own "
                     "lines:\n%s", how, data);
    /* What cudefer had to say went to the stderr it started with. */
    cr_expect_not_null(strstr(r.err, "invalid value 'maybe' for CUDEFER_DEVICE"),
                       "%s: no warning on the original stderr:\n%s", how, r.err);
    cr_expect_not_null(strstr(r.err, "flush"), "%s: no flush line on the original stderr:\n%s",
                       how, r.err);
    cr_expect_not_null(strstr(r.err, "statistics"),
                       "%s: no statistics on the original stderr:\n%s", how, r.err);
}

/* The program closes descriptor 2 and opens its data file, which takes
 * that number. */
Test(output, stderr_closed_and_its_number_reused, .timeout = 30)
{
    expect_nothing_in_the_data_file("fd2-close");
}

/* The program dup2's its data file onto descriptor 2. */
Test(output, stderr_replaced_by_dup2, .timeout = 30)
{
    expect_nothing_in_the_data_file("fd2-dup2");
}

/* ---- the waiter and the wall clock -------------------------------------------- */

/* A 200 MB device block freed under a 100 ms kernel, with no device cache
 * and no synchronisation by the program: the waiter, asleep until then,
 * must hand it back to the driver (the block and its bytes) within 0.2 s
 * of the kernel's end, whatever the wall clock says. */
static void expect_waiter_on_time(const char *shift)
{
    char shift_var[64];
    snprintf(shift_var, sizeof shift_var, "ROBUST_CLOCK_SHIFT=%s", shift);
    char *extra[] = {"CUDEFER_DEVICE_CACHE=0", shift_var, NULL};
    struct run r = run_child("waiter", NULL, extra, ROBUST_CLOCK, 20);
    expect_success(&r, "robust_child waiter");
    const char *line = strstr(r.out, "back_ms=");
    cr_assert_not_null(line, "no result:\n%s\nstderr:\n%s", r.out, r.err);
    double ms = -1;
    cr_expect(sscanf(line, "back_ms=%lf", &ms) == 1 && ms < 200.0,
              "clock shifted by %s s: the block was not back within 0.2 s of the kernel's "
              "end: %s", shift, line);
}

/* Every reading of the wall clock an hour behind. */
Test(clock, waiter_with_the_clock_set_back, .timeout = 30)
{
    expect_waiter_on_time("-3600");
}

/* The clock stepped back by an hour while the waiter was going to sleep:
 * what it read is an hour ahead of the clock the kernel times absolute
 * waits against. A wait timed on CLOCK_REALTIME would last an hour. */
Test(clock, waiter_when_the_clock_steps_back_mid_wait, .timeout = 30)
{
    expect_waiter_on_time("3600");
}

/* ---- options copied at start -------------------------------------------------- */

static void expect_report_after_rewrite(const char *mode)
{
    char path[] = "/tmp/cudefer-robust-report-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    unlink(path);
    char report[128];
    snprintf(report, sizeof report, "CUDEFER_REPORT=%s", path);
    char *extra[] = {report, NULL};
    struct run r = run_child(mode, NULL, extra, NULL, 15);
    char text[16384];
    size_t n = read_file(path, text, sizeof text);
    unlink(path);
    expect_success(&r, mode);
    cr_expect(n > 0 && text[0] == '{', "%s: no report at %s (the path it started with)\n"
              "stderr:\n%s", mode, path, r.err);
}

/* The environment rewritten after cuInit, the program's first CUDA call
 * (one cudefer does not wrap). */
Test(options, report_path_kept_when_the_environment_is_rewritten, .timeout = 30)
{
    expect_report_after_rewrite("environ");
}

/* The same, after a call cudefer wraps. */
Test(options, report_path_kept_when_rewritten_after_a_wrapped_call, .timeout = 30)
{
    expect_report_after_rewrite("environ-late");
}

/* ---- CUDEFER_DRIVER -------------------------------------------------------------- */

/* The test driver the program loads, as the dynamic linker found it. */
static const char *loaded_driver(void)
{
    Dl_info info;
    cr_assert(dladdr((void *)testdrv_calls, &info) && info.dli_fname);
    return info.dli_fname;
}

static void copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    cr_assert(in >= 0 && out >= 0, "cannot copy %s to %s", from, to);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        cr_assert_eq(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
}

/* CUDEFER_DRIVER names a copy of the driver the program loads: two
 * drivers. cudefer says so once, and every call works, answered by the
 * program's own driver. */
Test(driver_choice, another_copy_of_the_driver, .timeout = 30)
{
    char dir[] = "/tmp/cudefer-robust-driver-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char copy[256], var[300];
    snprintf(copy, sizeof copy, "%s/libcuda.so.1", dir);
    copy_file(loaded_driver(), copy);
    snprintf(var, sizeof var, "CUDEFER_DRIVER=%s", copy);
    char *extra[] = {var, NULL};
    struct run r = run_child("drivers", NULL, extra, NULL, 15);
    unlink(copy);
    rmdir(dir);
    expect_success(&r, "robust_child drivers (CUDEFER_DRIVER naming a copy)");
    cr_expect_eq(count_lines(r.err), 1, "stderr is not one line:\n%s", r.err);
    cr_expect_eq(count_of(r.err, "cudefer: "), 1, "not one message from cudefer:\n%s", r.err);
    cr_expect_not_null(strstr(r.err, "two drivers"), "no line says there are two drivers:\n%s",
                       r.err);
}

/* CUDEFER_DRIVER names the very file the program loads: cudefer works as
 * usual, silently. */
Test(driver_choice, the_program_s_own_driver, .timeout = 30)
{
    char var[4200];
    snprintf(var, sizeof var, "CUDEFER_DRIVER=%s", loaded_driver());
    char *extra[] = {var, NULL};
    struct run r = run_child("release", NULL, extra, NULL, 15);
    expect_success(&r, "robust_child release (CUDEFER_DRIVER naming the program's driver)");
    cr_expect_eq(r.err[0], '\0', "cudefer said something:\n%s", r.err);
}

/* ---- no fixed limits ------------------------------------------------------------- */

/* 200 contexts, up to 100 alive at once, each with a deferred device and
 * pinned release, all destroyed: every release deferred, everything given
 * back, no call on a destroyed context, nothing on stderr. */
Test(limits, two_hundred_contexts_a_hundred_alive, .timeout = 60)
{
    struct run r = run_child("contexts", NULL, NULL, NULL, 45);
    expect_success(&r, "robust_child contexts");
    cr_expect_eq(r.err[0], '\0', "stderr:\n%.2000s", r.err);
}

/* 300 captures live at once, all ended; then a release is fenced (no
 * wait) and its block is reused. Nothing on stderr. */
Test(limits, three_hundred_captures_live, .timeout = 60)
{
    struct run r = run_child("captures", NULL, NULL, NULL, 45);
    expect_success(&r, "robust_child captures");
    cr_expect_eq(r.err[0], '\0', "stderr:\n%.2000s", r.err);
}
