#define _GNU_SOURCE /* nftw's FTW_DEPTH, FTW_PHYS */
#include "tmpdir.h"

#include <ftw.h>
#include <stdio.h>

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
