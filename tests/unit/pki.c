/* pki: see pki.h. */
#include "pki.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpdir.h"

static int run(const char *dir, const char *cmd)
{
    char full[2048];
    snprintf(full, sizeof full, "cd %s && %s >/dev/null 2>&1", dir, cmd);
    return system(full);
}

int pki_make(struct pki *p, const char *prefix)
{
    snprintf(p->dir, sizeof p->dir, "/tmp/%s.XXXXXX", prefix);
    if (mkdtemp(p->dir) == NULL) {
        perror("mkdtemp");
        return -1;
    }
    static const char *const exts[][2] = {
        {"srv.ext", "subjectAltName=IP:127.0.0.1,DNS:node1.test\n"},
        {"wild.ext", "subjectAltName=DNS:*.wild.test,DNS:n*.part.test\n"},
    };
    for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) {
        char ext[300];
        snprintf(ext, sizeof ext, "%s/%s", p->dir, exts[i][0]);
        FILE *f = fopen(ext, "w");
        if (f == NULL) {
            perror(ext);
            tmpdir_remove(p->dir);
            return -1;
        }
        fputs(exts[i][1], f);
        fclose(f);
    }
    static const char *const cmds[] = {
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key "
        "-out ca.crt -days 2 -subj /CN=ca",
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout o.key "
        "-out other-ca.crt -days 2 -subj /CN=other",
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout srv.key -out "
        "srv.csr -subj /CN=srv",
        "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out srv.crt "
        "-days 2 -extfile srv.ext",
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout cli.key -out "
        "cli.csr -subj /CN=cli",
        "openssl x509 -req -in cli.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out cli.crt "
        "-days 2",
        "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out wild.crt "
        "-days 2 -extfile wild.ext",
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        if (run(p->dir, cmds[i]) != 0) {
            fprintf(stderr, "failed: %s\n", cmds[i]);
            tmpdir_remove(p->dir);
            return -1;
        }
    }
    static const char *const names[PKI_NPATHS] = {"ca.crt",  "srv.crt",      "srv.key", "cli.crt",
                                                  "cli.key", "other-ca.crt", "wild.crt"};
    for (int i = 0; i < PKI_NPATHS; i++) {
        snprintf(p->paths[i], sizeof p->paths[i], "%s/%s", p->dir, names[i]);
    }
    return 0;
}

int pki_remove(const struct pki *p)
{
    return tmpdir_remove(p->dir);
}
