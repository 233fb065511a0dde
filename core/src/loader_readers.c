/* Distributed readers (docs/DESIGN.md#readers): which ranks read the checkpoint, and which
 * tensors each one reads. Every rank computes the same answer from what it agreed on: the
 * hosts (ctx->host_of, agreed at sl_context_create), the plan's jobs and the options (the
 * planning digest). Where rank 0 reads alone it is the one reader and reads every tensor. */
#include <stdlib.h>
#include <string.h>

#include "loader.h"

/* One file: the same path (a source interns each file's path, a caller's table may not). */
static bool same_file(const char *a, const char *b) { return a == b || (a && b && strcmp(a, b) == 0); }

void sl__readers_share(size_t n, const sl_source_tensor *(*at)(void *u, size_t i), void *u, int R, int *out) {
  unsigned __int128 total = 0;
  size_t files = 0;
  const char *prev = NULL;
  for (size_t i = 0; i < n; i++) {
    const sl_source_tensor *t = at(u, i);
    total += t->nbytes;
    if (i == 0 || !same_file(t->file, prev)) files++;
    prev = t->file;
  }
  const bool by_file = R > 1 && files >= 2 * (size_t)R;
  unsigned __int128 cum = 0;
  for (size_t i = 0; i < n;) {
    /* one unit: a tensor, or every tensor of one file */
    size_t e = i + 1;
    uint64_t bytes = at(u, i)->nbytes;
    if (by_file)
      for (const char *f = at(u, i)->file; e < n && same_file(at(u, e)->file, f); e++) bytes += at(u, e)->nbytes;
    int r = 0;
    if (R > 1 && total) {
      unsigned __int128 mid = cum + bytes / 2;
      r = (int)(mid * (unsigned)R / total);
      if (r >= R) r = R - 1;
    }
    for (size_t k = i; k < e; k++) out[k] = r;
    cum += bytes;
    i = e;
  }
}

static const sl_source_tensor *job_tensor(void *u, size_t i) { return ((const loader *)u)->jobs[i].src; }

/* N readers, alike on every rank: the lowest rank of each host first, then the next lowest of
 * each host, and so on; in rank order. */
SL_API int sl_readers_choose(int world, const int *host_of, int readers, int *reader_rank) {
  if (world < 1 || !host_of || readers < 0 || readers > world || !reader_rank) return -1;
  int *pos = calloc((size_t)world, sizeof *pos), *seen = calloc((size_t)world, sizeof *seen);
  char *taken = calloc((size_t)world, 1);
  int n = -1;
  if (!pos || !seen || !taken) goto out;
  int maxpos = 0, hosts = 0;
  for (int r = 0; r < world; r++) {
    if (host_of[r] < 0 || host_of[r] >= world) goto out;
    if (seen[host_of[r]] == 0) hosts++;
    pos[r] = seen[host_of[r]]++;
    if (pos[r] > maxpos) maxpos = pos[r];
  }
  if (!readers) readers = hosts;
  int chosen = 0;
  for (int t = 0; t <= maxpos && chosen < readers; t++)
    for (int r = 0; r < world && chosen < readers; r++)
      if (pos[r] == t) taken[r] = 1, chosen++;
  n = 0;
  for (int r = 0; r < world; r++)
    if (taken[r]) reader_rank[n++] = r;
out:
  free(pos);
  free(seen);
  free(taken);
  return n;
}

static sl_status choose(loader *L, int n) {
  L->reader_rank = malloc((size_t)(n ? n : L->world) * sizeof *L->reader_rank);
  int got = L->reader_rank ? sl_readers_choose(L->world, L->ctx->host_of, n, L->reader_rank) : -1;
  if (got <= 0) return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory choosing %d readers among %d ranks", n, L->world);
  L->nreaders = got;
  L->my_reader = -1;
  for (int i = 0; i < got; i++)
    if (L->reader_rank[i] == L->rank) L->my_reader = i;
  return SL_OK;
}

static const sl_source_tensor *array_tensor(void *u, size_t i) { return ((const sl_source_tensor *const *)u)[i]; }

SL_API void sl_readers_share(size_t n, const sl_source_tensor *const *tensors, int readers, int *out) {
  if (!tensors || !out || readers < 1) return;
  sl__readers_share(n, array_tensor, (void *)tensors, readers, out);
}

sl_status sl__loader_readers(loader *L) {
  L->my_reader = -1;
  if (L->o.read_mode == SL_READ_EVERY_RANK) return SL_OK; /* no reader: every rank reads its own */
  if (L->o.read_mode == SL_READ_RANK0 || L->world == 1) {
    if (!(L->reader_rank = malloc(sizeof *L->reader_rank))) return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory");
    L->reader_rank[0] = 0;
    L->nreaders = 1;
    L->my_reader = L->rank == 0 ? 0 : -1;
    for (size_t i = 0; i < L->njobs; i++) L->jobs[i].reader = 0;
    return SL_OK;
  }
  sl_status st = choose(L, L->o.readers);
  if (st != SL_OK) return st;
  int *share = malloc((L->njobs ? L->njobs : 1) * sizeof *share);
  if (!share) return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory sharing %zu tensors between readers", L->njobs);
  sl__readers_share(L->njobs, job_tensor, L, L->nreaders, share);
  for (size_t i = 0; i < L->njobs; i++) L->jobs[i].reader = share[i];
  free(share);
  return SL_OK;
}
