/* Keyless trust in a daemon's trust directory (--trust-dir, a mounted
 * ConfigMap): the files of these names hold it, every other file keys.
 *
 *   trusted_root.json  sigstore's trusted root (Fulcio CAs, Rekor and CT
 *                      logs, with their validity)
 *   fulcio.pem         Fulcio CA certificates (PEM), instead or besides
 *   rekor.pub          Rekor public keys (PEM)
 *   ctlog.pub          CT log public keys (PEM): SCTs are then required
 *   identities.yaml    the identity rules (keyless.h), YAML or JSON
 *
 * With any of them present the whole must be complete: a CA, a log key and
 * a rule; a part missing or unreadable refuses the directory, so a reload
 * keeps the trust it had. */
#ifndef GKM_TRUST_KEYLESS_H
#define GKM_TRUST_KEYLESS_H

#include <stdbool.h>
#include <stddef.h>

#include "signature.h"
#include "watched.h"

/* Whether a file of the trust directory is keyless trust (not keys). */
bool trust_keyless_file(const char *name);

/* Build the keyless trust of dir's files w (when any is there) and give it
 * to ks. 0 (nothing to do when none is there), or -errno with err naming
 * the file and what is wrong ("keys/identities.yaml: identity 2: ..."). */
__attribute__((warn_unused_result)) int trust_keyless_load(const char *dir,
                                                           const struct watched_files *w,
                                                           struct sig_keyset *ks, char *err,
                                                           size_t errlen);

#endif
