/* Backends that were not compiled in: the same symbols, a clear refusal. */
#include "fastgen_config.h"
#include "backends/backend.h"

#ifndef FG_HAVE_CUDA
fg_status fg_backend_cuda_init(fg_backend *be) {
    return be->err(be->err_sink, FG_ERR_UNAVAILABLE,
                   "backend \"cuda\" is not compiled in: install the CUDA toolkit and configure with "
                   "`meson setup build -Dcuda=enabled`");
}
#endif

#if !defined(FG_HAVE_HIP) && !defined(FG_HAVE_HIP_CPU)
fg_status fg_backend_hip_init(fg_backend *be) {
    return be->err(be->err_sink, FG_ERR_UNAVAILABLE,
                   "backend \"hip\" is not compiled in: install hipcc and libamdhip64-dev and configure with "
                   "`meson setup build -Dhip=enabled` (or, without a device, run the kernels on the CPU through HIP-CPU: "
                   "`-Dhip-cpu=enabled -Dhip-cpu-dir=PATH`)");
}
#endif
