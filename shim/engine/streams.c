/* streams.c - the program's streams, as the engine follows them: before
 * driver 12.5 the fences are made of events on them (fence.c), and a
 * stream's destruction ends its capture (capture.c). */
#include "engine.h"

#include "capture.h"
#include "contexts.h"
#include "driver.h"
#include "fence.h"

/* The slot of stream's context (set up when create is true), or NULL; the
 * context itself in *ctx. */
static struct cd_ctx *context_of(CUstream stream, bool create, CUcontext *ctx)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    *ctx = NULL;
    if (ops->stream_get_ctx(stream, ctx) != CUDA_SUCCESS)
        return NULL;
    return create ? cd_ctx_get(*ctx) : cd_ctx_find(*ctx);
}

enum change { STREAM_CREATED, STREAM_DESTROYING, STREAM_CAPTURING };

/* Tells the fences of stream's context what happens to it. */
static void follow(CUstream stream, enum change what)
{
    CUcontext ctx;
    struct cd_ctx *c = context_of(stream, what == STREAM_CREATED, &ctx);
    unsigned gen;
    if (!c || !cd_ctx_enter_any(c, &gen))
        return;
    if (what == STREAM_CREATED)
        cd_fence_stream_added(c, stream, ctx);
    else if (what == STREAM_DESTROYING)
        cd_fence_stream_removed(c, stream);
    else
        cd_fence_stream_capturing(c, stream);
    cd_ctx_exit(c);
}

void cd_stream_created(CUstream stream)
{
    if (cd_engine_on())
        follow(stream, STREAM_CREATED);
}

void cd_stream_destroying(CUstream stream)
{
    if (!cd_engine_on())
        return;
    /* Its final record first (made before any capture of it began, when it
     * is in one): ending the capture fences what was deferred meanwhile,
     * and that fence must find the stream gone and its final record made. */
    follow(stream, STREAM_DESTROYING);
    cd_capture_stream_gone(stream);
}

void cd_stream_capturing(CUstream stream)
{
    /* From driver 12.5 the fences record the context instead (fence.c).
     * Stream 0, the legacy and the per-thread streams are not followed. */
    if (cd_engine_on() && !cd_driver_records_contexts() && stream && stream != CU_STREAM_LEGACY &&
        stream != CU_STREAM_PER_THREAD)
        follow(stream, STREAM_CAPTURING);
}
