/* backends.h - how each kind of resource is really released.
 *
 * One row per kind: the option that turns its deferral on, what the driver
 * answers to a second release, whether a context's teardown frees it (and
 * the answer for it then), and
 * the real release (which may wait for the GPU: called at flush points only).
 */
#ifndef CUDEFER_BACKENDS_H
#define CUDEFER_BACKENDS_H

#include "engine.h"
#include "options.h"

struct cd_record;

struct cd_backend {
    const char *name;
    enum cd_option option;
    /* The driver's answer when the object was already released. */
    CUresult double_release;
    /* Destroying the context frees it, so teardown drops the entry. */
    bool freed_by_context;
    /* The driver's answer for one its context's destruction freed (measured
     * on the H200: tests/test_conformance.c, *_after_ctx_destroy). */
    CUresult torn_release;
    /* Once its fence has passed, a released one may serve a later
     * allocation of the same size and flags: only driver-owned memory that
     * no kernel can still use. */
    bool reusable;
    /* Really releases the object. May wait for the GPU. */
    CUresult (*release)(const struct cd_record *r);
};

const struct cd_backend *cd_backend(enum cd_kind kind);

#endif
