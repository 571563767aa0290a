/* backends.h - one row per kind of released object: how it is released,
 * reused and torn down, and what the driver answers for it once gone.
 *
 * A new kind of release is one new row here plus its wrappers in the doors.
 */
#ifndef CUDEFER_BACKENDS_H
#define CUDEFER_BACKENDS_H

#include "kinds.h"
#include "options.h"
#include "registry.h"

struct cd_backend {
    /* The option that turns its deferral on. */
    enum cd_option option;
    /* Device memory: released through cuMemFreeAsync behind its fence, a
     * call that never waits (and so never counted against the limits of
     * the queue). The others only have the driver's waiting release. */
    bool stream_ordered;
    /* Once its fence has passed, a released one may serve a later
     * allocation of the same size and flags: memory the driver owns until
     * its real release, which no kernel can still use. Never memory the
     * program owns (registrations) and never handles. */
    bool reusable;
    /* The pages are the program's once its release returns (a
     * registration): the release waits for the work submitted before it. */
    bool program_pages;
    /* The context's destruction frees it (measured for every kind on the
     * H200, registrations included; libraries outlive contexts). */
    bool freed_by_context;
    /* The driver's answer for one released already... */
    CUresult double_release;
    /* ...and for one its context's destruction freed (measured on the
     * H200: tests/conformance); CUDA_SUCCESS: the driver's own call answers
     * (a registration's address may be covered by one made since). */
    CUresult torn_release;
    /* Really releases the object. MAY WAIT for the GPU: called at flush
     * points, teardown and for releases beyond the limits only. */
    CUresult (*release)(const struct cd_record *r);
};

const struct cd_backend *cd_backend(enum cd_kind kind);

/* Whether releases of kind are deferred (its option). */
bool cd_backend_on(enum cd_kind kind);

#endif
