/* Load this rank's shards of a checkpoint and print where each one went.
 *
 *   load_example CHECKPOINT            (one process: world size 1)
 *   torchrun --nproc-per-node 4 --no-python ./load_example CHECKPOINT
 *
 * Every rank gets its FSDP2-style shard(0) slice, cast to BF16, placed by the cpu_offload
 * contract (here INFER under a CPU offload policy: host memory). */
#include <stdio.h>

#include <shardload/shardload.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CHECKPOINT\n", argv[0]);
    return 2;
  }
  sl_context *ctx = NULL;
  sl_source *src = NULL;
  sl_plan *plan = NULL;
  sl_state *state = NULL;
  int rc = 1;

  /* Rank, world size and device from the launcher environment; backend: the best available. */
  sl_context_options copts = {.size = sizeof copts, .rank = -1, .world_size = 0, .local_rank = -1};
  sl_status s = sl_context_create(&copts, &ctx);
  if (s != SL_OK) goto out;

  /* A file, an index.json, or a directory holding one; every header is validated here. */
  if ((s = sl_source_open(ctx, argv[1], &src)) != SL_OK) goto out;

  /* Default plan: shard(0) over the whole world, 0-d tensors replicated. */
  sl_offload_policy policy = {.kind = SL_OFFLOAD_CPU, .pin_memory = 1};
  if ((s = sl_plan_create(ctx, &plan)) != SL_OK) goto out;
  if ((s = sl_plan_set_param_dtype(plan, SL_DTYPE_BF16)) != SL_OK) goto out;
  if ((s = sl_plan_set_offload_policy(plan, &policy)) != SL_OK) goto out;

  sl_load_options lopts = {.size = sizeof lopts, .cpu_offload = SL_CPU_OFFLOAD_INFER};
  if ((s = sl_load(ctx, plan, src, &lopts, &state)) != SL_OK) goto out;

  for (size_t i = 0; i < sl_state_count(state); i++) {
    const sl_tensor *t = sl_state_tensor(state, i);
    printf("rank %d: %-48s %-5s rows %lld..%lld on %s (%s)%s\n", sl_context_rank(ctx), t->name,
           sl_dtype_name(t->dtype), (long long)(t->ndim ? t->global_offset[0] : 0),
           (long long)(t->ndim ? t->global_offset[0] + t->local_shape[0] : 0),
           sl_device_kind_name(t->device), sl_placement_rule_describe(t->rule),
           t->pinned ? ", pinned" : "");
  }
  /* Device memory is read through the backend: e.g. the first bytes of the first tensor. */
  if (sl_state_count(state) > 0) {
    const sl_tensor *t = sl_state_tensor(state, 0);
    unsigned char head[8] = {0};
    size_t n = t->nbytes < sizeof head ? (size_t)t->nbytes : sizeof head;
    if (n && (s = sl_copy_to_host(ctx, head, t->data, t->device, n)) != SL_OK) goto out;
    printf("%s starts with", t->name);
    for (size_t i = 0; i < n; i++) printf(" %02x", head[i]);
    printf("\n");
  }
  rc = 0;

out:
  if (rc)
    fprintf(stderr, "load_example: %s: %s\n", sl_status_name(s), ctx ? sl_context_errmsg(ctx) : sl_strerror(s));
  sl_state_destroy(state);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return rc;
}
