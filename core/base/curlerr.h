/* What a libcurl transfer failure means as an errno, for every HTTP client
 * in gkm (the Kubernetes API, the registries). */
#ifndef GKM_CURLERR_H
#define GKM_CURLERR_H

#include <curl/curl.h>

/* -ETIMEDOUT, -ECONNREFUSED, -EHOSTUNREACH, -ECONNRESET (the connection
 * broke), -EPIPE (a body cut short), -ENOMEM, else -EIO. */
int curlerr_errno(CURLcode cc);

#endif
