#include "shardload/shardload.h"

SL_API const char *sl_status_name(sl_status s) {
  switch (s) {
#define SL_STATUS_NAME_(name, value, msg) \
  case SL_##name:                         \
    return "SL_" #name;
    SL_STATUS_MAP(SL_STATUS_NAME_)
#undef SL_STATUS_NAME_
    default:
      return "SL_ERR_UNKNOWN";
  }
}

SL_API const char *sl_strerror(sl_status s) {
  switch (s) {
#define SL_STATUS_MSG_(name, value, msg) \
  case SL_##name:                        \
    return msg;
    SL_STATUS_MAP(SL_STATUS_MSG_)
#undef SL_STATUS_MSG_
    default:
      return "unknown status";
  }
}

SL_API unsigned sl_version(void) { return SL_VERSION; }
SL_API const char *sl_version_string(void) { return SL_VERSION_STRING; }
