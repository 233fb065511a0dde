/* The registry's adapter of ABI v1 modules (registry_v1.c): a v1 table becomes a v2 table, so
 * the rest of the core only ever sees v2 (docs/DESIGN.md#modules). */
#ifndef SHARDLOAD_REGISTRY_V1_H
#define SHARDLOAD_REGISTRY_V1_H

#include "internal.h"

/* Whether a v1 table is complete enough to adapt; otherwise PROBLEM says what is wrong. */
bool sl__v1_backend_ok(const sl_backend_ops_v1 *o, char *problem, size_t len);
bool sl__v1_collective_ok(const sl_collective_ops_v1 *o, char *problem, size_t len);

/* A malloc'd v2 table that serves the v1 table O (NULL: out of memory). The table is the first
 * member of the allocation, so the pointer returned is also the shim the core frees (with
 * free()) once the module is done with: after fini, before dlclose. It holds everything the
 * adapter needs; nothing global changes. */
sl_backend_ops *sl__v1_backend_adapt(const sl_backend_ops_v1 *o);
sl_collective_ops *sl__v1_collective_adapt(const sl_collective_ops_v1 *o);

/* Probes an adapted table through its v1 score(); a v1 module gives no reason, so REASON says
 * that it said 0. */
int sl__v1_backend_probe(const sl_backend_ops *adapted, char *reason, size_t len);
int sl__v1_collective_probe(const sl_collective_ops *adapted, const char *backend, char *reason, size_t len);

#endif
