/* The test driver's fp64 example, in a module of its own as the Level Zero module keeps its F64
 * kernels (host twin: run_scale_f64 in ../kernels.c): a device without fp64 refuses to build it. */
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
kernel void zedrv_scale_f64(global double *dst, double factor, uint n)
{
    size_t i = get_global_id(0);
    if (i < n)
        dst[i] *= factor;
}
