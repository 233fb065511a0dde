/* Preloaded into the `shardload` command by test_cli_output: jansson running out of memory in
 * the middle of a report. Once the command has made the JSON string SHARDLOAD_TEST_JSON_OOM_AFTER
 * (a tensor's name, which its report element holds), every json_object() after it fails, as
 * jansson's does when malloc fails: the next tensor's element of the streamed --json report is
 * NULL, after the elements before it were written. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int armed;

__attribute__((visibility("default"))) json_t *json_string(const char *value) {
  json_t *(*real)(const char *) = (json_t * (*)(const char *)) dlsym(RTLD_NEXT, "json_string");
  const char *after = getenv("SHARDLOAD_TEST_JSON_OOM_AFTER");
  if (after && value && !strcmp(value, after)) armed = 1;
  return real ? real(value) : NULL;
}

__attribute__((visibility("default"))) json_t *json_object(void) {
  json_t *(*real)(void) = (json_t * (*)(void)) dlsym(RTLD_NEXT, "json_object");
  return armed || !real ? NULL : real();
}
