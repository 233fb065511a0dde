/* The two planes of a context (docs/DESIGN.md#data-flow, "Two planes"): a control plane in host
 * memory for agreements, manifests and status, and a data plane for tensor bytes that the
 * ranks agree on at creation. context.c creates and destroys them; planes.c holds the rest. */
#ifndef SHARDLOAD_PLANES_H
#define SHARDLOAD_PLANES_H

#include "internal.h"

/* Collective. Connects the control plane ("local" for one rank, else "gloo") under PREFIX and
 * LOBBY, then agrees with every rank on the data collective (WANT: NULL/"auto" or a name) and
 * starts it (under PREFIX "data/" unless it is the control plane's module). Every rank returns
 * the same verdict; ctx->data_reason says what was chosen and why. On failure nothing is left
 * open. Needs ctx's backend, unless BACKEND (the status of this rank's backend start) is not
 * SL_OK: then this rank only tells the others why (so that they fail at once, naming it, rather
 * than wait for it at the rendezvous) and returns BACKEND with its message kept. */
sl_status sl__planes_open(sl_context *ctx, const char *want, const char *prefix, const char *lobby,
                          const char *job_key, sl_status backend);
/* What names this rank's device on its machine, for the data-plane agreement: the backend's
 * device_identity ("0000:3b:00.0", "sim:1"), else "ordinal N"; "" for a backend whose device
 * memory is host memory. Complete on return; needs ctx's backend. */
#define SL__PLANE_DEVICE_ID 96
void sl__plane_device_id(const sl_context *ctx, char *buf, size_t len);
/* Closes the data plane (unless it shares the control plane's communicator), then the control
 * plane. Safe on a context whose planes are not (or only partly) open. */
void sl__planes_close(sl_context *ctx);
/* After the data plane failed: the ranks it lost (its `lost`) to the control plane (its
 * `note_lost`), whose fini then waits for none of them (module.h). */
void sl__planes_note_lost(sl_context *ctx);

#endif
