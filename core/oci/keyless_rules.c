/* Identity rules of keyless trust: an OIDC issuer and a subject, each
 * exact or a regular expression (see keyless.h). */
#include "keyless_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "yamljson.h"

#define MAX_PATTERN 1024

/* Go's (RE2's) class escapes in POSIX extended syntax: \d \w \s and their
 * negations (inside brackets the positive ones only). Everything else is
 * passed as written. */
static int put(char *out, size_t cap, size_t *o, const char *s, size_t n)
{
	if (*o + n >= cap)
		return -E2BIG;
	memcpy(out + *o, s, n);
	*o += n;
	return 0;
}

static int translate(const char *re, char *out, size_t cap)
{
	static const struct {
		char c;
		const char *outside, *inside;
	} cls[] = {{'d', "[0-9]", "0-9"},
	           {'w', "[A-Za-z0-9_]", "A-Za-z0-9_"},
	           {'s', "[[:space:]]", "[:space:]"},
	           {'D', "[^0-9]", NULL},
	           {'W', "[^A-Za-z0-9_]", NULL},
	           {'S', "[^[:space:]]", NULL}};
	size_t o = 0;
	bool in_bracket = false;
	int rc = 0;
	for (const char *p = re; *p && rc == 0; p++) {
		if (*p == '\\' && p[1] && strchr("dwsDWS", p[1])) {
			const char *add = NULL;
			for (size_t i = 0; i < sizeof(cls) / sizeof(cls[0]); i++)
				if (cls[i].c == p[1])
					add = in_bracket ? cls[i].inside : cls[i].outside;
			if (!add)
				return -EINVAL; /* a negated class inside brackets */
			rc = put(out, cap, &o, add, strlen(add));
			p++;
		} else if (*p == '\\' && p[1]) {
			rc = put(out, cap, &o, p, 2);
			p++;
		} else if (*p == '[' && !in_bracket) {
			/* "[]...]" and "[^]...]" start with a literal ']' */
			size_t n = 1 + (p[1] == '^');
			n += p[n] == ']';
			rc = put(out, cap, &o, p, n);
			p += n - 1;
			in_bracket = true;
		} else if (in_bracket && *p == '[' && p[1] && strchr(":=.", p[1])) {
			/* [:alpha:] and the like: copied whole */
			const char end[3] = {p[1], ']', 0}, *e = strstr(p + 2, end);
			if (!e)
				return -EINVAL;
			rc = put(out, cap, &o, p, (size_t)(e + 2 - p));
			p = e + 1;
		} else {
			if (*p == ']')
				in_bracket = false;
			rc = put(out, cap, &o, p, 1);
		}
	}
	if (rc == 0)
		out[o] = '\0';
	return rc;
}

static int compile(const char *what, const char *exact, const char *re, struct kl_match *m,
                   char *why, size_t whylen)
{
	if (!exact == !re) {
		errbuf_set(why, whylen, "want exactly one of %s and %sRegExp", what, what);
		return -EINVAL;
	}
	const char *text = exact ? exact : re;
	if (!text[0] || strlen(text) > MAX_PATTERN) {
		errbuf_set(why, whylen, "%s%s is empty or longer than %d characters", what,
		           exact ? "" : "RegExp", MAX_PATTERN);
		return -EINVAL;
	}
	if (!(m->text = strdup(text)))
		return -ENOMEM;
	if (exact)
		return 0;
	char ere[4 * MAX_PATTERN + 1];
	int rc = translate(re, ere, sizeof(ere));
	int erc = rc ? 0 : regcomp(&m->re, ere, REG_EXTENDED | REG_NOSUB);
	if (rc || erc) {
		char msg[128] = "a negated class (\\D \\W \\S) inside brackets";
		if (erc)
			regerror(erc, &m->re, msg, sizeof(msg));
		errbuf_set(why, whylen, "%sRegExp '%.200s': %s", what, re, msg);
		free(m->text);
		m->text = NULL;
		return -EINVAL;
	}
	m->is_re = true;
	return 0;
}

static void match_clear(struct kl_match *m)
{
	if (m->is_re)
		regfree(&m->re);
	free(m->text);
	memset(m, 0, sizeof(*m));
}

void kl_rule_clear(struct kl_rule *r)
{
	match_clear(&r->issuer);
	match_clear(&r->subject);
}

int kl_rule_compile(const struct keyless_rule_spec *s, size_t index, struct kl_rule *out, char *why,
                    size_t whylen)
{
	struct kl_rule r;
	memset(&r, 0, sizeof(r));
	if (s->name && (!s->name[0] || strlen(s->name) >= sizeof(r.name))) {
		errbuf_set(why, whylen, "name is empty or longer than %zu characters",
		           sizeof(r.name) - 1);
		return -EINVAL;
	}
	int rc = compile("issuer", s->issuer, s->issuer_regexp, &r.issuer, why, whylen);
	if (rc == 0)
		rc = compile("subject", s->subject, s->subject_regexp, &r.subject, why, whylen);
	if (rc) {
		kl_rule_clear(&r);
		return rc;
	}
	if (s->name)
		snprintf(r.name, sizeof(r.name), "%s", s->name);
	else
		snprintf(r.name, sizeof(r.name), "rule %zu", index + 1);
	snprintf(r.desc, sizeof(r.desc), "issuer %s '%.250s', subject %s '%.250s'",
	         r.issuer.is_re ? "~" : "=", r.issuer.text, r.subject.is_re ? "~" : "=",
	         r.subject.text);
	*out = r;
	return 0;
}

static bool matches(const struct kl_match *m, const char *v)
{
	return m->is_re ? regexec(&m->re, v, 0, NULL, 0) == 0 : strcmp(m->text, v) == 0;
}

int kl_rules_match(const struct sig_keyless *kl, const char *issuer, char *const *sans,
                   size_t nsans, struct keyless_result *res, char *why, size_t whylen)
{
	bool issuer_ok = false;
	snprintf(res->issuer, sizeof(res->issuer), "%s", issuer);
	snprintf(res->identity, sizeof(res->identity), "%s", nsans ? sans[0] : "");
	for (size_t i = 0; i < kl->nrules; i++) {
		const struct kl_rule *r = &kl->rules[i];
		if (!issuer[0] || !matches(&r->issuer, issuer))
			continue;
		issuer_ok = true;
		for (size_t k = 0; k < nsans; k++) {
			if (!matches(&r->subject, sans[k]))
				continue;
			snprintf(res->identity, sizeof(res->identity), "%s", sans[k]);
			snprintf(res->rule, sizeof(res->rule), "%s", r->name);
			snprintf(res->rule_id, sizeof(res->rule_id), "%s", r->id);
			return 0;
		}
	}
	if (!issuer_ok) {
		res->cause = KEYLESS_ISSUER;
		errbuf_set(why, whylen,
		           "issuer: the certificate's OIDC issuer '%.200s' is not one any identity "
		           "rule accepts",
		           issuer[0] ? issuer : "(none)");
	} else {
		res->cause = KEYLESS_SUBJECT;
		errbuf_set(
		    why, whylen,
		    "subject: the certificate's identity '%.200s' (issuer %.200s) is not one "
		    "any identity rule for that issuer accepts",
		    nsans ? sans[0] : "(none)", issuer);
	}
	return -EKEYREJECTED;
}

static const char *field(const cJSON *o, const char *k, bool *bad)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	if (v && !cJSON_IsString(v))
		*bad = true;
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int rule_of(struct sig_keyless *kl, const cJSON *o, char *why, size_t whylen)
{
	static const char *const known[] = {"name",    "issuer",        "issuerRegExp",
	                                    "subject", "subjectRegExp", NULL};
	bool bad = !cJSON_IsObject(o);
	for (const cJSON *kv = bad ? NULL : o->child; kv; kv = kv->next) {
		size_t i = 0;
		while (known[i] && strcmp(known[i], kv->string) != 0)
			i++;
		if (!known[i]) {
			errbuf_set(why, whylen,
			           "unknown key '%.64s' (name, issuer, issuerRegExp, subject, "
			           "subjectRegExp)",
			           kv->string);
			return -EINVAL;
		}
	}
	struct keyless_rule_spec s = {
	    .name = field(o, "name", &bad),
	    .issuer = field(o, "issuer", &bad),
	    .issuer_regexp = field(o, "issuerRegExp", &bad),
	    .subject = field(o, "subject", &bad),
	    .subject_regexp = field(o, "subjectRegExp", &bad),
	};
	if (bad) {
		errbuf_set(why, whylen, "want a mapping of strings");
		return -EINVAL;
	}
	return sig_keyless_add_rule(kl, &s, why, whylen);
}

int sig_keyless_add_rules_text(struct sig_keyless *kl, const char *text, size_t len, char *why,
                               size_t whylen)
{
	cJSON *docs = NULL;
	char perr[256];
	if (yamljson_parse(text, len, &docs, perr, sizeof(perr)) != 0) {
		errbuf_set(why, whylen, "%s", perr);
		return -EINVAL;
	}
	const cJSON *doc = cJSON_GetArrayItem(docs, 0), *list = doc;
	if (cJSON_IsObject(doc))
		list = cJSON_GetObjectItemCaseSensitive(doc, "identities");
	int rc = 0, i = 0;
	if (cJSON_GetArraySize(docs) != 1 || !cJSON_IsArray(list) || !cJSON_GetArraySize(list)) {
		errbuf_set(why, whylen, "want a list of identity rules ({issuer, subject}, ...)");
		rc = -EINVAL;
	}
	const cJSON *it, *items = rc ? NULL : list;
	cJSON_ArrayForEach(it, items)
	{
		char one[512] = "";
		if ((rc = rule_of(kl, it, one, sizeof(one)))) {
			errbuf_set(why, whylen, "identity %d: %s", i + 1, one);
			break;
		}
		i++;
	}
	cJSON_Delete(docs);
	return rc;
}
