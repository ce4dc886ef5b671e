/* scope.c - task scopes: every block allocated through a scope is freed
 * when the scope ends.  A scope is owned by one thread at a time; it is a
 * growable array of the blocks it handed out.  Scope blocks carry the
 * MP_HDR_SCOPE bit, so magpool_free refuses them (MAGPOOL_EINVAL) and the
 * scope can never free a block that went back to the pool behind its back
 * and was handed to someone else.  Layer 5. */
#include "internal.h"

#include <stdlib.h>

struct magpool_scope {
  magpool_t *pool;
  size_t n, cap;
  void **blk;
};

magpool_scope_t *magpool_scope_begin(magpool_t *pool) {
  if (pool == NULL) return mp_fail(MAGPOOL_EINVAL);
  magpool_scope_t *s = calloc(1, sizeof *s);
  if (s == NULL) return mp_fail(MAGPOOL_ENOMEM);
  s->pool = pool;
  return s;
}

void *magpool_scope_alloc(magpool_scope_t *s, size_t size) {
  if (s == NULL) return mp_fail(MAGPOOL_EINVAL);
  if (s->n == s->cap) {
    size_t nc = s->cap ? s->cap * 2 : 16;
    void **nb = realloc(s->blk, nc * sizeof *nb);
    if (nb == NULL) return mp_fail(MAGPOOL_ENOMEM);
    s->blk = nb;
    s->cap = nc;
  }
  void *p = mp_alloc_flags(s->pool, size, MP_HDR_SCOPE);
  if (p != NULL) s->blk[s->n++] = p;
  return p;
}

int magpool_scope_free(magpool_scope_t *s, void *ptr) {
  if (s == NULL) return MAGPOOL_EINVAL;
  if (ptr == NULL) return 0;
  for (size_t i = s->n; i-- > 0;) { /* recent blocks are freed first */
    if (s->blk[i] == ptr) {
      int rc = mp_free_checked(s->pool, ptr, 0, false, true);
      if (rc == 0) s->blk[i] = s->blk[--s->n];
      return rc;
    }
  }
  return MAGPOOL_EINVAL;
}

int magpool_scope_end(magpool_scope_t *s) {
  if (s == NULL) return MAGPOOL_EINVAL;
  int rc = 0;
  for (size_t i = 0; i < s->n; i++) {
    int r = mp_free_checked(s->pool, s->blk[i], 0, false, true);
    if (r != 0 && rc == 0) rc = r;
  }
  free(s->blk);
  free(s);
  return rc;
}
