/* What the conformance suites share (tests/conformance/, docs/MODULES.md "Testing a module"):
 * a module host that keeps the last message, opening a module by name or by path the way the
 * core does (the registry: its table checks, the v1 adapter), deterministic bytes, and a
 * blocker that holds a stream busy with device work so that a case can look at what a stream
 * has not run yet.
 *
 * Nothing here uses cmocka's asserts: the collective suite calls it from forked ranks, where a
 * failed assert would jump back into the parent's test list. */
#ifndef SL_CONFORMANCE_H
#define SL_CONFORMANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* ---- the host ------------------------------------------------------------------------------ */
/* The host every module instance of a suite gets: fail() keeps the last message (any thread
 * may call it), log() prints warnings and errors to stderr. */
extern const sl_module_host conf_host;
/* The last message a module gave through fail() ("" after conf_msg_clear). */
const char *conf_msg(void);
void conf_msg_clear(void);
/* Marks the calling thread as one of the suite's: the threads that call into modules. fail()
 * is for those only (module.h, Threads: never from a module's own threads, whose failures are
 * reported by a later call on the caller's thread). A forked child's thread keeps the mark. */
void conf_suite_thread(void);
/* How many fail() calls came from other threads since the process started, and the last such
 * message (for the report). */
int conf_foreign_fails(const char **last);

/* ---- opening a module ------------------------------------------------------------------------- */
typedef struct conf_module {
  char name[40];
  char variant[40];  /* after ':' in the spec, "" when none */
  char spec[96];     /* NAME[:VARIANT], what the registry was asked for */
  const void *ops;   /* sl_backend_ops or sl_collective_ops, v2 (adapted when v1) */
  void *dl, *shim;   /* as the registry returned them (NULL for a built-in) */
  bool v1;           /* the table is the v1 entry's, adapted */
} conf_module;

/* SPEC is NAME[:VARIANT] (a built-in module, or libshardload-NAME.so on SHARDLOAD_MODULE_PATH) or
 * a path DIR/libshardload-NAME.so[:VARIANT], whose DIR is put first on SHARDLOAD_MODULE_PATH so
 * that the registry takes that file. With V1, a module that exports both entries is used
 * through its v1 entry, adapted as the registry adapts a module that exports only that one.
 * Returns SL_OK, SL_ERR_NO_DEVICE when the module cannot run on this machine (WHY says why: the
 * caller skips), or another status (WHY says what is wrong). */
sl_status conf_module_open(const char *spec, bool collective, bool v1, conf_module *m, char *why, size_t len);
void conf_module_close(conf_module *m);

/* Init of a backend instance with the suite's host; SL_ERR_NO_DEVICE: none here. */
sl_status conf_backend_init(const conf_module *m, int local_rank, int local_world, int timeout_ms, void **be);

/* ---- bytes --------------------------------------------------------------------------------- */
/* Byte I of stream SEED (any I: a share at an offset is checked against the stream's bytes). */
uint8_t conf_byte(uint64_t seed, size_t i);
void conf_fill(void *p, size_t n, uint64_t seed, size_t start);
/* Index of the first byte of P that differs from stream SEED at START, or -1. */
long conf_differs(const void *p, size_t n, uint64_t seed, size_t start);
/* Index of the first byte of P that is not V, or -1. */
long conf_not_all(const void *p, size_t n, uint8_t v);
double conf_now_ms(void);
/* Whether MSG names rank V as the one a failure is about (sl_test_names_rank), not counting the
 * op's description of itself: "on rank R of W", "from rank ROOT", "from ranks R1, R2" (a
 * scatterv group's roots). */
bool conf_names_rank(const char *msg, int v);

/* ---- holding a stream ----------------------------------------------------------------------- */
/* A chain of device-to-device copies between two scratch buffers, long enough to keep a stream
 * busy for about HOLD_MS (calibrated once per process on the backend at hand). A backend whose
 * copies complete on return (cpu, a v1 module) cannot be held: SYNCHRONOUS says so, and
 * conf_block only records its event. */
typedef struct conf_blocker {
  const sl_backend_ops *o;
  void *be;
  void *a, *b;
  size_t bytes;   /* of each scratch buffer */
  unsigned n;     /* copies per block */
  bool synchronous;
} conf_blocker;

#define CONF_HOLD_MS 300

/* SL_OK, or the failing status with WHY. */
sl_status conf_blocker_init(conf_blocker *k, const sl_backend_ops *o, void *be, char *why, size_t len);
/* Enqueues the chain on STREAM, then records EV after it: while EV is pending, nothing queued on
 * STREAM after this call has started. */
sl_status conf_block(conf_blocker *k, void *stream, void *ev);
/* Synchronizes the backend (a block may still be running), then frees the scratch buffers. */
void conf_blocker_fini(conf_blocker *k);

#endif
