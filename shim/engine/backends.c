/* backends.c - the real release of each kind. Every release here may wait
 * for the GPU (that is what the driver's own calls do). */
#include "backends.h"

#include "driver.h"
#include "registry.h"

static CUresult release_device(const struct cd_record *r)
{
    return cd_driver_ops()->mem_free((CUdeviceptr)r->key);
}

static CUresult release_host(const struct cd_record *r)
{
    return cd_driver_ops()->mem_free_host((void *)r->key);
}

static CUresult release_registered(const struct cd_record *r)
{
    return cd_driver_ops()->mem_host_unregister((void *)r->key);
}

static CUresult release_array(const struct cd_record *r)
{
    return cd_driver_ops()->array_destroy((CUarray)r->key);
}

static CUresult release_mipmapped(const struct cd_record *r)
{
    return cd_driver_ops()->mipmapped_array_destroy((CUmipmappedArray)r->key);
}

static CUresult release_module(const struct cd_record *r)
{
    return cd_driver_ops()->module_unload((CUmodule)r->key);
}

static CUresult release_library(const struct cd_record *r)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    return ops->library_unload ? ops->library_unload((CUlibrary)r->key) : CUDA_ERROR_NOT_FOUND;
}

/* cuCtxDestroy frees what the context owns: device, pinned and managed
 * memory, arrays and modules. Registrations are undone and libraries
 * (which outlive contexts) unloaded for real before the teardown. */
/* Device memory waits in the queue (up to CUDEFER_DEVICE_CACHE) for an
 * allocation of its size, then goes back through the driver's
 * stream-ordered free. Registered memory is the program's own: after the unregister
 * it may be unmapped and the address mapped again to other pages, so a
 * registration is never revived. */
/* torn_release, measured on the H200 (driver 580.159.04): INVALID_VALUE for
 * memory (cuMemFree, cuMemFreeHost after cuCtxDestroy), INVALID_HANDLE for
 * a module, CONTEXT_IS_DESTROYED for an array; a mipmapped array is taken to
 * answer as an array. Kinds the teardown does not free have none. */
#define MEMORY(n, opt, rel)                                                                    \
    {.name = n, .option = opt, .double_release = CUDA_ERROR_INVALID_VALUE,                     \
     .freed_by_context = true, .torn_release = CUDA_ERROR_INVALID_VALUE, .reusable = true,     \
     .release = rel}
#define HANDLE(n, opt, torn, rel)                                                              \
    {.name = n, .option = opt, .double_release = CUDA_ERROR_INVALID_HANDLE,                    \
     .freed_by_context = true, .torn_release = torn, .reusable = false, .release = rel}

static const struct cd_backend backends[CD_KIND_COUNT] = {
    [CD_DEVICE] = MEMORY("device", CD_OPT_DEVICE, release_device),
    [CD_MANAGED] = MEMORY("managed", CD_OPT_MANAGED, release_device),
    [CD_HOST] = MEMORY("host", CD_OPT_HOST, release_host),
    [CD_REGISTERED] = {.name = "registered", .option = CD_OPT_REGISTERED,
                       .double_release = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                       .release = release_registered},
    [CD_ARRAY] = HANDLE("array", CD_OPT_ARRAY, CUDA_ERROR_CONTEXT_IS_DESTROYED, release_array),
    [CD_MIPMAPPED] = HANDLE("mipmapped", CD_OPT_ARRAY, CUDA_ERROR_CONTEXT_IS_DESTROYED,
                            release_mipmapped),
    [CD_MODULE] = HANDLE("module", CD_OPT_MODULE, CUDA_ERROR_INVALID_HANDLE, release_module),
    [CD_LIBRARY] = {.name = "library", .option = CD_OPT_LIBRARY,
                    .double_release = CUDA_ERROR_INVALID_HANDLE, .release = release_library},
};

const struct cd_backend *cd_backend(enum cd_kind kind)
{
    return &backends[kind];
}
