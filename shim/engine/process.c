/* process.c - start, exit and fork. */
#include "process.h"

#include "capture.h"
#include "contexts.h"
#include "engine.h"
#include "driver.h"
#include "fence.h"
#include "log.h"
#include "options.h"
#include "books.h"
#include "registry.h"
#include "retire.h"
#include "stats.h"
#include "waiter.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

static _Atomic bool started;
static _Atomic bool exit_registered;

static void at_exit(void)
{
    /* The driver may tear itself down after this: the engine takes no more
     * calls and the waiter stops touching it. */
    cd_driver_stop_using();
    cd_waiter_stop();
    cd_stats_report();
}

void cd_process_start(void)
{
    if (atomic_exchange(&started, true))
        return;
    cd_waiter_start();
    /* Registered after the CUDA runtime's own exit handler (the runtime
     * creates its contexts after it registered that), so it runs first. */
    if (!atomic_exchange(&exit_registered, true))
        atexit(at_exit);
    cd_options_print();
}

/* A forked child has no CUDA context of its parent's and none of its
 * threads. */
static void in_child(void)
{
    cd_contexts_reset();
    cd_fence_reset();
    cd_registry_reset();
    cd_books_reset();
    cd_capture_reset();
    cd_waiter_reset();
    cd_stats_reset();
    atomic_store(&started, false);
}

__attribute__((constructor)) static void process_init(void)
{
    cd_ctx_on_first_setup(cd_process_start);
    cd_capture_on_reopen(cd_retire_backlog);
    cd_waiter_on_visit(cd_retire_evict);
    pthread_atfork(NULL, NULL, in_child);
}

__attribute__((destructor)) static void process_fini(void)
{
    /* A library unloaded (dlclose) or a process that never set up a
     * context: the report, if the driver was used. */
    cd_stats_report();
}
