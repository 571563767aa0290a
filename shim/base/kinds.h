/* kinds.h - the kinds of objects whose release cudefer handles.
 *
 * The vocabulary shared by the engine (engine/backends.c has one row per
 * kind: how it is released, reused, torn down) and the statistics.
 */
#ifndef CUDEFER_KINDS_H
#define CUDEFER_KINDS_H

enum cd_kind {
    CD_DEVICE,     /* cuMemAlloc, cuMemAllocPitch */
    CD_MANAGED,    /* cuMemAllocManaged */
    CD_HOST,       /* cuMemAllocHost, cuMemHostAlloc */
    CD_REGISTERED, /* cuMemHostRegister */
    CD_ARRAY,      /* cuArrayCreate, cuArray3DCreate */
    CD_MIPMAPPED,  /* cuMipmappedArrayCreate */
    CD_MODULE,     /* cuModuleLoad* */
    CD_LIBRARY,    /* cuLibraryLoad* */
    CD_KIND_COUNT
};

#define CD_ALL_KINDS ((1u << CD_KIND_COUNT) - 1)

static inline const char *cd_kind_name(enum cd_kind kind)
{
    static const char *const names[CD_KIND_COUNT] = {
        "device", "managed", "host", "registered", "array", "mipmapped", "module", "library",
    };
    return (unsigned)kind < CD_KIND_COUNT ? names[kind] : "?";
}

#endif
