/* sl__ze_spirv_scan (kernels_host.h): the header, capabilities and entry points of a SPIR-V
 * module, from the binary layout of the SPIR-V specification (section 2.3: a five-word
 * header, then instructions whose first word holds their word count and opcode). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kernels_host.h"

enum {
  SPV_MAGIC = 0x07230203u,
  SPV_OP_ENTRY_POINT = 15,
  SPV_OP_CAPABILITY = 17,
  SPV_CAP_FLOAT64 = 10,
  SPV_MODEL_KERNEL = 6,
};

static int bad(char *why, size_t why_len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (why && why_len) {
    int n = snprintf(why, why_len, "SPIR-V: ");
    if (n > 0 && (size_t)n < why_len) vsnprintf(why + n, why_len - (size_t)n, fmt, ap);
  }
  va_end(ap);
  return -1;
}

static uint32_t word(const unsigned char *p, size_t i) {
  uint32_t w;
  memcpy(&w, p + 4 * i, 4);
  return w;
}

int sl__ze_spirv_scan(const void *il, size_t size, sl__ze_spirv_info *info, char *why, size_t why_len) {
  const unsigned char *p = il;
  memset(info, 0, sizeof *info);
  if (!il || size < 20 || size % 4 != 0)
    return bad(why, why_len, "%zu bytes is not a module (a five-word header, then whole words)", size);
  if (word(p, 0) != SPV_MAGIC)
    return bad(why, why_len, "no magic number (0x%08x; want 0x07230203, host-endian)", word(p, 0));
  info->version = word(p, 1);
  const size_t nwords = size / 4;
  for (size_t i = 5; i < nwords;) {
    const uint32_t w = word(p, i), count = w >> 16, op = w & 0xFFFFu;
    if (count == 0 || count > nwords - i)
      return bad(why, why_len, "the instruction at word %zu (opcode %u) has %u words, %zu remain", i, op, count,
                 nwords - i);
    if (op == SPV_OP_CAPABILITY && count >= 2 && word(p, i + 1) == SPV_CAP_FLOAT64) info->float64 = 1;
    if (op == SPV_OP_ENTRY_POINT) {
      /* model, function id, then the name: a NUL-terminated string padded to whole words */
      if (count < 4) return bad(why, why_len, "the entry point at word %zu has no name", i);
      const char *name = (const char *)(p + 4 * (i + 3));
      if (!memchr(name, 0, 4 * (count - 3)))
        return bad(why, why_len, "the entry point name at word %zu is not terminated", i);
      if (word(p, i + 1) == SPV_MODEL_KERNEL) {
        if (info->nkernels == SL_ZE_SPIRV_MAX_KERNELS)
          return bad(why, why_len, "more than %d kernels", SL_ZE_SPIRV_MAX_KERNELS);
        info->kernel[info->nkernels++] = name;
      }
    }
    i += count;
  }
  return 0;
}
