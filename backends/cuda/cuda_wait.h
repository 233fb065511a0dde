/* The CUDA backend's one bounded wait, free of CUDA so that a test can drive it with a fake
 * query (test_cuda_module.c). Private to the module. */
#ifndef SHARDLOAD_CUDA_WAIT_H
#define SHARDLOAD_CUDA_WAIT_H

#include <stddef.h>

typedef enum cu_wait { CU_WAIT_DONE, CU_WAIT_FAILED, CU_WAIT_TIMEOUT } cu_wait;

/* Item I of a wait: 1 once it has completed, 0 while not yet, < 0 when it failed. Never
 * blocks (cudaEventQuery, cudaStreamQuery). */
typedef int (*cu_query_fn)(void *arg, size_t i);

/* Seconds on the monotonic clock: what deadlines are given in. */
double cu__now_s(void);

/* Queries items 0..N-1 until every one has completed (DONE), one failed (FAILED) or DEADLINE
 * passed (TIMEOUT); *AT (may be NULL) is then the item that failed or is still pending. An
 * item that completed is not asked again. Spins briefly (a staging slot's copy ends in tens of
 * microseconds), then sleeps up to 100 us between rounds. A DEADLINE already past makes one
 * round and no wait: how a device known to be stuck is asked. */
cu_wait cu__poll(cu_query_fn query, void *arg, size_t n, double deadline, size_t *at);

#endif
