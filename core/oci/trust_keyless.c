/* Keyless trust from a trust directory (see trust_keyless.h). */
#include "trust_keyless.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "keyless.h"

enum part { ROOT, CAS, REKOR, CTLOG, RULES, NPARTS };

static const char *const names[NPARTS] = {"trusted_root.json", "fulcio.pem", "rekor.pub",
                                          "ctlog.pub", "identities.yaml"};

static int part_of(const char *name)
{
	for (int i = 0; i < NPARTS; i++)
		if (strcmp(names[i], name) == 0)
			return i;
	return -1;
}

bool trust_keyless_file(const char *name)
{
	return part_of(name) >= 0;
}

static int add_part(struct sig_keyless *kl, enum part p, const struct watched_file *f, char *why,
                    size_t whylen)
{
	switch (p) {
	case ROOT:
		return sig_keyless_add_trusted_root(kl, f->data, f->len, why, whylen);
	case CAS:
		return sig_keyless_add_ca_pem(kl, f->data, f->len, why, whylen);
	case REKOR:
	case CTLOG:
		return sig_keyless_add_log_pem(kl, f->data, f->len, p == CTLOG, why, whylen);
	default:
		return sig_keyless_add_rules_text(kl, f->data, f->len, why, whylen);
	}
}

int trust_keyless_load(const char *dir, const struct watched_files *w, struct sig_keyset *ks,
                       char *err, size_t errlen)
{
	struct sig_keyless *kl = NULL;
	char why[512] = "";
	int rc = 0;
	bool any = false;
	for (size_t i = 0; i < w->n && !any; i++)
		any = trust_keyless_file(w->f[i].name);
	if (!any)
		return 0;
	if ((rc = sig_keyless_new(&kl)))
		return rc;
	for (size_t i = 0; i < w->n && rc == 0; i++) {
		int p = part_of(w->f[i].name);
		if (p >= 0 && (rc = add_part(kl, (enum part)p, &w->f[i], why, sizeof(why))))
			snprintf(err, errlen, "%s/%s: %s", dir, w->f[i].name, why);
	}
	if (rc == 0 && (rc = sig_keyless_complete(kl, why, sizeof(why))))
		snprintf(err, errlen,
		         "%s: %s (keyless trust wants a CA, a Rekor key and an "
		         "identity rule: trusted_root.json or fulcio.pem and rekor.pub, and "
		         "identities.yaml)",
		         dir, why);
	if (rc) {
		sig_keyless_free(kl);
		return rc;
	}
	sig_keyset_set_keyless(ks, kl);
	return 0;
}
