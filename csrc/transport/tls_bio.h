/* The memory BIO under a TLS connection, the server's (transport/tls.c) and the client's
 * (client/tls_client.c): OpenSSL takes ciphertext from, and puts records into, the
 * connection's own buffers through the two functions its user gives. */
#ifndef OI_TRANSPORT_TLS_BIO_H
#define OI_TRANSPORT_TLS_BIO_H

#include <openssl/bio.h>

/* A BIO method named `name` over `write` and `read` (BIO_get_data gives the connection); its
 * flush succeeds and other controls answer 0. NULL when out of memory. Made once by each user
 * (pthread_once) and kept for the process's life. */
BIO_METHOD *oi_tls_bio_method_new(const char *name, int (*write)(BIO *, const char *, int),
                                  int (*read)(BIO *, char *, int));

#endif
