/* trace_at_exit.c - a traced pool that the process never destroys (as in
 * a PyTorch process) still has its trace written, at exit.  A plain
 * program (no test framework whose exit handlers a forked child would
 * run): it forks; the child records and exits without magpool_destroy;
 * the parent reads the file.  Exit 0 pass, 1 fail.
 */
#define _GNU_SOURCE
#include <magpool.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
  char path[256];
  snprintf(path, sizeof path, "%s/magpool-at-exit-%ld.trace",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
  unlink(path);
  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    magpool_config_t c;
    magpool_config_init(&c);
    c.pool_size = (size_t)4 << 20;
    c.trace_path = path;
    magpool_t *pool = NULL;
    if (magpool_create(&c, &pool) != 0) _exit(2);
    for (int i = 0; i < 5000; i++) {
      void *x = magpool_alloc(pool, 64 + (size_t)i);
      if (x == NULL || magpool_free(pool, x) != 0) _exit(3);
    }
    if (magpool_alloc(pool, 999) == NULL) _exit(4); /* live at exit */
    exit(0); /* atexit handlers run; no destroy */
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "trace_at_exit: child status %d\n", st);
    return 1;
  }
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "trace_at_exit: no trace at %s\n", path);
    return 1;
  }
  char line[256], last[256] = "";
  long a = 0, fr = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (line[0] == 'a') a++, snprintf(last, sizeof last, "%s", line);
    else if (line[0] == 'f') fr++;
  }
  fclose(f);
  unlink(path);
  if (a != 5001 || fr != 5000 || strncmp(last, "a 5000 999 0", 12) != 0) {
    fprintf(stderr, "trace_at_exit: %ld allocations, %ld frees, last '%s'\n", a, fr, last);
    return 1;
  }
  printf("trace_at_exit: OK (%ld allocations, %ld frees)\n", a, fr);
  return 0;
}
