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

/* Tells the fences of stream's context that it was created or is about to
 * be destroyed. */
static void follow(CUstream stream, bool created)
{
    CUcontext ctx;
    struct cd_ctx *c = context_of(stream, created, &ctx);
    unsigned gen;
    if (!c || !cd_ctx_enter_any(c, &gen))
        return;
    if (created)
        cd_fence_stream_added(c, stream, ctx);
    else
        cd_fence_stream_removed(c, stream);
    cd_ctx_exit(c);
}

void cd_stream_created(CUstream stream)
{
    if (cd_engine_on())
        follow(stream, true);
}

void cd_stream_destroying(CUstream stream)
{
    if (!cd_engine_on())
        return;
    cd_capture_stream_gone(stream);
    follow(stream, false);
}
