/* The test driver's example kernel (its host twin is run_add_u32 in ../kernels.c). */
kernel void zedrv_add_u32(global uint *dst, global const uint *src, uint add, uint n)
{
    size_t i = get_global_id(0);
    if (i < n)
        dst[i] = src[i] + add;
}
