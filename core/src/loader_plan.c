/* Phase 1 of sl_load: the plan against the rank's table (its own copy's, or rank 0's manifest)
 * gives one job per tensor (its placement, dtype, region and wire dtype: resolved once, the
 * geometry computed once by sl__shard_geometry, the region kept in the tensor's sl_tensor), then, once
 * every rank agreed, the shards are bound to caller buffers or allocated
 * (docs/DESIGN.md#data-flow). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"

/* DLPack's device of a tensor placed by this backend (sl_tensor.device_type), as the backend's
 * table gives it (module.h: dlpack_device_type, dlpack_pinned_type), whatever it is called. */
#define SL__KDL_CPU 1
#define SL__KDL_EXT_DEV 12
static int dlpack_device_type(const sl_context *ctx, sl_device_kind where, int pinned) {
  const sl_backend_ops *be = ctx->be;
  if (sl__device_is_host(ctx)) return SL__KDL_CPU;
  if (where == SL_DEVICE_CPU) return pinned && SL_HAS_OP(be, dlpack_pinned_type) ? be->dlpack_pinned_type : SL__KDL_CPU;
  /* not given: a device no consumer takes for its own */
  return SL_HAS_OP(be, dlpack_device_type) ? be->dlpack_device_type : SL__KDL_EXT_DEV;
}

sl_status sl__loader_plan(loader *L) {
  sl_context *ctx = L->ctx;
  size_t n = sl_source_tensor_count(L->src);
  unsigned char *take = calloc(n ? n : 1, 1);
  if (!take) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory planning %zu tensors", n);
  sl_status st = sl__plan_check_names(L->plan, L->src, L->world, take);
  if (st != SL_OK) goto out_free_take;
  L->mesh_ndim = sl__plan_mesh(L->plan, L->world, L->mesh);
  sl__mesh_coord(L->rank, L->mesh_ndim, L->mesh, L->coord);
  size_t ntake = 0, nskip = 0;
  for (size_t i = 0; i < n; i++) ntake += take[i], nskip += !take[i];
  L->jobs = calloc(ntake ? ntake : 1, sizeof *L->jobs);
  L->st->tensors = calloc(ntake ? ntake : 1, sizeof *L->st->tensors);
  L->st->skipped = calloc(nskip ? nskip : 1, sizeof *L->st->skipped);
  if (!L->jobs || !L->st->tensors || !L->st->skipped) {
    st = sl__fail(ctx, SL_ERR_NOMEM, "out of memory planning %zu tensors", n);
    goto out_free_take;
  }
  /* Each taken tensor is resolved once, into its job, in file order: the first that does not
   * resolve fails the plan, as sl__plan_check's own pass would (the dry run's message), and
   * before any tensor's geometry is computed. */
  size_t nj = 0, name_bytes = 0;
  for (size_t i = 0; i < n; i++)
    if (take[i]) name_bytes += strlen(sl_source_tensor_at(L->src, i)->name) + 1;
  if (!(L->st->names = malloc(name_bytes ? name_bytes : 1))) {
    st = sl__fail(ctx, SL_ERR_NOMEM, "out of memory for the names of %zu tensors (%zu bytes)", ntake, name_bytes);
    goto out_free_take;
  }
  char *name_at = L->st->names;
  for (size_t i = 0; i < n; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(L->src, i);
    if (!take[i]) {
      if (!(L->st->skipped[L->st->nskipped++] = sl__strdup(t->name))) {
        st = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
        goto out_free_take;
      }
      continue;
    }
    tensor_job *j = &L->jobs[nj++];
    j->src_index = i;
    j->src = t;
    if ((st = sl__plan_resolve(L->plan, t, &j->res)) != SL_OK) goto out_free_take;
  }
  for (size_t k = 0; k < nj; k++) {
    tensor_job *j = &L->jobs[k];
    const sl_source_tensor *t = j->src;
    sl_tensor *o = &L->st->tensors[k];
    j->out = o;
    uint64_t nbytes;
    sl__region mine;
    if ((st = sl__shard_geometry(L->plan, t, L->mesh_ndim, L->mesh, L->coord, &j->res, &mine, &nbytes)) != SL_OK)
      goto out_free_take;
    j->elems = 1; /* the reader checked that this product times the element size fits */
    for (int d = 0; d < t->ndim; d++) j->elems *= (uint64_t)t->shape[d];
    j->klass = 0;
    for (int m = 0; m < L->mesh_ndim; m++)
      if (j->res.placements[m].kind == SL_SHARD) j->klass |= 1u << m;
    /* HSDP: a replicate mesh dim 0 over a mesh of 2+ dims: replicas hold identical shards */
    j->hsdp = L->mesh_ndim >= 2 && L->mesh[0] > 1 && j->res.placements[0].kind == SL_REPLICATE;
    j->klass |= (uint32_t)j->hsdp << 8;
    j->wire = sl_dtype_size(j->res.dtype) < sl_dtype_size(t->dtype) ? j->res.dtype : t->dtype;
    size_t len = strlen(t->name) + 1;
    o->name = memcpy(name_at, t->name, len);
    name_at += len;
    L->njobs++;
    L->st->count = L->njobs;
    o->dtype = j->res.dtype;
    o->file_dtype = t->dtype;
    o->ndim = t->ndim;
    o->nbytes = nbytes;
    for (int d = 0; d < t->ndim; d++) {
      o->global_shape[d] = t->shape[d];
      o->local_shape[d] = mine.len[d];
      o->global_offset[d] = mine.off[d];
    }
    o->device = L->place.device;
    o->rule = L->place.rule;
    o->pinned = o->device == SL_DEVICE_CPU && L->pinned;
    o->device_type = dlpack_device_type(ctx, o->device, o->pinned);
    o->device_id = o->device == SL_DEVICE_ACCELERATOR || o->device_type != 1 ? ctx->device_ordinal : 0;
    L->total_bytes += t->nbytes;
  }
out_free_take:
  free(take);
  return st;
}

/* A caller buffer for tensor T, checked against its placement. *P is NULL when the caller
 * leaves it to the state. */
static sl_status bind_one(loader *L, sl_tensor *t, void **p) {
  sl_context *ctx = L->ctx;
  *p = NULL;
  int pinned = 0;
  if (L->o.bind_buffer) {
    sl_binding b;
    memset(&b, 0, sizeof b);
    b.size = sizeof b;
    sl_status st = L->o.bind_buffer(L->o.bind_buffer_user, t, &b);
    if (st != SL_OK) {
      b.message[sizeof b.message - 1] = 0;
      return sl__fail(ctx, st, "%s: the caller's bind_buffer failed on rank %d: %s", t->name, L->rank,
                      b.message[0] ? b.message : sl_strerror(st));
    }
    *p = b.data;
    pinned = b.pinned;
  } else if (L->o.bind) {
    *p = L->o.bind(L->o.bind_user, t);
    pinned = t->pinned; /* sl_bind_fn's contract: pinned when t->pinned asks for it */
  }
  if (!*p) return SL_OK;
  bool dev_ptr = SL_HAS_OP(ctx->be, is_device_ptr) && !sl__device_is_host(ctx);
  if (t->device == SL_DEVICE_CPU && dev_ptr && ctx->be->is_device_ptr(ctx->be_ctx, *p, 1))
    return sl__fail(ctx, SL_ERR_BUFFER,
                    "%s: the caller's buffer is device memory of backend %s, but the tensor is placed "
                    "on the CPU; pass host memory (sl_alloc(ctx, SL_DEVICE_CPU, ...))",
                    t->name, ctx->be->name);
  if (t->device == SL_DEVICE_ACCELERATOR && dev_ptr && !ctx->be->is_device_ptr(ctx->be_ctx, *p, (size_t)t->nbytes)) {
    /* device memory that ends before the shard does is a size mistake, not a kind mistake */
    if (t->nbytes > 1 && ctx->be->is_device_ptr(ctx->be_ctx, *p, 1))
      return sl__fail(ctx, SL_ERR_BUFFER,
                      "%s: the caller's device buffer ends before the tensor's %llu bytes; bind a "
                      "buffer of at least t->nbytes",
                      t->name, (unsigned long long)t->nbytes);
    return sl__fail(ctx, SL_ERR_BUFFER,
                    "%s: the caller's buffer is not device memory of backend %s; allocate it with "
                    "sl_alloc(ctx, SL_DEVICE_ACCELERATOR, ...)",
                    t->name, ctx->be->name);
  }
  if (t->device == SL_DEVICE_CPU) {
    /* pinned-ness as it truly is: what the caller says, or a registration of ours */
    if (!pinned && t->pinned && t->nbytes && SL_HAS_OP(ctx->be, register_host) &&
        SL_HAS_OP(ctx->be, unregister_host) && ctx->be->register_host(ctx->be_ctx, *p, (size_t)t->nbytes) == SL_OK) {
      void **r = realloc(L->st->registered, (L->st->nregistered + 1) * sizeof *r);
      if (!r) {
        ctx->be->unregister_host(ctx->be_ctx, *p);
        return sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
      }
      L->st->registered = r;
      r[L->st->nregistered++] = *p;
      pinned = 1;
    }
    t->pinned = pinned;
    t->device_type = dlpack_device_type(ctx, t->device, t->pinned);
  }
  return SL_OK;
}

/* A caller buffer's byte range, in one address space: host memory, or the backend's device
 * memory (the same space as host memory where device memory is host memory, as on cpu). */
typedef struct bound_range {
  int space;
  uintptr_t begin, end;
  size_t job;
} bound_range;

static int bound_range_cmp(const void *a, const void *b) {
  const bound_range *x = a, *y = b;
  if (x->space != y->space) return x->space < y->space ? -1 : 1;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->job < y->job ? -1 : x->job > y->job;
}

/* Every caller buffer holds only its own tensor: two that share a byte would each receive the
 * other's data (one buffer returned for every tensor left all but the last wrong). Sorted by
 * address, each range must begin at or past the furthest end before it in its space; empty
 * shards have no bytes to share. O(n log n), before the preparation agreement, so every rank
 * fails together and no byte of any buffer has been written. */
static sl_status check_bound_overlap(loader *L) {
  sl_context *ctx = L->ctx;
  size_t n = 0;
  for (size_t i = 0; i < L->njobs; i++) n += L->jobs[i].out->caller_buffer && L->jobs[i].out->nbytes;
  if (n < 2) return SL_OK;
  bound_range *r = malloc(n * sizeof *r);
  if (!r) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory checking %zu caller buffers", n);
  int one_space = sl__device_is_host(ctx);
  size_t k = 0;
  for (size_t i = 0; i < L->njobs; i++) {
    const sl_tensor *t = L->jobs[i].out;
    if (!t->caller_buffer || !t->nbytes) continue;
    uintptr_t b = (uintptr_t)t->data;
    r[k++] = (bound_range){one_space ? 0 : t->device == SL_DEVICE_ACCELERATOR, b,
                           t->nbytes > UINTPTR_MAX - b ? UINTPTR_MAX : b + (uintptr_t)t->nbytes, i};
  }
  qsort(r, n, sizeof *r, bound_range_cmp);
  sl_status st = SL_OK;
  for (size_t i = 1, far = 0; i < n && st == SL_OK; i++) {
    if (r[i].space != r[far].space) {
      far = i;
      continue;
    }
    if (r[i].begin < r[far].end) {
      /* name them in file order */
      const bound_range *a = r[far].job < r[i].job ? &r[far] : &r[i], *b = a == &r[i] ? &r[far] : &r[i];
      const sl_tensor *ta = L->jobs[a->job].out, *tb = L->jobs[b->job].out;
      st = sl__fail(ctx, SL_ERR_BUFFER,
                    "%s and %s: the caller's buffers overlap on rank %d (%p, %llu bytes, and %p, %llu bytes); "
                    "bind each tensor a buffer of its own, at least t->nbytes long",
                    ta->name, tb->name, L->rank, ta->data, (unsigned long long)ta->nbytes, tb->data,
                    (unsigned long long)tb->nbytes);
    }
    if (r[i].end > r[far].end) far = i;
  }
  free(r);
  return st;
}

/* ---- the shard arena -------------------------------------------------------------------
 * A checkpoint of 10^4-10^5 small tensors gave each shard an allocation of its own: a heap
 * block of its size plus a header, touched page by page (a fault per 4 KiB, the heap grown and
 * trimmed under it), which cost more than reading the shards. The state frees its shards only
 * all together (state.c:free_tensors; an export holds the state), so the small ones it owns
 * are carved out of a few blocks instead, each taken from sl__host_alloc (mapped with huge
 * pages and populated once it reaches 2 MiB) and freed once. A shard is small below the size
 * from which sl__host_alloc maps a block of its own anyway. */
#define SL__ARENA_SMALL (1u << 20)
#define SL__ARENA_BLOCK ((size_t)64 << 20) /* one block's most: a failure costs at most this */
/* a shard's bytes in a block: 64-aligned like sl__host_alloc's, at least one byte so that
 * shards have distinct addresses, and the sanitizer's guard after it */
#define SL__ARENA_SIZE(n) ((((size_t)(n) > 0 ? (size_t)(n) : 1) + 63) / 64 * 64 + SL__HOST_GUARD)

/* T can live in the arena: host memory the state owns and frees with sl__host_free. Pinned
 * memory is the backend's (freed with free_pinned); accelerator memory is host memory only on
 * a backend whose alloc_device is the cpu backend's (sim's is its own, checked by is_device_ptr). */
static bool arena_fits(const loader *L, const sl_tensor *t) {
  if (t->nbytes >= SL__ARENA_SMALL) return false;
  if (t->device == SL_DEVICE_CPU) return !t->pinned;
  return t->device == SL_DEVICE_ACCELERATOR && L->ctx->be->alloc_device == sl__backend_cpu()->alloc_device;
}

/* One block for the arena shards of jobs [first, last), each at its offset (SIZE[i] bytes). */
static sl_status carve_block(loader *L, const uint32_t *size, size_t first, size_t last, size_t bytes) {
  sl_context *ctx = L->ctx;
  sl_state *st = L->st;
  unsigned char *base = sl__host_alloc(bytes);
  if (!base) {
    size_t end = last;
    while (!st->in_arena[end - 1]) end--; /* the block's last shard: FIRST is one */
    const char *a = L->jobs[first].out->name, *b = L->jobs[end - 1].out->name;
    return sl__fail(ctx, SL_ERR_NOMEM,
                    "cannot allocate %zu bytes of host memory on rank %d for the shards of %s .. %s: free host "
                    "memory or raise the process's memory limit",
                    bytes, L->rank, a, b);
  }
  st->arenas[st->narenas++] = (struct sl__arena){base, bytes};
  size_t at = 0;
  for (size_t i = first; i < last; i++) {
    if (!st->in_arena[i]) continue;
    sl_tensor *t = L->jobs[i].out;
    t->data = base + at;
    /* under ASan: everything past the shard's last byte up to the next shard */
    if (SL__HOST_GUARD) sl__host_poison(base + at + t->nbytes, size[i] - (size_t)t->nbytes, 1);
    at += size[i];
  }
  return SL_OK;
}

/* The arena shards (N of them, TOTAL bytes; SIZE[i] bytes for job i, 0 for the others), in
 * file order, cut into blocks of at most SL__ARENA_BLOCK. */
static sl_status carve_arena(loader *L, const uint32_t *size, size_t n, size_t total) {
  sl_state *st = L->st;
  if (!n) return SL_OK;
  /* every block but the last is cut only when the next shard (< 1 MiB + 128) would pass 64 MiB,
   * so it holds more than 32 MiB */
  size_t most = total / (SL__ARENA_BLOCK / 2) + 1;
  if (!(st->arenas = calloc(most, sizeof *st->arenas)))
    return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory placing %zu shards", n);
  size_t first = 0, bytes = 0;
  for (size_t i = 0; i < L->njobs; i++) {
    if (!size[i]) continue;
    if (bytes && bytes + size[i] > SL__ARENA_BLOCK) {
      sl_status s = carve_block(L, size, first, i, bytes);
      if (s != SL_OK) return s;
      bytes = 0;
    }
    if (!bytes) first = i;
    bytes += size[i];
  }
  return carve_block(L, size, first, L->njobs, bytes);
}

/* One walk over the shards binds or allocates each and sizes the arena; the arena's carving
 * then walks only its shards' sizes (a table of 4 bytes a job, not the 256-byte sl_tensors). */
sl_status sl__loader_bind(loader *L) {
  sl_context *ctx = L->ctx;
  uint32_t *size = calloc(L->njobs ? L->njobs : 1, sizeof *size);
  if (!(L->st->in_arena = calloc(L->njobs ? L->njobs : 1, 1)) || !size) {
    free(size);
    return sl__fail(ctx, SL_ERR_NOMEM, "out of memory placing %zu shards", L->njobs);
  }
  size_t narena = 0, total = 0, ncaller = 0;
  sl_status st = SL_OK;
  for (size_t i = 0; i < L->njobs && st == SL_OK; i++) {
    sl_tensor *t = L->jobs[i].out;
    void *p;
    if ((st = bind_one(L, t, &p)) != SL_OK) break;
    if (p) {
      t->data = p;
      t->caller_buffer = 1;
      ncaller += t->nbytes != 0;
      continue;
    }
    if (arena_fits(L, t)) {
      L->st->in_arena[i] = 1;
      size[i] = (uint32_t)SL__ARENA_SIZE(t->nbytes);
      narena++;
      total += size[i];
      continue;
    }
    if ((st = sl_alloc(ctx, t->device, t->pinned, (size_t)t->nbytes, &t->data)) != SL_OK)
      st = sl__fail(ctx, st, "%s: cannot allocate %llu bytes on %s: %s", t->name, (unsigned long long)t->nbytes,
                    sl_device_kind_name(t->device), ctx->errmsg);
  }
  if (st == SL_OK) st = carve_arena(L, size, narena, total);
  free(size);
  return st != SL_OK || ncaller < 2 ? st : check_bound_overlap(L);
}
