/* pki: a throwaway certificate authority for the unit tests that speak TLS, made with the
 * openssl CLI in a fresh temporary directory. */
#ifndef IDEM_TESTS_PKI_H
#define IDEM_TESTS_PKI_H

enum pki_file {
    PKI_CA_CRT,   /* the CA that signed both certificates below */
    PKI_SRV_CRT,  /* server certificate: IP 127.0.0.1 and DNS node1.test */
    PKI_SRV_KEY,  /* its key */
    PKI_CLI_CRT,  /* client certificate, CN cli */
    PKI_CLI_KEY,  /* its key */
    PKI_OTHER_CA, /* a CA that signed neither */
    PKI_WILD_CRT, /* server certificate with PKI_SRV_KEY's key: DNS *.wild.test, n*.part.test */
    PKI_NPATHS
};

struct pki {
    char dir[64];                /* the directory holding the files */
    char paths[PKI_NPATHS][256]; /* each file's path, by enum pki_file */
};

/* Makes the files in a new directory /tmp/<prefix>.XXXXXX. 0, or -1 with a message on stderr
 * (what was made is removed). Call pki_remove() after a 0. */
int pki_make(struct pki *p, const char *prefix);

/* Removes the directory and its files. 0, or -1 with errno set. */
int pki_remove(const struct pki *p);

#endif
