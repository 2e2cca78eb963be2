/* xmalloc: allocation that aborts with a message on failure, for paths that cannot degrade. */
#ifndef IDEM_SERVER_XMALLOC_H
#define IDEM_SERVER_XMALLOC_H

#include <stddef.h>

/* Each returns memory the caller owns (free with free()), never NULL. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
void *xmemdup(const void *p, size_t n);
char *xstrndup(const char *s, size_t n);

#endif
