/* harness.c - see harness.h. */
#include "harness.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "testdriver.h"

struct hx_run hx;
struct hx_thread *hx_threads[HX_MAX_THREADS];

/* One lock per thread's history (the owner writes it, a report reads it),
 * one for reports. */
static pthread_mutex_t hist_lock[HX_MAX_THREADS];
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned nfailures;
static char failed_list[512];

uint64_t hx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t hx_thread_run_delay_ns(void)
{
    /* Opened once per thread (-2: not yet), read again from its start. */
    static _Thread_local int fd = -2;
    if (fd == -2)
        fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char buf[96];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    unsigned long long run, delay;
    return sscanf(buf, "%llu %llu", &run, &delay) == 2 ? delay : 0;
}

/* ---- the run ----------------------------------------------------------- */

static unsigned long long parse_count(const char *s, const char *what, bool zero_ok)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || (!zero_ok && v == 0)) {
        fprintf(stderr, "%s: bad %s '%s'\n", hx.name, what, s);
        exit(2);
    }
    return v;
}

static const char *env_of(const char *suffix)
{
    char name[64];
    snprintf(name, sizeof name, "%s_%s", hx.env_prefix, suffix);
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

void hx_parse(int argc, char **argv, const char *name, const char *env_prefix,
              unsigned long long default_ops, int default_threads,
              unsigned long long ops_per_s_floor)
{
    const char *v;
    hx.name = name;
    hx.env_prefix = env_prefix;
    hx.argv0 = argv[0];
    hx.ops = (v = env_of("OPS")) ? parse_count(v, "operation count", false) : default_ops;
    hx.threads = (v = env_of("THREADS")) ? (int)parse_count(v, "thread count", false)
                                         : default_threads;
    hx.seed = (v = env_of("SEED")) ? parse_count(v, "seed", true) : 1;
    if (argc > 1)
        hx.ops = parse_count(argv[1], "operation count", false);
    if (argc > 2)
        hx.threads = (int)parse_count(argv[2], "thread count", false);
    if (argc > 3)
        hx.seed = parse_count(argv[3], "seed", true);
    if (hx.threads < 1 || hx.threads > HX_MAX_THREADS) {
        fprintf(stderr, "%s: the thread count must be 1..%d\n", name, HX_MAX_THREADS);
        exit(2);
    }
    hx.timeout_s = 120;
    if (hx.ops / ops_per_s_floor > hx.timeout_s)
        hx.timeout_s = (unsigned)(hx.ops / ops_per_s_floor);
    if ((v = env_of("TIMEOUT")))
        hx.timeout_s = (unsigned)parse_count(v, "timeout", false);
    if ((v = env_of("STALL_S")))
        hx.stall_s = (unsigned)parse_count(v, "stall limit", true);
    hx.keep_going = (v = env_of("KEEP_GOING")) && strcmp(v, "0") != 0;
}

/* ---- threads --------------------------------------------------------------- */

void hx_thread_init(struct hx_thread *t, int index)
{
    memset(t, 0, sizeof *t);
    t->index = index;
    /* splitmix64 of (seed, index): independent streams per thread. */
    uint64_t z = hx.seed * 0x9E3779B97F4A7C15ull + (uint64_t)(index + 1) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    t->rng = (z ^ (z >> 31)) | 1;
    pthread_mutex_init(&hist_lock[index], NULL);
    /* The watchdog looks at the table while threads are set up. */
    __atomic_store_n(&hx_threads[index], t, __ATOMIC_RELEASE);
}

uint64_t hx_random(struct hx_thread *t)
{
    /* xorshift64* */
    t->rng ^= t->rng >> 12;
    t->rng ^= t->rng << 25;
    t->rng ^= t->rng >> 27;
    return t->rng * 0x2545F4914F6CDD1Dull;
}

unsigned hx_below(struct hx_thread *t, unsigned n)
{
    return n ? (unsigned)(hx_random(t) % n) : 0;
}

const char *hx_rc(CUresult rc)
{
    static _Thread_local char buf[24];
    const char *s = NULL;
    if (cuGetErrorName(rc, &s) == CUDA_SUCCESS && s)
        return s;
    snprintf(buf, sizeof buf, "CUresult %d", (int)rc);
    return buf;
}

static void vset(struct hx_thread *t, bool append, const char *fmt, va_list ap)
{
    pthread_mutex_lock(&hist_lock[t->index]);
    unsigned n = atomic_load(&t->nhist);
    struct hx_entry *e;
    if (append && n) {
        e = &t->hist[(n - 1) % HX_HISTORY];
        size_t used = strlen(e->text);
        vsnprintf(e->text + used, sizeof e->text - used, fmt, ap);
    } else {
        e = &t->hist[n % HX_HISTORY];
        e->op = atomic_load_explicit(&t->done, memory_order_relaxed);
        vsnprintf(e->text, sizeof e->text, fmt, ap);
        atomic_store(&t->nhist, n + 1);
    }
    pthread_mutex_unlock(&hist_lock[t->index]);
}

static void append(struct hx_thread *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(struct hx_thread *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(t, true, fmt, ap);
    va_end(ap);
}

void hx_begin(struct hx_thread *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(t, false, fmt, ap);
    va_end(ap);
    atomic_store(&t->call_start_ns, hx_now_ns());
    atomic_store(&t->in_call, "a driver call");
}

void hx_end(struct hx_thread *t, CUresult rc)
{
    atomic_store(&t->in_call, NULL);
    append(t, " -> %s", hx_rc(rc));
}

void hx_note(struct hx_thread *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(t, false, fmt, ap);
    va_end(ap);
}

/* ---- reports ----------------------------------------------------------------- */

static void print_history(struct hx_thread *t, unsigned shown)
{
    pthread_mutex_lock(&hist_lock[t->index]);
    unsigned n = atomic_load(&t->nhist);
    unsigned first = n > shown ? n - shown : 0;
    const char *in_call = atomic_load(&t->in_call);
    fprintf(stderr, "%s:   thread %d (%llu of %llu operations done%s):\n", hx.name, t->index,
            atomic_load(&t->done), t->ops,
            in_call ? ", inside the last call" : "");
    for (unsigned i = first; i < n; i++) {
        const struct hx_entry *e = &t->hist[i % HX_HISTORY];
        fprintf(stderr, "%s:     op %6llu  %s\n", hx.name, e->op, e->text);
    }
    if (in_call)
        fprintf(stderr, "%s:     (in that call for %.1f ms)\n", hx.name,
                (double)(hx_now_ns() - atomic_load(&t->call_start_ns)) / 1e6);
    pthread_mutex_unlock(&hist_lock[t->index]);
}

extern char **environ;

const char *hx_savings_by_seed(void)
{
    if (!getenv("CUDEFER_STATS") && !getenv("CUDEFER_REPORT") && !getenv("CUDEFER_SAVINGS") &&
        hx.seed % 2 == 0)
        setenv("CUDEFER_REPORT", "/dev/null", 0);
    const char *savings = getenv("CUDEFER_SAVINGS"), *stats = getenv("CUDEFER_STATS");
    const char *report = getenv("CUDEFER_REPORT");
    bool shown = (stats && strcmp(stats, "0") != 0) || (report && *report);
    return shown && !(savings && strcmp(savings, "0") == 0) ? "gathered" : "not gathered";
}

const char *hx_word_by_seed(void)
{
    setenv("CUDEFER_FENCE_WORD", hx.seed % 3 == 0 ? "0" : "1", 0);
    const char *word = getenv("CUDEFER_FENCE_WORD");
    return word && strcmp(word, "0") == 0 ? "events alone" : "words";
}

/* The seed, and the command that replays the run: the run's own variables
 * and cudefer's, then the program with its operation and thread counts. */
static void print_replay(void)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s_", hx.env_prefix);
    fprintf(stderr, "%s: seed %llu; replay:", hx.name, (unsigned long long)hx.seed);
    for (char **e = environ; *e; e++)
        if ((strncmp(*e, prefix, strlen(prefix)) == 0 || strncmp(*e, "CUDEFER_", 8) == 0) &&
            strncmp(*e + strlen(prefix), "SEED=", 5) != 0)
            fprintf(stderr, " %s", *e);
    fprintf(stderr, " %s_SEED=%llu %s %llu %d\n", hx.env_prefix, (unsigned long long)hx.seed,
            hx.argv0, hx.ops, hx.threads);
}

static void print_all(struct hx_thread *failing)
{
    if (failing)
        print_history(failing, HX_SHOWN);
    for (int i = 0; i < hx.threads; i++)
        if (hx_threads[i] && hx_threads[i] != failing)
            print_history(hx_threads[i], failing ? 4 : 8);
}

void hx_fail(struct hx_thread *t, const char *invariant, const char *fmt, ...)
{
    pthread_mutex_lock(&report_lock);
    nfailures++;
    if (!strstr(failed_list, invariant) &&
        strlen(failed_list) + strlen(invariant) + 2 < sizeof failed_list) {
        if (failed_list[0])
            strcat(failed_list, " ");
        strcat(failed_list, invariant);
    }
    /* The message is printed again after the histories: a test runner that
     * shows only a failing log's last lines still shows what failed. */
    char seen[32] = "", what[768];
    if (t)
        snprintf(seen, sizeof seen, ", seen by thread %d", t->index);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: FAILED invariant '%s'%s: %s\n", hx.name, invariant, seen, what);
    print_replay();
    fprintf(stderr, "%s: the last operations (op: the thread's operation number)%s:\n", hx.name,
            t ? "; other threads, fewer" : "");
    print_all(t);
    fprintf(stderr, "%s: (again) FAILED invariant '%s'%s: %s\n", hx.name, invariant, seen, what);
    print_replay();
    fflush(stderr);
    if (!hx.keep_going) {
        fflush(stdout);
        _exit(1);
    }
    pthread_mutex_unlock(&report_lock);
}

bool hx_expect(struct hx_thread *t, const char *call, CUresult rc, CUresult want)
{
    if (rc == want)
        return true;
    hx_fail(t, "result", "%s returned %s, the driver alone would return %s", call, hx_rc(rc),
            hx_rc(want));
    return false;
}

/* True once for each new value of a global counter: the thread that moves
 * *reported up to now reports it. */
static bool newly(_Atomic uint64_t *reported, uint64_t now)
{
    uint64_t seen = atomic_load(reported);
    while (now > seen)
        if (atomic_compare_exchange_weak(reported, &seen, now))
            return true;
    return false;
}

static _Atomic uint64_t faults_reported, dead_reported;

void hx_check_always(struct hx_thread *t)
{
    uint64_t faults = testdrv_faults(), dead = testdrv_dead_context_calls();
    if (newly(&faults_reported, faults))
        hx_fail(t, "fault", "%llu kernel touches of memory that was not live",
                (unsigned long long)faults);
    if (newly(&dead_reported, dead))
        hx_fail(t, "dead-context", "%llu calls named a destroyed context",
                (unsigned long long)dead);
}

unsigned hx_failures(void)
{
    pthread_mutex_lock(&report_lock);
    unsigned n = nfailures;
    pthread_mutex_unlock(&report_lock);
    return n;
}

const char *hx_failed_invariants(void)
{
    return failed_list;
}

/* ---- watchdog ------------------------------------------------------------- */

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_cv = PTHREAD_COND_INITIALIZER;
static bool watch_done;
static const char *watch_phase = "starting";
static pthread_t watch_thread;

/* The thread whose call has been under way for longer than hx.stall_s,
 * or NULL; *secs: how long. */
static struct hx_thread *stalled(double *secs)
{
    uint64_t now = hx_now_ns(), limit = (uint64_t)hx.stall_s * 1000000000ull;
    for (int i = 0; i < hx.threads && i < HX_MAX_THREADS; i++) {
        struct hx_thread *t = __atomic_load_n(&hx_threads[i], __ATOMIC_ACQUIRE);
        if (!t || !atomic_load(&t->in_call))
            continue;
        uint64_t start = atomic_load(&t->call_start_ns);
        if (start && now > start && now - start > limit && atomic_load(&t->in_call)) {
            *secs = (double)(now - start) / 1e9;
            return t;
        }
    }
    return NULL;
}

/* Ends the run with 'hang' past hx.timeout_s, and with 'stall' when one
 * call has been under way for longer than hx.stall_s (looked at four times
 * a second): a wait that ends only when a limit of cudefer's own runs out
 * (seconds of retries, a minute for another thread's flush) hides behind
 * the run's total time otherwise. */
static void *watchdog_main(void *arg)
{
    (void)arg;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += hx.timeout_s;
    pthread_mutex_lock(&watch_lock);
    while (!watch_done) {
        struct timespec until = deadline;
        if (hx.stall_s) {
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 250000000L;
            until.tv_sec += until.tv_nsec / 1000000000L;
            until.tv_nsec %= 1000000000L;
            if (until.tv_sec > deadline.tv_sec ||
                (until.tv_sec == deadline.tv_sec && until.tv_nsec > deadline.tv_nsec))
                until = deadline;
        }
        int rc = pthread_cond_timedwait(&watch_cv, &watch_lock, &until);
        if (watch_done)
            break;
        double secs = 0;
        struct hx_thread *t = hx.stall_s ? stalled(&secs) : NULL;
        if (t) {
            pthread_mutex_unlock(&watch_lock);
            hx.keep_going = false;
            hx_fail(t, "stall",
                    "one call has been under way for %.1f s (limit %u s, %s_STALL_S): a wait "
                    "far beyond the run's kernels, ended only by a limit", secs, hx.stall_s,
                    hx.env_prefix);
        }
        if (rc == ETIMEDOUT && until.tv_sec == deadline.tv_sec &&
            until.tv_nsec == deadline.tv_nsec) {
            const char *phase = watch_phase;
            pthread_mutex_unlock(&watch_lock);
            hx.keep_going = false;
            hx_fail(NULL, "hang",
                    "the run took more than %u s (phase: %s): a call that never returns "
                    "or a deadlock", hx.timeout_s, phase);
        }
    }
    pthread_mutex_unlock(&watch_lock);
    return NULL;
}

void hx_watchdog_start(void)
{
    if (pthread_create(&watch_thread, NULL, watchdog_main, NULL) != 0) {
        fprintf(stderr, "%s: no watchdog thread\n", hx.name);
        exit(2);
    }
}

void hx_watchdog_phase(const char *phase)
{
    pthread_mutex_lock(&watch_lock);
    watch_phase = phase;
    pthread_mutex_unlock(&watch_lock);
}

void hx_watchdog_stop(void)
{
    pthread_mutex_lock(&watch_lock);
    watch_done = true;
    pthread_cond_signal(&watch_cv);
    pthread_mutex_unlock(&watch_lock);
    pthread_join(watch_thread, NULL);
}

/* ---- entry points ---------------------------------------------------------- */

void *hx_sym_opt(const char *name)
{
    return dlsym(RTLD_DEFAULT, name);
}

void *hx_sym(const char *name)
{
    void *p = hx_sym_opt(name);
    if (!p) {
        fprintf(stderr, "%s: %s is not there\n", hx.name, name);
        exit(2);
    }
    return p;
}

static int (*flush_fn)(void);
static pthread_once_t flush_once = PTHREAD_ONCE_INIT;

static void find_flush(void)
{
    flush_fn = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
}

int hx_flush(void)
{
    pthread_once(&flush_once, find_flush);
    return flush_fn ? flush_fn() : -1;
}

bool hx_shim_loaded(void)
{
    pthread_once(&flush_once, find_flush);
    return flush_fn != NULL;
}

/* ---- contexts ------------------------------------------------------------------ */

static pthread_mutex_t legacy_lock = PTHREAD_MUTEX_INITIALIZER;

bool hx_legacy_enter(struct hx_ctx *c)
{
    pthread_mutex_lock(&legacy_lock);
    bool ok = c->blocking_captures == 0;
    if (ok)
        c->legacy_users++;
    pthread_mutex_unlock(&legacy_lock);
    return ok;
}

void hx_legacy_exit(struct hx_ctx *c)
{
    pthread_mutex_lock(&legacy_lock);
    c->legacy_users--;
    pthread_mutex_unlock(&legacy_lock);
}

bool hx_blocking_capture_enter(struct hx_ctx *c)
{
    pthread_mutex_lock(&legacy_lock);
    bool ok = c->legacy_users == 0;
    if (ok)
        c->blocking_captures++;
    pthread_mutex_unlock(&legacy_lock);
    return ok;
}

void hx_blocking_capture_exit(struct hx_ctx *c)
{
    pthread_mutex_lock(&legacy_lock);
    c->blocking_captures--;
    pthread_mutex_unlock(&legacy_lock);
}

typedef CUresult (*ctx_create_v1_fn)(CUcontext *, unsigned, CUdevice);
typedef CUresult (*ctx_create_v3_fn)(CUcontext *, CUexecAffinityParam *, int, unsigned,
                                     CUdevice);
typedef CUresult (*ctx_create_v4_fn)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);

CUresult hx_ctx_create(unsigned version, CUcontext *h, CUdevice dev)
{
    switch (version) {
    case 1: return ((ctx_create_v1_fn)hx_sym("cuCtxCreate"))(h, 0, dev);
    case 2: return ((ctx_create_v1_fn)hx_sym("cuCtxCreate_v2"))(h, 0, dev);
    case 3: return ((ctx_create_v3_fn)hx_sym("cuCtxCreate_v3"))(h, NULL, 0, 0, dev);
    default: return ((ctx_create_v4_fn)hx_sym("cuCtxCreate_v4"))(h, NULL, 0, dev);
    }
}

typedef CUresult (*get_resource_fn)(CUdevice, CUdevResource *, CUdevResourceType);
typedef CUresult (*split_fn)(CUdevResource *, unsigned *, const CUdevResource *,
                             CUdevResource *, unsigned, unsigned);
typedef CUresult (*gen_desc_fn)(CUdevResourceDesc *, CUdevResource *, unsigned);
typedef CUresult (*green_create_fn)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
typedef CUresult (*green_fn)(CUgreenCtx);
typedef CUresult (*ctx_from_green_fn)(CUcontext *, CUgreenCtx);
typedef CUresult (*green_stream_fn)(CUstream *, CUgreenCtx, unsigned, int);

static struct {
    get_resource_fn get_resource;
    split_fn split;
    gen_desc_fn gen_desc;
    green_create_fn create;
    green_fn destroy;
    ctx_from_green_fn ctx_from;
    green_stream_fn stream;
    bool all;
} green;
static pthread_once_t green_once = PTHREAD_ONCE_INIT;

static void find_green(void)
{
    green.get_resource = (get_resource_fn)hx_sym_opt("cuDeviceGetDevResource");
    green.split = (split_fn)hx_sym_opt("cuDevSmResourceSplitByCount");
    green.gen_desc = (gen_desc_fn)hx_sym_opt("cuDevResourceGenerateDesc");
    green.create = (green_create_fn)hx_sym_opt("cuGreenCtxCreate");
    green.destroy = (green_fn)hx_sym_opt("cuGreenCtxDestroy");
    green.ctx_from = (ctx_from_green_fn)hx_sym_opt("cuCtxFromGreenCtx");
    green.stream = (green_stream_fn)hx_sym_opt("cuGreenCtxStreamCreate");
    green.all = green.get_resource && green.split && green.gen_desc && green.create &&
                green.destroy && green.ctx_from && green.stream;
}

bool hx_green_available(void)
{
    pthread_once(&green_once, find_green);
    return green.all;
}

CUresult hx_green_create(CUdevice dev, unsigned sms, CUgreenCtx *g, CUcontext *h)
{
    if (!hx_green_available())
        return CUDA_ERROR_NOT_SUPPORTED;
    CUdevResource all, group, rest;
    CUdevResourceDesc desc;
    unsigned n = 1;
    CUresult rc = green.get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
    if (rc == CUDA_SUCCESS)
        rc = green.split(&group, &n, &all, &rest, 0, sms);
    if (rc == CUDA_SUCCESS)
        rc = green.gen_desc(&desc, &group, 1);
    if (rc == CUDA_SUCCESS)
        rc = green.create(g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (rc == CUDA_SUCCESS && (rc = green.ctx_from(h, *g)) != CUDA_SUCCESS)
        green.destroy(*g);
    return rc;
}

CUresult hx_green_destroy(CUgreenCtx g)
{
    return hx_green_available() ? green.destroy(g) : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult hx_green_stream(CUstream *s, CUgreenCtx g)
{
    return hx_green_available() ? green.stream(s, g, CU_STREAM_NON_BLOCKING, 0)
                                : CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- flags ---------------------------------------------------------------------- */

static void store_flag(volatile int *flag, int value)
{
    struct iovec local = {&value, sizeof value}, remote = {(void *)flag, sizeof value};
    if (process_vm_writev(getpid(), &local, 1, &remote, 1, 0) != (ssize_t)sizeof value)
        *flag = value;
}

void hx_set_flag(volatile int *flag)
{
    store_flag(flag, 1);
}

void hx_clear_flag(volatile int *flag)
{
    store_flag(flag, 0);
}

/* ---- canaries ------------------------------------------------------------------ */

static unsigned char canary_byte(size_t i, int thread, int index)
{
    /* Never the bytes of TESTDRV_STAMP's little-endian word (DE C0 17 5A)
     * in a row: a pattern of two bytes that depend on the page. */
    unsigned char a = (unsigned char)(0xA1 + (thread * 7 + index * 3) % 64);
    return i % 2 ? a : (unsigned char)(a ^ 0x3C);
}

void hx_canary_fill(unsigned char *page, size_t bytes, int thread, int index)
{
    for (size_t i = 0; i < bytes; i++)
        page[i] = canary_byte(i, thread, index);
}

long hx_canary_check(const unsigned char *page, size_t bytes, int thread, int index)
{
    for (size_t i = 0; i < bytes; i++)
        if (page[i] != canary_byte(i, thread, index))
            return (long)i;
    return -1;
}

bool hx_pages_map(struct hx_pages *p)
{
    p->base = mmap(NULL, (size_t)HX_REG_PAGES * HX_PAGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p->base == MAP_FAILED) {
        fprintf(stderr, "%s: mmap failed\n", hx.name);
        return false;
    }
    return true;
}

bool hx_pages_unmap(struct hx_thread *t, struct hx_pages *p)
{
    for (int k = 0; k < HX_REG_PAGES; k++)
        if (p->state[k] == HX_PAGE_REGISTERED)
            return false;
    for (int k = 0; k < HX_REG_PAGES; k++) {
        hx_page_check(t, p, k);
        p->state[k] = HX_PAGE_FREE;
    }
    munmap(p->base, (size_t)HX_REG_PAGES * HX_PAGE);
    p->base = NULL;
    return true;
}

unsigned char *hx_page_at(struct hx_pages *p, int page)
{
    return p->base + (size_t)page * HX_PAGE;
}

int hx_pages_free(struct hx_thread *t, struct hx_pages *p, int want)
{
    int start = (int)hx_below(t, HX_REG_PAGES);
    for (int k = 0; k < HX_REG_PAGES; k++) {
        int first = (start + k) % HX_REG_PAGES, n = 0;
        while (n < want && first + n < HX_REG_PAGES && p->state[first + n] != HX_PAGE_REGISTERED)
            n++;
        if (n == want)
            return first;
    }
    return -1;
}

void hx_pages_set_canaries(struct hx_thread *t, struct hx_pages *p, int first, int n)
{
    for (int k = first; k < first + n; k++) {
        hx_canary_fill(hx_page_at(p, k), HX_PAGE, t->index, k);
        p->state[k] = HX_PAGE_CANARY;
    }
}

void hx_page_check(struct hx_thread *t, struct hx_pages *p, int page)
{
    if (p->state[page] != HX_PAGE_CANARY)
        return;
    long at = hx_canary_check(hx_page_at(p, page), HX_PAGE, t->index, page);
    if (at >= 0)
        hx_fail(t, "canary",
                "page %d (%p) was written after its cuMemHostUnregister returned (byte %ld: "
                "%#x)", page, (void *)hx_page_at(p, page), at, hx_page_at(p, page)[at]);
}

/* ---- a worker's run --------------------------------------------------------- */

void hx_worker_enter(struct hx_thread *t, struct hx_ctx *home)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    hx_expect(t, "cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode(&mode),
              CUDA_SUCCESS);
    hx_expect(t, "cuCtxSetCurrent", cuCtxSetCurrent(home->h), CUDA_SUCCESS);
}

void hx_worker_ops(struct hx_thread *t, void (*one_operation)(void *w), void *w)
{
    for (unsigned long long n = 0; n < t->ops; n++) {
        one_operation(w);
        hx_check_always(t);
        atomic_store_explicit(&t->done, n + 1, memory_order_relaxed);
    }
    hx_note(t, "-- the end: release everything");
}

void hx_worker_leave(struct hx_thread *t, struct hx_pages *reg)
{
    for (int p = 0; p < HX_REG_PAGES; p++)
        hx_page_check(t, reg, p);
    hx_check_always(t);
}

/* ---- events recorded after writers ---------------------------------------- */

int hx_event_slot(CUevent *ev, CUstream *streams, int n, CUstream s)
{
    for (int i = 0; i < n; i++)
        if (ev[i] && streams[i] == s)
            return i;
    for (int i = 0; i < n; i++)
        if (!ev[i])
            return i;
    for (int i = 0; i < n; i++)
        if (cuEventQuery(ev[i]) == CUDA_SUCCESS)
            return i;
    return -1;
}

/* ---- memory released while its writers may still run ---------------------- */

static pthread_mutex_t released_lock = PTHREAD_MUTEX_INITIALIZER;
static struct released {
    uintptr_t lo, hi;
    char what[64];
    CUevent ev[HX_WRITERS];
    int nev;
} released[HX_RELEASED];
static size_t nreleased;
static unsigned long long released_checked, released_unchecked;
static void (*released_destroy)(CUevent);

void hx_released_destroy_with(void (*destroy)(CUevent))
{
    released_destroy = destroy;
}

/* Under released_lock. */
static void released_drop(size_t i)
{
    for (int k = 0; k < released[i].nev; k++) {
        if (released_destroy)
            released_destroy(released[i].ev[k]);
        else
            cuEventDestroy(released[i].ev[k]);
    }
    released[i] = released[--nreleased];
}

/* Under released_lock. */
static bool released_running(const struct released *r)
{
    for (int k = 0; k < r->nev; k++)
        if (cuEventQuery(r->ev[k]) == CUDA_ERROR_NOT_READY)
            return true;
    return false;
}

void hx_released_note(uintptr_t lo, uintptr_t hi, const char *what, CUevent *ev, int n)
{
    struct released r = {.lo = lo, .hi = hi};
    for (int k = 0; k < n && k < HX_WRITERS; k++)
        if (ev[k]) {
            r.ev[r.nev++] = ev[k];
            ev[k] = NULL;
        }
    if (!r.nev)
        return;
    snprintf(r.what, sizeof r.what, "%s", what);
    pthread_mutex_lock(&released_lock);
    if (nreleased == HX_RELEASED) {
        for (size_t i = 0; i < nreleased;) {
            if (released_running(&released[i]))
                i++;
            else
                released_drop(i);
        }
    }
    if (nreleased == HX_RELEASED) {
        released_drop(0);
        released_unchecked++;
    }
    released[nreleased++] = r;
    pthread_mutex_unlock(&released_lock);
}

bool hx_released_check(struct hx_thread *t, uintptr_t lo, uintptr_t hi, const char *returned)
{
    bool seen = false;
    pthread_mutex_lock(&released_lock);
    for (size_t i = 0; i < nreleased;) {
        struct released *r = &released[i];
        if (r->hi <= lo || hi <= r->lo) {
            i++;
            continue;
        }
        if (released_running(r))
            hx_fail(t, "reuse-early",
                    "%s returned %#lx, which overlaps %s, released while a kernel submitted "
                    "before its release (in any context) still writes it",
                    returned, (unsigned long)lo, r->what);
        seen = true;
        released_drop(i);
    }
    released_checked += seen;
    pthread_mutex_unlock(&released_lock);
    return seen;
}

void hx_released_clear(void)
{
    pthread_mutex_lock(&released_lock);
    while (nreleased)
        released_drop(nreleased - 1);
    pthread_mutex_unlock(&released_lock);
}

unsigned long long hx_released_checked(void)
{
    pthread_mutex_lock(&released_lock);
    unsigned long long n = released_checked;
    pthread_mutex_unlock(&released_lock);
    return n;
}

unsigned long long hx_released_unchecked(void)
{
    pthread_mutex_lock(&released_lock);
    unsigned long long n = released_unchecked;
    pthread_mutex_unlock(&released_lock);
    return n;
}
