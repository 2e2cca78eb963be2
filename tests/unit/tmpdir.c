#define _GNU_SOURCE /* nftw's FTW_DEPTH, FTW_PHYS */
#include "tmpdir.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

static int removeEntry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int tmpdir_remove(const char *dir)
{
    return nftw(dir, removeEntry, 8, FTW_DEPTH | FTW_PHYS);
}

int tmpdir_make(char *dir, size_t len, const char *name)
{
    int n = snprintf(dir, len, "/tmp/%s-XXXXXX", name);
    if (n < 0 || (size_t)n >= len) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkdtemp(dir) != NULL ? 0 : -1;
}
