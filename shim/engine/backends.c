/* backends.c - the rows: how each kind is really released. Every release
 * here may wait for the GPU (that is what the driver's own calls do). */
#include "backends.h"

#include "driver.h"

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

static const struct cd_backend rows[CD_KIND_COUNT] = {
    [CD_DEVICE] = {.option = CD_OPT_DEVICE, .stream_ordered = true, .reusable = true,
                   .freed_by_context = true, .double_release = CUDA_ERROR_INVALID_VALUE,
                   .torn_release = CUDA_ERROR_INVALID_VALUE, .release = release_device},
    /* cuMemFreeAsync answers CUDA_ERROR_NOT_SUPPORTED for managed memory. */
    [CD_MANAGED] = {.option = CD_OPT_MANAGED, .reusable = true, .freed_by_context = true,
                    .double_release = CUDA_ERROR_INVALID_VALUE,
                    .torn_release = CUDA_ERROR_INVALID_VALUE, .release = release_device},
    [CD_HOST] = {.option = CD_OPT_HOST, .reusable = true, .freed_by_context = true,
                 .double_release = CUDA_ERROR_INVALID_VALUE,
                 .torn_release = CUDA_ERROR_INVALID_VALUE, .release = release_host},
    [CD_REGISTERED] = {.option = CD_OPT_REGISTERED, .program_pages = true,
                       .freed_by_context = true,
                       .double_release = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                       .torn_release = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                       .release = release_registered},
    [CD_ARRAY] = {.option = CD_OPT_ARRAY, .freed_by_context = true,
                  .double_release = CUDA_ERROR_INVALID_HANDLE,
                  .torn_release = CUDA_ERROR_CONTEXT_IS_DESTROYED, .release = release_array},
    /* Taken to answer as an array. */
    [CD_MIPMAPPED] = {.option = CD_OPT_ARRAY, .freed_by_context = true,
                      .double_release = CUDA_ERROR_INVALID_HANDLE,
                      .torn_release = CUDA_ERROR_CONTEXT_IS_DESTROYED,
                      .release = release_mipmapped},
    [CD_MODULE] = {.option = CD_OPT_MODULE, .freed_by_context = true,
                   .double_release = CUDA_ERROR_INVALID_HANDLE,
                   .torn_release = CUDA_ERROR_INVALID_HANDLE, .release = release_module},
    [CD_LIBRARY] = {.option = CD_OPT_LIBRARY, .double_release = CUDA_ERROR_INVALID_HANDLE,
                    .torn_release = CUDA_ERROR_INVALID_HANDLE, .release = release_library},
};

const struct cd_backend *cd_backend(enum cd_kind kind)
{
    return &rows[kind];
}

bool cd_backend_on(enum cd_kind kind)
{
    return cd_option_int(rows[kind].option) != 0;
}
