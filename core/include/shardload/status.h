/* Status codes: one table gives the enum, the stable name and the generic message.
 * Values are never renumbered; new codes go at the end. */
#ifndef SHARDLOAD_STATUS_H
#define SHARDLOAD_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#define SL_STATUS_MAP(X)                                                                     \
  X(OK, 0, "success")                                                                        \
  X(ERR_INVALID, 1, "invalid argument")                                                      \
  X(ERR_NOMEM, 2, "out of memory")                                                           \
  X(ERR_IO, 3, "input/output error")                                                         \
  X(ERR_NOT_FOUND, 4, "file or tensor not found")                                            \
  X(ERR_FORMAT, 5, "malformed checkpoint")                                                   \
  X(ERR_DTYPE, 6, "unsupported or mismatched dtype")                                         \
  X(ERR_SHAPE, 7, "shape mismatch")                                                          \
  X(ERR_PLAN, 8, "invalid plan")                                                             \
  X(ERR_MISSING, 9, "plan names tensors the checkpoint lacks")                               \
  X(ERR_UNEXPECTED, 10, "checkpoint holds tensors the strict plan does not name")             \
  X(ERR_BACKEND, 11, "backend failure")                                                      \
  X(ERR_NO_DEVICE, 12, "backend or device unavailable")                                      \
  X(ERR_COMM, 13, "collective communication failed")                                         \
  X(ERR_TIMEOUT, 14, "timed out")                                                            \
  X(ERR_PEER, 15, "another rank failed")                                                     \
  X(ERR_MISMATCH, 16, "ranks disagree")                                                      \
  X(ERR_ABI, 17, "module ABI mismatch")                                                      \
  X(ERR_UNSUPPORTED, 18, "not supported")                                                    \
  X(ERR_BUFFER, 19, "caller buffer rejected")

typedef enum sl_status {
#define SL_STATUS_ENUM_(name, value, msg) SL_##name = value,
  SL_STATUS_MAP(SL_STATUS_ENUM_)
#undef SL_STATUS_ENUM_
  SL_STATUS_COUNT_
} sl_status;

#if defined(_WIN32)
#define SL_STATUS_API __declspec(dllexport)
#else
#define SL_STATUS_API __attribute__((visibility("default")))
#endif

/* Stable short name, e.g. "SL_ERR_FORMAT"; "SL_ERR_UNKNOWN" for values outside the table. */
SL_STATUS_API const char *sl_status_name(sl_status s);
/* Generic message, e.g. "malformed checkpoint". */
SL_STATUS_API const char *sl_strerror(sl_status s);

#ifdef __cplusplus
}
#endif
#endif
