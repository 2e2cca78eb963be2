/* tmpdir: the unit tests' temporary directories. */
#ifndef IDEM_TESTS_TMPDIR_H
#define IDEM_TESTS_TMPDIR_H

#include <stddef.h>

/* Makes a fresh directory /tmp/<name>-XXXXXX (mkdtemp) and writes its path into dir (len
 * bytes). Returns 0, or -1 with errno set. */
int tmpdir_make(char *dir, size_t len, const char *name);

/* Removes `dir` and everything under it (files and directories, symlinks not followed).
 * Returns 0, or -1 with errno set. */
int tmpdir_remove(const char *dir);

#endif
