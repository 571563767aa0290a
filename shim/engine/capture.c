/* capture.c - the capture gate.
 *
 * While any stream capture is live the engine records no event in a context
 * and queues releases unfenced. A fence announces itself in fences_active
 * before it looks at captures_live; a capture raises captures_live, then
 * waits for the fences already announced (each takes microseconds) before
 * the real cuStreamBeginCapture. Sequentially consistent atomics make the
 * two never miss each other. When the last capture ends, what was queued
 * meanwhile is fenced.
 */
#include "engine.h"
#include "lifecycle.h"

#include "backends.h"
#include "contexts.h"
#include "driver.h"
#include "log.h"
#include "options.h"
#include "queue.h"
#include "registry.h"
#include "stats.h"

#include <pthread.h>
#include <sched.h>

static _Atomic int captures_live;
static _Atomic int fences_active;
static pthread_mutex_t capturing_lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_CAPTURES 256
/* The capturing streams, with their contexts: a capture also ends when its
 * stream or its context is destroyed. */
static struct {
    CUstream stream;
    CUcontext ctx;
} capturing[MAX_CAPTURES];
static size_t ncapturing;

bool cd_fence_enter(void)
{
    atomic_fetch_add(&fences_active, 1);
    if (atomic_load(&captures_live) == 0)
        return true;
    atomic_fetch_sub(&fences_active, 1);
    return false;
}

void cd_fence_exit(void)
{
    atomic_fetch_sub(&fences_active, 1);
}

static void capture_done(void)
{
    if (atomic_fetch_sub(&captures_live, 1) == 1)
        cd_fence_backlogs();
}

void cd_capture_begin(void)
{
    atomic_fetch_add(&captures_live, 1);
    while (atomic_load(&fences_active) != 0)
        sched_yield();
}

void cd_capture_begun(CUstream stream, CUresult rc)
{
    if (rc != CUDA_SUCCESS) {
        capture_done();
        return;
    }
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext ctx = NULL;
    /* The stream's own context; the current one only for the default
     * stream handles, which name no stream object. */
    if (ops && (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD ||
                ops->stream_get_ctx(stream, &ctx) != CUDA_SUCCESS))
        ops->ctx_get_current(&ctx);
    pthread_mutex_lock(&capturing_lock);
    bool kept = ncapturing < MAX_CAPTURES;
    if (kept) {
        capturing[ncapturing].stream = stream;
        capturing[ncapturing++].ctx = ctx;
    }
    pthread_mutex_unlock(&capturing_lock);
    if (!kept)
        cd_log(CD_LOG_ERROR, "more than %d live captures: releases stay queued until a flush",
               MAX_CAPTURES);
}

/* Forgets the captures of stream (or, with stream NULL, of every stream of
 * ctx); each one forgotten ends. */
static void forget(CUstream stream, CUcontext ctx)
{
    int ended = 0;
    pthread_mutex_lock(&capturing_lock);
    for (size_t i = 0; i < ncapturing;) {
        bool match = stream ? capturing[i].stream == stream : capturing[i].ctx == ctx;
        if (match && (stream || ctx)) {
            capturing[i] = capturing[--ncapturing];
            ended++;
            if (stream)
                break;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&capturing_lock);
    while (ended--)
        capture_done();
}

void cd_capture_ended(CUstream stream, CUresult rc)
{
    (void)rc; /* an invalidated capture has ended too */
    forget(stream, NULL);
}

void cd_capture_stream_gone(CUstream stream)
{
    if (stream)
        forget(stream, NULL);
}

void cd_capture_context_gone(CUcontext ctx)
{
    if (ctx)
        forget(NULL, ctx);
}

void cd_capture_reset(void)
{
    pthread_mutex_init(&capturing_lock, NULL);
    ncapturing = 0;
    atomic_store(&captures_live, 0);
    atomic_store(&fences_active, 0);
}
