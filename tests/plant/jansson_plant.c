/* A stand-in for libjansson.so.4 that a hostile user could leave in a shared directory: its
 * constructor drops the file "planted-ran" in the current directory, so a test can tell
 * whether a binary run from that directory loaded it. It defines jansson's version node
 * (jansson_plant.map) so the loader's version check passes and the constructor would run.
 * tests/test_elf_paths.c copies it to a scratch directory as libjansson.so.4. */
#include <fcntl.h>
#include <unistd.h>

__attribute__((constructor)) static void sl_plant_ran(void) {
  int fd = open("planted-ran", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) close(fd);
}

/* one exported symbol, so the version node has something to carry */
__attribute__((visibility("default"))) int sl_plant_marker = 1;
